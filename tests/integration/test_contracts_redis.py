"""Traffic contracts on a real redis-server: two proxy instances counting concurrently, and Redis going
away and coming back in the middle of a run."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from litellm_ratebalance.proxy.contracts import TrafficContractsCallback
from litellm_ratebalance.proxy.tokens import estimate_tokens
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.integration.contracts_support import (
    auth,
    call,
    finish,
    headers_of,
    make_callback,
    request,
    requests_total,
    room_in_window,
    sample,
)
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

WINDOW, TTL = 3600, 7200


def _client(url: str) -> Any:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=50, timeout=5, socket_timeout=5, socket_connect_timeout=2
    )
    return aioredis.Redis(connection_pool=pool)


async def _two_instances(redis_client: Any, url: str, contracts: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Two callbacks, each with its own RedisStore and connection pool, on the same server."""
    other = _client(url)
    keys = KeySpace("rbconc")
    callbacks = [make_callback(RedisStore(client, keys), contracts) for client in (redis_client, other)]
    return other, callbacks


async def _burst(callbacks: list[TrafficContractsCallback], feature: str, count: int) -> list[tuple[Any, Any]]:
    """``count`` concurrent requests, alternating between the instances; (request data, 429/503 or None)."""
    datas = [request() for _ in range(count)]
    results = await asyncio.gather(
        *(call(callbacks[index % len(callbacks)], data, auth(feature)) for index, data in enumerate(datas))
    )
    return list(zip(datas, results, strict=True))


async def test_concurrent_requests_from_two_instances_get_exact_modes(
    redis_client: aioredis.Redis, redis_server: RedisServer
) -> None:
    await room_in_window(WINDOW, margin=10)
    estimate = estimate_tokens("m", request(), "total", 256, 4096)
    contracts = {
        "window_seconds": WINDOW,
        "counter_ttl_seconds": TTL,
        "basket": {"rpm": 60, "tpm": 50 * estimate},
        "features": {"smart-window": {"rpm": 20, "tpm": 30 * estimate}},
    }
    other, callbacks = await _two_instances(redis_client, redis_server.url, contracts)
    try:
        results = await _burst(callbacks, "smart-window", 100)
        assert all(refused is None for _, refused in results)  # observe only: all served
        rpm = Counter(data["metadata"]["traffic_contract_rpm_mode"] for data, _ in results)
        tpm = Counter(data["metadata"]["traffic_contract_tpm_mode"] for data, _ in results)
        # The contract implies, whatever the interleaving: requests 1-20 of the window normal, 21-60
        # borrowed (feature over, basket not), 61-100 degraded; by tokens (none reconciled yet) 30 / 20 / 50.
        assert rpm == {"normal": 20, "borrowed": 40, "degraded": 40}
        assert tpm == {"normal": 30, "borrowed": 20, "degraded": 50}
        window = await callbacks[0]._runtime().store().contract_window(WINDOW)
        assert window is not None
        assert window.requests == {"smart-window": 100, "__basket__": 100}
        assert window.in_flight["__basket__"] == 100 * estimate

        # Each instance reconciles the requests it admitted; nothing is lost or counted twice.
        await asyncio.gather(*(finish(callbacks[index % 2], data, 7) for index, (data, _) in enumerate(results)))
        window = await callbacks[1]._runtime().store().contract_window(WINDOW)
        assert window is not None
        assert window.tokens["__basket__"] == 700 and window.in_flight["__basket__"] == 0
    finally:
        await other.aclose()


async def test_concurrent_rejections_leave_exactly_the_basket(
    redis_client: aioredis.Redis, redis_server: RedisServer
) -> None:
    await room_in_window(WINDOW, margin=10)
    contracts = {
        "window_seconds": WINDOW,
        "counter_ttl_seconds": TTL,
        "basket": {"rpm": 60},
        "features": {"smart-window": {"rpm": 20}},
        "enforcement": {"degraded": "reject"},
    }
    other, callbacks = await _two_instances(redis_client, redis_server.url, contracts)
    try:
        results = await _burst(callbacks, "smart-window", 100)
        statuses = Counter(None if refused is None else refused.status_code for _, refused in results)
        assert statuses == {None: 60, 429: 40}
        served = Counter(data["metadata"]["traffic_contract_rpm_mode"] for data, refused in results if refused is None)
        assert served == {"normal": 20, "borrowed": 40}
        window = await callbacks[0]._runtime().store().contract_window(WINDOW)
        assert window is not None and window.requests["__basket__"] == 60
    finally:
        await other.aclose()


# -- Redis going away ---------------------------------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this module's own: these tests stop and restart it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def outage_client(own_redis: RedisServer) -> AsyncIterator[Any]:
    client = _client(own_redis.url)
    yield client
    await client.aclose()


OUTAGE_CONTRACTS = {
    "window_seconds": WINDOW,
    "counter_ttl_seconds": TTL,
    "basket": {"rpm": 1000},
    "features": {"s2s": {"rpm": 1000}},
}


def _outage_callback(client: Any, **overrides: Any) -> TrafficContractsCallback:
    # A short circuit-breaker cool-down so the test runs fast. The outage is a kill (refused connections fail
    # at once), so the timeout only keeps slow calls on a loaded machine from failing open and losing counts.
    store = RedisStore(client, KeySpace("rbout"), cooldown_seconds=0.2)
    return make_callback(store, {**OUTAGE_CONTRACTS, **overrides})


async def test_redis_down_mid_run_fails_open_and_counting_resumes(own_redis: RedisServer, outage_client: Any) -> None:
    await room_in_window(WINDOW, margin=20)
    callback = _outage_callback(outage_client)
    errors = {"component": "traffic_contracts", "mode": "open"}
    errors_before = sample("litellm_ratebalance_store_errors_total", errors)
    unknown_before = requests_total("s2s", "unknown", "unknown")
    modes: list[str] = []
    admitted_before_outage: list[dict[str, Any]] = []
    for index in range(60):
        if index == 20:
            own_redis.stop()
            # Requests counted before the outage report back during it: their reconcile fails quietly.
            for data in admitted_before_outage:
                await finish(callback, data, 5)
        if index == 40:
            own_redis.start()  # same port, empty (no persistence), script cache gone
            await asyncio.sleep(0.3)  # past the circuit breaker's cool-down
        data = request()
        assert await call(callback, data, auth("s2s")) is None  # always served
        modes.append((await headers_of(callback, data))["x-traffic-contract-rpm-mode"])
        if index < 20:
            admitted_before_outage.append(data)
        await asyncio.sleep(0.01)

    assert modes[:20] == ["normal"] * 20
    assert modes[20:40] == ["unknown"] * 20
    assert modes[40:] == ["normal"] * 20
    # 20 refused admissions and 20 failed reconciles, each counted as a store error.
    assert sample("litellm_ratebalance_store_errors_total", errors) == errors_before + 40
    assert requests_total("s2s", "unknown", "unknown") == unknown_before + 20
    # Counting resumed on the restarted (empty) server: exactly the 20 requests after it came back.
    window = await callback._runtime().store().contract_window(WINDOW)
    assert window is not None and window.requests == {"s2s": 20, "__basket__": 20}


async def test_redis_down_with_fail_closed_is_503(own_redis: RedisServer, outage_client: Any) -> None:
    callback = _outage_callback(outage_client, fail_open=False)
    assert await call(callback, request(), auth("s2s")) is None
    own_redis.stop()
    refused = [await call(callback, request(), auth("s2s")) for _ in range(3)]
    assert all(r is not None and r.status_code == 503 for r in refused)
    own_redis.start()
    await asyncio.sleep(0.3)
    assert await call(callback, request(), auth("s2s")) is None
