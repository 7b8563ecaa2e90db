"""Behavioural suite of the signal reports (what a deployment's server signals are worth, for ``status``), on
the embedded store and Redis."""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.signals import MAX_DETAIL_CHARS

pytestmark = pytest.mark.redis


async def test_the_last_report_is_read_back(store: MemoryStore | RedisStore) -> None:
    assert await store.signal_report_read("gpu1") is None
    await store.signal_report(
        "gpu1", server=None, problems=["unrecognised"], detail="unrecognised: no vllm:* metric", ttl_ms=60_000
    )
    first = await store.signal_report_read("gpu1")
    assert first is not None
    assert (first.server, first.problems, first.detail) == (None, ("unrecognised",), "unrecognised: no vllm:* metric")
    await store.signal_report("gpu1", server="vllm", problems=[], detail="", ttl_ms=60_000)
    second = await store.signal_report_read("gpu1")
    assert second is not None and (second.server, second.problems, second.detail) == ("vllm", (), "")
    assert second.reported_ms >= first.reported_ms > 0
    await store.signal_report("gpu2", server="tgi", problems=["no_kv_capacity", "no_queue"], detail="x", ttl_ms=60_000)
    other = await store.signal_report_read("gpu2")
    assert other is not None and other.problems == ("no_kv_capacity", "no_queue")
    again = await store.signal_report_read("gpu1")
    assert again is not None and again.server == "vllm"  # deployments are independent


async def test_a_report_nobody_renews_lapses(store: MemoryStore | RedisStore) -> None:
    await store.signal_report("gpu1", server="sglang", problems=[], detail="", ttl_ms=50)
    assert await store.signal_report_read("gpu1") is not None
    await asyncio.sleep(0.15)
    assert await store.signal_report_read("gpu1") is None


async def test_bad_arguments_are_refused_and_the_detail_is_bounded(store: MemoryStore | RedisStore) -> None:
    with pytest.raises(ValueError, match="time-to-live must be positive"):
        await store.signal_report("gpu1", server="vllm", problems=[], detail="", ttl_ms=0)
    with pytest.raises(ValueError, match="no comma"):
        await store.signal_report("gpu1", server="vllm", problems=["a,b"], detail="", ttl_ms=1000)
    await store.signal_report("gpu1", server="vllm", problems=["out_of_range"], detail="y" * 10_000, ttl_ms=60_000)
    report = await store.signal_report_read("gpu1")
    assert report is not None and len(report.detail) == MAX_DETAIL_CHARS
