"""The LiteLLM docs' quick start, through the real proxy, with our limiter in place of ``dynamic_rate_limiter_v3``.

``my-fake-model`` has tpm 60 and a mock answer of 30 tokens (10 prompt + 20 completion). Clients send no
``max_tokens``, one request at a time, from two keys without priority. The docs' promise: two requests are
served (2 x 30 = 60 tokens), then every key gets a 429 until the window rolls. A limiter that reserved
``default_output_tokens`` (256) per request served one, then refused with room for a second left.

Runs twice: on the embedded store (no Redis, the docs' set-up) and on a redis-server.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.conftest import StartProxies
from tests.e2e.harness import chat_body, mock_deployment

pytestmark = [pytest.mark.e2e]

CONFIG: dict[str, Any] = {
    "model_list": [mock_deployment("my-fake-model", tpm=60, mock_response="hello-world")],
    "litellm_settings": {
        "callbacks": ["litellm_ratebalance.rate_limiter"],
        "ratebalance": {"key_prefix": "e2e-quick-start"},
    },
    "router_settings": {"num_retries": 0},
}


@pytest.mark.parametrize("backend", ["embedded", "redis"])
async def test_the_docs_quick_start_serves_two_requests_then_429(
    proxies: StartProxies, backend: str, request: pytest.FixtureRequest
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if backend == "redis" else None
    if redis_url is not None:
        import redis

        server = redis.Redis.from_url(redis_url)
        for key in server.scan_iter("e2e-quick-start:*"):
            server.delete(key)
        server.close()
    (proxy,) = proxies(CONFIG, redis_url=redis_url)
    async with proxy.async_client() as client:
        statuses = []
        for token, content in (("sk-none", "Hello world!"), ("sk-unknown-priority", "Hello world!")):
            response = await client.post(
                "/v1/chat/completions",
                headers=proxy.auth(token),
                json=chat_body("my-fake-model", content, max_tokens=None),
            )
            statuses.append(response.status_code)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["total_tokens"] == 30
        refused = await post_until_settled(client, proxy.auth("sk-unknown-priority"))
    assert statuses == [200, 200]
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["type"] == "throttling_error"
    assert error["message"].startswith(
        "Model capacity reached for my-fake-model. Priority: None, Rate limit type: tokens, Model TPM: 60"
    ), error["message"]
    assert int(refused.headers["retry-after"]) >= 1


async def post_until_settled(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """The docs' third call. A client one request at a time sends it after the second answer arrived; the
    second one's usage reaches the limiter with this request (or within 100 ms), never later."""
    return await client.post(
        "/v1/chat/completions",
        headers=headers,
        json=chat_body("my-fake-model", "Hey, how's it going?", max_tokens=None),
    )
