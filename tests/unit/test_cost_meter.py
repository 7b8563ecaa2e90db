"""The cost meter's bookkeeping around backpressure's leases, on the embedded store with explicit times."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from litellm.proxy._types import UserAPIKeyAuth
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy.cost import CostMeter
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import MemoryStore
from litellm_ratebalance.store.cost import CostMark


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowStartStore(MemoryStore):
    """The start mark waits until the test lets it through (a slow Redis round trip)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.let_through = asyncio.Event()

    async def cost_start(self, deployment_id: str, *, half_life_ms: int, ttl_ms: int) -> CostMark:
        await self.let_through.wait()
        return await super().cost_start(deployment_id, half_life_ms=half_life_ms, ttl_ms=ttl_ms)


@pytest.fixture
def clock() -> Iterator[Clock]:
    reset_runtime()
    yield Clock()
    reset_runtime()


def request(priority: str) -> dict[str, Any]:
    return {"metadata": {"user_api_key_auth": UserAPIKeyAuth(token="k", metadata={"priority": priority})}}


async def test_the_start_mark_never_holds_up_the_caller_and_the_end_waits_for_it(clock: Clock) -> None:
    store = SlowStartStore(clock)
    configure(settings=parse_settings({"ratebalance": {"backpressure": {"tiers": ["dev"]}}}), store=store)
    meter = CostMeter(clock=clock)
    await store.lease_acquire("gpu1", "lease-a", slot_cap=4, ttl_ms=600_000)
    # Returns at once although the store has not answered: no cancellation point between the lease and its
    # owner's bookkeeping.
    await asyncio.wait_for(meter.lease_started("gpu1", "lease-a"), timeout=5)
    assert meter.open_requests == 1 and meter.is_local("gpu1") and not meter.is_local("api")
    store.let_through.set()
    for _ in range(10):  # let the start mark run, at store time 100 s
        await asyncio.sleep(0)
    usage = SimpleNamespace(usage=SimpleNamespace(prompt_tokens=7, completion_tokens=3))
    meter.lease_usage("lease-a", usage)
    clock.now += 2.5
    await store.lease_release("gpu1", "lease-a")
    await meter.lease_ended("gpu1", "lease-a", request("dev"), 40)
    assert meter.open_requests == 0
    efficiency = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert efficiency is not None
    assert efficiency.gpu_seconds == pytest.approx(2.5)  # alone for 2.5 s on one GPU
    assert efficiency.output_tokens == pytest.approx(3)


async def test_an_end_without_a_start_or_after_a_failed_start_charges_nothing(clock: Clock) -> None:
    ends: list[str] = []

    class NoStart(MemoryStore):
        async def cost_start(self, *args: Any, **kwargs: Any) -> CostMark:
            raise RuntimeError("a bug, not a store fault")

        async def cost_end(self, deployment_id: str, *args: Any, **kwargs: Any) -> CostMark:
            ends.append(deployment_id)
            return await super().cost_end(deployment_id, *args, **kwargs)

    configure(settings=parse_settings({}), store=NoStart(clock=clock))
    meter = CostMeter(clock=clock)
    await meter.lease_ended("gpu1", "never-started", request("dev"), 10)
    await meter.lease_started("gpu1", "lease-b")
    await meter.lease_ended("gpu1", "lease-b", request("dev"), 10)  # the failed start is logged, never raised
    assert ends == []  # no end mark without a start mark
    assert meter.open_requests == 0


async def test_entries_whose_end_never_came_are_forgotten_after_the_lease_max_age(clock: Clock) -> None:
    settings = parse_settings({"ratebalance": {"backpressure": {"lease_max_age_seconds": 60}}})
    configure(settings=settings, store=MemoryStore(clock=clock))
    meter = CostMeter(clock=clock)
    await meter.lease_started("gpu1", "lost")
    clock.now += 61
    await meter.lease_started("gpu1", "next")
    assert meter.open_requests == 1  # "lost" is gone, "next" is open


async def test_two_replicas_share_one_deployments_busy_time_through_the_store(clock: Clock) -> None:
    """Two meters (two proxy replicas) on one store: each request's share counts the other replica's requests."""
    store = MemoryStore(clock=clock)
    configure(settings=parse_settings({"ratebalance": {"backpressure": {"tiers": ["dev", "prod"]}}}), store=store)
    replica_a, replica_b = CostMeter(clock=clock), CostMeter(clock=clock)

    async def start(meter: CostMeter, lease: str) -> None:
        await store.lease_acquire("gpu1", lease, slot_cap=8, ttl_ms=600_000)
        await meter.lease_started("gpu1", lease)
        for _ in range(5):  # the start mark's task runs now, at this store time
            await asyncio.sleep(0)

    async def end(meter: CostMeter, lease: str, priority: str) -> None:
        await store.lease_release("gpu1", lease)
        meter.lease_usage(lease, SimpleNamespace(usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1)))
        await meter.lease_ended("gpu1", lease, request(priority), 2)

    gpu = "litellm_ratebalance_gpu_seconds_total"
    labels = {"deployment": "gpu1", "team": "none", "feature": "unassigned"}
    before = {p: REGISTRY.get_sample_value(gpu, {**labels, "priority": p}) or 0.0 for p in ("prod", "dev")}
    await start(replica_a, "a")  # t=100
    clock.now += 1.0
    await start(replica_b, "b")  # t=101: two in flight, one on each replica
    clock.now += 2.0
    await end(replica_a, "a", "prod")  # t=103: a had 1 s alone and 2 s shared
    clock.now += 3.0
    await end(replica_b, "b", "dev")  # t=106: b had 2 s shared and 3 s alone
    charged = {p: (REGISTRY.get_sample_value(gpu, {**labels, "priority": p}) or 0.0) - before[p] for p in before}
    assert charged["prod"] == pytest.approx(1.0 + 2.0 / 2)
    assert charged["dev"] == pytest.approx(2.0 / 2 + 3.0)
    efficiency = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert efficiency is not None
    # 6 s busy in all, whichever replica served what (the 3 s decay between the ends is ~0.3%).
    assert efficiency.gpu_seconds == pytest.approx(6.0, rel=5e-3)
