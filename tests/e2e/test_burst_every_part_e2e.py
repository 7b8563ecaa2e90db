"""A burst through two real proxy replicas leaves every part's shared counts exact, with default store settings:
traffic contracts and routing statistics (300 requests at once), backpressure leases and cost marks (200 at
once on a simulated inference server).

The limiter's own bursts are in tests/e2e/test_bursts_e2e.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from litellm_ratebalance.contracts.policy import window_start
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.view import SyncPlan
from litellm_ratebalance.simulate.inference_server import ServerSpec
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.e2e.bursts import assert_no_store_errors
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, chat_body, inference_server_process, mock_deployment
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "e2e-every-part"
CONTRACT_WINDOW_S = 3600
FEATURE_RPM, BASKET_RPM = 50, 200
KEYS = {"sk-burst": {"metadata": {"feature": "burst-feature"}}}
CONTRACT_BURST = 300
LEASE_BURST = 200
LOCAL_MAX_LIMIT = 8


@pytest.fixture(scope="module")
def inference_server() -> Iterator[str]:
    with inference_server_process(ServerSpec(knee=4, step_seconds=0.01, memory_tokens=8000)) as url:
        yield url


@pytest.fixture(scope="module")
def replicas(proxies: StartProxies, redis_server: RedisServer, inference_server: str) -> list[LiteLLMProxy]:
    config: dict[str, Any] = {
        "model_list": [
            mock_deployment("mixed", model_id="mixed-a", mock_delay=0.3),
            mock_deployment("mixed", model_id="mixed-b", mock_delay=0.3),
            {
                "model_name": "local",
                "litellm_params": {"model": "openai/sim", "api_base": inference_server + "/v1", "api_key": "sk-up"},
                "model_info": {"id": "local-gpu", "backpressure": {"max_limit": LOCAL_MAX_LIMIT}},
            },
        ],
        "litellm_settings": {
            "callbacks": [
                "litellm_ratebalance.traffic_contracts",
                "litellm_ratebalance.backpressure",
                "litellm_ratebalance.rate_balancer",
                "litellm_ratebalance.cost",
            ],
            "ratebalance": {
                "key_prefix": PREFIX,
                "traffic_contracts": {
                    "window_seconds": CONTRACT_WINDOW_S,
                    "counter_ttl_seconds": 2 * CONTRACT_WINDOW_S,
                    "basket": {"rpm": BASKET_RPM},
                    "features": {"burst-feature": {"rpm": FEATURE_RPM}},
                },
                "backpressure": {"tiers": ["dev", "prod"]},
            },
        },
        "router_settings": {"num_retries": 0},
    }
    return proxies(config, redis_url=redis_server.url, keys=KEYS, count=2)


@pytest.fixture(scope="module")
def redis_sync(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    client.close()


async def burst(replicas: list[LiteLLMProxy], model: str, count: int, *tokens: str) -> list[httpx.Response]:
    """``count`` requests at once, alternating between the replicas, and between ``tokens`` (each a key)."""
    clients = [replica.async_client() for replica in replicas]
    try:
        body = chat_body(model, "a" * 200, max_tokens=20)
        return list(
            await asyncio.gather(
                *(
                    clients[i % 2].post(
                        "/v1/chat/completions", headers=replicas[i % 2].auth(tokens[i % len(tokens)]), json=body
                    )
                    for i in range(count)
                )
            )
        )
    finally:
        for client in clients:
            await client.aclose()


def contract_counts(client: redis.Redis) -> dict[str, int]:
    seconds, _ = client.time()
    start = window_start(int(seconds) * 1000, CONTRACT_WINDOW_S)
    raw: dict[bytes, bytes] = client.hgetall(KeySpace(PREFIX).contract_window("rpm", start))  # type: ignore[assignment]
    return {key.decode(): int(value) for key, value in raw.items()}


async def routing_samples(url: str, model_group: str) -> float:
    """Samples of ``model_group`` in the shared routing buckets of the last minute, every deployment."""
    client = aioredis.Redis.from_url(url)
    try:
        store = RedisStore(client, KeySpace(PREFIX))
        plan = SyncPlan(RoutingSettings())
        seconds, micros = await client.time()
        last = (int(seconds) * 1000 + int(micros) // 1000) // plan.bucket_ms
        snapshot = await store.routing_sync(
            model_group,
            {},
            {},
            first_bucket=last - 30,
            last_bucket=last,
            bucket_ms=plan.bucket_ms,
            bucket_ttl_ms=plan.bucket_ttl_ms,
            limits_ttl_ms=plan.limits_ttl_ms,
        )
        return sum(aggregate.count for bucket in snapshot.buckets.values() for aggregate in bucket.values())
    finally:
        await client.aclose()


async def test_contract_counts_and_routing_samples_are_exact_after_a_burst(
    replicas: list[LiteLLMProxy], redis_sync: redis.Redis, redis_server: RedisServer
) -> None:
    if CONTRACT_WINDOW_S - time.time() % CONTRACT_WINDOW_S < 60:
        await asyncio.sleep(CONTRACT_WINDOW_S - time.time() % CONTRACT_WINDOW_S + 0.5)
    before = contract_counts(redis_sync)
    assert not before, "a fresh window: nothing counted yet"

    responses = await burst(replicas, "mixed", CONTRACT_BURST, "sk-burst")

    assert Counter(r.status_code for r in responses) == {200: CONTRACT_BURST}
    # Counted once each in one window whichever replica took it; the k-th request's mode follows exactly.
    assert contract_counts(redis_sync) == {"burst-feature": CONTRACT_BURST, "__basket__": CONTRACT_BURST}
    modes = Counter(r.headers["x-traffic-contract-rpm-mode"] for r in responses)
    assert modes == {
        "normal": FEATURE_RPM,
        "borrowed": BASKET_RPM - FEATURE_RPM,
        "degraded": CONTRACT_BURST - BASKET_RPM,
    }
    # Each answer is one routing sample. A replica writes what it holds when a request of the group comes
    # after its refresh interval (1 s): one more request per replica makes both write the burst's samples.
    # Those two requests' own samples may be written as well, or wait for a later request; a batch written
    # twice would add tens.
    await asyncio.sleep(1.2)
    trailing = await burst(replicas, "mixed", 2, "sk-burst")
    assert [r.status_code for r in trailing] == [200, 200]
    seen = 0.0
    for _ in range(50):
        seen = await routing_samples(redis_server.url, "mixed")
        if seen >= CONTRACT_BURST:
            break
        await asyncio.sleep(0.2)
    assert CONTRACT_BURST <= seen <= CONTRACT_BURST + len(trailing)
    assert_no_store_errors(replicas)


async def test_leases_and_cost_marks_are_exact_after_a_burst_on_a_local_server(
    replicas: list[LiteLLMProxy], redis_server: RedisServer, inference_server: str
) -> None:
    async with httpx.AsyncClient() as client:
        await client.post(inference_server + "/_sim/reset")

    responses = await burst(replicas, "local", LEASE_BURST, "sk-prod-1", "sk-dev-1")

    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 429, 503} and statuses[200] >= LOCAL_MAX_LIMIT, statuses
    async with httpx.AsyncClient() as client:
        stats = (await client.get(inference_server + "/_sim/stats")).json()
    # One server, two replicas: the shared leases never let more than the limit run, nothing ran out of
    # KV cache, and every admitted request ran exactly once.
    assert stats["peak_running"] <= LOCAL_MAX_LIMIT
    assert stats["oom_failures"] == 0
    assert stats["completed"] == statuses[200]
    # Every lease was given back exactly once (none left to lapse), and the cost clock counts none in flight.
    store_client = aioredis.Redis.from_url(redis_server.url)
    try:
        store = RedisStore(store_client, KeySpace(PREFIX))
        snapshot = await store.concurrency_snapshot("local-gpu")
        for _ in range(50):
            if snapshot.inflight == 0:
                break
            await asyncio.sleep(0.1)
            snapshot = await store.concurrency_snapshot("local-gpu")
        assert (snapshot.inflight, snapshot.reserved_tokens) == (0, 0)
        in_flight_by_cost_clock = await store_client.hget(KeySpace(PREFIX).cost_state("local-gpu"), "n")
        assert in_flight_by_cost_clock == b"0"
    finally:
        await store_client.aclose()
    assert_no_store_errors(replicas)
