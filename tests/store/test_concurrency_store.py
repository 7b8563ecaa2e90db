"""Behavioural suite of the concurrency leases, run on the embedded store and a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.concurrency import LeaseRefusal

pytestmark = pytest.mark.redis


async def test_slot_cap_is_exact_and_release_frees_a_slot(store: MemoryStore | RedisStore) -> None:
    results = [await store.lease_acquire("d1", f"l{i}", slot_cap=3, ttl_ms=60_000) for i in range(5)]
    assert [r.acquired for r in results] == [True, True, True, False, False]
    assert results[2].inflight == 3
    assert results[3].refusal is LeaseRefusal.SLOTS and results[3].inflight == 3
    released = await store.lease_release("d1", "l0")
    assert released.changed == 1 and released.inflight == 2
    again = await store.lease_acquire("d1", "l9", slot_cap=3, ttl_ms=60_000)
    assert again.acquired and again.inflight == 3


async def test_release_of_unknown_lease_changes_nothing(store: MemoryStore | RedisStore) -> None:
    await store.lease_acquire("d1", "a", slot_cap=3, ttl_ms=60_000, cost_tokens=10)
    snapshot = await store.lease_release("d1", "nope")
    assert (snapshot.changed, snapshot.inflight, snapshot.reserved_tokens) == (0, 1, 10)
    twice = await store.lease_release("d1", "a")
    assert twice.changed == 1
    assert (await store.lease_release("d1", "a")).changed == 0


async def test_token_cap_counts_reservations_in_flight(store: MemoryStore | RedisStore) -> None:
    first = await store.lease_acquire("d1", "a", slot_cap=10, ttl_ms=60_000, cost_tokens=600, token_cap=1000)
    second = await store.lease_acquire("d1", "b", slot_cap=10, ttl_ms=60_000, cost_tokens=600, token_cap=1000)
    assert first.acquired and first.reserved_tokens == 600
    assert not second.acquired and second.refusal is LeaseRefusal.TOKENS and second.reserved_tokens == 600
    # A request larger than the cap never fits, even on an idle deployment.
    assert not (
        await store.lease_acquire("d2", "c", slot_cap=10, ttl_ms=60_000, cost_tokens=2000, token_cap=1000)
    ).acquired
    await store.lease_release("d1", "a")
    third = await store.lease_acquire("d1", "b", slot_cap=10, ttl_ms=60_000, cost_tokens=600, token_cap=1000)
    assert third.acquired and third.reserved_tokens == 600


async def test_acquiring_a_live_lease_again_is_idempotent(store: MemoryStore | RedisStore) -> None:
    await store.lease_acquire("d1", "a", slot_cap=1, ttl_ms=60_000, cost_tokens=5)
    again = await store.lease_acquire("d1", "a", slot_cap=1, ttl_ms=60_000, cost_tokens=5)
    assert again.acquired and again.inflight == 1 and again.reserved_tokens == 5


async def test_expired_leases_free_their_slot_and_tokens(store: MemoryStore | RedisStore) -> None:
    # A replica that crashed never releases: its leases must lapse on their own.
    # (1 s: the crashed lease must outlive the next two calls even on a loaded machine)
    await store.lease_acquire("d1", "crashed", slot_cap=2, ttl_ms=1000, cost_tokens=100)
    await store.lease_acquire("d1", "alive", slot_cap=2, ttl_ms=60_000, cost_tokens=50)
    assert not (await store.lease_acquire("d1", "x", slot_cap=2, ttl_ms=60_000)).acquired
    await asyncio.sleep(1.1)
    snapshot = await store.concurrency_snapshot("d1")
    assert (snapshot.inflight, snapshot.reserved_tokens) == (1, 50)
    assert (await store.lease_acquire("d1", "x", slot_cap=2, ttl_ms=60_000)).acquired


async def test_renewal_keeps_a_lease_alive_and_does_not_revive_an_expired_one(store: MemoryStore | RedisStore) -> None:
    # 600 ms leases renewed every 200 ms: 400 ms of slack per renewal for a loaded machine.
    await store.lease_acquire("d1", "kept", slot_cap=5, ttl_ms=600, cost_tokens=1)
    await store.lease_acquire("d1", "lapsed", slot_cap=5, ttl_ms=600, cost_tokens=2)
    for _ in range(4):
        await asyncio.sleep(0.2)
        renewed = await store.lease_renew("d1", ["kept"], 600)
        assert renewed.changed == 1
    # "lapsed" was not renewed: gone after 800 ms, and a late renewal does not bring it back.
    late = await store.lease_renew("d1", ["kept", "lapsed"], 600)
    assert (late.changed, late.inflight, late.reserved_tokens) == (1, 1, 1)


async def test_deployments_are_independent(store: MemoryStore | RedisStore) -> None:
    assert (await store.lease_acquire("d1", "a", slot_cap=1, ttl_ms=60_000)).acquired
    assert (await store.lease_acquire("d2", "a", slot_cap=1, ttl_ms=60_000)).acquired
    assert not (await store.lease_acquire("d1", "b", slot_cap=1, ttl_ms=60_000)).acquired


async def test_hostile_deployment_names_stay_on_their_own_keys(store: MemoryStore | RedisStore) -> None:
    for name in ("{bp:x}", "a:b", "x" * 300):
        assert (await store.lease_acquire(name, "a", slot_cap=1, ttl_ms=60_000)).acquired
    assert (await store.lease_acquire("x", "a", slot_cap=1, ttl_ms=60_000)).acquired


async def test_bad_lease_ids_and_ttls_are_refused(store: MemoryStore | RedisStore) -> None:
    with pytest.raises(ValueError, match="lease ids"):
        await store.lease_acquire("d1", "has space", slot_cap=1, ttl_ms=1000)
    with pytest.raises(ValueError, match="ttl"):
        await store.lease_acquire("d1", "a", slot_cap=1, ttl_ms=0)


async def test_concurrent_acquires_take_exactly_the_cap(store: MemoryStore | RedisStore) -> None:
    results = await asyncio.gather(
        *(store.lease_acquire("d1", f"l{i}", slot_cap=25, ttl_ms=60_000, cost_tokens=1) for i in range(120))
    )
    assert sum(r.acquired for r in results) == 25
    snapshot = await store.concurrency_snapshot("d1")
    assert (snapshot.inflight, snapshot.reserved_tokens) == (25, 25)
