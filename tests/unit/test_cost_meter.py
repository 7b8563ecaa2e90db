"""The cost meter's bookkeeping around backpressure's leases, on the embedded store with explicit times.

The marks ride on the lease operations; these tests drive them the way backpressure does: ``start_mark`` into
``lease_acquire``, ``lease_started`` with the mark it returned, ``end_mark`` into ``lease_release`` and
``lease_ended`` with the end mark.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from litellm.proxy._types import UserAPIKeyAuth
from prometheus_client import REGISTRY

from litellm_ratebalance.attribution import Mark
from litellm_ratebalance.proxy.cost import CostMeter
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import MemoryStore
from litellm_ratebalance.store.metering import CostMark


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    reset_runtime()
    yield Clock()
    reset_runtime()


def request(priority: str) -> dict[str, Any]:
    return {"metadata": {"user_api_key_auth": UserAPIKeyAuth(token="k", metadata={"priority": priority})}}


async def start(store: MemoryStore, meter: CostMeter, lease: str, deployment: str = "gpu1") -> None:
    taken = await store.lease_acquire(deployment, lease, slot_cap=8, ttl_ms=600_000, meter=meter.start_mark(deployment))
    assert taken.acquired
    meter.lease_started(deployment, lease, taken.cost)


async def end(store: MemoryStore, meter: CostMeter, lease: str, priority: str, deployment: str = "gpu1") -> None:
    meter.lease_usage(lease, SimpleNamespace(usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1)))
    released = await store.lease_release(deployment, lease, meter.end_mark(lease))
    meter.lease_ended(lease, request(priority), 2, released.cost)


def gpu_seconds(priority: str) -> float:
    labels = {"deployment": "gpu1", "team": "none", "feature": "unassigned", "priority": priority}
    return REGISTRY.get_sample_value("litellm_ratebalance_gpu_seconds_total", labels) or 0.0


async def test_a_request_is_marked_with_its_lease_and_charged_its_busy_time(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    configure(settings=parse_settings({"ratebalance": {"backpressure": {"tiers": ["dev"]}}}), store=store)
    meter = CostMeter(clock=clock)
    before = gpu_seconds("dev")
    await start(store, meter, "lease-a")
    assert meter.open_requests == 1 and meter.is_local("gpu1") and not meter.is_local("api")
    clock.now += 2.5
    meter.lease_usage("lease-a", SimpleNamespace(usage=SimpleNamespace(prompt_tokens=7, completion_tokens=3)))
    released = await store.lease_release("gpu1", "lease-a", meter.end_mark("lease-a"))
    meter.lease_ended("lease-a", request("dev"), 40, released.cost)
    assert meter.open_requests == 0
    assert gpu_seconds("dev") - before == pytest.approx(2.5)  # alone for 2.5 s on one GPU
    efficiency = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert efficiency is not None
    assert efficiency.gpu_seconds == pytest.approx(2.5)
    assert efficiency.output_tokens == pytest.approx(3)


async def test_cost_off_asks_for_no_mark_and_keeps_nothing(clock: Clock) -> None:
    configure(settings=parse_settings({"ratebalance": {"cost": {"enabled": False}}}), store=MemoryStore(clock=clock))
    meter = CostMeter(clock=clock)
    assert meter.start_mark("gpu1") is None
    meter.lease_started("gpu1", "a", CostMark(Mark(1, 0.0), None, 1))
    assert meter.open_requests == 0 and meter.end_mark("a") is None and not meter.is_local("gpu1")


async def test_an_end_without_a_start_mark_or_a_failed_release_charges_nothing(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    configure(settings=parse_settings({}), store=store)
    meter = CostMeter(clock=clock)
    before = gpu_seconds("default")
    assert meter.end_mark("never-started") is None
    meter.lease_ended("never-started", request("dev"), 10, None)
    meter.lease_started("gpu1", "unmarked", None)  # the acquire returned no mark (fail open without a lease)
    assert meter.open_requests == 0 and meter.end_mark("unmarked") is None
    await start(store, meter, "lease-b")
    assert meter.end_mark("lease-b") is not None
    meter.lease_ended("lease-b", request("dev"), 10, None)  # the release failed: unmetered, forgotten
    assert meter.open_requests == 0
    assert gpu_seconds("default") == before


async def test_entries_whose_end_never_came_are_forgotten_after_the_lease_max_age(clock: Clock) -> None:
    settings = parse_settings({"ratebalance": {"backpressure": {"lease_max_age_seconds": 60}}})
    store = MemoryStore(clock=clock)
    configure(settings=settings, store=store)
    meter = CostMeter(clock=clock)
    await start(store, meter, "lost")
    clock.now += 61
    await start(store, meter, "next")
    assert meter.open_requests == 1  # "lost" is gone, "next" is open


async def test_two_replicas_share_one_deployments_busy_time_through_the_store(clock: Clock) -> None:
    """Two meters (two proxy replicas) on one store: each request's share counts the other replica's requests."""
    store = MemoryStore(clock=clock)
    configure(settings=parse_settings({"ratebalance": {"backpressure": {"tiers": ["dev", "prod"]}}}), store=store)
    replica_a, replica_b = CostMeter(clock=clock), CostMeter(clock=clock)
    before = {p: gpu_seconds(p) for p in ("prod", "dev")}
    await start(store, replica_a, "a")  # t=100
    clock.now += 1.0
    await start(store, replica_b, "b")  # t=101: two in flight, one on each replica
    clock.now += 2.0
    await end(store, replica_a, "a", "prod")  # t=103: a had 1 s alone and 2 s shared
    clock.now += 3.0
    await end(store, replica_b, "b", "dev")  # t=106: b had 2 s shared and 3 s alone
    charged = {p: gpu_seconds(p) - before[p] for p in before}
    assert charged["prod"] == pytest.approx(1.0 + 2.0 / 2)
    assert charged["dev"] == pytest.approx(2.0 / 2 + 3.0)
    efficiency = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert efficiency is not None
    # 6 s busy in all, whichever replica served what (the 3 s decay between the ends is ~0.3%).
    assert efficiency.gpu_seconds == pytest.approx(6.0, rel=5e-3)
