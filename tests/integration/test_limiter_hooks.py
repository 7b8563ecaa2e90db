"""PriorityRateLimiter through its hooks, on both store backends (the real redis-server for Redis)."""

from __future__ import annotations

import asyncio
import itertools
from typing import cast

import pytest

from litellm_ratebalance.proxy.admission import PriorityRateLimiter
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


async def test_corrections_of_a_cold_start_reach_the_other_instance_before_its_next_decision(
    redis_server: RedisServer,
) -> None:
    """Before anything is learned a request reserves its prompt + default_output_tokens (256): 3 fit tpm
    1000. Their 30-token answers come back through instance A; a request to instance B right after must
    find the room they freed and reserve the learned estimate, not be refused on A's stale reservations."""
    import redis.asyncio as aioredis

    from litellm_ratebalance.proxy.tokens import estimate_tokens

    router = make_router(tpm=1000)
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(2)]
    await clients[0].flushdb()
    first, second = (make_limiter(RedisStore(client), router) for client in clients)
    datas = [request(max_tokens=None) for _ in range(3)]
    for data in datas:
        assert await call(first, data, auth()) is None
    assert (await call(second, request(max_tokens=None), auth())) is not None  # 4 x 266 > 1000
    prompt = estimate_tokens("m", datas[0], "input", 0, 0)
    for data in datas:
        await finish(first, data, prompt + 30, flush=False)  # as the proxy does: no flush by hand
    data = request(max_tokens=None)
    assert await call(second, data, auth()) is None
    snapshot = await RedisStore(clients[1]).admission_snapshot("m", 60_000)
    assert snapshot is not None and snapshot.estimate == 30.0
    assert snapshot.tokens == 4 * (prompt + 30)
    for client in clients:
        await client.aclose()


async def _cold_burst(limiters: list[PriorityRateLimiter]) -> int:
    """Tokens served when 20 clients send at once to a fresh model group (tpm 1000, no max_tokens), each
    client sending again as soon as its answer (30 tokens, 20 ms) is in and stopping at its first 429 (as a
    client honouring ``retry-after`` would within the window). Each client's requests go to the instances
    in turn, all starting with the first (a burst reaches one replica, what follows is spread). Corrections
    go as the limiter sends them: nothing is flushed by hand."""
    from litellm_ratebalance.proxy.tokens import estimate_tokens

    served = 0

    async def client() -> None:
        nonlocal served
        for sent in itertools.count():
            limiter = limiters[sent % len(limiters)]
            data = request(max_tokens=None)
            if await call(limiter, data, auth()) is not None:
                return
            await asyncio.sleep(0.02)
            used = estimate_tokens("m", data, "input", 0, 0) + 30
            served += used
            await finish(limiter, data, used, flush=False)

    await asyncio.gather(*(client() for _ in range(20)))
    return served


@pytest.mark.parametrize("instances", [1, 2])
async def test_a_cold_burst_fills_the_tpm_through_two_instances_as_through_one(
    redis_server: RedisServer, instances: int
) -> None:
    """Before anything is learned a request reserves its prompt + default_output_tokens (256): 3 of the
    first 20 fit tpm 1000. Their answers teach the estimate and free the room; the instance the next
    requests go to must see that, or it refuses what the tpm has room for and the clients stop."""
    import redis.asyncio as aioredis

    router = make_router(tpm=1000)
    # A burst: the store timeout for exact counts (a call failed open on a loaded machine is not under test).
    pools = [aioredis.BlockingConnectionPool.from_url(redis_server.url, max_connections=40) for _ in range(instances)]
    clients = [aioredis.Redis(connection_pool=pool) for pool in pools]
    await clients[0].flushdb()
    stores = [RedisStore(client) for client in clients]
    served = await _cold_burst([make_limiter(store, router) for store in stores])
    assert 800 <= served <= 1000
    for client in clients:
        await client.aclose()


async def test_an_answer_is_corrected_before_it_is_sent_so_the_next_request_sees_its_real_usage(
    store: MemoryStore | RedisStore,
) -> None:
    """The docs' quick start, one request at a time: tpm 60, answers of 30 tokens, no max_tokens. The first
    request reserves the prior (256 output tokens); its answer's usage must be in before the client can send
    the second request, which LiteLLM's success logging (after the response, in the background) is not."""
    limiter = make_limiter(store, make_router("q", tpm=60))
    first = request("q", max_tokens=None)
    assert await call(limiter, first, auth()) is None
    usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
    await limiter.async_post_call_success_hook(first, auth(), {"usage": usage})
    second = request("q", max_tokens=None)
    assert await call(limiter, second, auth()) is None  # decided on 30 used, not on 266 reserved
    # Success logging of the first request comes later and changes nothing more.
    await finish(limiter, first, 30)
    third = request("q", max_tokens=None)
    refused = await call(limiter, third, auth())
    assert refused is not None and refused.status_code == 429
