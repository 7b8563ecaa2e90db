"""Behavioural suite of the admission operations, run on the embedded store and a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.admission.policy import AdmissionLimits, Floor, RejectReason
from litellm_ratebalance.store import MemoryStore, RedisStore
from tests.store.admission_support import settle

pytestmark = pytest.mark.redis


def limits(**overrides: object) -> AdmissionLimits:
    base: dict[str, object] = dict(
        rpm=None, tpm=None, saturation_threshold=0.5, pool="p.a", pool_rpm=None, pool_tpm=None
    )
    base.update(overrides)
    return AdmissionLimits(**base)  # type: ignore[arg-type]


async def test_rpm_cap_is_exact(store: MemoryStore | RedisStore) -> None:
    lim = limits(rpm=5)
    results = [await store.acquire("m", lim, 0, 60_000) for _ in range(8)]
    assert [r.admitted for r in results] == [True] * 5 + [False] * 3
    assert results[-1].reason is RejectReason.MODEL_REQUESTS
    assert results[4].counters.requests == 5


async def test_tpm_reservation_counts_before_the_call(store: MemoryStore | RedisStore) -> None:
    lim = limits(tpm=100)
    first = await store.acquire("m", lim, 60, 60_000)
    second = await store.acquire("m", lim, 60, 60_000)
    assert first.admitted and not second.admitted
    assert second.reason is RejectReason.MODEL_TOKENS
    # Reconciling the first to its actual 30 tokens frees room for the second.
    await settle(store, "m", "p.a", first.window_start_ms, -30)
    third = await store.acquire("m", lim, 60, 60_000)
    assert third.admitted and third.counters.tokens == 90


async def test_strict_mode_caps_pool_at_its_share(store: MemoryStore | RedisStore) -> None:
    lim = limits(rpm=10, pool_rpm=3.0, saturation_threshold=0.5)
    admitted = [(await store.acquire("m", lim, 0, 60_000)).admitted for _ in range(10)]
    # Lenient until 5 of 10 requests (saturation 0.5); strict then, and the pool already has 5 > 3.
    assert admitted == [True] * 5 + [False] * 5
    refused = await store.acquire("m", lim, 0, 60_000)
    assert refused.reason is RejectReason.POOL_REQUESTS and refused.strict
    assert refused.saturation == pytest.approx(0.5)


async def test_strict_mode_caps_pool_tokens_at_its_share(store: MemoryStore | RedisStore) -> None:
    # 1000 tpm, threshold 0.5; pool a's share is 300 tokens. Pool b fills half the model: strict from here.
    lim_a = limits(tpm=1000, pool_tpm=300.0)
    lim_b = limits(tpm=1000, pool="p.b", pool_tpm=700.0)
    b = await store.acquire("m", lim_b, 500, 60_000)
    assert b.admitted and not b.strict
    first = await store.acquire("m", lim_a, 200, 60_000)
    assert first.admitted and first.strict
    # 200 more would pass the model (900 of 1000) but not the pool's share (400 of 300).
    refused = await store.acquire("m", lim_a, 200, 60_000)
    assert not refused.admitted and refused.reason is RejectReason.POOL_TOKENS and refused.strict
    assert refused.saturation == pytest.approx(0.7)
    # Exactly the rest of the share fits; then not one token more.
    assert (await store.acquire("m", lim_a, 100, 60_000)).admitted
    last = await store.acquire("m", lim_a, 1, 60_000)
    assert not last.admitted and last.reason is RejectReason.POOL_TOKENS
    # The other pool still has room of its own under the model cap.
    assert (await store.acquire("m", lim_b, 100, 60_000)).admitted


async def test_pool_token_share_applies_only_once_saturated(store: MemoryStore | RedisStore) -> None:
    # Alone, pool a may pass its 300-token share while the model is below the threshold (lenient) ...
    lim = limits(tpm=1000, pool_tpm=300.0, saturation_threshold=0.5)
    assert [(await store.acquire("m", lim, 200, 60_000)).strict for _ in range(3)] == [False, False, False]
    # ... and at 600 of 1000 tokens (saturation 0.6) its share applies: refused for the pool, not the model.
    refused = await store.acquire("m", lim, 1, 60_000)
    assert not refused.admitted and refused.reason is RejectReason.POOL_TOKENS and refused.strict


async def test_oversize_request_may_take_a_whole_unused_pool_share(store: MemoryStore | RedisStore) -> None:
    # Strict mode (pool b used half the model); 400 tokens exceed pool a's whole 300-token share, which is
    # unused: admitted (the oversize rule), and then the share is used up.
    lim_a = limits(tpm=1000, pool_tpm=300.0)
    assert (await store.acquire("m", limits(tpm=1000, pool="p.b"), 500, 60_000)).admitted
    big = await store.acquire("m", lim_a, 400, 60_000)
    assert big.admitted and big.strict
    after = await store.acquire("m", lim_a, 1, 60_000)
    assert not after.admitted and after.reason is RejectReason.POOL_TOKENS


async def test_floor_of_non_lendable_pool_is_kept_free(store: MemoryStore | RedisStore) -> None:
    # Pool b reserves 40% of 10 rpm and lends none of it: pool a can only reach 6.
    lim_a = limits(rpm=10, saturation_threshold=1.0, floors=(Floor("p.b", 4.0, 0.0),))
    admitted = [(await store.acquire("m", lim_a, 0, 60_000)).admitted for _ in range(8)]
    assert admitted == [True] * 6 + [False] * 2
    lim_b = limits(rpm=10, pool="p.b", saturation_threshold=1.0)
    assert all([(await store.acquire("m", lim_b, 0, 60_000)).admitted for _ in range(4)])


async def test_oversize_request_is_admitted_into_an_empty_window_only(store: MemoryStore | RedisStore) -> None:
    lim = limits(tpm=100)
    big = await store.acquire("m", lim, 500, 60_000)
    assert big.admitted
    assert not (await store.acquire("m", lim, 500, 60_000)).admitted
    assert not (await store.acquire("m", lim, 1, 60_000)).admitted


async def test_window_rolls_over_and_late_settle_is_dropped(store: MemoryStore | RedisStore) -> None:
    # A 1 s window: the calls that must share one window have ample time on a loaded machine.
    lim = limits(rpm=1)
    first = await store.acquire("m", lim, 10, 1000)
    assert first.admitted
    assert not (await store.acquire("m", lim, 10, 1000)).admitted
    await asyncio.sleep(1.05)
    again = await store.acquire("m", lim, 10, 1000)
    assert again.admitted and again.window_start_ms > first.window_start_ms
    assert again.window_start_ms >= first.window_start_ms + 1000
    await settle(store, "m", "p.a", first.window_start_ms, -10)  # late and negative: dropped
    snap = await store.admission_snapshot("m", 1000)
    assert snap is not None and snap.tokens == 10 and snap.requests == 1


async def test_settle_never_goes_negative_and_release_returns_request(store: MemoryStore | RedisStore) -> None:
    lim = limits(rpm=2, tpm=100)
    r = await store.acquire("m", lim, 40, 60_000)
    await settle(store, "m", "p.a", r.window_start_ms, -1000, -1)
    snap = await store.admission_snapshot("m", 60_000)
    assert snap is not None and snap.tokens == 0 and snap.requests == 0
    assert snap.pools["p.a"] == (0, 0)


async def test_model_groups_are_independent(store: MemoryStore | RedisStore) -> None:
    lim = limits(rpm=1)
    assert (await store.acquire("m1", lim, 0, 60_000)).admitted
    assert (await store.acquire("m2", lim, 0, 60_000)).admitted
    assert not (await store.acquire("m1", lim, 0, 60_000)).admitted


async def test_concurrent_acquires_admit_exactly_the_limit(store: MemoryStore | RedisStore) -> None:
    lim = limits(rpm=50)
    results = await asyncio.gather(*(store.acquire("m", lim, 0, 60_000) for _ in range(200)))
    assert sum(r.admitted for r in results) == 50
