"""Backpressure behind two real ``litellm`` proxy replicas sharing one redis-server, in front of simulated
inference servers (child processes): the replicas protect one server as one.

Set-up (started once for the module): two proxies with ``litellm_ratebalance.backpressure``, tiers
``[dev, prod]`` (the e2e keys ``sk-dev-*`` and ``sk-prod-*``), the queue on, and two deployments, each on a
simulated server of its own:

* ``gpu-mixed`` (model group ``mixed``): the bench's vLLM-like server (knee 12, a 3,000-token KV cache whose
  overflow fails every running request), with the defaults (learned output estimate, adaptive limit);
* ``gpu-hold`` (model group ``hold``): a 1,000-token KV cache whose answers are as long as their
  ``max_tokens``, with a fixed limit of 8 slots, so a test decides which resource binds.

Tests:

* a short overload of both tiers through both replicas (requests alternate between them, a third without
  ``max_tokens``): no simulated out-of-memory failure, every answer a 200 or a backpressure refusal, and both
  replicas apply the same concurrency limit (the lowest learned one, exchanged every scrape interval);
* a top-tier request waiting in one replica's queue holds back a lower-tier request sent to the *other*
  replica, whose own queue is empty and whose own counts admit it: only the store's shared record of the
  waiting tiers can refuse it. The same request is admitted just before the top-tier one starts waiting.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from litellm_ratebalance.simulate.inference_server import ServerSpec
from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, inference_server_process
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "e2e-bp-replicas"
MIXED = ServerSpec(knee=12, step_seconds=0.02, max_num_seqs=64, memory_tokens=3000, answer_tokens=(50, 300))
HOLD = ServerSpec(knee=12, step_seconds=0.02, max_num_seqs=64, memory_tokens=1000)
HOLD_LIMIT = 8
WORDS = ("the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one")


@pytest.fixture(scope="module")
def mixed_server() -> Iterator[str]:
    with inference_server_process(MIXED) as url:
        yield url


@pytest.fixture(scope="module")
def hold_server() -> Iterator[str]:
    with inference_server_process(HOLD) as url:
        yield url


@pytest.fixture(scope="module")
def pair(proxies: StartProxies, redis_server: RedisServer, mixed_server: str, hold_server: str) -> list[LiteLLMProxy]:
    def deployment(group: str, url: str) -> dict[str, Any]:
        return {
            "model_name": group,
            "litellm_params": {"model": "openai/sim", "api_base": url + "/v1", "api_key": "sk-none", "timeout": 60},
            "model_info": {"id": f"gpu-{group}"},
        }

    config: dict[str, Any] = {
        "model_list": [deployment("mixed", mixed_server), deployment("hold", hold_server)],
        "litellm_settings": {
            "callbacks": ["prometheus", "litellm_ratebalance.backpressure"],
            "require_auth_for_metrics_endpoint": False,
            "ratebalance": {
                "key_prefix": PREFIX,
                "backpressure": {
                    "tiers": ["dev", "prod"],
                    "queue": {"enabled": True, "max_wait_seconds": 10},
                    "deployments": {
                        "gpu-mixed": {"metrics_url": mixed_server + "/metrics", "kv_cache_tokens": MIXED.memory_tokens},
                        "gpu-hold": {
                            "metrics_url": hold_server + "/metrics",
                            "kv_cache_tokens": HOLD.memory_tokens,
                            "initial_limit": HOLD_LIMIT,
                            "min_limit": HOLD_LIMIT,
                            "max_limit": HOLD_LIMIT,
                        },
                    },
                },
            },
        },
        "router_settings": {"num_retries": 0},
    }
    return proxies(config, redis_url=redis_server.url, count=2)


def words(rng: random.Random, n: int) -> str:
    """``n`` three-letter words: the simulator (4 characters a token) and LiteLLM's counter count them alike."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def post(
    client: httpx.AsyncClient, group: str, token: str, content: str, max_tokens: int | None
) -> httpx.Response:
    body: dict[str, Any] = {"model": group, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"})


async def sim_stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        return dict((await client.get(url + "/_sim/stats")).json())


def applied_limit(proxy: LiteLLMProxy, deployment: str) -> float | None:
    """The concurrency limit ``proxy`` applies to ``deployment`` (its gauge on ``/metrics``)."""
    text = httpx.get(proxy.url("/metrics"), follow_redirects=True, timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "litellm_ratebalance_backpressure_concurrency_limit" and sample.labels == {
                "deployment": deployment
            }:
                return float(sample.value)
    return None


def test_overload_through_two_replicas_no_oom_and_one_limit(
    pair: list[LiteLLMProxy], redis_server: RedisServer, mixed_server: str
) -> None:
    rng = random.Random(11)
    # ~3x what the 3,000-token cache serves (about 5 requests of ~600 tokens at once, ~1.5 requests/s).
    arrivals: list[tuple[float, str, str, int | None]] = []
    t = 0.0
    while t < 6.0:
        t += rng.expovariate(4.5)
        token = "sk-prod-1" if rng.random() < 0.2 else "sk-dev-1"
        kind = len(arrivals) % 3
        arrivals.append((t, token, words(rng, rng.randint(100, 600)), (None, 300, 2048)[kind]))

    async def run() -> list[httpx.Response]:
        clients = [p.async_client(timeout=httpx.Timeout(60.0)) for p in pair]
        origin = time.monotonic()

        async def one(index: int, at: float, token: str, content: str, max_tokens: int | None) -> httpx.Response:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - origin)))
            return await post(clients[index % 2], "mixed", token, content, max_tokens)

        try:
            return list(await asyncio.gather(*(one(i, *arrival) for i, arrival in enumerate(arrivals))))
        finally:
            for client in clients:
                await client.aclose()

    responses = asyncio.run(run())
    statuses = [r.status_code for r in responses]
    stats = asyncio.run(sim_stats(mixed_server))
    assert stats["oom_failures"] == 0, (stats, statuses)
    unexplained = [
        (r.status_code, r.text[:300])
        for r in responses
        if r.status_code != 200 and "x-litellm-backpressure-reason" not in r.headers
    ]
    assert not unexplained, unexplained
    assert statuses.count(200) >= len(statuses) // 4, statuses  # the layer serves, it does not just refuse
    assert any(r.status_code != 200 for r in responses), statuses  # it was an overload

    # Every replica applies the lowest of the learned limits the replicas published (each publishes its own
    # every scrape interval, 1 s, and pools the others').
    _, states_key = KeySpace(PREFIX).peer_keys("gpu-mixed")
    store = redis.Redis.from_url(redis_server.url, decode_responses=True)
    seen: tuple[list[float | None], list[int]] = ([], [])
    try:
        for _ in range(30):
            states = cast(dict[str, str], store.hgetall(states_key))
            learned = sorted(int(json.loads(state)["limit"]) for state in states.values())
            limits = [applied_limit(p, "gpu-mixed") for p in pair]
            seen = (limits, learned)
            if len(learned) == 2 and limits == [learned[0], learned[0]]:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"applied limits {seen[0]}, learned limits published {seen[1]}")
    finally:
        store.close()
    for proxy in pair:
        assert "Traceback" not in proxy.log_text(), proxy.log_tail()


def test_top_tier_waiting_in_one_replica_holds_back_lower_tier_in_the_other(
    pair: list[LiteLLMProxy], redis_server: RedisServer, hold_server: str
) -> None:
    first, second = pair
    rng = random.Random(5)
    waiting_key = KeySpace(PREFIX).waiting_tiers("gpu-hold")
    store = redis.Redis.from_url(redis_server.url, decode_responses=True)

    def waiting_tiers() -> list[str]:
        """The live entries ``<rank>:<replica>`` of the deployment's waiting tiers."""
        return [str(member) for member in cast(list[Any], store.zrange(waiting_key, 0, -1))]

    async def run() -> None:
        a, b = first.async_client(), second.async_client()
        try:
            # Two lower-tier requests hold ~550 of the 1,000 tokens for ~6 s (300 tokens at 20 ms); each
            # reserves its prompt + 256 (the default output reserve, nothing learned yet). Lower tier: the
            # first top-tier arrival below is then the only one, so no reserve of slots for the top tier's
            # arrivals refuses the lower tier here (what is tested is the waiting tier alone).
            holders = [asyncio.create_task(post(a, "hold", "sk-dev-1", words(rng, 20), 300)) for _ in range(2)]
            for _ in range(100):
                if (await sim_stats(hold_server))["running"] >= 2:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the two holding requests never ran")
            # Nothing waits: a small lower-tier request on the other replica fits and is admitted.
            before = await post(b, "hold", "sk-dev-1", words(rng, 5), 1)
            assert before.status_code == 200, before.text
            # A top-tier request of ~600 tokens does not fit beside them (cap 0.95 x 1,000): it waits in the
            # first replica's queue, which publishes its tier.
            started = time.monotonic()
            waiter = asyncio.create_task(post(a, "hold", "sk-prod-2", words(rng, 500), 100))
            for _ in range(100):
                if any(m.startswith("1:") for m in waiting_tiers()):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"no top-tier waiting entry in {waiting_key}: {waiting_tiers()}")
            assert not waiter.done()
            # The same small lower-tier request on the second replica (its queue is empty, its counts admit
            # it): refused, because the top tier waits in the first replica.
            during = await post(b, "hold", "sk-dev-2", words(rng, 5), 1)
            assert during.status_code == 503, during.text
            assert during.headers["x-litellm-backpressure-reason"] in ("memory_pressure", "compute_saturation")
            assert "higher priority tier are waiting" in during.text, during.text
            assert not waiter.done()
            # The top-tier request gets the tokens once a holder ends, and nothing ran out of memory.
            served = await waiter
            assert served.status_code == 200, served.text
            assert time.monotonic() - started > 1.0
            for holder in holders:
                assert (await holder).status_code == 200
        finally:
            await a.aclose()
            await b.aclose()

    try:
        asyncio.run(run())
        assert asyncio.run(sim_stats(hold_server))["oom_failures"] == 0
        # The queue emptied: the first replica cleared its entry (or it lapsed), and lower tiers go on.
        for _ in range(80):
            if not any(m.startswith("1:") for m in waiting_tiers()):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the waiting entry outlived the queue")
    finally:
        store.close()
