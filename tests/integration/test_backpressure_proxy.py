"""Backpressure through the real ``litellm`` proxy over HTTP, in front of the simulated inference server.

What only the proxy shows: the refusals reach clients as 503 / 429 with our headers and an OpenAI-style
error body, successful responses carry ``x-litellm-queue-depth`` / ``x-litellm-concurrency-limit``, and
the priority comes from the key's / team's metadata (custom_auth test keys: ``sk-dev-1`` is priority
``dev``, ``sk-prod-1``'s team is ``prod``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from litellm_ratebalance.simulate.inference_server import ServerSpec
from tests.e2e.conftest import StartProxies, proxies
from tests.e2e.harness import LiteLLMProxy, chat_body, inference_server_process

pytestmark = pytest.mark.e2e

__all__ = ["proxies"]  # the e2e harness's module-scoped fixture, used here by name


@pytest.fixture(scope="module")
def inference_server() -> Iterator[str]:
    """The simulated server in a child process (sync, for the module-scoped proxy); yields its URL."""
    spec = ServerSpec(knee=4, step_seconds=0.02, memory_tokens=4000)
    with inference_server_process(spec) as url:
        yield url


@pytest.fixture(scope="module")
def proxy(proxies: StartProxies, inference_server: str) -> LiteLLMProxy:
    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": "local",
                "litellm_params": {"model": "openai/sim", "api_base": inference_server + "/v1", "api_key": "sk-up"},
                "model_info": {
                    "id": "gpu1",
                    "backpressure": {
                        "metrics_url": inference_server + "/metrics",
                        "initial_limit": 2,
                        "min_limit": 2,
                        "max_limit": 2,
                    },
                },
            }
        ],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.backpressure"],
            "ratebalance": {"backpressure": {"tiers": ["dev", "prod"]}},
        },
        "router_settings": {"num_retries": 0},
    }
    return proxies(config)[0]


def post(proxy: LiteLLMProxy, token: str, max_tokens: int) -> httpx.Response:
    return httpx.post(
        proxy.url("/v1/chat/completions"),
        headers=proxy.auth(token),
        json=chat_body("local", "a" * 200, max_tokens=max_tokens),
        timeout=60,
    )


def burst(proxy: LiteLLMProxy, token: str, count: int, max_tokens: int) -> list[httpx.Response]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: post(proxy, token, max_tokens), range(count)))


def test_success_carries_queue_depth_and_concurrency_limit(proxy: LiteLLMProxy) -> None:
    response = post(proxy, "sk-prod-1", 5)
    assert response.status_code == 200, response.text
    assert response.headers["x-litellm-concurrency-limit"] == "2"
    assert int(response.headers["x-litellm-queue-depth"]) >= 0


def test_low_tier_is_shed_with_an_actionable_503(proxy: LiteLLMProxy) -> None:
    # Limit 2: the dev tier may take floor(0.85 x 2) = 1 slot; each request runs ~1 s upstream.
    responses = burst(proxy, "sk-dev-1", 4, 50)
    assert Counter(r.status_code for r in responses) == {200: 1, 503: 3}
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.headers["x-litellm-backpressure-reason"] == "compute_saturation"
    assert refused.headers["x-litellm-backpressure-advice"] in ("retry", "reroute")
    assert int(refused.headers["retry-after"]) >= 1
    message = refused.json()["error"]["message"]
    assert "compute_saturation" in message and "priority tier 'dev'" in message


def test_top_tier_at_the_limit_gets_429(proxy: LiteLLMProxy) -> None:
    responses = burst(proxy, "sk-prod-1", 4, 50)
    assert Counter(r.status_code for r in responses) == {200: 2, 429: 2}
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["x-litellm-backpressure-reason"] == "concurrency_limit"
    assert "all 2 concurrency slots are in use" in refused.json()["error"]["message"]
