"""PriorityRateLimiter through its hooks, on both store backends (the real redis-server for Redis)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from litellm_ratebalance.store import MemoryStore, RedisStore
from tests.integration.limiter_support import auth, call, finish, make_limiter, make_router, request
from tests.servers import RedisServer

pytestmark = pytest.mark.redis


async def test_unlimited_model_is_not_counted(store: MemoryStore | RedisStore) -> None:
    limiter = make_limiter(store, make_router())
    for _ in range(5):
        assert await call(limiter, request(), auth()) is None


async def test_rpm_429_has_message_and_headers(store: MemoryStore | RedisStore) -> None:
    limiter = make_limiter(store, make_router(rpm=2))
    assert await call(limiter, request(), auth()) is None
    assert await call(limiter, request(), auth()) is None
    refused = await call(limiter, request(), auth())
    assert refused is not None and refused.status_code == 429
    message = cast(dict[str, str], refused.detail)["error"]  # FastAPI types detail as str; the hooks send a dict
    assert message.startswith("Model capacity reached for m. Priority: None, Rate limit type: requests")
    assert "Model TPM: not configured, Model RPM: 2, Remaining: 0" in message
    headers = refused.headers or {}
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-litellm-priority"] == "default"


async def test_admitted_request_carries_headers_for_the_response(store: MemoryStore | RedisStore) -> None:
    limiter = make_limiter(store, make_router(tpm=1000, rpm=10))
    data = request(max_tokens=50)
    assert await call(limiter, data, auth()) is None
    headers = await limiter.async_post_call_response_headers_hook(data, auth(), object())
    assert headers is not None
    assert headers["x-ratelimit-remaining-requests"] == "9"
    remaining_tokens = int(headers["x-ratelimit-remaining-tokens"])
    assert 1000 - 50 - 20 <= remaining_tokens <= 1000 - 50
    assert float(headers["x-litellm-saturation"]) == 0.0


async def test_priority_pool_strict_message(store: MemoryStore | RedisStore) -> None:
    settings = {
        "priority_reservation": {"prod": 0.9, "dev": 0.1},
        "priority_reservation_settings": {"saturation_threshold": 0.5},
    }
    limiter = make_limiter(store, make_router(rpm=10), settings)
    results = [await call(limiter, request(), auth("dev")) for _ in range(7)]
    admitted = [r is None for r in results]
    # Lenient until 5/10; then strict caps dev at 1 request (it already has 5).
    assert admitted == [True] * 5 + [False] * 2
    refused = results[-1]
    assert refused is not None
    message = cast(dict[str, str], refused.detail)["error"]  # FastAPI types detail as str; the hooks send a dict
    assert message.startswith("Priority-based rate limit exceeded. Model: m, Priority: dev, Rate limit type: requests")
    assert message.endswith("Model saturation: 50.0%")
    # prod is still within its 9.
    assert all([await call(limiter, request(), auth("prod")) is None for _ in range(4)])


async def test_team_priority_wins_over_key_priority(store: MemoryStore | RedisStore) -> None:
    settings = {"priority_reservation": {"prod": 0.9, "dev": 0.1}}
    limiter = make_limiter(store, make_router(rpm=10), settings)
    data = request()
    await call(limiter, data, auth("dev", team_priority="prod"))
    headers = await limiter.async_post_call_response_headers_hook(data, auth(), object())
    assert headers is not None and headers["x-litellm-priority"] == "prod"


async def test_tokens_are_reconciled_to_actual_usage(store: MemoryStore | RedisStore) -> None:
    limiter = make_limiter(
        store, make_router(tpm=100), {"ratebalance": {"limiter": {"token_rate_limit_type": "output"}}}
    )
    first = request(max_tokens=60)
    assert await call(limiter, first, auth()) is None
    assert await call(limiter, request(max_tokens=60), auth()) is not None  # 60 + 60 > 100
    await finish(limiter, first, 20)  # actual output: 10 completion tokens (half of 20)
    assert await call(limiter, request(max_tokens=60), auth()) is None  # 10 + 60 <= 100


async def test_failure_releases_tokens_and_success_after_failure_still_counts(store: MemoryStore | RedisStore) -> None:
    limiter = make_limiter(
        store, make_router(tpm=100), {"ratebalance": {"limiter": {"token_rate_limit_type": "output"}}}
    )
    data = request(max_tokens=80)
    assert await call(limiter, data, auth()) is None
    await limiter.async_log_failure_event({"litellm_params": {"metadata": data["metadata"]}}, None, None, None)
    assert await call(limiter, request(max_tokens=80), auth()) is None  # the 80 came back
    # A retry of the first request then succeeded using 40 output tokens: they count (80 + 40 > 100).
    await finish(limiter, data, 80)
    assert await call(limiter, request(max_tokens=30), auth()) is not None
    # Settling twice is a no-op.
    await finish(limiter, data, 80)
    snapshot = await store.admission_snapshot("m", 60_000)
    assert snapshot is not None and snapshot.tokens == 120


async def test_two_instances_sharing_redis_admit_exactly_rpm(redis_server: RedisServer) -> None:
    import redis.asyncio as aioredis

    router = make_router(rpm=50)
    pools = [aioredis.BlockingConnectionPool.from_url(redis_server.url, max_connections=40) for _ in range(2)]
    clients = [aioredis.Redis(connection_pool=pool) for pool in pools]
    await clients[0].flushdb()
    limiters = [make_limiter(RedisStore(client), router) for client in clients]
    results = await asyncio.gather(*(call(limiters[i % 2], request(), auth()) for i in range(200)))
    assert sum(r is None for r in results) == 50
    assert all(r.status_code == 429 for r in results if r is not None)
    for client in clients:
        await client.aclose()


async def test_store_fault_fails_open_by_default_and_closed_when_asked() -> None:
    import redis.asyncio as aioredis

    from tests.servers import free_port

    dead = RedisStore(aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2))
    router = make_router(rpm=1)
    open_limiter = make_limiter(dead, router)
    assert await call(open_limiter, request(), auth()) is None
    assert await call(open_limiter, request(), auth()) is None
    closed_limiter = make_limiter(dead, router, {"ratebalance": {"fail_mode": "closed"}})
    refused = await call(closed_limiter, request(), auth())
    assert refused is not None and refused.status_code == 503
    assert "fail_mode is 'closed'" in cast(dict[str, str], refused.detail)["error"]  # detail: a dict (see above)


async def test_tpm_holds_under_concurrency_within_estimation_error(redis_server: RedisServer) -> None:
    """Two instances, 120 concurrent requests in flight at once, tpm 1000, max_tokens given.

    Actual usage differs from the reservation by a per-request error (the prompt count of a provider's
    tokenizer, a shorter answer); tokens served may exceed the limit by at most the positive errors of
    the requests admitted.
    """
    import random

    import redis.asyncio as aioredis

    rng = random.Random(7)
    router = make_router(tpm=1000)
    pools = [aioredis.BlockingConnectionPool.from_url(redis_server.url, max_connections=40) for _ in range(2)]
    clients = [aioredis.Redis(connection_pool=pool) for pool in pools]
    await clients[0].flushdb()
    limiters = [make_limiter(RedisStore(client), router) for client in clients]
    datas = [request(max_tokens=rng.randint(20, 60), content="word " * rng.randint(1, 30)) for _ in range(120)]
    results = await asyncio.gather(*(call(limiters[i % 2], d, auth()) for i, d in enumerate(datas)))
    admitted = [(i, d) for i, (d, r) in enumerate(zip(datas, results, strict=True)) if r is None]
    assert admitted and len(admitted) < len(datas)
    served = 0
    positive_error = 0
    settles = []
    for index, data in admitted:  # settled by the instance that admitted it, as in the proxy
        # A real call's usage: somewhat below or above what was reserved.
        reserved = data["max_tokens"] + 5
        actual = max(1, reserved + rng.randint(-15, 5))
        served += actual
        positive_error += max(0, actual - reserved)
        settles.append(finish(limiters[index % 2], data, actual))
    await asyncio.gather(*settles)
    assert served <= 1000 + positive_error
    snapshot = await RedisStore(clients[0]).admission_snapshot("m", 60_000)
    assert snapshot is not None and snapshot.tokens == served
    for client in clients:
        await client.aclose()


def test_prompt_tokens_are_counted_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    from litellm_ratebalance.proxy.tokens import estimate_tokens

    calls = []
    real = litellm.token_counter

    def counting(*args: object, **kwargs: object) -> int:
        calls.append(1)
        return int(real(*args, **kwargs))  # type: ignore[arg-type]

    monkeypatch.setattr(litellm, "token_counter", counting)
    data = request(max_tokens=7, content="hello there")
    first = estimate_tokens("m", data, "total", 0, 100)
    second = estimate_tokens("m", data, "input", 0, 100)
    assert len(calls) == 1 and first == second + 7 and second > 0
