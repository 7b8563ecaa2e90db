"""Signal parsing, NVML through the fake module and its idle floor, and the board: degradation, problems
reported once, exported capacity, preemptions (the bodies of each server: tests/unit/test_backpressure_servers.py)."""

from __future__ import annotations

import logging
from typing import TypedDict

import pytest

from litellm_ratebalance.overload.config import BackpressureSettings
from litellm_ratebalance.overload.servers import Problem
from litellm_ratebalance.overload.signals import (
    GpuSample,
    IdleMemory,
    NvmlProbe,
    ServerMetrics,
    SignalBoard,
    SignalUpkeep,
    held_at_scrape,
    parse_metrics,
    server_signals,
)
from litellm_ratebalance.proxy.backpressure.book import DeploymentState
from litellm_ratebalance.simulate.fake_nvml import FakeNvml
from tests.unit import server_bodies as bodies

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


# -- which server answers, and what is wrong with its signals ------------------------------------------------


class _Bodies:
    """A fetcher answering the body set last (or raising the exception set)."""

    def __init__(self, body: str) -> None:
        self.body: str | Exception = body

    async def __call__(self, url: str, timeout: float) -> str:
        if isinstance(self.body, Exception):
            raise self.body
        return self.body


async def test_a_problem_is_logged_once_while_it_holds_and_once_when_it_clears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fetch = _Bodies(bodies.VLLM_DISABLE_LOG_STATS)
    board = SignalBoard(fetch)
    url = "http://gpu1:8000/metrics"
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance.backpressure"):
        for t in range(3):
            assert await board.scrape("gpu1", url, "auto", 0.5, now=float(t)) is not None
        health = board.health("gpu1")
        assert health is not None and health.server is None and health.problems == (Problem.UNRECOGNISED,)
        assert board.metrics("gpu1", 3.0, stale_after=10.0) == ServerMetrics()  # a good scrape with nothing in it
        fetch.body = bodies.VLLM_V1_ONE_ENGINE  # the server restarted without --disable-log-stats
        await board.scrape("gpu1", url, "auto", 0.5, now=4.0)
        await board.scrape("gpu1", url, "auto", 0.5, now=5.0)
    messages = [r for r in caplog.records if r.name == "litellm_ratebalance.backpressure"]
    assert [r.levelno for r in messages] == [logging.WARNING, logging.INFO]
    assert "deployment gpu1 (http://gpu1:8000/metrics)" in messages[0].getMessage()
    assert "--disable-log-stats" in messages[0].getMessage() and "[unrecognised]" in messages[0].getMessage()
    assert messages[1].getMessage().endswith("signal problems cleared: unrecognised")
    health = board.health("gpu1")
    assert health is not None and (health.server, health.engines, health.findings) == ("vllm", 1, ())


async def test_an_unreachable_endpoint_keeps_its_last_problems_and_its_capacity() -> None:
    fetch = _Bodies(bodies.TGI_V3)
    board = SignalBoard(fetch)
    assert await board.scrape("gpu2", "http://gpu2/metrics", "vllm", 0.5, now=0.0) is not None
    health = board.health("gpu2")
    assert health is not None and (health.server, health.problems) == ("tgi", (Problem.SERVER_MISMATCH,))
    assert board.capacity("gpu2") == 122880 and board.server("gpu2") == "tgi"
    fetch.body = ConnectionError("refused")
    await board.scrape("gpu2", "http://gpu2/metrics", "vllm", 0.5, now=1.0)
    health = board.health("gpu2")
    assert health is not None and health.problems == (Problem.SERVER_MISMATCH,)  # one failure is not reported
    await board.scrape("gpu2", "http://gpu2/metrics", "vllm", 0.5, now=2.0)
    health = board.health("gpu2")
    assert health is not None and health.problems == (Problem.UNREACHABLE, Problem.SERVER_MISMATCH)
    assert "2 scrapes in a row failed, the last ConnectionError: refused" in health.findings[0].detail
    # The reading goes stale; the capacity a server exported stays (it does not change while it runs).
    assert board.metrics("gpu2", 30.0, stale_after=10.0) is None
    assert board.capacity("gpu2") == 122880
    never = SignalBoard(_Bodies(bodies.TGI_V3))
    assert never.health("gpu9") is None and never.capacity("gpu9") is None


async def test_the_preemption_counter_rises_between_scrapes() -> None:
    def body(preemptions: float) -> str:
        return bodies.vllm_v1([{"running": 4, "waiting": 0, "usage": 0.5, "preemptions": preemptions, "blocks": 1000}])

    fetch = _Bodies(body(40))
    board = SignalBoard(fetch)
    await board.scrape("gpu1", "u", "vllm", 0.5, now=0.0)
    assert board.take_preemptions("gpu1") == 0.0  # the first reading is the baseline, not 40 new preemptions
    fetch.body = body(43)
    await board.scrape("gpu1", "u", "vllm", 0.5, now=1.0)
    fetch.body = body(45)
    await board.scrape("gpu1", "u", "vllm", 0.5, now=2.0)
    assert board.take_preemptions("gpu1") == 5.0
    assert board.take_preemptions("gpu1") == 0.0
    fetch.body = body(2)  # the server restarted
    await board.scrape("gpu1", "u", "vllm", 0.5, now=3.0)
    assert board.take_preemptions("gpu1") == 2.0
    assert board.take_preemptions("nobody") == 0.0


async def test_a_configured_capacity_that_differs_from_the_exported_one_is_noted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = SignalBoard(_Bodies(bodies.SGLANG_ONE_ENGINE))
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance.backpressure"):
        for t in range(3):
            await board.scrape("gpu3", "u", "sglang", 0.5, now=float(t), kv_cache_tokens=600000)
        await board.scrape("gpu4", "u", "sglang", 0.5, now=0.0, kv_cache_tokens=400000)
        await board.scrape("gpu5", "u", "sglang", 0.5, now=0.0, kv_cache_tokens=471040)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "litellm_ratebalance.backpressure"]
    assert len(lines) == 2
    assert lines[0][0] == logging.WARNING and "kv_cache_tokens 600000 overrides the 471040 tokens" in lines[0][1]
    assert "may be preempted" in lines[0][1]
    assert lines[1][0] == logging.INFO and "kv_cache_tokens 400000 overrides" in lines[1][1]


def test_gpu_memory_next_to_a_preallocating_server_is_read_above_its_idle_floor() -> None:
    idle = IdleMemory()
    assert idle.above_idle(GpuSample(0.915, 0.3)) == GpuSample(None, 0.3)  # no floor yet: no memory signal
    idle.observe_idle(0.92)
    idle.observe_idle(0.915)
    idle.observe_idle(0.95)  # a later idle reading higher up does not raise the floor
    assert idle.floor == 0.915
    assert idle.above_idle(GpuSample(0.915, None)).memory_used_fraction == 0.0  # an idle vLLM reads 0, not 0.915
    assert idle.above_idle(GpuSample(0.9, None)).memory_used_fraction == 0.0
    assert idle.above_idle(GpuSample(0.9915, None)).memory_used_fraction == pytest.approx(0.9)
    assert idle.above_idle(GpuSample(1.0, None)).memory_used_fraction == 1.0
    idle.reset()
    assert idle.floor is None
    full = IdleMemory()
    full.observe_idle(1.0)
    assert full.above_idle(GpuSample(1.0, None)).memory_used_fraction == 0.0
    # A sample without memory stays without: the signal is absent, never 0.
    assert server_signals(None, GpuSample(None, 0.99), kv_cache_tokens=None, server_queue_limit=1,
                          gpu_utilization=True) == {"gpu_compute": 0.99}  # fmt: skip


def test_upkeep_writes_a_report_when_it_changes_or_is_due_and_paces_the_preemption_log() -> None:
    upkeep = SignalUpkeep()
    assert upkeep.report_due(("vllm", ()), now=0.0, refresh=30.0)
    assert not upkeep.report_due(("vllm", ()), now=10.0, refresh=30.0)
    assert upkeep.report_due(("vllm", ("no_queue",)), now=11.0, refresh=30.0)  # changed: at once
    assert not upkeep.report_due(("vllm", ("no_queue",)), now=40.0, refresh=30.0)
    assert upkeep.report_due(("vllm", ("no_queue",)), now=41.0, refresh=30.0)  # renewed before it lapses
    upkeep.report_failed()
    assert upkeep.report_due(("vllm", ("no_queue",)), now=42.0, refresh=30.0)  # the failed write is retried
    assert upkeep.preemptions_to_log(3, now=0.0, interval=60.0) == 3
    assert upkeep.preemptions_to_log(2, now=10.0, interval=60.0) is None
    assert upkeep.preemptions_to_log(0, now=59.0, interval=60.0) is None
    assert upkeep.preemptions_to_log(4, now=60.0, interval=60.0) == 6
    assert upkeep.preemptions_to_log(0, now=200.0, interval=60.0) is None
