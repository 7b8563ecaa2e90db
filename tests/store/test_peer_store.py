"""Behavioural suite of what the replicas of one deployment share (waiting tiers, replica states), and of the
lease acquire's refusal of a lower tier while a higher one waits, on the embedded store and a real
redis-server."""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.concurrency import LeaseRefusal

pytestmark = pytest.mark.redis


async def test_a_higher_tier_waiting_in_one_replica_holds_back_lower_tiers_of_all(
    store: MemoryStore | RedisStore,
) -> None:
    assert await store.waiting_publish("d1", "replica-a", [2], 60_000) == 2
    low = await store.lease_acquire("d1", "low", slot_cap=10, ttl_ms=60_000, rank=0)
    assert not low.acquired and low.refusal is LeaseRefusal.WAITING and low.inflight == 0
    same = await store.lease_acquire("d1", "same", slot_cap=10, ttl_ms=60_000, rank=2)
    assert same.acquired
    # Without a rank the check is skipped (the former behaviour).
    assert (await store.lease_acquire("d1", "unranked", slot_cap=10, ttl_ms=60_000)).acquired
    # Another deployment is not held back.
    assert (await store.lease_acquire("d2", "low", slot_cap=10, ttl_ms=60_000, rank=0)).acquired


async def test_a_replica_replaces_its_own_entries_and_not_the_others(store: MemoryStore | RedisStore) -> None:
    assert await store.waiting_publish("d1", "host:1", [1, 2], 60_000) == 2
    # A name that ends like another replica's is a different replica.
    assert await store.waiting_publish("d1", "a:host:1", [1], 60_000) == 2
    assert await store.waiting_publish("d1", "host:1", [], 60_000) == 1
    refused = await store.lease_acquire("d1", "x", slot_cap=10, ttl_ms=60_000, rank=0)
    assert refused.refusal is LeaseRefusal.WAITING
    assert (await store.lease_acquire("d1", "y", slot_cap=10, ttl_ms=60_000, rank=1)).acquired
    assert await store.waiting_publish("d1", "a:host:1", [], 60_000) == -1
    assert (await store.lease_acquire("d1", "x", slot_cap=10, ttl_ms=60_000, rank=0)).acquired


async def test_waiting_entries_of_a_crashed_replica_lapse(store: MemoryStore | RedisStore) -> None:
    # (1 s: the entry must outlive the next call even on a loaded machine)
    await store.waiting_publish("d1", "crashed", [1], 1000)
    assert not (await store.lease_acquire("d1", "a", slot_cap=10, ttl_ms=60_000, rank=0)).acquired
    await asyncio.sleep(1.1)
    assert (await store.lease_acquire("d1", "a", slot_cap=10, ttl_ms=60_000, rank=0)).acquired
    assert await store.waiting_publish("d1", "other", [], 60_000) == -1


async def test_the_slot_cap_still_binds_the_tier_that_waits(store: MemoryStore | RedisStore) -> None:
    await store.waiting_publish("d1", "r", [1], 60_000)
    assert (await store.lease_acquire("d1", "a", slot_cap=1, ttl_ms=60_000, rank=1)).acquired
    full = await store.lease_acquire("d1", "b", slot_cap=1, ttl_ms=60_000, rank=1)
    assert not full.acquired and full.refusal is LeaseRefusal.SLOTS


async def test_peer_exchange_returns_the_other_live_replicas(store: MemoryStore | RedisStore) -> None:
    assert await store.peer_exchange("d1", "a", '{"limit": 7}', 60_000) == {}
    assert await store.peer_exchange("d1", "b", '{"limit": 9}', 60_000) == {"a": '{"limit": 7}'}
    assert await store.peer_exchange("d1", "a", '{"limit": 8}', 60_000) == {"b": '{"limit": 9}'}
    assert await store.peer_exchange("d1", "c", "{}", 60_000) == {"a": '{"limit": 8}', "b": '{"limit": 9}'}
    assert await store.peer_exchange("d2", "c", "{}", 60_000) == {}


async def test_a_silent_replica_drops_out_of_the_exchange(store: MemoryStore | RedisStore) -> None:
    await store.peer_exchange("d1", "crashed", "x", 1000)
    assert await store.peer_exchange("d1", "alive", "y", 60_000) == {"crashed": "x"}
    await asyncio.sleep(1.1)
    assert await store.peer_exchange("d1", "alive", "y", 60_000) == {}


async def test_bad_arguments_are_refused(store: MemoryStore | RedisStore) -> None:
    with pytest.raises(ValueError, match="replica name"):
        await store.waiting_publish("d1", "", [1], 1000)
    with pytest.raises(ValueError, match="time-to-live"):
        await store.waiting_publish("d1", "r", [1], 0)
    with pytest.raises(ValueError, match="ranks"):
        await store.waiting_publish("d1", "r", [-1], 1000)
    with pytest.raises(ValueError, match="characters"):
        await store.peer_exchange("d1", "r", "x" * 20_000, 1000)
