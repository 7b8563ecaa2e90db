"""Backpressure reading each kind of inference server, through a real ``litellm.Router`` and the simulated
server on loopback exporting vLLM V1's, TGI 3's or SGLang's metrics (or none, as a vLLM started with
``--disable-log-stats``): the server recognised, its exported KV-cache capacity used without
``kv_cache_tokens``, every missing signal reported, preemptions backing the limit off, and NVML memory next to
a server that reserves it up front. Outcomes are counted; nothing is timed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import litellm
import pytest
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.overload.signals import NvmlProbe
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.runtime import configure, get_runtime, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.fake_nvml import FakeNvml
from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec
from litellm_ratebalance.store import MemoryStore

PROMPT = "The quick brown fox jumps over the lazy dog. " * 10
"""108 tokens to LiteLLM's counter, 113 to the simulated server's: reservations close to what the cache holds."""
OURS = "litellm_ratebalance.backpressure"

Build = Callable[..., Awaitable[tuple[Router, BackpressureCallback, InferenceServer]]]


@pytest.fixture
async def deployment() -> AsyncIterator[Build]:
    """``await deployment(spec, backpressure_settings, model_backpressure, gpu_probe=...)``: one simulated
    server behind one deployment ``gpu1`` whose ``metrics_url`` points at it."""
    saved = list(litellm.callbacks)
    servers: list[InferenceServer] = []
    callbacks: list[BackpressureCallback] = []

    async def build(
        spec: ServerSpec,
        backpressure: dict[str, Any] | None = None,
        model_backpressure: dict[str, Any] | None = None,
        *,
        gpu_probe: Any = None,
    ) -> tuple[Router, BackpressureCallback, InferenceServer]:
        reset_runtime()
        # The background step runs once at the start; the tests run the next ones (maintain_once).
        signals = {"scrape_interval_seconds": 60.0, **(backpressure or {}).get("signals", {})}
        settings = parse_settings({"ratebalance": {"backpressure": {**(backpressure or {}), "signals": signals}}})
        configure(settings=settings, store=MemoryStore())
        server = await InferenceServer(spec).start()
        servers.append(server)
        info = {"id": "gpu1", "backpressure": {"metrics_url": server.metrics_url, **(model_backpressure or {})}}
        params = {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"}
        callback = BackpressureCallback(gpu_probe=gpu_probe)
        callbacks.append(callback)
        litellm.callbacks = [callback]
        model_list = [{"model_name": "local", "litellm_params": params, "model_info": info}]
        router = Router(model_list=model_list, num_retries=0)
        configure(router=router)  # the deployment is known (and scraped) before its first request
        return router, callback, server

    yield build
    for callback in callbacks:
        await callback.aclose()
    for server in servers:
        await server.stop()
    litellm.callbacks = saved
    reset_runtime()


async def call(router: Router, priority: str | None = None, *, max_tokens: int = 40) -> Any:
    try:
        return await router.acompletion(
            model="local",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            metadata={"user_api_key_auth": auth(priority)},
        )
    except Exception as exc:
        return exc


def auth(priority: str | None) -> UserAPIKeyAuth:
    return UserAPIKeyAuth(token="k1", metadata={"priority": priority} if priority else {})


def outcome(result: Any) -> tuple[int, str | None]:
    if isinstance(result, Exception):
        headers = getattr(result, "headers", None) or {}
        return int(getattr(result, "status_code", 0)), headers.get("x-litellm-backpressure-reason")
    return 200, None


async def settle(callback: BackpressureCallback) -> None:
    for _ in range(20):
        await asyncio.sleep(0.02)
    await callback.maintain_once()


def problem_gauge(problem: str) -> float | None:
    return REGISTRY.get_sample_value(
        "litellm_ratebalance_backpressure_signal_problem", {"deployment": "gpu1", "problem": problem}
    )


@pytest.mark.parametrize("flavour", ["vllm", "tgi", "sglang"])
async def test_the_exported_capacity_keeps_the_cache_from_overflowing_without_kv_cache_tokens(
    deployment: Build, flavour: str
) -> None:
    # 6 requests of ~110 + 40 tokens need ~920 of a 600-token cache: sent together they overflow it.
    spec = ServerSpec(knee=4, step_seconds=0.01, memory_tokens=600, metrics_flavor=flavour)  # type: ignore[arg-type]
    router, callback, server = await deployment(spec)
    await callback.maintain_once()
    view = callback.snapshot()["gpu1"]
    assert (view["server"], view["kv_cache_tokens"], view["signal_problems"]) == (flavour, 600, [])
    assert problem_gauge("no_kv_capacity") == 0.0
    capacity = REGISTRY.get_sample_value("litellm_ratebalance_backpressure_kv_capacity_tokens", {"deployment": "gpu1"})
    assert capacity == 600
    results = [outcome(r) for r in await asyncio.gather(*(call(router) for _ in range(6)))]
    assert server.stats.oom_failures == 0
    assert results.count((200, None)) >= 1
    assert set(results) <= {(200, None), (503, "memory_pressure")} and (503, "memory_pressure") in results


async def test_an_endpoint_of_no_supported_server_is_reported_once_in_the_log_a_metric_and_the_store(
    deployment: Build, caplog: pytest.LogCaptureFixture
) -> None:
    router, callback, _ = await deployment(ServerSpec(step_seconds=0.002, metrics_flavor="none"))
    with caplog.at_level(logging.INFO, logger=OURS):
        for _ in range(3):
            await callback.maintain_once()
            assert outcome(await call(router, max_tokens=5)) == (200, None)  # it runs on its concurrency limit
    warnings = [r.getMessage() for r in caplog.records if r.name == OURS and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "deployment gpu1" in warnings[0] and "--disable-log-stats" in warnings[0]
    view = callback.snapshot()["gpu1"]
    assert (view["server"], view["signal_problems"], view["kv_cache_tokens"]) == (None, ["unrecognised"], None)
    assert problem_gauge("unrecognised") == 1.0 and problem_gauge("no_queue") == 0.0
    report = await get_runtime().store().signal_report_read("gpu1")
    assert report is not None and (report.server, report.problems) == (None, ("unrecognised",))
    assert "--disable-log-stats" in report.detail


async def test_a_configured_server_that_does_not_answer_is_reported_and_read_as_the_one_that_does(
    deployment: Build,
) -> None:
    spec = ServerSpec(step_seconds=0.002, memory_tokens=800, metrics_flavor="tgi")
    _, callback, _ = await deployment(spec, model_backpressure={"server": "vllm"})
    await callback.maintain_once()
    view = callback.snapshot()["gpu1"]
    assert (view["server"], view["signal_problems"], view["kv_cache_tokens"]) == ("tgi", ["server_mismatch"], 800)
    assert problem_gauge("server_mismatch") == 1.0
    assert (
        REGISTRY.get_sample_value("litellm_ratebalance_backpressure_server", {"deployment": "gpu1", "server": "tgi"})
        == 1.0
    )


@pytest.mark.parametrize("as_drops", [True, False])
async def test_preemptions_back_the_limit_off(
    deployment: Build, caplog: pytest.LogCaptureFixture, as_drops: bool
) -> None:
    # kv_cache_tokens overstates the cache (100,000 of 600), so the layer admits what the server must preempt.
    spec = ServerSpec(knee=4, step_seconds=0.01, memory_tokens=600, kv_overflow="preempt")
    settings = {
        "kv_cache_tokens": 100_000,
        "limit": {"initial_limit": 16, "tolerance": 10.0},  # latency alone never cuts the limit here
        "signals": {"preemptions_as_drops": as_drops},
    }
    router, callback, server = await deployment(spec, settings)
    with caplog.at_level(logging.INFO, logger=OURS):
        await callback.maintain_once()  # the counter's baseline
        results = await asyncio.gather(*(call(router, max_tokens=30) for _ in range(12)))
        assert [outcome(r) for r in results] == [(200, None)] * 12  # preempted, recomputed, not failed
        assert server.stats.preemptions > 0 and server.stats.oom_failures == 0
        for _ in range(20):
            await asyncio.sleep(0.02)
        grown = callback.snapshot()["gpu1"]["limit"]  # latency within tolerance: it only grew
        await callback.maintain_once()
        after = callback.snapshot()["gpu1"]["limit"]
    counted = REGISTRY.get_sample_value(
        "litellm_ratebalance_backpressure_server_preemptions_total", {"deployment": "gpu1"}
    )
    assert counted is not None and counted >= server.stats.preemptions
    messages = [r.getMessage() for r in caplog.records if r.name == OURS and r.levelno == logging.WARNING]
    assert sum("kv_cache_tokens 100000 overrides the 600 tokens" in m for m in messages) == 1
    preempted = [m for m in messages if "preempted" in m and "for want of KV cache" in m]
    assert len(preempted) == 1
    assert grown >= 16
    if as_drops:
        assert after < grown and f"the concurrency limit backs off (now {after})" in preempted[0]
    else:
        assert after == grown and "preemptions_as_drops is off" in preempted[0]


async def test_nvml_memory_next_to_vllm_counts_above_what_it_holds_idle(deployment: Build) -> None:
    used = {"fraction": 0.915}  # vLLM reserved 90% of the GPU at start-up
    nvml = FakeNvml(total_bytes=1000, used_bytes=lambda: 1000 * used["fraction"])
    router, callback, _ = await deployment(
        ServerSpec(step_seconds=0.002),
        {"tiers": ["low", "high"], "signals": {"nvml": True}},
        gpu_probe=NvmlProbe(module=nvml),
    )
    await callback.maintain_once()  # idle: the floor is 0.915
    assert callback.snapshot()["gpu1"]["signals"]["gpu_memory"] == 0.0
    assert outcome(await call(router, "low", max_tokens=5)) == (200, None)  # an idle server refuses nobody
    used["fraction"] = 0.99  # something else takes 88% of what was left
    await settle(callback)
    assert callback.snapshot()["gpu1"]["signals"]["gpu_memory"] == pytest.approx(0.075 / 0.085)
    low = await call(router, "low", max_tokens=5)
    assert outcome(low) == (503, "memory_pressure") and "gpu_memory" in str(low)
    assert outcome(await call(router, "high", max_tokens=5)) == (200, None)
