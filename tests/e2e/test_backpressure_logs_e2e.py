"""What the real ``litellm`` proxy logs when backpressure refuses requests: one WARNING per reason per
interval, no traceback, and no scrape warning for a metrics endpoint that answers.

Before: LiteLLM logged every 503 refusal as an ERROR with a ~50-line traceback (its handler treats any 5xx
as a server fault), so an overload produced one traceback per refused request. The deployment here refuses
every request at once (a 10-token KV cache against ~28 tokens of prompt + ``max_tokens``); its metrics
endpoint is the simulated inference server's, which is up from the start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from litellm_ratebalance.simulate.inference_server import ServerSpec
from tests.e2e.conftest import StartProxies, proxies
from tests.e2e.harness import LiteLLMProxy, chat_body, inference_server_process, mock_deployment

pytestmark = pytest.mark.e2e

__all__ = ["proxies"]  # the e2e harness's module-scoped fixture, used here by name

REFUSALS = 6


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    """The simulated inference server in a child process; yields its Prometheus endpoint."""
    with inference_server_process(ServerSpec()) as url:
        yield url + "/metrics"


@pytest.fixture(scope="module")
def proxy(proxies: StartProxies, metrics_url: str) -> LiteLLMProxy:
    deployment = mock_deployment("m", model_id="gpu1")
    deployment["model_info"]["backpressure"] = {"kv_cache_tokens": 10, "metrics_url": metrics_url}
    config: dict[str, Any] = {
        "model_list": [deployment],
        "litellm_settings": {"callbacks": ["litellm_ratebalance.backpressure"]},
        "router_settings": {"num_retries": 0},
    }
    (started,) = proxies(config)
    return started


def test_refusals_log_one_warning_per_reason_without_traceback(proxy: LiteLLMProxy, metrics_url: str) -> None:
    assert httpx.get(metrics_url, timeout=5).status_code == 200  # the endpoint is up before the first request
    with httpx.Client(timeout=30) as client:
        for _ in range(REFUSALS):
            response = client.post(
                proxy.url("/v1/chat/completions"), headers=proxy.auth("sk-dev-1"), json=chat_body("m")
            )
            assert response.status_code == 503, response.text
            assert response.headers["x-litellm-backpressure-reason"] == "memory_pressure"
    time.sleep(2.5)  # two more scrapes (every second): a failing endpoint would have warned by now
    log = proxy.log_text()
    assert proxy.running, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    assert "_handle_llm_api_exception" not in log, log[-5000:]
    warnings = [line for line in log.splitlines() if "refusals are logged once per reason" in line]
    assert len(warnings) == 1, log[-5000:]
    assert warnings[0].startswith("litellm_ratebalance backpressure (memory_pressure): model group 'm'")
    assert "0 more of this reason since the last warning" in warnings[0]
    assert "cannot scrape" not in log, log[-5000:]
