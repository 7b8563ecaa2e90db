"""Cost attribution through the real ``litellm`` proxy over HTTP: a local deployment (the simulated inference
server, behind backpressure) and an API deployment (LiteLLM's mock response, priced by its cost map).

What only the proxy shows: the caller's identity comes from the proxy's auth (custom_auth test keys:
``sk-prod-1``'s team ``team-prod`` has priority ``prod``; ``sk-dev-1`` is priority ``dev`` without a team), our
series reach ``/metrics`` with those labels, and ``litellm-ratebalance status`` reads GPU-seconds per 1k output
tokens from the Redis the proxy wrote to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from litellm_ratebalance.cli import main
from litellm_ratebalance.simulate.inference_server import ServerSpec
from tests.e2e.conftest import StartProxies, proxies
from tests.e2e.harness import LiteLLMProxy, chat_body, inference_server_process
from tests.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

__all__ = ["proxies"]  # the e2e harness's module-scoped fixture, used here by name

GPU_HOUR_USD = 3.6


@pytest.fixture(scope="module")
def inference_server() -> Iterator[str]:
    """The simulated server in a child process; yields its URL."""
    spec = ServerSpec(knee=4, step_seconds=0.01, memory_tokens=8000)
    with inference_server_process(spec) as url:
        yield url


@pytest.fixture(scope="module")
def proxy(proxies: StartProxies, inference_server: str, redis_server: RedisServer) -> LiteLLMProxy:
    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": "local",
                "litellm_params": {"model": "openai/sim", "api_base": inference_server + "/v1", "api_key": "sk-up"},
                "model_info": {"id": "gpu-cost", "backpressure": {"max_limit": 8}},
            },
            {
                "model_name": "api",
                "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-up", "mock_response": "Hello!"},
                "model_info": {"id": "api-cost"},
            },
        ],
        "litellm_settings": {
            "callbacks": ["prometheus", "litellm_ratebalance.backpressure", "litellm_ratebalance.cost"],
            "require_auth_for_metrics_endpoint": False,
            "ratebalance": {
                "key_prefix": "rbcoste2e",
                "backpressure": {"tiers": ["dev", "prod"]},
                "cost": {"gpu_hour_usd": GPU_HOUR_USD},
            },
        },
        "router_settings": {"num_retries": 0},
    }
    return proxies(config, redis_url=redis_server.url)[0]


def post(proxy: LiteLLMProxy, token: str, model: str) -> httpx.Response:
    response = httpx.post(
        proxy.url("/v1/chat/completions"),
        headers=proxy.auth(token),
        json=chat_body(model, "a" * 200, max_tokens=20),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response


def scrape(proxy: LiteLLMProxy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Our samples on ``/metrics``: (sample name, sorted labels) -> value."""
    text = httpx.get(proxy.url("/metrics"), follow_redirects=True, timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("litellm_ratebalance_")
        for sample in family.samples
    }


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((f"litellm_ratebalance_{name}", tuple(sorted(labels.items()))), 0.0)


def test_costs_reach_metrics_with_the_callers_labels_and_status_reads_them(
    proxy: LiteLLMProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = [post(proxy, "sk-prod-1", "local") for _ in range(2)] + [post(proxy, "sk-dev-1", "local")]
    post(proxy, "sk-prod-1", "api")
    prod = {"priority": "prod", "team": "team-prod", "feature": "unassigned"}
    dev = {"priority": "dev", "team": "none", "feature": "unassigned"}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    # Every series arrives after its response: the API call's cost with LiteLLM's success event, the GPU time
    # with the end mark that follows the lease's release. Wait for all of them (a loaded machine can lag).
    for _ in range(100):
        samples = scrape(proxy)
        arrived = (
            sample(samples, "cost_usd_total", **prod, source="api"),
            sample(samples, "gpu_seconds_total", deployment="gpu-cost", **prod),
            sample(samples, "gpu_seconds_total", deployment="gpu-cost", **dev),
        )
        if all(value > 0 for value in arrived):
            break
        time.sleep(0.2)
    faults = [line for line in proxy.log_text().splitlines() if "store error" in line]
    assert not faults, faults  # a store fault leaves its request unmetered, by design: not this test's case

    prod_gpu = sample(samples, "gpu_seconds_total", deployment="gpu-cost", **prod)
    assert prod_gpu > 0
    assert sample(samples, "gpu_seconds_total", deployment="gpu-cost", **dev) > 0
    assert sample(samples, "cost_usd_total", **prod, source="gpu") == pytest.approx(prod_gpu * GPU_HOUR_USD / 3600)
    assert sample(samples, "cost_usd_total", **prod, source="api") > 0
    assert sample(samples, "cost_usd_total", **dev, source="api") == 0.0  # the local call is GPU time only
    used = sum(r.json()["usage"]["total_tokens"] for r in local[:2])
    assert sample(samples, "cost_tokens_total", **prod, kind="used") == used
    assert sample(samples, "cost_tokens_total", **prod, kind="reserved") > 0

    capsys.readouterr()
    assert main(["status", "--config", str(proxy.workdir / "config.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    deployments = {d["deployment_id"]: d for g in doc["model_groups"] for d in g["deployments"]}
    assert deployments["gpu-cost"]["gpu_seconds_per_1k_output_tokens"] > 0
    assert deployments["api-cost"]["gpu_seconds_per_1k_output_tokens"] is None
