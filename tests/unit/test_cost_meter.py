"""The cost meter's bookkeeping around backpressure's leases, on the embedded store with explicit times."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from litellm.proxy._types import UserAPIKeyAuth

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
