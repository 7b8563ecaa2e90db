"""Two rate balancers (two proxy replicas) sharing the real redis-server route from one picture."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio as aioredis

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.conftest import fresh_redis_client
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.redis

CANDIDATES = (Candidate("fast"), Candidate("mid"), Candidate("slow"))
RATES = {"fast": 120.0, "mid": 90.0, "slow": 40.0}


def routing(**overrides: object) -> RoutingSettings:
    # The shared picture only: each replica's own requests in flight and its load fit are local by design
    # (they adjust its live weights until its requests finish), so they are off where replicas are compared.
    base: dict[str, object] = {"refresh_interval": 0.05, "in_flight_evidence": False, "load_aware": False}
    base.update(overrides)
    return RoutingSettings(**base)  # type: ignore[arg-type]


async def replica(server: RedisServer, seed: int) -> tuple[RateBalancer, aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url)
    return RateBalancer(RedisStore(client, KeySpace("rbtest")), routing(), rng=random.Random(seed)), client


async def test_two_replicas_converge_on_the_same_weights(redis_server: RedisServer) -> None:
    await (await fresh_redis_client(redis_server)).aclose()
    (one, c1), (two, c2) = await replica(redis_server, 1), await replica(redis_server, 2)
    rng = random.Random(0)
    try:
        # Each replica routes and records its own traffic; neither sees the other's samples directly.
        for _ in range(3):
            for balancer in (one, two):
                for _ in range(40):
                    name = CANDIDATES[balancer.choose("g", CANDIDATES)].id
                    rate = max(1.0, rng.gauss(RATES[name], RATES[name] * 0.1))
                    balancer.record("g", name, latency=1.0, output_tokens=round(rate))
            await asyncio.sleep(0.06)  # past the refresh interval: the next choose starts a sync
        # Flush both, then read both again: each sees the union of the samples.
        await one.refresh("g")
        await two.refresh("g")
        await one.refresh("g")
        w1, w2 = one.weights("g", CANDIDATES), two.weights("g", CANDIDATES)
        # The same picture; the recency weights differ only by the few ms between the two syncs.
        assert w1 == pytest.approx(w2, abs=1e-6)
        assert w1["fast"] > w1["mid"] > w1["slow"]
        e1, e2 = one.estimates("g", CANDIDATES), two.estimates("g", CANDIDATES)
        assert sum(e.requests_last_minute for e in e1.values()) == 240
        assert {n: e.requests_last_minute for n, e in e1.items()} == {n: e.requests_last_minute for n, e in e2.items()}
        assert {n: e.samples for n, e in e1.items()} == pytest.approx({n: e.samples for n, e in e2.items()}, rel=1e-2)
    finally:
        await one.aclose()
        await two.aclose()
        await c1.aclose()
        await c2.aclose()


async def test_a_new_replica_starts_from_the_shared_picture(redis_server: RedisServer) -> None:
    await (await fresh_redis_client(redis_server)).aclose()
    (old, c1), (new, c2) = await replica(redis_server, 3), await replica(redis_server, 4)
    try:
        for name, rate in RATES.items():
            for i in range(20):
                old.record("g", name, latency=1.0, output_tokens=round(rate + i % 5))
        await old.refresh("g")
        assert new.weights("g", CANDIDATES) == pytest.approx({"fast": 1 / 3, "mid": 1 / 3, "slow": 1 / 3})
        await new.refresh("g")
        assert new.weights("g", CANDIDATES) == pytest.approx(old.weights("g", CANDIDATES), abs=1e-6)
        assert new.weights("g", CANDIDATES)["fast"] > 0.6
    finally:
        await c1.aclose()
        await c2.aclose()


async def test_an_unreachable_redis_keeps_routing_and_reports() -> None:
    errors: list[BaseException] = []
    client = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    balancer = RateBalancer(RedisStore(client, KeySpace("rbtest")), routing(), on_store_error=errors.append)
    try:
        for _ in range(20):
            index = balancer.choose("g", CANDIDATES)
            balancer.record("g", CANDIDATES[index].id, latency=1.0, output_tokens=50)
        await balancer.refresh("g")
        assert errors and all(isinstance(e, StoreError) for e in errors)
        assert sum(balancer.weights("g", CANDIDATES).values()) == pytest.approx(1.0)
    finally:
        await client.aclose()
