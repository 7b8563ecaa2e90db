"""Reading real servers' ``/metrics`` (tests/unit/server_bodies.py): which server answers, its load and KV-cache
capacity combined over its engines, and every missing, mismatched or out-of-range signal reported."""

from __future__ import annotations

import pytest

from litellm_ratebalance.overload.servers import (
    Problem,
    ServerKind,
    ServerMetrics,
    ServerReading,
    counter_rise,
    parse_exposition,
    read_server,
)
from litellm_ratebalance.overload.shedding import DeploymentLoad, TierThresholds, decide
from litellm_ratebalance.overload.signals import parse_metrics, server_signals
from tests.unit import server_bodies as bodies


def read(text: str, configured: ServerKind | None = None, *, capacity_configured: bool = False) -> ServerReading:
    return read_server(parse_exposition(text), configured, capacity_configured=capacity_configured)


def test_vllm_v1_one_engine() -> None:
    reading = read(bodies.VLLM_V1_ONE_ENGINE)
    assert (reading.server, reading.engines, reading.findings) == ("vllm", 1, ())
    assert reading.metrics == ServerMetrics(
        running=14.0, waiting=3.0, kv_cache_usage=0.6875, kv_capacity_tokens=27931 * 16, preemptions=2.0
    )


def test_vllm_v1_two_engines_combine_as_memory_used_over_capacity() -> None:
    reading = read(bodies.VLLM_V1_TWO_ENGINES)
    assert (reading.server, reading.engines, reading.findings) == ("vllm", 2, ())
    metrics = reading.metrics
    assert (metrics.running, metrics.waiting, metrics.preemptions) == (11.0, 4.0, 5.0)
    assert metrics.kv_capacity_tokens == 2 * 27931 * 16
    # Engines at 0.91 and 0.22 of equal caches: 56.5% of the memory is in use, not 91%.
    assert metrics.kv_cache_usage == pytest.approx((0.91 + 0.22) / 2)
    signals = server_signals(
        metrics, None, kv_cache_tokens=metrics.kv_capacity_tokens, server_queue_limit=32, gpu_utilization=False
    )
    load = DeploymentLoad(
        server_signals=signals,
        inflight=11,
        limit=32,
        reserved_tokens=11 * 600,
        kv_cache_tokens=metrics.kv_capacity_tokens,
    )
    verdict = decide(TierThresholds(2, 0.85, 0.95), 0, 600, load)
    assert verdict.admitted  # the lowest tier is not shed while half the cache is free


def test_engines_of_different_sizes_weigh_by_their_capacity() -> None:
    body = bodies.vllm_v1(
        [
            {"running": 1, "waiting": 0, "usage": 0.9, "preemptions": 0, "blocks": 1000},
            {"running": 1, "waiting": 0, "usage": 0.1, "preemptions": 0, "blocks": 3000},
        ]
    )
    metrics = read(body).metrics
    assert metrics.kv_capacity_tokens == 4000 * 16
    assert metrics.kv_cache_usage == pytest.approx((0.9 * 1000 + 0.1 * 3000) / 4000)


def test_vllm_v0() -> None:
    reading = read(bodies.VLLM_V0)
    assert (reading.server, reading.engines, reading.findings) == ("vllm", 1, ())
    assert reading.metrics == ServerMetrics(
        running=6.0, waiting=1.0, kv_cache_usage=0.4127, kv_capacity_tokens=7281 * 16, preemptions=7.0
    )


def test_vllm_with_disable_log_stats_is_reported_unrecognised() -> None:
    reading = read(bodies.VLLM_DISABLE_LOG_STATS, "vllm")
    assert reading.server is None and reading.metrics == ServerMetrics()
    assert [f.problem for f in reading.findings] == [Problem.UNRECOGNISED]
    detail = reading.findings[0].detail
    assert "--disable-log-stats" in detail and "concurrency limit alone" in detail
    assert "http_*" in detail and "process_*" in detail and "python_*" in detail
    assert read("").findings[0].problem is Problem.UNRECOGNISED


def test_tgi_v3_exports_its_token_budget() -> None:
    reading = read(bodies.TGI_V3)
    assert (reading.server, reading.findings) == ("tgi", ())
    assert reading.metrics == ServerMetrics(running=12.0, waiting=4.0, batch_tokens=61440.0, kv_capacity_tokens=122880)
    signals = server_signals(
        reading.metrics, None, kv_cache_tokens=122880, server_queue_limit=32, gpu_utilization=False
    )
    assert signals == {"kv_cache": 0.5, "server_queue": 4 / 32}


def test_tgi_without_its_budget_needs_kv_cache_tokens_and_says_so() -> None:
    reading = read(bodies.TGI_WITHOUT_CAPACITY)
    assert reading.server == "tgi" and reading.metrics.kv_capacity_tokens is None
    assert reading.problems == {Problem.NO_KV_USAGE, Problem.NO_KV_CAPACITY}
    assert any("kv_cache_tokens" in f.detail and "max-batch-total-tokens" in f.detail for f in reading.findings)
    # Without a capacity there is no KV signal; with the setting there is, and nothing is reported.
    assert "kv_cache" not in server_signals(
        reading.metrics, None, kv_cache_tokens=None, server_queue_limit=32, gpu_utilization=False
    )
    configured = read(bodies.TGI_WITHOUT_CAPACITY, capacity_configured=True)
    assert configured.findings == ()
    assert server_signals(
        configured.metrics, None, kv_cache_tokens=81920, server_queue_limit=32, gpu_utilization=False
    )["kv_cache"] == pytest.approx(0.75)


def test_sglang_one_engine() -> None:
    reading = read(bodies.SGLANG_ONE_ENGINE)
    assert (reading.server, reading.engines, reading.findings) == ("sglang", 1, ())
    assert reading.metrics == ServerMetrics(
        running=21.0, waiting=2.0, kv_cache_usage=0.58, kv_capacity_tokens=471040, preemptions=3.0
    )


def test_sglang_data_parallel_counts_each_engine_once_over_its_tensor_parallel_ranks() -> None:
    reading = read(bodies.SGLANG_DP2_TP2)
    assert (reading.server, reading.engines, reading.findings) == ("sglang", 2, ())
    metrics = reading.metrics
    assert (metrics.running, metrics.waiting, metrics.preemptions) == (40.0, 6.0, 4.0)
    assert metrics.kv_capacity_tokens == 500000
    assert metrics.kv_cache_usage == pytest.approx((0.9 * 200000 + 0.3 * 300000) / 500000)


@pytest.mark.parametrize(
    ("body", "configured", "answering"),
    [
        (bodies.TGI_V3, "vllm", "tgi"),
        (bodies.SGLANG_ONE_ENGINE, "vllm", "sglang"),
        (bodies.VLLM_V1_ONE_ENGINE, "sglang", "vllm"),
    ],
)
def test_a_configured_server_that_is_not_the_one_answering_is_reported_and_read_as_it_is(
    body: str, configured: ServerKind, answering: ServerKind
) -> None:
    reading = read(body, configured)
    assert reading.server == answering
    assert [f.problem for f in reading.findings] == [Problem.SERVER_MISMATCH]
    assert f"configured server: {configured}" in reading.findings[0].detail
    assert f"set server: {answering}, or auto" in reading.findings[0].detail
    assert reading.metrics == read(body).metrics  # read as the server it is


def test_a_kv_percentage_out_of_its_range_is_dropped_and_reported() -> None:
    body = bodies.VLLM_V1_ONE_ENGINE.replace(
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{bodies.MODEL}"}} 0.6875',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{bodies.MODEL}"}} 91',
    )
    reading = read(body)
    assert reading.metrics.kv_cache_usage is None
    assert [f.problem for f in reading.findings] == [Problem.OUT_OF_RANGE]
    detail = reading.findings[0].detail
    assert "vllm:kv_cache_usage_perc" in detail and "= 91 " in detail and "fraction from 0 to 1" in detail
    # A rounding error just above 1 is a full cache, not a fault.
    full = body.replace(
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{bodies.MODEL}"}} 91',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{bodies.MODEL}"}} 1.0000001',
    )
    assert read(full).metrics.kv_cache_usage == 1.0 and read(full).findings == ()


def test_a_negative_count_and_an_empty_cache_are_out_of_range() -> None:
    negative = bodies.TGI_V3.replace("tgi_queue_size 4", "tgi_queue_size -2")
    reading = read(negative)
    assert reading.metrics.waiting is None
    assert [f.problem for f in reading.findings] == [Problem.OUT_OF_RANGE]  # not "no_queue": it is there
    no_blocks = bodies.vllm_v1([{"running": 1, "waiting": 0, "usage": 0.5, "preemptions": 0, "blocks": 0}])
    reading = read(no_blocks)
    assert reading.metrics.kv_capacity_tokens is None
    assert [f.problem for f in reading.findings] == [Problem.OUT_OF_RANGE]
    assert "num_gpu_blocks and block_size of at least 1" in reading.findings[0].detail


def test_signals_a_server_does_not_export_are_each_reported() -> None:
    body = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    reading = read(body)
    assert reading.server == "vllm"
    assert reading.problems == {Problem.NO_QUEUE, Problem.NO_KV_USAGE, Problem.NO_KV_CAPACITY}
    assert read(body, capacity_configured=True).problems == {Problem.NO_QUEUE, Problem.NO_KV_USAGE}


def test_a_capacity_not_profiled_yet_is_no_capacity() -> None:
    body = bodies.VLLM_V1_ONE_ENGINE.replace('num_gpu_blocks="27931"', 'num_gpu_blocks="None"')
    reading = read(body)
    assert reading.metrics.kv_capacity_tokens is None
    assert reading.problems == {Problem.NO_KV_CAPACITY}


def test_parse_metrics_reads_whichever_server_answers() -> None:
    assert parse_metrics(bodies.TGI_V3) == read(bodies.TGI_V3).metrics
    assert parse_metrics(bodies.SGLANG_ONE_ENGINE, "vllm").kv_cache_usage == 0.58


def test_counter_rise() -> None:
    assert counter_rise(None, 5.0) == 0.0  # the first reading is the baseline
    assert counter_rise(5.0, None) == 0.0
    assert counter_rise(5.0, 9.0) == 4.0
    assert counter_rise(9.0, 2.0) == 2.0  # restarted: counts from 0 again
