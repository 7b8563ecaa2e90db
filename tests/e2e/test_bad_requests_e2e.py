"""Bad requests and bad configuration through the real ``litellm`` proxy over HTTP.

One proxy with the priority limiter and the traffic contracts on the session redis-server (so the tests
read the counters the proxy wrote), keys from tests/e2e/auth_module.py plus keys whose admin-set priority is
missing, a number, a list or unknown. What is checked:

* the request body cannot raise a request's priority (``metadata.priority`` / ``litellm_metadata``); the
  admission counts the key's pool (header ``x-litellm-priority``, pool counters in Redis);
* a missing, non-string or unknown priority in key metadata puts the request in the default pool;
* a huge ``max_tokens`` is clamped to ``limiter.max_reserved_output_tokens``: admitted when that fits the
  model's unused TPM (and reconciled to the actual usage), else a clear 429, never a 500;
* an unknown model gets LiteLLM's own error (our hooks do not crash on it, and count nothing);
* an embeddings call and a streaming chat call are admitted and counted by both components;
* a proxy started with an invalid setting exits with status 78 and prints the key path and what is valid.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from litellm_ratebalance.proxy.runtime import EXIT_CONFIG
from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

PREFIX = "e2e-bad-requests"
CONTRACT_WINDOW_S = 3600
MAX_RESERVED = 4096
"""``limiter.max_reserved_output_tokens`` here: the most output tokens one request may reserve."""

KEYS: dict[str, dict[str, Any]] = {
    "sk-number-priority": {"metadata": {"priority": 5}},
    "sk-list-priority": {"metadata": {"priority": ["prod"]}},
    "sk-empty-priority": {"metadata": {"priority": ""}},
}
DEFAULT_POOL_KEYS = ["sk-none", "sk-unknown-priority", *KEYS]

CONFIG: dict[str, Any] = {
    "model_list": [
        mock_deployment("spoof", rpm=1000, tpm=1_000_000),
        mock_deployment("pools", rpm=1000, tpm=1_000_000),
        mock_deployment("roomy", rpm=1000, tpm=100_000),  # a clamped reservation fits
        mock_deployment("tight", rpm=1000, tpm=2000),  # a clamped max_tokens would not fit
        mock_deployment("stream", rpm=1000, tpm=100_000),
        mock_deployment("embed", rpm=1000, tpm=100_000, model="openai/text-embedding-3-small", mock_response=[0.1]),
    ],
    "litellm_settings": {
        "callbacks": ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.traffic_contracts"],
        "priority_reservation": {"prod": 0.7, "dev": 0.3},
        "ratebalance": {
            "key_prefix": PREFIX,
            "limiter": {"max_reserved_output_tokens": MAX_RESERVED},
            "traffic_contracts": {
                "window_seconds": CONTRACT_WINDOW_S,
                "counter_ttl_seconds": 2 * CONTRACT_WINDOW_S,
                "basket": {"rpm": 1_000_000},
            },
        },
    },
    "router_settings": {"num_retries": 0},
}


@pytest.fixture(scope="module")
def redis_sync(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(f"{PREFIX}:*"):
        client.delete(key)
    yield client
    client.close()


@pytest.fixture(scope="module")
def proxy(proxies: StartProxies, redis_server: Any, redis_sync: redis.Redis) -> LiteLLMProxy:
    return proxies(CONFIG, redis_url=redis_server.url, keys=KEYS)[0]


# -- helpers ---------------------------------------------------------------------------------------------
def window(client: redis.Redis, model_group: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = client.hgetall(KeySpace(PREFIX).admission_window(model_group))  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}


def contract_requests(client: redis.Redis) -> int:
    """Requests counted in the current contract window (the basket counts every request)."""
    seconds, _ = client.time()
    start = int(seconds) // CONTRACT_WINDOW_S * CONTRACT_WINDOW_S
    value = client.hget(KeySpace(PREFIX).contract_window("rpm", start), "__basket__")
    return int(value) if value is not None else 0  # type: ignore[arg-type]


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for post-call accounting (LiteLLM logs success off the response path)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def chat(proxy: LiteLLMProxy, token: str, body: dict[str, Any]) -> httpx.Response:
    async with proxy.async_client() as client:
        return await client.post("/v1/chat/completions", headers=proxy.auth(token), json=body)


def assert_no_crash_of_ours(proxy: LiteLLMProxy) -> None:
    log = proxy.log_text()
    assert "Traceback" not in log or "litellm_ratebalance" not in log.split("Traceback", 1)[1][:4000]
    assert "pre-call check failed" not in log and "reading model capacity failed" not in log
    assert " 500 Internal Server Error" not in log


# -- priority trust -------------------------------------------------------------------------------------------
async def test_the_request_body_cannot_raise_the_priority(proxy: LiteLLMProxy, redis_sync: redis.Redis) -> None:
    body = chat_body("spoof", metadata={"priority": "prod"}, litellm_metadata={"priority": "prod"})
    responses = [await chat(proxy, "sk-dev-1", body) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert {r.headers["x-litellm-priority"] for r in responses} == {"dev"}
    counters = window(redis_sync, "spoof")
    assert counters["r:p.dev"] == 3 and "r:p.prod" not in counters


@pytest.mark.parametrize("token", DEFAULT_POOL_KEYS)
async def test_missing_non_string_or_unknown_key_priority_uses_the_default_pool(
    proxy: LiteLLMProxy, redis_sync: redis.Redis, token: str
) -> None:
    before = window(redis_sync, "pools").get("r:d", 0)
    response = await chat(proxy, token, chat_body("pools"))
    assert response.status_code == 200, response.text
    assert response.headers["x-litellm-priority"] == "default"
    counters = window(redis_sync, "pools")
    assert counters["r:d"] == before + 1
    assert not any(field.startswith("r:p.") and field not in ("r:p.prod", "r:p.dev") for field in counters)


# -- huge max_tokens -------------------------------------------------------------------------------------------
async def test_a_huge_max_tokens_is_clamped_and_admitted_into_unused_tpm(
    proxy: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    response = await chat(proxy, "sk-prod-1", chat_body("roomy", max_tokens=10**12))
    assert response.status_code == 200, response.text
    used = response.json()["usage"]["total_tokens"]
    # Reserved: prompt + MAX_RESERVED (not 10**12) out of 100000; then reconciled to the actual usage.
    assert int(response.headers["x-ratelimit-remaining-tokens"]) >= 100_000 * 0.7 - MAX_RESERVED - 50
    await eventually(lambda: window(redis_sync, "roomy").get("t") == used)


async def test_a_huge_max_tokens_reserves_the_learned_answer_and_never_blocks_the_model(
    proxy: LiteLLMProxy, redis_sync: redis.Redis
) -> None:
    # docs/admission.md, "The output estimate": a request reserves the model group's learned answer, capped at its
    # max_tokens, so max_tokens 10**12 against tpm 2000 costs what the answer costs (before anything is
    # learned: default_output_tokens), never the clamped max_tokens nor a 500.
    responses = [await chat(proxy, "sk-prod-1", chat_body("tight", max_tokens=10**12)) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
    used = sum(r.json()["usage"]["total_tokens"] for r in responses)
    remaining = [int(r.headers["x-ratelimit-remaining-tokens"]) for r in responses]
    # The first reserved the prior (256 + prompt); the next ones what the first answer used (about 30).
    assert remaining[0] <= 2000 - 256 and remaining[2] >= 2000 - 256 - 2 * 40
    await eventually(lambda: window(redis_sync, "tight").get("t") == used)
    assert window(redis_sync, "tight")["r"] == 3


# -- unknown model ---------------------------------------------------------------------------------------------
async def test_an_unknown_model_gets_litellms_own_error(proxy: LiteLLMProxy, redis_sync: redis.Redis) -> None:
    keys_before = sorted(redis_sync.scan_iter(f"{PREFIX}:*"))
    response = await chat(proxy, "sk-prod-1", chat_body("no-such-model"))
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert "no-such-model" in error["message"]
    assert "litellm_ratebalance" not in error["message"]
    assert sorted(redis_sync.scan_iter(f"{PREFIX}:*")) == keys_before  # no window for a made-up name
    assert_no_crash_of_ours(proxy)


# -- other call types --------------------------------------------------------------------------------------------
async def test_an_embeddings_call_is_admitted_and_counted(proxy: LiteLLMProxy, redis_sync: redis.Redis) -> None:
    contracts_before = contract_requests(redis_sync)
    async with proxy.async_client() as client:
        response = await client.post(
            "/v1/embeddings", headers=proxy.auth("sk-prod-1"), json={"model": "embed", "input": "hello there"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["embedding"]
    assert response.headers["x-litellm-priority"] == "prod"
    assert window(redis_sync, "embed")["r"] == 1
    # An embedding produces no output tokens: its input is what counts (the mock reports total_tokens 0).
    prompt = response.json()["usage"]["prompt_tokens"]
    assert prompt > 0
    await eventually(lambda: window(redis_sync, "embed").get("t") == prompt)
    assert contract_requests(redis_sync) == contracts_before + 1


async def test_a_streaming_chat_call_is_admitted_and_counted(proxy: LiteLLMProxy, redis_sync: redis.Redis) -> None:
    contracts_before = contract_requests(redis_sync)
    body = chat_body("stream", stream=True, stream_options={"include_usage": True})
    chunks: list[dict[str, Any]] = []
    async with (
        proxy.async_client() as client,
        client.stream("POST", "/v1/chat/completions", headers=proxy.auth("sk-dev-1"), json=body) as s,
    ):
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        async for line in s.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    usage = next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))
    assert window(redis_sync, "stream")["r"] == 1
    await eventually(lambda: window(redis_sync, "stream").get("t") == usage["total_tokens"])
    assert contract_requests(redis_sync) == contracts_before + 1
    assert_no_crash_of_ours(proxy)


# -- bad configuration ---------------------------------------------------------------------------------------------
def _start_and_wait_for_exit(config: dict[str, Any], name: str) -> tuple[int, str]:
    """Start a proxy that is expected to refuse its config: its exit status and log."""
    proxy = LiteLLMProxy(config, name=name)
    try:
        proxy.launch()
        process = proxy._process
        assert process is not None
        status = process.wait(timeout=120)
        return status, proxy.log_text()
    finally:
        proxy.cleanup()


def test_an_invalid_setting_stops_the_proxy_with_status_78_and_the_key_path() -> None:
    config = {
        "model_list": [mock_deployment("m", rpm=10)],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter"],
            "ratebalance": {"fail_mode": "sometimes", "limiter": {"window_seconds": 0}},
        },
    }
    status, log = _start_and_wait_for_exit(config, "badconfig")
    assert status == EXIT_CONFIG == 78, log[-3000:]
    assert "litellm_ratebalance: refusing to start, invalid configuration:" in log
    assert "litellm_settings.ratebalance.fail_mode: must be 'open', 'closed' or 'local' (got 'sometimes')" in log
    assert "litellm_settings.ratebalance.limiter.window_seconds: must be between 1 and 3600 (got 0)" in log


def test_a_bad_model_info_value_stops_the_proxy_with_status_78_and_the_deployment() -> None:
    """The rate balancer's per-deployment keys are checked at start-up too: a config-file model list with a
    ``model_info.slots`` below 1 is refused before any request, naming the deployment, the key and the range."""
    bad = mock_deployment("m", model_id="small-box")
    bad["model_info"]["slots"] = 0
    config = {
        "model_list": [bad, mock_deployment("m", model_id="big-box")],
        "litellm_settings": {"callbacks": ["litellm_ratebalance.rate_balancer"]},
    }
    status, log = _start_and_wait_for_exit(config, "badslots")
    assert status == EXIT_CONFIG == 78, log[-3000:]
    assert "litellm_ratebalance: refusing to start, invalid model_info:" in log
    assert "deployment small-box (model_name m): model_info.slots=0 must be a number of at least 1" in log
    assert "big-box" not in log.split("refusing to start")[1]
