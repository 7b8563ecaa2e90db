"""Backpressure against LiteLLM's own behaviour around callbacks: the Router's retries, how LiteLLM
registers logger instances, and cancelled requests (no event at all).

A real ``litellm.Router`` in front of the simulated inference server on loopback, as in
test_backpressure_router.py (whose helpers are reused); outcomes are counted, nothing is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import litellm
import pytest
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec
from litellm_ratebalance.store import MemoryStore
from litellm_ratebalance.store.metering import MeterEnd
from tests.integration.test_backpressure_router import call, outcome, settle


class CountingStore(MemoryStore):
    """Counts granted leases and releases; with ``race_first``, another (ghost) replica wins the race for the
    first lease asked for: it takes the deployment's only slot between our filter's check and our attempt."""

    def __init__(self, race_first: bool = False) -> None:
        super().__init__()
        self.granted = 0
        self.released = 0
        self.raced: str | None = None
        self._race_first = race_first

    async def lease_acquire(self, deployment_id: str, lease_id: str, **kwargs: Any) -> Any:
        if self._race_first:
            self._race_first = False
            self.raced = deployment_id
            await super().lease_acquire(deployment_id, "ghost", slot_cap=1, ttl_ms=60_000)
        result = await super().lease_acquire(deployment_id, lease_id, **kwargs)
        self.granted += int(result.acquired)
        return result

    async def lease_release(self, deployment_id: str, lease_id: str, meter: MeterEnd | None = None) -> Any:
        self.released += 1
        return await super().lease_release(deployment_id, lease_id, meter)


Build = Callable[..., Awaitable[tuple[Router, list[BackpressureCallback], list[InferenceServer]]]]


@pytest.fixture
async def build() -> AsyncIterator[Build]:
    """``await build(settings, specs, store=, num_retries=, orders=, instances=)`` -> (router, callbacks, servers).

    ``instances`` > 1 lists that many instances of the class in ``litellm.callbacks`` (what an SDK user may
    do by mistake). LiteLLM's registered success/failure loggers are cleared first and restored after.
    """
    saved = (list(litellm.callbacks), list(litellm._async_success_callback), list(litellm._async_failure_callback))
    litellm._async_success_callback = []
    litellm._async_failure_callback = []
    started: list[InferenceServer] = []
    made: list[BackpressureCallback] = []

    async def make(
        backpressure: dict[str, Any],
        specs: list[ServerSpec],
        *,
        store: Any = None,
        num_retries: int = 0,
        orders: list[int] | None = None,
        instances: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> tuple[Router, list[BackpressureCallback], list[InferenceServer]]:
        reset_runtime()
        settings = parse_settings({"ratebalance": {"backpressure": {"all_deployments": True, **backpressure}}})
        configure(settings=settings, store=store if store is not None else MemoryStore())
        servers = [await InferenceServer(spec).start() for spec in specs]
        started.extend(servers)
        model_list = []
        for i, server in enumerate(servers):
            params: dict[str, Any] = {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"}
            if orders is not None:
                params["order"] = orders[i]
            model_list.append({"model_name": "local", "litellm_params": params, "model_info": {"id": f"gpu{i + 1}"}})
        callbacks = [
            BackpressureCallback() if clock is None else BackpressureCallback(clock=clock) for _ in range(instances)
        ]
        made.extend(callbacks)
        litellm.callbacks = list(callbacks)
        return Router(model_list=model_list, num_retries=num_retries), callbacks, servers

    yield make
    for callback in made:
        await callback.aclose()
    for server in started:
        await server.stop()
    litellm.callbacks, litellm._async_success_callback, litellm._async_failure_callback = saved
    reset_runtime()


def refusals(reason: str, tier: str = "default") -> float:
    value = REGISTRY.get_sample_value(
        "litellm_ratebalance_backpressure_refusals_total", {"model_group": "local", "tier": tier, "reason": reason}
    )
    return value or 0.0


def filter_latency_count() -> float:
    labels = {"component": "backpressure", "hook": "filter_deployments"}
    return REGISTRY.get_sample_value("litellm_ratebalance_hook_latency_seconds_count", labels) or 0.0


def drops(deployment: str) -> float:
    return REGISTRY.get_sample_value("litellm_ratebalance_backpressure_drops_total", {"deployment": deployment}) or 0.0


# -- the Router's num_retries -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_retries", "orders", "rerouted"),
    [
        (0, None, False),  # no retries configured: the client gets the 429
        (1, None, True),  # the Router retries, our filter keeps it off the full deployment
        (0, [1, 2], True),  # no retries, but the Router's own order fallback moves on to order 2
    ],
)
async def test_a_slot_lost_to_a_race_is_retried_on_another_deployment_where_the_router_would(
    build: Build, num_retries: int, orders: list[int] | None, rerouted: bool
) -> None:
    # Another replica takes the picked deployment's only slot between our filter and our lease attempt. The
    # refusal comes from the deployment hook with another deployment free, so the Router's policy decides.
    store = CountingStore(race_first=True)
    router, (callback,), servers = await build(
        {"limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}},
        [ServerSpec(step_seconds=0.002), ServerSpec(step_seconds=0.002)],
        store=store,
        num_retries=num_retries,
        orders=orders,
    )
    before = refusals("concurrency_limit")
    result = await call(router, max_tokens=5)
    assert refusals("concurrency_limit") == before + 1  # the lost race, counted once
    assert store.raced is not None
    if orders is not None:
        assert store.raced == "gpu1"  # order 1 first
    if rerouted:
        assert outcome(result) == (200, None)
        assert _litellm.response_deployment_id(result) not in (None, store.raced)
    else:
        assert outcome(result) == (429, "concurrency_limit")
        assert getattr(result, "num_retries", None) != 0  # not marked final: the Router was free to retry it
    assert sum(server.stats.completed for server in servers) == int(rerouted)
    await settle(callback)
    assert store.granted == store.released == int(rerouted)


@pytest.mark.parametrize("race", [False, True])
async def test_a_refusal_nothing_else_would_take_is_not_retried_inside_the_router(build: Build, race: bool) -> None:
    # One deployment, its slot held by another replica: refused in the filter (our counts are fresh) or, when
    # our counts are stale, in the deployment hook. Either way a retry cannot help: the Router must not
    # make one (nor sleep its back-off first), whatever num_retries says.
    store = CountingStore(race_first=race)
    router, _, (server,) = await build(
        {"limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}},
        [ServerSpec(step_seconds=0.002)],
        store=store,
        num_retries=3,
    )
    if not race:
        assert (await store.lease_acquire("gpu1", "other-replica", slot_cap=1, ttl_ms=60_000)).acquired
    before = refusals("concurrency_limit")
    filter_timings = filter_latency_count()
    result = await call(router, max_tokens=5)
    assert outcome(result) == (429, "concurrency_limit")
    assert filter_latency_count() > filter_timings  # the refusing filter is timed like every hook
    assert result.num_retries == 0
    assert refusals("concurrency_limit") == before + 1  # one attempt, not 1 + num_retries
    assert server.stats.completed == 0


# -- logger registration --------------------------------------------------------------------------------------


def _registered(callbacks: list[Any]) -> int:
    return sum(isinstance(cb, BackpressureCallback) for cb in callbacks)


async def test_one_logger_per_class_is_registered_and_each_request_is_counted_once(build: Build) -> None:
    spec = ServerSpec(step_seconds=0.002)
    # A first instance serves some requests (LiteLLM registers it for the success/failure events)...
    router, (first,), _ = await build({"limit": {"initial_limit": 8}}, [spec])
    assert [outcome(r)[0] for r in await asyncio.gather(*(call(router, max_tokens=5) for _ in range(3)))] == [200] * 3
    await settle(first)
    # ...then the config is loaded again: a new instance (two, even, listed by mistake) with new settings.
    store = CountingStore()
    router, (second, third), _ = await build({"limit": {"initial_limit": 8}}, [spec], store=store, instances=2)
    results = await asyncio.gather(*(call(router, max_tokens=5) for _ in range(6)))
    assert [outcome(r)[0] for r in results] == [200] * 6
    await settle(second)
    assert _registered(litellm._async_success_callback) == 1
    assert _registered(litellm._async_failure_callback) == 1
    # One lease per request (not one per listed instance), each released exactly once, by whichever instance
    # LiteLLM kept for the events.
    assert store.granted == store.released == 6
    view = second.snapshot()["gpu1"]
    assert view["inflight"] == 0 and view["local_leases"] == 0 and view["reserved_tokens"] == 0
    assert third.snapshot() == second.snapshot()  # one process-wide view


# -- cancelled requests ---------------------------------------------------------------------------------------


async def test_a_cancelled_request_releases_its_lease_and_records_nothing(build: Build) -> None:
    store = CountingStore()
    router, (callback,), (server,) = await build(
        {"limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}}, [ServerSpec(step_seconds=0.05)], store=store
    )
    before = (drops("gpu1"), refusals("concurrency_limit"), refusals("queue_overflow"))
    task = asyncio.create_task(call(router, max_tokens=100))  # ~5 s upstream
    for _ in range(100):
        await asyncio.sleep(0.02)
        if server.running:
            break
    limit_before = callback.snapshot()["gpu1"]["limit"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(callback)
    view = callback.snapshot()["gpu1"]
    assert view["local_leases"] == 0 and view["inflight"] == 0
    assert store.granted == store.released == 1
    assert (drops("gpu1"), refusals("concurrency_limit"), refusals("queue_overflow")) == before
    assert view["limit"] == limit_before and view["mean_latency_seconds"] is None  # nothing learnt from it


async def test_a_request_cancelled_while_queued_leaves_no_trace(build: Build) -> None:
    store = CountingStore()
    router, (callback,), (server,) = await build(
        {"limit": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}, "queue": {"enabled": True}},
        [ServerSpec(step_seconds=0.02)],
        store=store,
    )
    before = (drops("gpu1"), refusals("concurrency_limit"), refusals("queue_overflow"))
    running = asyncio.create_task(call(router, max_tokens=100))  # ~2 s upstream: the second one queues behind it
    for _ in range(100):
        await asyncio.sleep(0.02)
        if server.running:
            break
    queued = asyncio.create_task(call(router, max_tokens=5))
    for _ in range(100):
        await asyncio.sleep(0.02)
        if callback.snapshot()["gpu1"]["queue_depth"] == 1:
            break
    assert callback.snapshot()["gpu1"]["queue_depth"] == 1
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert outcome(await running) == (200, None)
    await settle(callback)
    view = callback.snapshot()["gpu1"]
    assert view["queue_depth"] == 0 and view["local_leases"] == 0 and view["inflight"] == 0
    assert store.granted == store.released == 1  # the queued request never took a slot
    assert (drops("gpu1"), refusals("concurrency_limit"), refusals("queue_overflow")) == before
    assert server.stats.completed == 1


# -- metrics --------------------------------------------------------------------------------------------------


async def test_each_refusal_is_counted_once_by_model_group_tier_and_reason(build: Build) -> None:
    store = CountingStore()
    router, _, _ = await build(
        {"tiers": ["low", "high"], "limit": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}},
        [ServerSpec(step_seconds=0.002)],
        store=store,
    )
    # Another replica holds one of the two slots: the low tier may use floor(0.85 x 2) = 1, the high tier 2.
    assert (await store.lease_acquire("gpu1", "other-replica", slot_cap=2, ttl_ms=60_000)).acquired
    low_before, high_before = refusals("compute_saturation", "low"), refusals("compute_saturation", "high")
    result = await call(router, "low", max_tokens=5)
    assert outcome(result) == (503, "compute_saturation")
    assert refusals("compute_saturation", "low") == low_before + 1
    assert outcome(await call(router, "high", max_tokens=5)) == (200, None)
    assert refusals("compute_saturation", "high") == high_before
