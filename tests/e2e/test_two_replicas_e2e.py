"""Two real ``litellm`` proxy replicas sharing one redis-server: the priority limiter and traffic contracts
hold globally, and a Redis kill + restart during load only ever gives clients the documented statuses.

Set-up (started once for the module): a redis-server of this module's own (the outage tests kill it), two
proxies (``pair``) with both callbacks, ``fail_mode: open`` and a short store cool-down, and one proxy
(``closed``) on the same Redis with ``fail_mode: closed`` and ``traffic_contracts.fail_open: false``.

What clients may see, per the docs: 200; 429 from the limiter or a contract's ``reject`` action; 503 only
from a fail-closed component while the store is down. Never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "e2e-two-replicas"
CONTRACT_WINDOW_S = 3600
FEATURE_RPM, BASKET_RPM = 20, 60
OUTAGE_RPM = 30
RETRY_AFTER_S = 0.2

KEYS = {"sk-smart": {"metadata": {"feature": "smart-window"}}}
"""A key whose admin-set metadata names the feature (requests cannot choose it themselves)."""


def config(*, fail_closed: bool = False) -> dict[str, Any]:
    contracts: dict[str, Any] = {
        "window_seconds": CONTRACT_WINDOW_S,  # an hour: a test never straddles a window (see room_in_window)
        "counter_ttl_seconds": 2 * CONTRACT_WINDOW_S,
        # (a tpm contract far above the traffic: requests hold a token estimate in flight until reconciled)
        "basket": {"rpm": BASKET_RPM, "tpm": 1_000_000_000},
        "features": {"smart-window": {"rpm": FEATURE_RPM}},
    }
    ratebalance: dict[str, Any] = {
        "key_prefix": PREFIX,
        "store_retry_after_seconds": RETRY_AFTER_S,
        "fault_log_interval_seconds": 3600,
        "traffic_contracts": contracts,
    }
    if fail_closed:
        ratebalance["fail_mode"] = "closed"
        contracts["fail_open"] = False
    return {
        "model_list": [
            mock_deployment("rpm60", rpm=60),
            mock_deployment("contracted"),  # no rpm/tpm: only the contracts count it
            mock_deployment("outage", rpm=OUTAGE_RPM, mock_delay=0.05),
            mock_deployment("background", rpm=1_000_000, mock_delay=0.05),
            mock_deployment("probe", rpm=1_000_000),
        ],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.traffic_contracts"],
            "ratebalance": ratebalance,
        },
        "router_settings": {"num_retries": 0},
    }


# -- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def redis_sync(own_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url, socket_timeout=2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def pair(proxies: StartProxies, own_redis: RedisServer) -> list[LiteLLMProxy]:
    return proxies(config(), redis_url=own_redis.url, keys=KEYS, count=2)


@pytest.fixture(scope="module")
def closed(proxies: StartProxies, own_redis: RedisServer) -> LiteLLMProxy:
    return proxies(config(fail_closed=True), redis_url=own_redis.url, keys=KEYS)[0]


@pytest.fixture
def redis_back_up(own_redis: RedisServer) -> Iterator[RedisServer]:
    """For tests that kill Redis: whatever happens, it is running again afterwards."""
    yield own_redis
    if own_redis.process is None:
        own_redis.start()


# -- helpers ---------------------------------------------------------------------------------------------
async def post(client: httpx.AsyncClient, proxy: LiteLLMProxy, model: str, token: str = "sk-none") -> httpx.Response:
    return await client.post("/v1/chat/completions", headers=proxy.auth(token), json=chat_body(model))


async def burst(pair: list[LiteLLMProxy], model: str, count: int, token: str = "sk-none") -> list[httpx.Response]:
    """``count`` concurrent requests, alternating between the replicas."""
    clients = [proxy.async_client() for proxy in pair]
    try:
        return list(await asyncio.gather(*(post(clients[i % 2], pair[i % 2], model, token) for i in range(count))))
    finally:
        for client in clients:
            await client.aclose()


def statuses(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(response.status_code for response in responses)


def contract_counts(client: redis.Redis) -> dict[str, int]:
    seconds, _ = client.time()
    start = int(seconds) // CONTRACT_WINDOW_S * CONTRACT_WINDOW_S
    # A client made without decode_responses answers bytes; redis-py types the hash as bytes | str.
    raw = cast(dict[bytes, bytes], client.hgetall(KeySpace(PREFIX).contract_window("rpm", start)))
    return {key.decode(): int(value) for key, value in raw.items()}


async def room_in_window(margin_s: float = 30.0) -> None:
    left = CONTRACT_WINDOW_S - time.time() % CONTRACT_WINDOW_S
    if left < margin_s:
        await asyncio.sleep(left + 0.5)


PROBE_BURST = 40
"""Concurrent probes per replica: at least as many as the connections a replica pooled before the crash."""


async def counting_again(proxies: list[LiteLLMProxy], timeout_s: float = 20.0) -> int:
    """Wait until every replica decides every request through Redis again; return the probe rounds taken.

    An admission counted in the store carries the limiter's ``x-litellm-saturation`` header; one admitted
    fail-open does not (LiteLLM's own ``x-ratelimit-*`` headers are there either way). After a restart each
    connection a replica had pooled fails once when next used (the server closed it), which opens the
    store's circuit breaker again for ``store_retry_after_seconds``; so the probes go in bursts that use up
    the stale connections, until a whole burst is counted.
    """
    deadline = time.monotonic() + timeout_s
    rounds = 0
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(proxy.async_client()) for proxy in proxies]
        for proxy, client in zip(proxies, clients, strict=True):
            while True:
                rounds += 1
                responses = await asyncio.gather(*(post(client, proxy, "probe") for _ in range(PROBE_BURST)))
                if all(r.status_code == 200 and "x-litellm-saturation" in r.headers for r in responses):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{proxy.name} did not count through Redis again: {statuses(responses)}")
                await asyncio.sleep(RETRY_AFTER_S)
    return rounds


def assert_no_server_errors(proxy: LiteLLMProxy) -> None:
    """No request got a 5xx other than the documented 503, and nothing of ours failed unexpectedly."""
    log = proxy.log_text()
    access = [line for line in log.splitlines() if '"POST /v1/chat/completions' in line]
    assert access, "the proxy's access log is empty"
    assert all(
        line.rstrip().endswith(("200 OK", "429 Too Many Requests", "503 Service Unavailable")) for line in access
    )
    assert "litellm_ratebalance rate_limiter: settling a reservation failed" not in log
    assert "pre-call check failed" not in log


async def background_load(pair: list[LiteLLMProxy], stop: asyncio.Event, seen: Counter[int]) -> None:
    """One request every ~50 ms per replica until ``stop`` (bounded by a 60 s guard)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(proxy.async_client()) for proxy in pair]
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            responses = await asyncio.gather(*(post(c, p, "background") for c, p in zip(clients, pair, strict=True)))
            seen.update(response.status_code for response in responses)
            await asyncio.sleep(0.05)


# -- global limits across replicas --------------------------------------------------------------------------
async def test_traffic_contract_modes_are_exact_across_replicas(
    pair: list[LiteLLMProxy], redis_sync: redis.Redis
) -> None:
    await room_in_window()
    before = contract_counts(redis_sync)
    f0, b0 = before.get("smart-window", 0), before.get("__basket__", 0)
    assert b0 + FEATURE_RPM < BASKET_RPM, "other traffic filled the basket; this test needs room in it"

    responses = await burst(pair, "contracted", 100, token="sk-smart")

    assert statuses(responses) == {200: 100}  # observe-only actions: all served
    modes = Counter(response.headers["x-traffic-contract-rpm-mode"] for response in responses)
    assert {response.headers["x-traffic-contract-feature"] for response in responses} == {"smart-window"}
    # Counted atomically in one window whichever replica took a request: the k-th request of the window
    # is degraded once the basket is over its contract, else borrowed once the feature is over its own.
    expected: Counter[str] = Counter()
    for k in range(100):
        if b0 + k + 1 > BASKET_RPM:
            expected["degraded"] += 1
        elif f0 + k + 1 > FEATURE_RPM:
            expected["borrowed"] += 1
        else:
            expected["normal"] += 1
    assert modes == expected
    after = contract_counts(redis_sync)
    assert (after["smart-window"], after["__basket__"]) == (f0 + 100, b0 + 100)


async def test_limiter_rpm_is_exact_across_replicas(pair: list[LiteLLMProxy], redis_sync: redis.Redis) -> None:
    responses = await burst(pair, "rpm60", 150)

    assert statuses(responses) == {200: 60, 429: 90}
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["type"] == "throttling_error"
            assert int(response.headers["retry-after"]) >= 1
    window = redis_sync.hgetall(KeySpace(PREFIX).admission_window("rpm60"))
    assert int(window[b"r"]) == 60
    # Each replica sent 75: a per-replica limit would have let 120 through.


def contract_tokens(client: redis.Redis) -> dict[str, int]:
    seconds, _ = client.time()
    start = int(seconds) // CONTRACT_WINDOW_S * CONTRACT_WINDOW_S
    raw = cast(dict[bytes, bytes], client.hgetall(KeySpace(PREFIX).contract_window("tpm", start)))
    return {key.decode(): int(value) for key, value in raw.items()}


async def settled_tokens(client: redis.Redis, timeout: float = 15.0) -> dict[str, int]:
    """The contract window's tokens once nothing is in flight in it (an earlier burst's reconciles follow
    its responses by up to 100 ms, later on a busy machine); fails if estimates stay in flight."""
    deadline = time.monotonic() + timeout
    while True:
        tokens = contract_tokens(client)
        in_flight = {name: value for name, value in tokens.items() if name.endswith(":inflight") and value}
        if not in_flight:
            return tokens
        assert time.monotonic() < deadline, f"estimates left in flight: {in_flight}"
        await asyncio.sleep(0.1)


async def test_a_burst_is_reconciled_exactly_across_replicas(pair: list[LiteLLMProxy], redis_sync: redis.Redis) -> None:
    """Each replica sends its reconciles of one window together: after a burst over both, the window holds
    exactly the usage the responses reported, and nothing stays in flight."""
    await room_in_window()
    before = await settled_tokens(redis_sync)  # earlier tests' reconciles of this window have all arrived
    responses = await burst(pair, "contracted", 200, token="sk-smart")
    assert statuses(responses) == {200: 200}
    assert "unknown" not in {response.headers["x-traffic-contract-rpm-mode"] for response in responses}
    used = sum(int(response.json()["usage"]["total_tokens"]) for response in responses)
    expected = {
        "smart-window": before.get("smart-window", 0) + used,
        "__basket__": before.get("__basket__", 0) + used,
        "smart-window:inflight": 0,
        "__basket__:inflight": 0,
    }
    deadline = time.monotonic() + 15.0  # logging runs after the responses; reconciles follow within 100 ms
    while True:
        after = contract_tokens(redis_sync)
        if {name: after.get(name, 0) for name in expected} == expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert {name: after.get(name, 0) for name in expected} == expected


# -- Redis killed and restarted during load ---------------------------------------------------------------
async def test_redis_outage_during_load_fail_open(pair: list[LiteLLMProxy], redis_back_up: RedisServer) -> None:
    stop = asyncio.Event()
    background: Counter[int] = Counter()
    load = asyncio.create_task(background_load(pair, stop, background))
    try:
        await asyncio.sleep(0.5)
        first = await burst(pair, "outage", 40)  # the limit (30) holds while Redis is up
        redis_back_up.stop()
        during = await burst(pair, "outage", 20)  # fail open: served, uncounted
        await asyncio.sleep(0.5)
        redis_back_up.start()  # same port, empty (no persistence)
        await counting_again(pair)
        after = await burst(pair, "outage", 40)  # counting resumed in a fresh window
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.wait_for(load, timeout=30)

    assert statuses(first) == {200: OUTAGE_RPM, 429: 40 - OUTAGE_RPM}
    assert statuses(during) == {200: 20}
    for response in during:
        assert "x-litellm-saturation" not in response.headers  # admitted without the store
        assert response.headers["x-traffic-contract-rpm-mode"] == "unknown"
        assert response.json()["choices"][0]["message"]["content"] == "Hello world!"
    # The restarted Redis is empty: the window starts again, and the limit holds exactly again.
    assert statuses(after) == {200: OUTAGE_RPM, 429: 40 - OUTAGE_RPM}
    # The steady background traffic (unlimited model) was served throughout: never a 429, 503 or 500.
    assert set(background) == {200} and background[200] >= 20
    for proxy in pair:
        assert_no_server_errors(proxy)


async def test_redis_outage_fail_closed_answers_503_then_recovers(
    closed: LiteLLMProxy, redis_back_up: RedisServer
) -> None:
    async with closed.async_client() as client:
        assert (await post(client, closed, "probe")).status_code == 200
        redis_back_up.stop()
        down = [await post(client, closed, "probe") for _ in range(5)]
        redis_back_up.start()
        await counting_again([closed])
        assert (await post(client, closed, "probe")).status_code == 200

    assert statuses(down) == {503: 5}
    for response in down:
        assert response.headers["retry-after"] == "1"
        assert "the shared rate-limit store is unavailable" in response.json()["error"]["message"]
    assert_no_server_errors(closed)
