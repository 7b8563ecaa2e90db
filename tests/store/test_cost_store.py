"""Behavioural suite of the cost state (sharing clock, efficiency sums), on the embedded store and Redis.

The marks ride on the lease operations (``meter=``), so each test takes and gives back leases. Redis uses its
own clock, so exact figures are checked against the times the marks report (``now_ms``), and
the sleeps only guarantee that some time passes (a lower bound, never an upper one).
"""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.attribution import Mark
from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.metering import CostMark, MeterEnd, MeterStart

pytestmark = pytest.mark.redis

START = MeterStart(half_life_ms=600_000, ttl_ms=3_600_000)


def end_of(start: CostMark, *, gpus: float = 1, output_tokens: int = 1) -> MeterEnd:
    return MeterEnd(start.mark, gpus, output_tokens, half_life_ms=600_000, ttl_ms=3_600_000)


async def acquire(store: MemoryStore | RedisStore, deployment: str, lease: str) -> CostMark:
    taken = await store.lease_acquire(deployment, lease, slot_cap=9, ttl_ms=60_000, meter=START)
    assert taken.acquired and taken.cost is not None
    return taken.cost


async def release(store: MemoryStore | RedisStore, deployment: str, lease: str, meter: MeterEnd) -> CostMark:
    snapshot = await store.lease_release(deployment, lease, meter)
    assert snapshot.cost is not None
    return snapshot.cost


async def test_two_overlapping_requests_share_the_busy_time_exactly(store: MemoryStore | RedisStore) -> None:
    start_a = await acquire(store, "gpu1", "a")
    await asyncio.sleep(0.02)
    start_b = await acquire(store, "gpu1", "b")
    await asyncio.sleep(0.02)
    end_a = await release(store, "gpu1", "a", end_of(start_a, gpus=1, output_tokens=10))
    await asyncio.sleep(0.02)
    end_b = await release(store, "gpu1", "b", end_of(start_b, gpus=1, output_tokens=30))
    assert start_a.share is None and start_b.share is None
    assert end_a.share is not None and end_b.share is not None
    alone_a = (start_b.now_ms - start_a.now_ms) / 1000
    shared = (end_a.now_ms - start_b.now_ms) / 1000
    alone_b = (end_b.now_ms - end_a.now_ms) / 1000
    assert end_a.share == pytest.approx(alone_a + shared / 2, abs=1e-9)
    assert end_b.share == pytest.approx(shared / 2 + alone_b, abs=1e-9)
    assert end_a.share + end_b.share == pytest.approx((end_b.now_ms - start_a.now_ms) / 1000, abs=1e-9)
    assert alone_a >= 0.019 and alone_b >= 0.019  # the sleeps passed on the store's clock too
    efficiency = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert efficiency is not None
    assert efficiency.output_tokens == pytest.approx(40, rel=1e-3)
    assert efficiency.gpu_seconds == pytest.approx(end_a.share + end_b.share, rel=1e-3)


async def test_gpus_multiply_and_an_idle_gap_costs_nothing(store: MemoryStore | RedisStore) -> None:
    start = await acquire(store, "gpu1", "a")
    end = await release(store, "gpu1", "a", end_of(start, gpus=4, output_tokens=1))
    await asyncio.sleep(0.03)  # idle: no lease alive
    start_b = await acquire(store, "gpu1", "b")
    assert end.share == pytest.approx(4 * (end.now_ms - start.now_ms) / 1000, abs=1e-9)
    assert start_b.mark.integral == pytest.approx(end.mark.integral, abs=1e-9)


async def test_a_start_from_another_epoch_is_not_measured(store: MemoryStore | RedisStore) -> None:
    start = await acquire(store, "gpu1", "a")
    stranger = CostMark(Mark(start.mark.epoch_ms - 1, 0.0), None, start.now_ms)
    end = await release(store, "gpu1", "a", end_of(stranger, output_tokens=5))
    assert end.share is None
    assert await store.cost_efficiency("gpu1", half_life_ms=600_000) is None  # nothing was charged
    assert await store.cost_efficiency("never-used", half_life_ms=600_000) is None


async def test_deployments_keep_separate_clocks(store: MemoryStore | RedisStore) -> None:
    start_1 = await acquire(store, "gpu1", "a")
    start_2 = await acquire(store, "gpu2", "b")
    await asyncio.sleep(0.02)
    end_1 = await release(store, "gpu1", "a", end_of(start_1))
    # gpu2's request is alone on gpu2: gpu1's does not divide its time.
    assert end_1.share == pytest.approx((end_1.now_ms - start_1.now_ms) / 1000, abs=1e-9)
    assert start_2.mark.epoch_ms >= start_1.mark.epoch_ms


async def test_only_a_newly_taken_lease_marks_a_start(store: MemoryStore | RedisStore) -> None:
    start = await acquire(store, "gpu1", "a")
    again = await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000, meter=START)
    assert again.acquired and again.cost is None  # a renewal of the same lease: counted once, marked once
    refused = await store.lease_acquire("gpu1", "b", slot_cap=1, ttl_ms=60_000, meter=START)
    assert not refused.acquired and refused.cost is None
    plain = await store.lease_acquire("gpu1", "c", slot_cap=9, ttl_ms=60_000)
    assert plain.acquired and plain.cost is None  # no meter asked: no mark
    # "c" entered without a mark, so the interval since "a"'s start is still divided by one.
    await asyncio.sleep(0.02)
    end = await release(store, "gpu1", "a", end_of(start))
    assert end.share == pytest.approx((end.now_ms - start.now_ms) / 1000, abs=1e-9)
    unmetered = await store.lease_release("gpu1", "c")
    assert unmetered.changed == 1 and unmetered.cost is None


async def test_bad_durations_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl must be at least 1 ms"):
        MeterStart(half_life_ms=1, ttl_ms=0)
    with pytest.raises(ValueError, match="half-life must be at least 1 ms"):
        MeterEnd(Mark(0, 0.0), 1.0, 0, half_life_ms=0, ttl_ms=1)


async def test_a_metered_request_costs_no_round_trip_of_its_own(redis_client: object) -> None:
    """Cost on or off, a managed request makes one store call to take its lease and one to give it back: the
    marks ride on them."""
    store = RedisStore(redis_client)
    calls = []
    for metered in (False, True):
        store.take_tally()
        meter = MeterStart(half_life_ms=60_000, ttl_ms=60_000) if metered else None
        taken = await store.lease_acquire("gpu", f"lease-{metered}", slot_cap=4, ttl_ms=60_000, meter=meter)
        end = end_of(taken.cost) if metered and taken.cost is not None else None
        await store.lease_release("gpu", f"lease-{metered}", end)
        calls.append(store.take_tally().calls)
    assert calls == [2, 2]
