"""Signal parsing (vLLM, TGI), NVML through the fake module, and the board's degradation."""

from __future__ import annotations

import logging
from typing import TypedDict

import pytest

from litellm_ratebalance.overload.config import BackpressureSettings
from litellm_ratebalance.overload.signals import (
    GpuSample,
    NvmlProbe,
    ServerMetrics,
    SignalBoard,
    held_at_scrape,
    parse_metrics,
    server_signals,
)
from litellm_ratebalance.proxy.backpressure_book import DeploymentState
from litellm_ratebalance.simulate.fake_nvml import FakeNvml

VLLM = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 7.0
vllm:num_requests_running{model_name="qwen"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 3.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.62
vllm:gpu_cache_usage_perc{model_name="qwen"} 0.31
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="llama"} 12345.0
"""

VLLM_V1 = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 12
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 30000
"""


def test_parse_vllm_sums_counts_and_takes_the_worst_cache() -> None:
    assert parse_metrics(VLLM, "vllm") == ServerMetrics(running=9.0, waiting=3.0, kv_cache_usage=0.62)


def test_parse_vllm_v1_cache_name() -> None:
    metrics = parse_metrics(VLLM_V1, "vllm")
    assert metrics.kv_cache_usage == 0.5 and metrics.waiting == 0.0 and metrics.running is None


def test_parse_tgi() -> None:
    assert parse_metrics(TGI, "tgi") == ServerMetrics(running=16.0, waiting=12.0, batch_tokens=30000.0)


def test_parse_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="Prometheus"):
        parse_metrics("<html>502 Bad Gateway</html>\n{", "vllm")


def test_signals_from_readings() -> None:
    metrics = parse_metrics(VLLM, "vllm")
    signals = server_signals(
        metrics, GpuSample(0.9, 0.99), kv_cache_tokens=None, server_queue_limit=10, gpu_utilization=False
    )
    assert signals == {"kv_cache": 0.62, "server_queue": 0.3, "gpu_memory": 0.9}
    with_compute = server_signals(
        None, GpuSample(0.5, 0.99), kv_cache_tokens=None, server_queue_limit=10, gpu_utilization=True
    )
    assert with_compute == {"gpu_memory": 0.5, "gpu_compute": 0.99}
    tgi = server_signals(
        parse_metrics(TGI, "tgi"), None, kv_cache_tokens=40_000, server_queue_limit=24, gpu_utilization=False
    )
    assert tgi == {"kv_cache": 0.75, "server_queue": 0.5}
    assert server_signals(None, None, kv_cache_tokens=None, server_queue_limit=1, gpu_utilization=True) == {}


def test_nvml_probe_reads_the_worst_gpu() -> None:
    used = {"value": 40 * 2**30}
    nvml = FakeNvml(total_bytes=80 * 2**30, used_bytes=lambda: used["value"], utilization=55, device_count=2)
    probe = NvmlProbe(module=nvml)
    assert probe.sample([0, 1]) == GpuSample(0.5, 0.55)
    used["value"] = 72 * 2**30
    assert probe.sample([0]) == GpuSample(0.9, 0.55)
    assert nvml.init_calls == 1


def test_nvml_absent_logs_once_and_degrades(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.fail_init = True
    probe = NvmlProbe(module=nvml)
    with caplog.at_level(logging.WARNING, logger="litellm_ratebalance.backpressure"):
        assert probe.sample([0]) is None
        assert probe.sample([0]) is None
    lines = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert len(lines) == 1 and "other signals" in lines[0].getMessage()
    assert nvml.init_calls == 1


def test_nvml_read_failure_logs_once_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(used_bytes=2**30, total_bytes=2**31)
    probe = NvmlProbe(module=nvml)
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance.backpressure"):
        nvml.fail_reads = True
        assert probe.sample([0]) is None and probe.sample([0]) is None
        assert probe.sample([5]) is None  # no such GPU: same degraded state, no new line
        nvml.fail_reads = False
        assert probe.sample([0]) == GpuSample(0.5, 0.0)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("through NVML failed" in m for m in messages) == 1
    assert sum("NVML reads work again" in m for m in messages) == 1


class _Answers(TypedDict):
    text: str
    fail: bool


async def test_board_degrades_on_unreachable_endpoint_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    answers: _Answers = {"text": VLLM, "fail": False}

    async def fetch(url: str, timeout: float) -> str:
        if answers["fail"]:
            raise ConnectionError("connection refused")
        return answers["text"]

    board = SignalBoard(fetch)
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance.backpressure"):
        assert await board.scrape("d1", "http://127.0.0.1:9/metrics", "vllm", 0.5, now=0.0) is not None
        assert board.metrics("d1", 1.0, stale_after=10.0) is not None
        answers["fail"] = True
        for t in (2.0, 3.0, 4.0):
            assert await board.scrape("d1", "http://127.0.0.1:9/metrics", "vllm", 0.5, now=t) is None
        assert board.is_failing("d1")
        # The last good scrape still counts until it goes stale, then the deployment has no server signals.
        assert board.metrics("d1", 5.0, stale_after=10.0) is not None
        assert board.metrics("d1", 11.0, stale_after=10.0) is None
        answers["fail"] = False
        assert await board.scrape("d1", "http://127.0.0.1:9/metrics", "vllm", 0.5, now=12.0) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot scrape" in m for m in messages) == 1
    assert sum("are back" in m for m in messages) == 1


async def test_board_without_probe_has_no_gpu_readings() -> None:
    board = SignalBoard(fetch=lambda url, timeout: None)  # type: ignore[arg-type,return-value]
    assert board.sample_gpus([0], 0.0) is None
    assert board.gpus([0], 0.0, 10.0) is None


def test_memory_of_requests_finished_since_the_scrape_leaves_the_reading() -> None:
    # Scrape answered at t = 10. A request from t = 8 to t = 12 with a 300-token prompt and 100 tokens of
    # output had generated half of them at the reading: it held 350 tokens there.
    assert held_at_scrape(10.0, 8.0, 12.0, 300, 100) == 350.0
    assert held_at_scrape(10.0, 10.5, 12.0, 300, 100) == 0.0  # started after the reading: not in it
    assert held_at_scrape(10.0, 8.0, 9.5, 300, 100) == 0.0  # ended before it: already out of it
    assert held_at_scrape(10.0, 8.0, 10.0, 300, 100) == 0.0  # ended while the scrape was answered: maybe in it
    # The reading (60% of 3,000 tokens) less what finished since: 1,800 - 350 - 350 = 1,100 tokens.
    metrics = ServerMetrics(running=4, waiting=0, kv_cache_usage=0.6)
    fresh = server_signals(metrics, None, kv_cache_tokens=3000, server_queue_limit=32, gpu_utilization=False,
                           freed_tokens=700.0)  # fmt: skip
    assert fresh["kv_cache"] == pytest.approx(1100 / 3000)
    assert server_signals(metrics, None, kv_cache_tokens=3000, server_queue_limit=32, gpu_utilization=False,
                          freed_tokens=5000.0)["kv_cache"] == 0.0  # fmt: skip
    # Without a capacity there is no scale to subtract on: the reading stands.
    assert server_signals(metrics, None, kv_cache_tokens=None, server_queue_limit=32, gpu_utilization=False,
                          freed_tokens=700.0)["kv_cache"] == 0.6  # fmt: skip
    # The deployment's book: the sum restarts at each scrape; nothing is subtracted before the first one.
    config = BackpressureSettings(kv_cache_tokens=3000).for_deployment("gpu1", {"backpressure": {}})
    state = DeploymentState(config, "local", BackpressureSettings().limit)
    state.finished(8.0, 12.0, 300, 100)
    assert state.freed_tokens == 0.0
    state.scraped(10.0)
    state.finished(8.0, 12.0, 300, 100)
    state.finished(9.0, 11.0, 300, 100)
    assert state.freed_tokens == 700.0
    state.scraped(13.0)
    assert state.freed_tokens == 0.0
