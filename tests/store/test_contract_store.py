"""Behavioural suite of the traffic-contract operations, run on the embedded store and a real redis-server."""

from __future__ import annotations

import asyncio
import time

import pytest

from litellm_ratebalance.contracts.policy import BASKET_FIELD, ContractLimits, Mode
from litellm_ratebalance.store import MemoryStore, RedisStore

pytestmark = pytest.mark.redis

LONG = 3600  # a window long enough that one test never crosses a boundary (see _room_in_window)
TTL = 7200


async def _room_in_window(window: int, margin: float = 3.0) -> None:
    """Wait until the current window has at least ``margin`` seconds left (Redis runs on this host)."""
    left = window - (time.time() % window)
    if left < margin:
        await asyncio.sleep(left + 0.05)


async def admit(store, feature: str, limits: ContractLimits, estimate: int = 0, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("window_seconds", LONG)
    kw.setdefault("ttl_seconds", TTL)
    return await store.contract_admit(feature, limits, estimate, **kw)


async def test_rpm_modes_follow_feature_then_basket(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_rpm=2, basket_rpm=4)
    modes = [(await admit(store, "a", limits)).rpm_mode for _ in range(5)]
    assert modes == [Mode.NORMAL, Mode.NORMAL, Mode.BORROWED, Mode.BORROWED, Mode.DEGRADED]
    last = await admit(store, "a", limits)
    assert last.counted and last.feature_requests == 6 and last.basket_requests == 6
    assert last.tpm_mode is Mode.NORMAL  # no TPM contract: never exceeded


async def test_features_share_the_basket_and_have_separate_fields(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    a = ContractLimits(feature_rpm=1, basket_rpm=3)
    b = ContractLimits(feature_rpm=5, basket_rpm=3)
    assert (await admit(store, "a", a)).rpm_mode is Mode.NORMAL
    assert (await admit(store, "a", a)).rpm_mode is Mode.BORROWED
    third = await admit(store, "b", b)
    assert third.rpm_mode is Mode.NORMAL and third.feature_requests == 1 and third.basket_requests == 3
    assert (await admit(store, "b", b)).rpm_mode is Mode.DEGRADED
    window = await store.contract_window(LONG, third.window_start)
    assert window is not None
    assert window.requests == {"a": 2, "b": 2, BASKET_FIELD: 4}


async def test_tpm_counts_estimates_in_flight_then_actual_usage(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_tpm=100, basket_tpm=1000)
    first = await admit(store, "a", limits, 60)
    assert first.tpm_mode is Mode.NORMAL and first.feature_tokens == 60
    # The first is still in flight: its estimate counts, so a second 60 would take the feature to 120.
    second = await admit(store, "a", limits, 60)
    assert second.tpm_mode is Mode.BORROWED and second.feature_tokens == 120
    # Reconcile both to their actual usage (10 tokens each): the estimates leave, usage stays.
    settled = await store.contract_settle("a", first.window_start, 60, 10)
    assert settled.applied and settled.feature_tokens == 70 and settled.basket_tokens == 70
    settled = await store.contract_settle("a", first.window_start, 60, 10)
    assert settled.feature_tokens == 20
    third = await admit(store, "a", limits, 60)
    assert third.tpm_mode is Mode.NORMAL and third.feature_tokens == 80
    window = await store.contract_window(LONG, first.window_start)
    assert window is not None
    assert window.tokens == {"a": 20, BASKET_FIELD: 20}
    assert window.in_flight == {"a": 60, BASKET_FIELD: 60}


async def test_oversize_estimate_is_normal_in_an_empty_window_only(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_tpm=100, basket_tpm=1000)
    assert (await admit(store, "a", limits, 500)).tpm_mode is Mode.NORMAL
    assert (await admit(store, "a", limits, 1)).tpm_mode is Mode.BORROWED


async def test_rejected_modes_are_not_counted(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_rpm=1, basket_rpm=2)
    reject = {Mode.DEGRADED}
    assert (await admit(store, "a", limits, reject_modes=reject)).counted
    borrowed = await admit(store, "a", limits, 7, reject_modes=reject)
    assert borrowed.counted and borrowed.rpm_mode is Mode.BORROWED
    refused = [await admit(store, "b", limits, 7, reject_modes=reject) for _ in range(3)]
    assert all(r.rpm_mode is Mode.DEGRADED and not r.counted for r in refused)
    assert refused[-1].basket_requests == 2  # the refused ones left the counters as they were
    window = await store.contract_window(LONG, borrowed.window_start)
    assert window is not None
    assert window.requests == {"a": 2, BASKET_FIELD: 2}
    assert window.in_flight == {"a": 7, BASKET_FIELD: 7}


async def test_settle_never_goes_below_zero_and_skips_expired_windows(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_tpm=100)
    first = await admit(store, "a", limits, 10)
    settled = await store.contract_settle("a", first.window_start, 1000, 0)
    assert settled.applied and settled.feature_tokens == 0
    missing = await store.contract_settle("a", first.window_start - LONG, 10, 10)
    assert not missing.applied
    assert await store.contract_window(LONG, first.window_start - LONG) is None


async def test_window_rolls_over_and_old_counters_expire(store: MemoryStore | RedisStore) -> None:
    # 1 s windows whose counters live 2 s: the next window starts from zero.
    limits = ContractLimits(feature_rpm=1)
    await _room_in_window(1, margin=0.5)
    first = await admit(store, "a", limits, window_seconds=1, ttl_seconds=2)
    second = await admit(store, "a", limits, window_seconds=1, ttl_seconds=2)
    assert (first.rpm_mode, second.rpm_mode) == (Mode.NORMAL, Mode.BORROWED)
    assert second.window_start == first.window_start
    await asyncio.sleep(first.window_start + 1 - time.time() + 0.05)
    later = await admit(store, "a", limits, window_seconds=1, ttl_seconds=2)
    assert later.window_start == first.window_start + 1
    assert later.rpm_mode is Mode.NORMAL and later.feature_requests == 1
    # The previous window stays readable until start + ttl, then it is gone.
    previous = await store.contract_window(1, first.window_start)
    assert previous is not None and previous.requests["a"] == 2
    await asyncio.sleep(first.window_start + 2 - time.time() + 0.1)
    assert await store.contract_window(1, first.window_start) is None


async def test_current_window_is_read_by_the_store_clock(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    counted = await admit(store, "a", ContractLimits())
    window = await store.contract_window(LONG)
    assert window is not None and window.window_start == counted.window_start
    assert window.requests["a"] == 1


async def test_hostile_feature_names_get_distinct_fields(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    names = ["a:inflight", "a", "{x}", "a b", "x" * 300, "y" * 300]
    for name in names:
        await admit(store, name, ContractLimits(feature_rpm=1))
    window = await store.contract_window(LONG)
    assert window is not None
    assert len(window.requests) == len(names) + 1
    assert all(value == 1 for name, value in window.requests.items() if name != BASKET_FIELD)
    with pytest.raises(ValueError):
        await admit(store, BASKET_FIELD, ContractLimits())


async def test_concurrent_admissions_count_exactly(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_rpm=20, basket_rpm=60)
    results = await asyncio.gather(*(admit(store, "a", limits) for _ in range(100)))
    modes = [r.rpm_mode for r in results]
    assert (modes.count(Mode.NORMAL), modes.count(Mode.BORROWED), modes.count(Mode.DEGRADED)) == (20, 40, 40)
    assert sorted(r.basket_requests for r in results) == list(range(1, 101))


async def test_settling_several_features_at_once_ends_as_one_by_one(store: MemoryStore | RedisStore) -> None:
    await _room_in_window(LONG)
    limits = ContractLimits(feature_tpm=1000, basket_tpm=5000)
    first = await admit(store, "a", limits, 100)
    await admit(store, "a", limits, 100)
    await admit(store, "b", limits, 50)
    # a: two requests, 200 in flight, 30 + 40 used; b: 50 in flight, 20 used; an over-release stops at 0.
    settled = await store.contract_settle_many(first.window_start, {"a": (200, 70), "b": (80, 20)})
    assert settled.applied
    assert settled.feature_tokens == {"a": 70, "b": 20} and settled.basket_tokens == 90
    window = await store.contract_window(LONG, first.window_start)
    assert window is not None
    assert window.tokens == {"a": 70, "b": 20, BASKET_FIELD: 90}
    assert window.in_flight == {"a": 0, "b": 0, BASKET_FIELD: 0}
    expired = await store.contract_settle_many(first.window_start - LONG, {"a": (10, 10)})
    assert not expired.applied and expired.feature_tokens == {}
    assert await store.contract_window(LONG, first.window_start - LONG) is None
