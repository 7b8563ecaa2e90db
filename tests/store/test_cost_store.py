"""Behavioural suite of the cost state (sharing clock, efficiency sums), on the embedded store and Redis.

Redis uses its own clock, so exact figures are checked against the times the marks report (``now_ms``), and
the sleeps only guarantee that some time passes (a lower bound, never an upper one).
"""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.attribution import Mark
from litellm_ratebalance.store import MemoryStore, RedisStore

pytestmark = pytest.mark.redis

DURATIONS = {"half_life_ms": 600_000, "ttl_ms": 3_600_000}


async def test_two_overlapping_requests_share_the_busy_time_exactly(store: MemoryStore | RedisStore) -> None:
    await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000)
    start_a = await store.cost_start("gpu1", **DURATIONS)
    await asyncio.sleep(0.02)
    await store.lease_acquire("gpu1", "b", slot_cap=9, ttl_ms=60_000)
    start_b = await store.cost_start("gpu1", **DURATIONS)
    await asyncio.sleep(0.02)
    await store.lease_release("gpu1", "a")
    end_a = await store.cost_end("gpu1", start_a.mark, gpus=1, output_tokens=10, **DURATIONS)
    await asyncio.sleep(0.02)
    await store.lease_release("gpu1", "b")
    end_b = await store.cost_end("gpu1", start_b.mark, gpus=1, output_tokens=30, **DURATIONS)
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
    await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000)
    start = await store.cost_start("gpu1", **DURATIONS)
    await store.lease_release("gpu1", "a")
    end = await store.cost_end("gpu1", start.mark, gpus=4, output_tokens=1, **DURATIONS)
    await asyncio.sleep(0.03)  # idle: no lease alive
    await store.lease_acquire("gpu1", "b", slot_cap=9, ttl_ms=60_000)
    start_b = await store.cost_start("gpu1", **DURATIONS)
    assert end.share == pytest.approx(4 * (end.now_ms - start.now_ms) / 1000, abs=1e-9)
    assert start_b.mark.integral == pytest.approx(end.mark.integral, abs=1e-9)


async def test_a_start_from_another_epoch_is_not_measured(store: MemoryStore | RedisStore) -> None:
    await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000)
    start = await store.cost_start("gpu1", **DURATIONS)
    stranger = Mark(start.mark.epoch_ms - 1, 0.0)
    end = await store.cost_end("gpu1", stranger, gpus=1, output_tokens=5, **DURATIONS)
    assert end.share is None
    assert await store.cost_efficiency("gpu1", half_life_ms=600_000) is None  # nothing was charged
    assert await store.cost_efficiency("never-used", half_life_ms=600_000) is None


async def test_deployments_keep_separate_clocks(store: MemoryStore | RedisStore) -> None:
    await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000)
    await store.lease_acquire("gpu2", "b", slot_cap=9, ttl_ms=60_000)
    start_1 = await store.cost_start("gpu1", **DURATIONS)
    start_2 = await store.cost_start("gpu2", **DURATIONS)
    await asyncio.sleep(0.02)
    await store.lease_release("gpu1", "a")
    end_1 = await store.cost_end("gpu1", start_1.mark, gpus=1, output_tokens=1, **DURATIONS)
    # gpu2's request is alone on gpu2: gpu1's does not divide its time.
    assert end_1.share == pytest.approx((end_1.now_ms - start_1.now_ms) / 1000, abs=1e-9)
    assert start_2.mark.epoch_ms >= start_1.mark.epoch_ms


async def test_bad_durations_are_refused(store: MemoryStore | RedisStore) -> None:
    with pytest.raises(ValueError, match="ttl must be at least 1 ms"):
        await store.cost_start("gpu1", half_life_ms=1, ttl_ms=0)
