"""Backpressure through a real ``litellm.Router`` against the simulated inference server on loopback.

Every test: an :class:`InferenceServer` (latency grows past its knee, fails with a simulated OOM past its
KV-cache capacity), the callback registered in ``litellm.callbacks``, settings and store handed in
through ``configure``. No timed assertions: outcomes are counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import litellm
import pytest
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.overload.signals import NvmlProbe
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.backpressure.callback import process_of
from litellm_ratebalance.proxy.backpressure.trace import TRACE_ENV
from litellm_ratebalance.proxy.runtime import configure, get_runtime, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.fake_nvml import FakeNvml
from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec
from litellm_ratebalance.store import MemoryStore, RedisStore

PROMPT = "a" * 400  # ~100 tokens

Harness = Callable[..., Awaitable[tuple[Router, BackpressureCallback, list[InferenceServer]]]]
"""The ``harness`` fixture: ``await harness(settings, specs, ...)`` -> (router, callback, servers)."""


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    """``await harness(settings, specs, store=..., gpu_probe=..., model_info=...)`` -> (router, cb, servers)."""
    saved_callbacks = list(litellm.callbacks)
    started: list[InferenceServer] = []
    callbacks: list[BackpressureCallback] = []

    async def build(
        backpressure: dict[str, Any],
        specs: list[ServerSpec],
        *,
        store: Any = None,
        gpu_probe: Any = None,
        model_info: list[dict[str, Any]] | None = None,
        fail_mode: str = "open",
    ) -> tuple[Router, BackpressureCallback, list[InferenceServer]]:
        reset_runtime()
        # all_deployments: the test deployments carry no backpressure block of their own.
        backpressure = {"all_deployments": True, **backpressure}
        settings = parse_settings({"ratebalance": {"fail_mode": fail_mode, "backpressure": backpressure}})
        configure(settings=settings, store=store or MemoryStore())
        servers = [await InferenceServer(spec).start() for spec in specs]
        started.extend(servers)
        model_list = []
        for i, server in enumerate(servers):
            info = {"id": f"gpu{i + 1}", **((model_info or [{}] * len(servers))[i])}
            model_list.append(
                {
                    "model_name": "local",
                    "litellm_params": {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"},
                    "model_info": info,
                }
            )
        callback = BackpressureCallback(gpu_probe=gpu_probe)
        callbacks.append(callback)
        litellm.callbacks = [callback]
        router = Router(model_list=model_list, num_retries=0)
        return router, callback, servers

    yield build
    for callback in callbacks:
        await callback.aclose()
    for server in started:
        await server.stop()
    litellm.callbacks = saved_callbacks
    reset_runtime()


def auth(priority: str | None, key: str = "k1") -> UserAPIKeyAuth:
    return UserAPIKeyAuth(token=key, metadata={"priority": priority} if priority else {})


async def call(
    router: Router, priority: str | None = None, *, max_tokens: int = 40, key: str = "k1", prompt: str = PROMPT
) -> Any:
    """The response, or the exception (with ``status_code`` / ``headers``) the caller would see."""
    try:
        return await router.acompletion(
            model="local",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            metadata={"user_api_key_auth": auth(priority, key)},
        )
    except Exception as exc:
        return exc


def outcome(result: Any) -> tuple[int, str | None]:
    if isinstance(result, Exception):
        headers = getattr(result, "headers", None) or {}
        return int(getattr(result, "status_code", 0)), headers.get("x-litellm-backpressure-reason")
    return 200, None


async def settle(callback: BackpressureCallback) -> None:
    """Let the success/failure events (dispatched as tasks) run, then one maintenance step."""
    for _ in range(20):
        await asyncio.sleep(0.02)
    await callback.maintain_once()


async def test_the_simulated_server_falls_off_the_memory_cliff_without_the_layer() -> None:
    async with InferenceServer(ServerSpec(knee=4, step_seconds=0.005, memory_tokens=2000)) as server:
        router = Router(
            model_list=[
                {
                    "model_name": "local",
                    "litellm_params": {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"},
                }
            ],
            num_retries=0,
        )
        saved = list(litellm.callbacks)
        litellm.callbacks = []
        try:
            results = await asyncio.gather(*(call(router) for _ in range(24)))
        finally:
            litellm.callbacks = saved
        assert server.stats.oom_failures > 0
        assert sum(outcome(r)[0] == 500 for r in results) == server.stats.oom_failures


async def test_burst_sheds_low_priority_first_and_never_ooms(harness: Harness) -> None:
    router, callback, (server,) = await harness(
        {
            "tiers": ["low", "high"],
            "kv_cache_tokens": 2000,
            "limit": {"initial_limit": 8, "max_limit": 32},
            "queue": {"enabled": True, "max_wait_seconds": 20},
        },
        [ServerSpec(knee=4, step_seconds=0.005, memory_tokens=2000)],
    )
    priorities = ["high" if i % 3 == 0 else "low" for i in range(36)]
    results = await asyncio.gather(*(call(router, p) for p in priorities))
    by_tier = Counter((p, outcome(r)[0]) for p, r in zip(priorities, results, strict=True))
    assert by_tier[("high", 200)] == 12  # every high-priority request served (queued when slots were full)
    assert by_tier[("low", 503)] > 0  # low priority shed
    assert server.stats.oom_failures == 0
    reasons = {outcome(r)[1] for p, r in zip(priorities, results, strict=True) if p == "low" and outcome(r)[0] == 503}
    assert reasons <= {"compute_saturation", "memory_pressure"}
    # Memory: reservations never exceeded the highest tier's 95% of the KV cache.
    assert server.stats.peak_memory_tokens <= 0.95 * 2000
    await settle(callback)
    view = callback.snapshot()["gpu1"]
    assert view["inflight"] == 0 and view["reserved_tokens"] == 0 and view["local_leases"] == 0


async def test_refusal_is_actionable(harness: Harness) -> None:
    router, _, _ = await harness(
        {"tiers": ["low", "high"], "limit": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}},
        [ServerSpec(knee=4, step_seconds=0.01)],
    )
    results = await asyncio.gather(*(call(router, "low", max_tokens=60) for _ in range(4)))
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == 3  # the lowest tier may take floor(0.85 x 2) = 1 slot of 2
    exc: Any = refused[0]  # LiteLLM's exception class (version-dependent) carries status_code and headers
    assert exc.status_code == 503
    assert exc.headers["x-litellm-backpressure-reason"] == "compute_saturation"
    assert exc.headers["x-litellm-backpressure-advice"] == "retry"
    assert int(exc.headers["retry-after"]) >= 1
    assert exc.headers["x-litellm-concurrency-limit"] == "2"
    assert "priority tier 'low'" in str(exc) and "retry after" in str(exc)
    assert exc.num_retries == 0  # every deployment refused: the router must not retry it inside the proxy


async def test_concurrency_limit_gives_429_without_a_queue(harness: Harness) -> None:
    router, _, (server,) = await harness(
        {"limit": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}},
        [ServerSpec(knee=4, step_seconds=0.01)],
    )
    results = await asyncio.gather(*(call(router, max_tokens=50) for _ in range(6)))
    assert Counter(outcome(r) for r in results) == {(200, None): 2, (429, "concurrency_limit"): 4}
    assert server.stats.peak_running == 2


async def test_queue_waits_for_a_slot_instead_of_refusing(harness: Harness) -> None:
    router, callback, (server,) = await harness(
        {"limit": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}, "queue": {"enabled": True}},
        [ServerSpec(knee=4, step_seconds=0.005)],
    )
    results = await asyncio.gather(*(call(router, key=f"k{i % 3}", max_tokens=20) for i in range(8)))
    assert [outcome(r)[0] for r in results] == [200] * 8, [str(r)[:400] for r in results if isinstance(r, Exception)]
    assert server.stats.peak_running == 2
    await settle(callback)
    assert callback.snapshot()["gpu1"]["queue_depth"] == 0


async def test_queue_overflow_and_wait_timeout_give_503(harness: Harness) -> None:
    router, _, _ = await harness(
        {
            "limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1},
            "queue": {"enabled": True, "max_depth": 1, "max_wait_seconds": 0.2},
        },
        [ServerSpec(knee=4, step_seconds=0.02)],  # 50 tokens = 1 s, far past the wait limit
    )
    results = await asyncio.gather(*(call(router, max_tokens=50) for _ in range(3)))
    assert Counter(outcome(r) for r in results) == {(200, None): 1, (503, "queue_overflow"): 2}
    messages = sorted(str(r) for r in results if isinstance(r, Exception))
    assert any("wait queue is full" in m for m in messages)
    assert any("waited" in m for m in messages)


async def test_filter_keeps_traffic_off_a_deployment_at_its_limit(harness: Harness) -> None:
    router, callback, (small, big) = await harness(
        {"limit": {"max_limit": 16}},
        [ServerSpec(knee=4, step_seconds=0.005), ServerSpec(knee=8, step_seconds=0.005)],
        model_info=[{"backpressure": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}}, {}],
    )
    # The router shuffles between deployments that pass the filter: in one burst of 8 the small one is
    # skipped altogether with probability 1/256, so bursts repeat (at most 6) until it has served one.
    bursts = 0
    while bursts == 0 or (small.stats.completed == 0 and bursts < 6):
        bursts += 1
        results = await asyncio.gather(*(call(router, max_tokens=30) for _ in range(8)))
        assert [outcome(r)[0] for r in results] == [200] * 8
    assert small.stats.peak_running == 1
    assert small.stats.completed + big.stats.completed == 8 * bursts
    assert callback.gates_deployments()  # what the routing hook checks before asking per deployment


async def test_successful_responses_carry_queue_depth_and_limit(harness: Harness) -> None:
    router, callback, _ = await harness({"limit": {"initial_limit": 5}}, [ServerSpec(step_seconds=0.002)])
    response = await call(router, max_tokens=5)
    headers = await callback.async_post_call_response_headers_hook(data={}, user_api_key_dict=None, response=response)
    assert headers == {"x-litellm-queue-depth": "0", "x-litellm-concurrency-limit": "5"}
    assert await callback.async_post_call_response_headers_hook(data={}, user_api_key_dict=None, response=None) is None


async def test_gpu_memory_through_nvml_sheds_the_low_tier(harness: Harness) -> None:
    used = {"fraction": 0.50}
    nvml = FakeNvml(total_bytes=1000, used_bytes=lambda: 1000 * used["fraction"])
    router, callback, _ = await harness(
        {"tiers": ["low", "high"], "signals": {"nvml": True}},
        [ServerSpec(step_seconds=0.002)],
        gpu_probe=NvmlProbe(module=nvml),
    )
    await callback.maintain_once()
    assert outcome(await call(router, "low", max_tokens=5)) == (200, None)
    used["fraction"] = 0.90
    await callback.maintain_once()
    low = await call(router, "low", max_tokens=5)
    assert outcome(low) == (503, "memory_pressure")
    assert "gpu_memory" in str(low)
    assert outcome(await call(router, "high", max_tokens=5)) == (200, None)
    used["fraction"] = 0.97
    await callback.maintain_once()
    assert outcome(await call(router, "high", max_tokens=5)) == (503, "memory_pressure")


async def test_a_request_in_litellms_priority_queue_is_refused_once(harness: Harness) -> None:
    """A request sent with LiteLLM's own ``priority`` waits in the Router's queue, whose "any deployment
    healthy?" lookup (LiteLLM 1.110+) runs the filter too: the refusal comes from the request's own pick and is
    counted once."""
    used = {"fraction": 0.50}
    nvml = FakeNvml(total_bytes=1000, used_bytes=lambda: 1000 * used["fraction"])
    router, callback, _ = await harness(
        {"tiers": ["low", "high"], "signals": {"nvml": True}},
        [ServerSpec(step_seconds=0.002)],
        gpu_probe=NvmlProbe(module=nvml),
    )
    await callback.maintain_once()
    assert outcome(await call(router, "low", max_tokens=5)) == (200, None)
    used["fraction"] = 0.90
    await callback.maintain_once()
    labels = {"model_group": "local", "tier": "low", "reason": "memory_pressure"}
    before = REGISTRY.get_sample_value("litellm_ratebalance_backpressure_refusals_total", labels) or 0.0
    try:
        result: Any = await router.acompletion(
            model="local",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=5,
            metadata={"user_api_key_auth": auth("low")},
            priority=0,
        )
    except Exception as exc:
        result = exc
    assert outcome(result) == (503, "memory_pressure")
    after = REGISTRY.get_sample_value("litellm_ratebalance_backpressure_refusals_total", labels) or 0.0
    assert after - before == 1


async def test_absent_nvml_degrades_with_one_line(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.fail_init = True
    router, callback, _ = await harness(
        {"signals": {"nvml": True}}, [ServerSpec(step_seconds=0.002)], gpu_probe=NvmlProbe(module=nvml)
    )
    with caplog.at_level(logging.WARNING, logger="litellm_ratebalance.backpressure"):
        for _ in range(3):
            await callback.maintain_once()
            assert outcome(await call(router, max_tokens=5)) == (200, None)
    assert sum("NVML unavailable" in r.getMessage() for r in caplog.records) == 1


async def test_scraped_kv_cache_sheds_and_an_unreachable_endpoint_degrades(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # 60 ms a token: the KV cache stays above the low tier's 85% for ~0.5 s before the background finishes
    # (at 20 ms it was ~0.1 s, which a loaded machine can miss between the poll and the low request).
    spec = ServerSpec(knee=8, step_seconds=0.06, memory_tokens=1000)
    server = InferenceServer(spec)
    await server.start()
    try:
        router, callback, _ = await harness(
            {
                "tiers": ["low", "high"],
                "signals": {"scrape_interval_seconds": 0.5, "scrape_timeout_seconds": 0.5, "stale_after_seconds": 0.3},
            },
            [],  # the deployment below points at the server started here
        )
        router.set_model_list(
            [
                {
                    "model_name": "local",
                    "litellm_params": {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"},
                    "model_info": {"id": "gpu1", "backpressure": {"metrics_url": server.metrics_url}},
                }
            ]
        )
        # Six long high-priority requests fill ~88% of the KV cache (100-token prompts, 50 tokens each).
        background = [asyncio.create_task(call(router, "high", max_tokens=50)) for _ in range(6)]
        for _ in range(400):  # up to 8 s (the background needs ~2.7 s to get there)
            await asyncio.sleep(0.02)
            if server.memory_used >= 870:
                break
        await callback.maintain_once()
        low = await call(router, "low", max_tokens=5)
        assert outcome(low) == (503, "memory_pressure") and "kv_cache" in str(low)
        with caplog.at_level(logging.INFO, logger="litellm_ratebalance.backpressure"):
            server.set_metrics_down(True)
            await callback.maintain_once()
            await callback.maintain_once()
            await asyncio.sleep(0.35)  # the last good scrape goes stale
            assert outcome(await call(router, "low", max_tokens=5)) == (200, None)
            server.set_metrics_down(False)
            await callback.maintain_once()
        messages = [r.getMessage() for r in caplog.records]
        assert sum("cannot scrape" in m and "other signals" in m for m in messages) == 1
        assert sum("are back" in m for m in messages) == 1
        assert [outcome(r)[0] for r in await asyncio.gather(*background)] == [200] * 6
    finally:
        await server.stop()


async def test_server_failures_back_off_the_limit_and_free_the_slots(harness: Harness) -> None:
    router, callback, (server,) = await harness(
        {"limit": {"initial_limit": 16, "backoff_ratio": 0.5}},
        [ServerSpec(knee=4, step_seconds=0.005, memory_tokens=600)],  # 5 prompts of ~100 tokens overflow it
    )
    results = await asyncio.gather(*(call(router, max_tokens=30) for _ in range(12)))
    assert server.stats.oom_failures > 0
    assert sum(outcome(r)[0] == 500 for r in results) == server.stats.oom_failures
    await settle(callback)
    view = callback.snapshot()["gpu1"]
    assert view["limit"] <= 8
    assert view["inflight"] == 0 and view["local_leases"] == 0


class BrokenStore(MemoryStore):
    async def lease_acquire(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("redis script 'concurrency_acquire' failed: ConnectionError")


async def test_store_fault_fails_open(harness: Harness) -> None:
    router, _, _ = await harness({}, [ServerSpec(step_seconds=0.002)], store=BrokenStore())
    assert outcome(await call(router, max_tokens=5)) == (200, None)


async def test_store_fault_fails_closed_with_503(harness: Harness) -> None:
    router, _, _ = await harness({}, [ServerSpec(step_seconds=0.002)], store=BrokenStore(), fail_mode="closed")
    result = await call(router, max_tokens=5)
    assert outcome(result)[0] == 503 and "fail_mode is 'closed'" in str(result)


@pytest.mark.redis
async def test_a_crashed_replicas_slots_come_back_after_the_lease_ttl(
    harness: Harness, store: MemoryStore | RedisStore
) -> None:
    router, callback, _ = await harness(
        {"limit": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}}, [ServerSpec(step_seconds=0.002)], store=store
    )
    # The first call of a process is slow (client and tokenizer set-up): make it before the leases' TTL runs.
    assert outcome(await call(router, max_tokens=5)) == (200, None)
    await settle(callback)
    # Another replica took both slots and died without releasing them.
    for lease in ("dead-1", "dead-2"):
        assert (await store.lease_acquire("gpu1", lease, slot_cap=2, ttl_ms=1000)).acquired
    assert outcome(await call(router, max_tokens=5)) == (429, "concurrency_limit")
    await asyncio.sleep(1.1)
    assert outcome(await call(router, max_tokens=5)) == (200, None)


async def test_a_cancelled_request_gives_its_slot_back(harness: Harness) -> None:
    # LiteLLM sends no success/failure event for a cancelled call (client gone, timeout): the slot must
    # still come back, not stay leased until lease_max_age_seconds.
    router, callback, (server,) = await harness(
        {"limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}}, [ServerSpec(step_seconds=0.05)]
    )
    task = asyncio.create_task(call(router, max_tokens=100))  # ~5 s upstream
    for _ in range(100):
        await asyncio.sleep(0.02)
        if server.running:
            break
    assert callback.snapshot()["gpu1"]["local_leases"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(callback)
    view = callback.snapshot()["gpu1"]
    assert view["local_leases"] == 0 and view["inflight"] == 0
    assert outcome(await call(router, max_tokens=5)) == (200, None)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Poll (not a timed assertion: the bound only stops a hung test) until ``predicate`` holds."""
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_lower_tiers_leave_kv_headroom_requests_typical_requests_of_memory(harness: Harness) -> None:
    """The same two low requests as below, which the default headroom (one typical request) admits together:
    with ``kv_headroom_requests: 3`` the second one is refused, as three typical requests (~1,380 tokens) stay
    free under the 1,900-token cap."""
    router, callback, (server,) = await harness(
        {
            "tiers": ["low", "high"],
            "kv_cache_tokens": 2000,
            "kv_headroom_requests": 3,
            "output_estimate": "max_tokens",
            "limit": {"initial_limit": 16, "min_limit": 16, "max_limit": 16},
        },
        [ServerSpec(knee=16, step_seconds=0.002, memory_tokens=2000)],
    )
    first = asyncio.create_task(call(router, "low", max_tokens=400, key="l0"))
    await _until(lambda: callback.snapshot().get("gpu1", {}).get("inflight") == 1, "the first low request admitted")
    second = await call(router, "low", max_tokens=400, key="l1")
    assert outcome(second) == (503, "memory_pressure")
    assert outcome(await first) == (200, None)
    assert server.stats.oom_failures == 0


async def test_top_tier_waits_for_memory_and_lower_tiers_are_refused_meanwhile(harness: Harness) -> None:
    router, callback, (server,) = await harness(
        {
            "tiers": ["low", "high"],
            "kv_cache_tokens": 2000,
            "output_estimate": "max_tokens",  # reservations are exactly prompt + max_tokens here
            "limit": {"initial_limit": 16, "min_limit": 16, "max_limit": 16},  # slots never bind
            "queue": {"enabled": True, "max_wait_seconds": 30},
        },
        [ServerSpec(knee=16, step_seconds=0.002, memory_tokens=2000)],
    )
    # Two low requests reserve ~2 x 460 tokens (prompt ~60 by LiteLLM's count + 400), within the low tier's
    # cap: 1700, less one typical request (~460) kept for the tier above.
    lows = [asyncio.create_task(call(router, "low", max_tokens=400, key=f"l{i}")) for i in range(2)]
    await _until(lambda: callback.snapshot().get("gpu1", {}).get("inflight") == 2, "both low requests admitted")
    # A high request needs ~1060 more: past 1900, its tier's cap. It waits instead of a 503...
    high = asyncio.create_task(call(router, "high", max_tokens=1000, key="h"))
    await _until(lambda: callback.snapshot()["gpu1"]["queue_depth"] == 1, "the high request waiting")
    # ...and a small low request, which would fit under the low tier's cap, is refused while it waits.
    small = await call(router, "low", max_tokens=10, key="s")
    assert outcome(small) == (503, "memory_pressure")
    assert "higher priority tier are waiting" in str(small)
    assert outcome(await high) == (200, None)
    assert [outcome(r) for r in await asyncio.gather(*lows)] == [(200, None)] * 2
    assert server.stats.oom_failures == 0
    assert server.stats.peak_memory_tokens <= 1900


@pytest.mark.parametrize("mode", ["learned", "max_tokens"])
async def test_a_request_reserves_the_learned_output_not_its_max_tokens(harness: Harness, mode: str) -> None:
    router, callback, _ = await harness(
        {"kv_cache_tokens": 1000, "output_estimate": mode, "queue": {"enabled": True}},
        # 10 ms per token: the last request stays in flight ~0.2 s, long enough to be seen there.
        [ServerSpec(knee=16, step_seconds=0.01, memory_tokens=4096, answer_tokens=(20, 20))],
    )
    # Twelve answers of 20 tokens teach the estimate (10 are needed before it replaces the default).
    for i in range(12):
        assert outcome(await call(router, max_tokens=40, key=f"k{i}")) == (200, None)
    await settle(callback)
    # max_tokens 900: prompt + 900 passes the top tier's 950-token cap of the 1,000-token cache...
    task = asyncio.create_task(call(router, max_tokens=900))
    if mode == "max_tokens":
        result = await task
        assert outcome(result) == (503, "memory_pressure")
        assert getattr(result, "headers", {})["x-litellm-backpressure-advice"] == "reroute"
        return
    # ...but the learned answer is 20 tokens: admitted, holding prompt + 20.
    assert callback.snapshot()["gpu1"]["output_estimate_tokens"] == pytest.approx(20.0)
    await _until(lambda: callback.snapshot()["gpu1"]["inflight"] == 1, "the request admitted")
    assert 20 < callback.snapshot()["gpu1"]["reserved_tokens"] < 200
    assert outcome(await task) == (200, None)


async def test_the_prompt_reserved_follows_the_servers_count_not_litellms(harness: Harness) -> None:
    router, callback, (server,) = await harness(
        {"kv_cache_tokens": 4000, "output_estimate": "max_tokens", "queue": {"enabled": True}},
        # 10 ms per token: a request stays in flight ~0.2 s, long enough to see its reservation.
        [ServerSpec(knee=16, step_seconds=0.01, memory_tokens=4096, answer_tokens=(20, 20))],
    )
    # One character repeated: the simulator counts 600 tokens (4 characters each), LiteLLM's counter about
    # half as many, so a reservation of LiteLLM's count would hold half of what the prompt takes.
    prompt = "x" * 2400
    for i in range(6):
        assert outcome(await call(router, max_tokens=20, key=f"k{i}", prompt=prompt)) == (200, None)
    await settle(callback)
    assert callback.snapshot()["gpu1"]["prompt_scale"] == pytest.approx(2.0, rel=0.15)
    gauge = REGISTRY.get_sample_value("litellm_ratebalance_backpressure_prompt_scale", {"deployment": "gpu1"})
    assert gauge == callback.snapshot()["gpu1"]["prompt_scale"]
    task = asyncio.create_task(call(router, max_tokens=20, prompt=prompt))
    await _until(lambda: callback.snapshot()["gpu1"]["inflight"] == 1, "the request admitted")
    assert 560 <= callback.snapshot()["gpu1"]["reserved_tokens"] <= 720  # ~600 + 20, not ~310 + 20
    assert outcome(await task) == (200, None)
    assert server.stats.oom_failures == 0


@pytest.mark.parametrize("quantile", [0.0, 0.9])
async def test_lower_tiers_leave_the_top_tiers_reserve_of_slots(harness: Harness, quantile: float) -> None:
    router, callback, (server,) = await harness(
        {
            "tiers": ["low", "high"],
            "top_reserve_quantile": quantile,
            "limit": {"initial_limit": 8, "min_limit": 8, "max_limit": 8},
        },
        [ServerSpec(knee=16, step_seconds=0.002)],
    )
    # The top tier keeps about four requests in flight: rounds of four, back to back.
    for _ in range(4):
        results = await asyncio.gather(*(call(router, "high", max_tokens=20, key=f"h{i}") for i in range(4)))
        assert [outcome(r) for r in results] == [(200, None)] * 4
    await settle(callback)
    reserve = callback.snapshot()["gpu1"]["top_reserve"]
    # A burst of the low tier, long enough to be in flight together.
    lows = await asyncio.gather(*(call(router, "low", max_tokens=200, key=f"l{i}") for i in range(10)))
    served = sum(outcome(r) == (200, None) for r in lows)
    if quantile == 0.0:
        assert reserve == 0 and served == 7  # the plain tier rule: one slot of 8 stays free
    else:
        # About four in flight on average: the 90% quantile of Poisson(~4) is 6-7 slots; the low tier
        # gets what is left (the estimate decays a little between the snapshot and the burst).
        assert 2 <= reserve <= 8, reserve
        assert 8 - reserve <= served <= 8 - reserve + 1, (served, reserve)
        assert served < 7
    assert server.stats.oom_failures == 0


async def test_the_debug_trace_follows_a_top_tier_request_through_the_queue(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LITELLM_RATEBALANCE_BACKPRESSURE_TRACE`` (read when the context is built): one JSON line per
    admission event, with this process's view of the deployment."""
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    router, callback, _ = await harness(
        {
            "tiers": ["low", "high"],
            "kv_cache_tokens": 2000,
            "output_estimate": "max_tokens",
            "limit": {"initial_limit": 16, "min_limit": 16, "max_limit": 16},
            "queue": {"enabled": True, "max_wait_seconds": 30},
        },
        [ServerSpec(knee=16, step_seconds=0.002, memory_tokens=2000)],
    )
    lows = [asyncio.create_task(call(router, "low", max_tokens=400, key=f"l{i}")) for i in range(2)]
    await _until(lambda: callback.snapshot().get("gpu1", {}).get("inflight") == 2, "both low requests admitted")
    high = asyncio.create_task(call(router, "high", max_tokens=1000, key="h"))
    await _until(lambda: callback.snapshot()["gpu1"]["queue_depth"] == 1, "the high request waiting")
    assert outcome(await call(router, "low", max_tokens=10, key="s")) == (503, "memory_pressure")
    assert outcome(await high) == (200, None)
    await asyncio.gather(*lows)
    await settle(callback)

    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert {e["dep"] for e in events} == {"gpu1"}
    for e in events:  # every line carries the view
        assert {"t", "pid", "limit", "inflight", "reserved", "kv", "top_reserve", "top_inflight", "queue"} <= set(e)
    direct = [e for e in events if e["ev"] == "lease" and e["how"] == "direct"]
    assert [e["tier"] for e in direct] == ["low", "low"]
    (arrive,) = [e for e in events if e["ev"] == "arrive" and e["tier"] == "high"]
    assert (arrive["admitted"], arrive["signal"], arrive["queueable"]) == (False, "kv_cache", True)
    (enqueue,) = [e for e in events if e["ev"] == "enqueue"]
    (queued,) = [e for e in events if e["ev"] == "lease" and e["how"] == "queue"]
    assert enqueue["call"] == queued["call"] == arrive["call"] and queued["t"] > enqueue["t"]
    assert any(e["ev"] == "head" and not e["admitted"] for e in events)
    (refused,) = [e for e in events if e["ev"] == "refuse"]
    assert (refused["tier"], refused["refused"], refused["higher_waiting"], refused["queue"]) == (
        "low",
        "memory_pressure",
        True,
        1,
    )
    releases = [e for e in events if e["ev"] == "release"]
    assert sorted(e["tier"] for e in releases) == ["high", "low", "low"]
    assert all(e["held"] > 0 for e in releases)


async def test_no_trace_without_its_environment_variable(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    router, _, _ = await harness({}, [ServerSpec(knee=4, step_seconds=0.002)])
    assert outcome(await call(router, max_tokens=5)) == (200, None)
    ctx = process_of(get_runtime()).ctx
    assert ctx is not None and not ctx.trace.enabled
