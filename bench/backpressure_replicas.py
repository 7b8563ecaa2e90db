"""The ``--replicas N`` part of ``bench/bench_backpressure.py``: the same overload sequence sent through ``N``
real ``litellm`` proxy processes sharing one throwaway redis-server, in front of one simulated inference server.

Each proxy lists ``litellm_ratebalance.backpressure`` with the defaults (``output_estimate: learned``), tiers
``[batch, prod]`` (the demo's keys: ``sk-demo-prod`` is the top tier, ``sk-demo-batch`` the lower one), the
server's ``kv_cache_tokens`` and metrics, the queue on (max wait 10 s). Two model groups point at the same
server: ``mixed`` (deployment ``gpu-mixed``) takes the whole sequence, ``alone`` (``gpu-alone``) only its
top-tier requests at the same times (**top tier alone**: the lower tiers absent, behind the layer). Requests go
to the replicas in turn (request ``i`` to replica ``i mod N``), as a load balancer in front of them would.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from litellm_ratebalance.demo.proxy_process import ProxyProcess
from litellm_ratebalance.demo.services import LocalRedis
from litellm_ratebalance.proxy.backpressure.trace import TRACE_ENV

__all__ = ["KEYS", "Replicas", "send_http"]

KEYS = {"high": "sk-demo-prod", "low": "sk-demo-batch"}
"""The bench's tiers -> the demo key whose priority is that tier."""

REPO_ROOT = Path(__file__).resolve().parent.parent


def config(api_base: str, metrics_url: str, kv_cache_tokens: int, redis_url: str) -> dict[str, Any]:
    def deployment(group: str) -> dict[str, Any]:
        return {
            "model_name": group,
            "litellm_params": {"model": "openai/sim", "api_base": api_base, "api_key": "sk-none", "timeout": 120},
            "model_info": {"id": f"gpu-{group}"},
        }

    return {
        "model_list": [deployment("mixed"), deployment("alone")],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.backpressure"],
            "ratebalance": {
                "redis_url": redis_url,
                "key_prefix": "bench-bp",
                "backpressure": {
                    "tiers": ["batch", "prod"],
                    "kv_cache_tokens": kv_cache_tokens,
                    "queue": {"enabled": True, "max_wait_seconds": 10},
                    "deployments": {
                        "gpu-mixed": {"metrics_url": metrics_url},
                        "gpu-alone": {"metrics_url": metrics_url},
                    },
                },
            },
        },
        "general_settings": {"custom_auth": "demo_auth.user_api_key_auth"},
        "router_settings": {"num_retries": 0},
    }


class Replicas:
    """``async with Replicas(n, api_base, metrics_url, kv) as replicas``: a redis-server and ``n`` proxies."""

    def __init__(
        self, n: int, api_base: str, metrics_url: str, kv_cache_tokens: int, trace_path: Path | None = None
    ) -> None:
        self.n = n
        self.trace_path = trace_path
        """Where every proxy appends its backpressure trace (``LITELLM_RATEBALANCE_BACKPRESSURE_TRACE``);
        ``None``: no trace."""
        self._settings = (api_base, metrics_url, kv_cache_tokens)
        self.redis = LocalRedis()
        self.workdir = Path(tempfile.mkdtemp(prefix="ratebalance-bench-replicas-"))
        self.proxies: list[ProxyProcess] = []
        self.clients: list[httpx.AsyncClient] = []

    async def __aenter__(self) -> Replicas:
        self.redis.start()
        auth = resources.files("litellm_ratebalance.demo").joinpath("demo_auth.py").read_text("utf-8")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        if self.trace_path is not None:
            env[TRACE_ENV] = str(self.trace_path)
        cfg = config(*self._settings, redis_url=self.redis.url)
        self.proxies = [
            ProxyProcess(cfg, self.workdir / f"proxy{i + 1}", files={"demo_auth.py": auth}, env=env)
            for i in range(self.n)
        ]
        for proxy in self.proxies:
            proxy.launch()
        try:
            await asyncio.gather(*(p.wait_ready_async(180.0) for p in self.proxies))
        except BaseException:
            await self.__aexit__()
            raise
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
        self.clients = [
            httpx.AsyncClient(base_url=p.base_url, timeout=180.0, limits=limits, trust_env=False) for p in self.proxies
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self.clients:
            await client.aclose()
        for proxy in self.proxies:
            proxy.stop()
        self.redis.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> list[str]:
        return [p.log_path.read_text(errors="replace") if p.log_path.exists() else "" for p in self.proxies]


async def send_http(
    client: httpx.AsyncClient,
    group: str,
    priority: str,
    messages: Sequence[dict[str, str]],
    max_tokens: int | None,
    call_id: str | None = None,
) -> tuple[int, str | None, int]:
    """One chat completion through a proxy: (status, backpressure reason of a refusal, completion tokens).
    ``call_id``: sent as ``x-litellm-call-id`` (the proxy uses it as the request's call id: the trace's key)."""
    body: dict[str, Any] = {"model": group, "messages": list(messages)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    headers = {"Authorization": f"Bearer {KEYS[priority]}"}
    if call_id is not None:
        headers["x-litellm-call-id"] = call_id
    try:
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
    except httpx.HTTPError:
        return 0, None, 0
    if response.status_code == 200:
        usage = response.json().get("usage") or {}
        return 200, None, int(usage.get("completion_tokens") or 0)
    reason = response.headers.get("x-litellm-backpressure-reason")
    if reason is None and response.status_code in (429, 503):
        reason = f"status_{response.status_code}"
    return response.status_code, reason, 0


def started_at() -> float:
    return time.monotonic()
