"""The priority limiter through the real ``litellm`` proxy over HTTP (custom_auth keys, mock deployments).

Two proxy set-ups, each started once for the module:

* ``single``: one proxy with priorities ``prod`` 0.75 / ``dev`` 0.25 (threshold 0.5), one model group per
  test so each test starts its own 60 s window;
* ``pair``: two proxies without priorities sharing one redis-server (global limits across replicas).

Both use the session redis-server through ``ratebalance.redis_url`` so the tests can read the window
counters the proxies wrote (``KeySpace.admission_window``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

SINGLE_PREFIX = "e2e-limiter-single"
PAIR_PREFIX = "e2e-limiter-pair"
WINDOW_S = 60

SINGLE_CONFIG: dict[str, Any] = {
    "model_list": [
        mock_deployment("basic", rpm=4, tpm=100_000),
        mock_deployment("prio", rpm=10),
        mock_deployment("who", rpm=1000),
        mock_deployment("spoof", rpm=8),
        mock_deployment("stream", rpm=2, tpm=10_000),
        mock_deployment("embed", rpm=2, tpm=10_000, model="openai/text-embedding-3-small", mock_response=[0.1, 0.2]),
        mock_deployment("failing", rpm=10, tpm=10_000, mock_response="litellm.InternalServerError"),
    ],
    "litellm_settings": {
        "callbacks": ["litellm_ratebalance.rate_limiter"],
        "priority_reservation": {"prod": 0.75, "dev": 0.25},
        "priority_reservation_settings": {"saturation_threshold": 0.5},
        # Exact counts under concurrent bursts are under test, not the fault policy: see PAIR_CONFIG.
        "ratebalance": {
            "key_prefix": SINGLE_PREFIX,
            "limiter": {"window_seconds": WINDOW_S},
        },
    },
    "router_settings": {"num_retries": 0},
}

PAIR_TPM = 600
PAIR_CONFIG: dict[str, Any] = {
    "model_list": [
        mock_deployment("rpm50", rpm=50),
        # Five seconds upstream keep the whole burst in flight while it is decided (even on busy cores):
        # admission must count reservations, not finished usage.
        mock_deployment("tpm", tpm=PAIR_TPM, mock_delay=5.0),
    ],
    "litellm_settings": {
        "callbacks": ["litellm_ratebalance.rate_limiter"],
        # Default store settings: a cold 100-request burst per proxy on 2 busy cores keeps the event loop
        # busy for longer than the store timeout, which must not make the limiter fail open.
        "ratebalance": {"key_prefix": PAIR_PREFIX},
    },
    "router_settings": {"num_retries": 0},
}


# -- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_sync(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    for prefix in (SINGLE_PREFIX, PAIR_PREFIX):
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
    yield client
    client.close()


@pytest.fixture(scope="module")
def single(proxies: StartProxies, redis_server: Any, redis_sync: redis.Redis) -> LiteLLMProxy:
    return proxies(SINGLE_CONFIG, redis_url=redis_server.url)[0]


@pytest.fixture(scope="module")
def pair(proxies: StartProxies, redis_server: Any, redis_sync: redis.Redis) -> list[LiteLLMProxy]:
    # redis-py 8 pools allow 100 connections and raise past that (MaxConnectionsError, so the limiter fails
    # open); a burst of 100+ per proxy needs more. The query parameter is redis-py's own URL option.
    return proxies(PAIR_CONFIG, redis_url=redis_server.url + "?max_connections=1000", count=2)


# -- helpers ---------------------------------------------------------------------------------------------
def window(client: redis.Redis, prefix: str, model_group: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = client.hgetall(KeySpace(prefix).admission_window(model_group))  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for post-call accounting (LiteLLM logs success off the response path)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def post(client: httpx.AsyncClient, proxy: LiteLLMProxy, token: str, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/chat/completions", headers=proxy.auth(token), json=body)


def assert_throttled(response: httpx.Response, message_start: str) -> str:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "throttling_error"
    assert error["code"] == "429"
    assert error["message"].startswith(message_start), error["message"]
    return str(error["message"])


def expected_retry_after(client: redis.Redis, prefix: str, model_group: str) -> int:
    start = window(client, prefix, model_group)["start"]
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    return max(1, math.ceil((start + WINDOW_S * 1000 - now_ms) / 1000))


# -- tests: single proxy ---------------------------------------------------------------------------------
async def test_admitted_responses_carry_headers_then_429_with_body_and_headers(
    single: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    async with single.async_client() as client:
        admitted = [await post(client, single, "sk-prod-1", chat_body("basic")) for _ in range(3)]
        first_refusal = await post(client, single, "sk-prod-1", chat_body("basic"))
        expected = expected_retry_after(redis_sync, SINGLE_PREFIX, "basic")
        await asyncio.sleep(1.2)
        second_refusal = await post(client, single, "sk-prod-1", chat_body("basic"))

    # rpm 4: lenient for the first two (model cap 4), strict from saturation 0.5 (prod's share: 3).
    assert [r.status_code for r in admitted] == [200, 200, 200]
    assert [r.headers["x-litellm-saturation"] for r in admitted] == ["0.000", "0.250", "0.500"]
    assert [r.headers["x-ratelimit-limit-requests"] for r in admitted] == ["4", "4", "3"]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in admitted] == ["3", "2", "0"]
    for response in admitted:
        assert response.headers["x-litellm-priority"] == "prod"
        assert response.headers["x-ratelimit-limit-tokens"] in ("100000", "75000")
        assert int(response.headers["x-ratelimit-remaining-tokens"]) < 100_000
        assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        assert response.json()["choices"][0]["message"]["content"] == "Hello world!"

    message = assert_throttled(first_refusal, "Priority-based rate limit exceeded. Model: basic, Priority: prod")
    assert message == (
        "Priority-based rate limit exceeded. Model: basic, Priority: prod, Rate limit type: requests, "
        "Model TPM: 100000, Model RPM: 4, Remaining: 0, Model saturation: 75.0%"
    )
    headers = first_refusal.headers
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-litellm-priority"] == "prod"
    assert headers["x-litellm-saturation"] == "0.750"
    # retry-after is the time until the window ends, not a constant: it matches the window Redis holds
    # and shrinks as the window runs out.
    first_retry = int(headers["retry-after"])
    assert abs(first_retry - expected) <= 1
    assert 1 <= first_retry <= WINDOW_S
    assert int(second_refusal.headers["retry-after"]) <= first_retry - 1
    assert_throttled(second_refusal, "Priority-based rate limit exceeded. Model: basic")
    # Refusals are not counted; the three admitted requests are (tokens reconciled to actual usage).
    await eventually(lambda: window(redis_sync, SINGLE_PREFIX, "basic").get("t") == 90)
    counters = window(redis_sync, SINGLE_PREFIX, "basic")
    assert counters["r"] == 3 and counters["r:p.prod"] == 3


async def test_saturated_model_caps_dev_at_its_share_and_prod_still_gets_in(
    single: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    async with single.async_client() as client:
        dev = await asyncio.gather(*(post(client, single, f"sk-dev-{1 + i % 2}", chat_body("prio")) for i in range(10)))
        prod = await asyncio.gather(
            *(post(client, single, f"sk-prod-{1 + i % 2}", chat_body("prio")) for i in range(10))
        )

    # rpm 10, threshold 0.5: dev is admitted while the model is below 50% (5 requests), then capped at
    # its share (2.5, already used); prod (share 7.5) takes the rest of the model, 5, then the model is full.
    dev_codes = [r.status_code for r in dev]
    assert dev_codes.count(200) == 5 and dev_codes.count(429) == 5
    for response in dev:
        if response.status_code == 429:
            message = assert_throttled(response, "Priority-based rate limit exceeded. Model: prio, Priority: dev")
            assert message.endswith("Model saturation: 50.0%")
    prod_codes = [r.status_code for r in prod]
    assert prod_codes.count(200) == 5 and prod_codes.count(429) == 5
    for response in prod:
        if response.status_code == 429:
            assert_throttled(
                response,
                "Model capacity reached for prio. Priority: prod, Rate limit type: requests, "
                "Model TPM: not configured, Model RPM: 10, Remaining: 0",
            )
    counters = window(redis_sync, SINGLE_PREFIX, "prio")
    assert (counters["r"], counters["r:p.dev"], counters["r:p.prod"]) == (10, 5, 5)


async def test_priority_comes_from_team_then_key_metadata_never_the_request_body(single: LiteLLMProxy) -> None:
    spoof: dict[str, Any] = {"metadata": {"priority": "prod"}, "litellm_metadata": {"priority": "prod"}}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("sk-prod-1", {}, "prod"),
        ("sk-dev-1", {}, "dev"),
        ("sk-devkey-prodteam", {}, "prod"),
        ("sk-none", {}, "default"),
        ("sk-unknown-priority", {}, "default"),
        ("sk-none", spoof, "default"),
        ("sk-dev-1", spoof, "dev"),
    ]
    async with single.async_client() as client:
        for token, extra, expected in cases:
            response = await post(client, single, token, chat_body("who", **extra))
            assert response.status_code == 200, response.text
            assert response.headers["x-litellm-priority"] == expected, token


async def test_priority_in_the_request_body_gets_no_more_than_the_keys_priority(
    single: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    body = chat_body("spoof", metadata={"priority": "prod"}, litellm_metadata={"priority": "prod"})
    async with single.async_client() as client:
        responses = await asyncio.gather(*(post(client, single, "sk-dev-1", body) for _ in range(8)))
    # As dev: 4 admitted below 50% of rpm 8, then dev's share (2) applies. prod would have got 6.
    codes = [r.status_code for r in responses]
    assert codes.count(200) == 4
    for response in responses:
        if response.status_code == 429:
            assert_throttled(response, "Priority-based rate limit exceeded. Model: spoof, Priority: dev")
        else:
            assert response.headers["x-litellm-priority"] == "dev"
    counters = window(redis_sync, SINGLE_PREFIX, "spoof")
    assert counters["r:p.dev"] == 4 and "r:p.prod" not in counters


async def test_streaming_request_is_admitted_with_headers_and_counted(
    single: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    body = chat_body("stream", stream=True, stream_options={"include_usage": True})
    async with single.async_client() as client:
        async with client.stream("POST", "/v1/chat/completions", headers=single.auth("sk-prod-1"), json=body) as s:
            assert s.status_code == 200
            assert s.headers["content-type"].startswith("text/event-stream")
            stream_headers = s.headers
            lines = [line async for line in s.aiter_lines() if line.startswith("data: ")]
        refused = await post(client, single, "sk-prod-1", body)

    assert stream_headers["x-litellm-priority"] == "prod"
    assert stream_headers["x-ratelimit-remaining-requests"] == "1"
    assert lines[-1] == "data: [DONE]"

    usage = [json.loads(line[6:])["usage"] for line in lines[:-1] if json.loads(line[6:]).get("usage")]
    assert usage, "the mock stream reports usage with include_usage"
    total = usage[-1]["total_tokens"]
    # Counted as a request, and its reservation reconciled to the stream's usage once it ended.
    await eventually(lambda: window(redis_sync, SINGLE_PREFIX, "stream").get("t") == total)
    assert window(redis_sync, SINGLE_PREFIX, "stream")["r"] == 1
    # rpm 2: the second stream finds the model at 50% and prod's share (1.5) used: a JSON 429, not a stream.
    assert_throttled(refused, "Priority-based rate limit exceeded. Model: stream, Priority: prod")


async def test_embeddings_reserve_input_tokens_only_and_are_limited(
    single: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    payload = {"model": "embed", "input": "hello there"}
    async with single.async_client() as client:
        first = await client.post("/v1/embeddings", headers=single.auth("sk-prod-1"), json=payload)
        second = await client.post("/v1/embeddings", headers=single.auth("sk-prod-1"), json=payload)

    assert first.status_code == 200, first.text
    assert first.json()["data"][0]["embedding"] == [0.1, 0.2]
    assert first.headers["x-litellm-priority"] == "prod"
    # An embedding has no output: the reservation is the input's few tokens, not an output estimate.
    assert 10_000 - int(first.headers["x-ratelimit-remaining-tokens"]) <= 20
    # LiteLLM's mock embedding reports 10 prompt tokens: that is what the window keeps.
    await eventually(lambda: window(redis_sync, SINGLE_PREFIX, "embed").get("t") == 10)
    assert_throttled(second, "Priority-based rate limit exceeded. Model: embed, Priority: prod")


async def test_failed_call_releases_its_token_reservation(single: LiteLLMProxy, redis_sync: redis.Redis) -> None:
    async with single.async_client() as client:
        response = await post(client, single, "sk-prod-1", chat_body("failing", max_tokens=4000))
    assert response.status_code == 500
    # The provider saw the request (it counts); the 4000 reserved tokens come back.
    await eventually(lambda: window(redis_sync, SINGLE_PREFIX, "failing").get("t") == 0)
    assert window(redis_sync, SINGLE_PREFIX, "failing")["r"] == 1


# -- tests: two proxies, one Redis -----------------------------------------------------------------------
async def test_two_proxies_sharing_redis_admit_exactly_rpm(pair: list[LiteLLMProxy], redis_sync: redis.Redis) -> None:
    clients = [proxy.async_client() for proxy in pair]
    try:
        responses = await asyncio.gather(
            *(post(clients[i % 2], pair[i % 2], "sk-none", chat_body("rpm50")) for i in range(200))
        )
    finally:
        for client in clients:
            await client.aclose()
    codes = [r.status_code for r in responses]
    assert codes.count(200) == 50, codes
    assert codes.count(429) == 150
    for response in responses:
        if response.status_code == 429:
            assert_throttled(
                response,
                "Model capacity reached for rpm50. Priority: None, Rate limit type: requests, "
                "Model TPM: not configured, Model RPM: 50, Remaining: 0",
            )
            assert response.headers["x-ratelimit-remaining-requests"] == "0"
            assert response.headers["x-litellm-priority"] == "default"
            assert 1 <= int(response.headers["retry-after"]) <= 60
    assert window(redis_sync, PAIR_PREFIX, "rpm50")["r"] == 50


async def test_two_proxies_keep_tpm_with_requests_in_flight(pair: list[LiteLLMProxy], redis_sync: redis.Redis) -> None:
    import litellm

    body = chat_body("tpm", max_tokens=20)
    estimate = litellm.token_counter(model="tpm", messages=body["messages"]) + 20
    clients = [proxy.async_client() for proxy in pair]
    try:
        responses = await asyncio.gather(*(post(clients[i % 2], pair[i % 2], "sk-none", body) for i in range(40)))
    finally:
        for client in clients:
            await client.aclose()
    served = [r.json()["usage"]["total_tokens"] for r in responses if r.status_code == 200]
    # All 40 are in flight together (5 s upstream): the reservations, not finished usage, fill the window.
    assert len(served) == PAIR_TPM // estimate
    for response in responses:
        if response.status_code == 429:
            assert_throttled(response, "Model capacity reached for tpm. Priority: None, Rate limit type: tokens")
    # Overshoot is bounded by the estimation error of what was admitted (the mock reports a fixed usage).
    estimation_error = sum(max(0, tokens - estimate) for tokens in served)
    assert sum(served) <= PAIR_TPM + estimation_error
    await eventually(lambda: window(redis_sync, PAIR_PREFIX, "tpm").get("t") == sum(served))
