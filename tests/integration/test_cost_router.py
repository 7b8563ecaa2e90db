"""Cost attribution through the real hooks of a ``litellm.Router``: backpressure (local deployment, the simulated
inference server) and the cost callback (an API deployment with LiteLLM's mock response and its cost map).

What is checked: the counters move with the labels the caller's identity gives (priority from team then key
metadata, team, feature from key metadata), local requests are charged GPU-seconds that add up to at least the
simulated engine's busy time and at most the wall time, priced GPU time and LiteLLM's response cost land in
the USD counter by source, tokens reserved and used, and nothing is left open. No timed assertions: the bounds
hold whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import litellm
import pytest
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.cost import CostCallback, CostMeter, cost_meter
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec
from litellm_ratebalance.store import MemoryStore
from litellm_ratebalance.store.metering import MeterEnd
from tests.integration.contracts_support import sample

P = "litellm_ratebalance_"
GPU_HOUR_USD = 7.2
GPUS = 2.0
# Team and feature names of this test only: the Prometheus registry is shared by every test in the process.
PROD = UserAPIKeyAuth(
    token="k-cost-prod",
    team_id="team-cost-prod",
    team_metadata={"priority": "prod"},
    metadata={"priority": "dev", "feature": "cost-search"},
)
DEV = UserAPIKeyAuth(token="k-cost-dev", metadata={"priority": "dev"})


def process_meter() -> CostMeter:
    """The cost meter of the process runtime (the lease meter backpressure marks)."""
    meter = cost_meter()
    assert meter is not None
    return meter


def value(name: str, **labels: str) -> float:
    return sample(P + name, labels)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Router, InferenceServer]]:
    saved = list(litellm.callbacks)
    reset_runtime()
    settings = parse_settings(
        {
            "ratebalance": {
                "backpressure": {"tiers": ["dev", "prod"], "deployments": {"cost-gpu": {"max_limit": 8}}},
                "traffic_contracts": {"features": {"cost-search": {"rpm": 1000}}},
                "cost": {"gpu_hour_usd": GPU_HOUR_USD, "deployments": {"cost-gpu": {"gpus": GPUS}}},
            }
        }
    )
    configure(settings=settings, store=MemoryStore())
    server = await InferenceServer(ServerSpec(knee=4, step_seconds=0.01, memory_tokens=8000)).start()
    model_list = [
        {
            "model_name": "local",
            "litellm_params": {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"},
            "model_info": {"id": "cost-gpu"},
        },
        {
            "model_name": "api",
            "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-none", "mock_response": "Hello!"},
            "model_info": {"id": "cost-api"},
        },
    ]
    backpressure = BackpressureCallback()
    litellm.callbacks = [backpressure, CostCallback()]
    yield Router(model_list=model_list, num_retries=0), server
    await backpressure.aclose()
    await server.stop()
    litellm.callbacks = saved


async def ask(router: Router, model: str, who: UserAPIKeyAuth, max_tokens: int) -> Any:
    return await router.acompletion(
        model=model,
        messages=[{"role": "user", "content": "a" * 200}],
        max_tokens=max_tokens,
        metadata={"user_api_key_auth": who},
    )


async def test_counters_move_with_the_callers_labels(setup: tuple[Router, InferenceServer]) -> None:
    router, server = setup
    prod_gpu = {"deployment": "cost-gpu", "priority": "prod", "team": "team-cost-prod", "feature": "cost-search"}
    dev_gpu = {"deployment": "cost-gpu", "priority": "dev", "team": "none", "feature": "unassigned"}
    prod_labels = {k: v for k, v in prod_gpu.items() if k != "deployment"}
    before = {
        "prod": value("gpu_seconds_total", **prod_gpu),
        "dev": value("gpu_seconds_total", **dev_gpu),
        "gpu_usd": value("cost_usd_total", **prod_labels, source="gpu"),
        "api_usd": value("cost_usd_total", **prod_labels, source="api"),
        "used": value("cost_tokens_total", **prod_labels, kind="used"),
        "reserved": value("cost_tokens_total", **prod_labels, kind="reserved"),
    }
    server.reset()
    started = time.monotonic()
    local = await asyncio.gather(
        *(ask(router, "local", PROD, 30) for _ in range(3)), *(ask(router, "local", DEV, 30) for _ in range(2))
    )
    wall = time.monotonic() - started
    api = [await ask(router, "api", PROD, 20) for _ in range(2)]
    await asyncio.sleep(0.5)  # LiteLLM's success events run after the responses return
    for _ in range(50):
        if value("cost_usd_total", **prod_labels, source="api") > before["api_usd"]:
            break
        await asyncio.sleep(0.1)

    prod = value("gpu_seconds_total", **prod_gpu) - before["prod"]
    dev = value("gpu_seconds_total", **dev_gpu) - before["dev"]
    assert prod > 0 and dev > 0
    # Every instant the engine works on a request, that request holds its slot: the shares (per GPU) add up
    # to at least the engine's busy time (1 ms of clock rounding per mark allowed) and never to more than the
    # wall time the requests were in flight.
    assert (prod + dev) / GPUS >= server.stats.busy_seconds - 0.002 * 2 * len(local)
    assert (prod + dev) / GPUS <= wall + 0.01
    assert value("cost_usd_total", **prod_labels, source="gpu") - before["gpu_usd"] == pytest.approx(
        prod * GPU_HOUR_USD / 3600
    )
    api_cost = sum(float(r._hidden_params["response_cost"]) for r in api)
    assert api_cost > 0
    assert value("cost_usd_total", **prod_labels, source="api") - before["api_usd"] == pytest.approx(api_cost)
    # The local deployment's calls are never charged LiteLLM's cost as well.
    assert value("cost_usd_total", priority="dev", team="none", feature="unassigned", source="api") == 0.0
    used = sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in local[:3])
    assert value("cost_tokens_total", **prod_labels, kind="used") - before["used"] == used
    assert value("cost_tokens_total", **prod_labels, kind="reserved") - before["reserved"] > 0
    assert process_meter().open_requests == 0


def total(name: str) -> float:
    """Sum of every sample of a counter family (all label sets)."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == P + name
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def test_a_disabled_cost_part_meters_nothing(setup: tuple[Router, InferenceServer]) -> None:
    router, _ = setup
    settings = parse_settings({"ratebalance": {"cost": {"enabled": False}, "backpressure": {"tiers": ["dev"]}}})
    configure(settings=settings)
    before = (total("gpu_seconds"), total("cost_tokens"))
    response = await ask(router, "local", DEV, 5)
    assert response.usage.completion_tokens == 5  # served by the local deployment, through backpressure
    assert (total("gpu_seconds"), total("cost_tokens")) == before
    assert process_meter().open_requests == 0


async def test_a_flood_of_bogus_names_creates_a_bounded_set_of_series() -> None:
    """Hostile identities (a new team, priority and feature each, in key and team metadata and in the request
    body) through the API-cost path: label values stay within the configured names plus a fixed few."""
    reset_runtime()
    configure(
        settings=parse_settings(
            {
                "priority_reservation": {"cost-flood-prod": 1.0},
                "ratebalance": {
                    "traffic_contracts": {"features": {"cost-flood-feature": {"rpm": 10}}},
                    "cost": {"max_teams": 3},
                },
            }
        ),
        store=MemoryStore(),
    )
    meter = process_meter()
    for index in range(300):
        who = UserAPIKeyAuth(
            token=f"k-flood-{index}",
            team_id=f"cost-flood-team-{index}",
            team_metadata={"priority": f"bogus-{index}"} if index % 2 else None,
            metadata={"priority": "cost-flood-prod" if index % 3 == 0 else f"p-{index}", "feature": f"f-{index}"},
        )
        kwargs = {
            "metadata": {"user_api_key_auth": who, "feature": "cost-flood-feature", "traffic_contract_feature": "x"},
            "standard_logging_object": {"response_cost": 0.001, "model_id": f"api-{index}"},
        }
        assert meter.api_cost(kwargs, None) == 0.001
    flood = [
        dict(sample.labels)
        for family in REGISTRY.collect()
        if family.name == P + "cost_usd"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["team"].startswith(("cost-flood-team-", "other"))
    ]
    assert {labels["team"] for labels in flood} == {
        "cost-flood-team-0",
        "cost-flood-team-1",
        "cost-flood-team-2",
        "other",
    }
    assert {labels["priority"] for labels in flood} == {"cost-flood-prod", "default"}
    assert {labels["feature"] for labels in flood} == {"unassigned"}  # the body's and unknown names are not trusted
    assert {labels["source"] for labels in flood} == {"api"}


async def test_the_request_may_name_its_feature_only_when_the_contracts_trust_it() -> None:
    reset_runtime()
    contracts: dict[str, Any] = {"features": {"cost-trusted": {"rpm": 10}}, "trust_request_feature": True}
    configure(settings=parse_settings({"ratebalance": {"traffic_contracts": contracts}}), store=MemoryStore())
    kwargs = {
        "metadata": {"user_api_key_auth": DEV, "feature": "cost-trusted"},
        "standard_logging_object": {"response_cost": 0.5, "model_id": "api-x"},
    }
    labels = {"priority": "default", "team": "none", "feature": "cost-trusted", "source": "api"}
    before = value("cost_usd_total", **labels)
    assert process_meter().api_cost(kwargs, None) == 0.5
    assert value("cost_usd_total", **labels) - before == 0.5


class ReleaseDown(MemoryStore):
    """Leases are taken; giving one back fails (a Redis fault at the end of the request, where its end mark
    rides)."""

    async def lease_release(self, deployment_id: str, lease_id: str, meter: MeterEnd | None = None) -> Any:
        raise StoreError("redis down (test)")


async def test_a_store_fault_leaves_the_request_served_and_unmetered(setup: tuple[Router, InferenceServer]) -> None:
    router, _ = setup
    configure(store=ReleaseDown())
    faults = value("store_errors_total", component="backpressure", mode="open")
    before = total("gpu_seconds")
    response = await ask(router, "local", DEV, 5)
    assert response.usage.completion_tokens == 5
    for _ in range(50):  # the release runs in the success event, after the response
        if value("store_errors_total", component="backpressure", mode="open") > faults:
            break
        await asyncio.sleep(0.02)
    assert value("store_errors_total", component="backpressure", mode="open") == faults + 1
    assert total("gpu_seconds") == before
    assert process_meter().open_requests == 0
