"""The demo's proxy config: ``example_config.yaml``'s structure, pointed at the local mocks, scaled for a
run of a minute or less.

What :func:`demo_config` changes in the example (everything else is used as written):

* addresses: each ``chat`` deployment's ``api_base`` -> its mock, ``local``'s ``api_base`` and
  ``metrics_url`` -> the simulated inference server, whose KV cache sets ``kv_cache_tokens``;
* windows: the limiter's and the contracts' windows become ``window_seconds`` (10 s) so a short run shows
  several; deployment ``rpm``/``tpm`` and the contracts are scaled to that window; the routing window is
  30 s with 1 s buckets so weights follow the run;
* ``routing.rate_limit_headroom: 0``: the deployments' ``rpm`` now count per 10 s limiter window, while the
  balancer reads ``rpm`` per minute and would see every deployment as nearly exhausted;
* a model group ``quota`` (one deployment on the fast mock, ``rpm = quota_rpm``) for the global limit check;
* ``general_settings``: the demo's ``custom_auth`` (demo keys) instead of an environment master key
  (:class:`~litellm_ratebalance.demo.proxy_process.ProxyProcess` sets a random one);
* ``ratebalance.redis_url`` when replicas share a Redis.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHAT_DEPLOYMENTS",
    "CHAT_GROUP",
    "LOCAL_DEPLOYMENT",
    "LOCAL_GROUP",
    "QUOTA_DEPLOYMENT",
    "QUOTA_GROUP",
    "default_example_path",
    "demo_config",
    "load_example",
]

CHAT_GROUP = "chat"
LOCAL_GROUP = "local"
QUOTA_GROUP = "quota"
CHAT_DEPLOYMENTS = ("chat-fast", "chat-slow", "chat-flaky")
"""Deployment ids of ``chat`` in example_config.yaml; the mocks carry the same names."""
LOCAL_DEPLOYMENT = "local-gpu"
QUOTA_DEPLOYMENT = "quota-fast"
DEMO_STORE_TIMEOUT_SECONDS = 3.0


def default_example_path() -> Path:
    """``example_config.yaml`` at the root of the checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "example_config.yaml"


def load_example(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the demo reads example_config.yaml from the repository root "
            "(run it from a checkout, or pass --example-config PATH)"
        )
    loaded = yaml.safe_load(path.read_text("utf-8"))
    if not isinstance(loaded, dict) or not isinstance(loaded.get("model_list"), list):
        raise ValueError(f"{path}: not a LiteLLM config with a model_list")
    return loaded


def demo_config(
    example: dict[str, Any],
    *,
    chat_api_bases: dict[str, str],
    local_url: str,
    kv_cache_tokens: int,
    window_seconds: int,
    deployment_rpm: int,
    quota_rpm: int,
    redis_url: str | None,
) -> dict[str, Any]:
    """The config the demo's proxies run (see the module docstring for every change)."""
    config = copy.deepcopy(example)
    seen: set[str] = set()
    for entry in config["model_list"]:
        params = entry["litellm_params"]
        info = entry.setdefault("model_info", {})
        deployment_id = info.get("id")
        if deployment_id in chat_api_bases:
            params.update(api_base=chat_api_bases[deployment_id], api_key="sk-mock", rpm=deployment_rpm)
            params["tpm"] = deployment_rpm * 200  # ~50 tokens a request: requests, not tokens, bind
            seen.add(deployment_id)
        elif deployment_id == LOCAL_DEPLOYMENT:
            params.update(api_base=local_url + "/v1", api_key="sk-mock")
            info["backpressure"] = {
                **info.get("backpressure", {}),
                "metrics_url": local_url + "/metrics",
                "kv_cache_tokens": kv_cache_tokens,
            }
            seen.add(deployment_id)
    missing = ({*chat_api_bases, LOCAL_DEPLOYMENT}) - seen
    if missing:
        raise ValueError(f"the example config has no deployments with ids {sorted(missing)}")
    config["model_list"].append(
        {
            "model_name": QUOTA_GROUP,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": chat_api_bases[CHAT_DEPLOYMENTS[0]],
                "api_key": "sk-mock",
                "rpm": quota_rpm,
                "tpm": 10_000_000,
                "max_parallel_requests": 10_000,
            },
            "model_info": {"id": QUOTA_DEPLOYMENT},
        }
    )

    settings = config["litellm_settings"]
    ours = settings["ratebalance"]
    ours["limiter"]["window_seconds"] = window_seconds
    routing = ours["routing"]
    routing.update(window_seconds=30, bucket_seconds=1, refresh_interval=0.5, rate_limit_headroom=0.0)
    contracts = ours["traffic_contracts"]
    contracts.update(window_seconds=window_seconds, counter_ttl_seconds=2 * window_seconds)
    # Per 10 s window: the basket is below what the callers send, so borrowed and degraded both show.
    # A request is estimated at ~45 tokens (prompt + max_tokens) before the call.
    contracts["basket"] = {"rpm": 90, "tpm": 4000}
    features = contracts["features"]
    features["checkout-assistant"].update(rpm=30, tpm=1500)
    features["summaries"].update(rpm=40, tpm=2000)
    features["search"].update(rpm=8)
    backpressure = ours["backpressure"]
    backpressure["signals"].update(scrape_interval_seconds=0.5, scrape_timeout_seconds=0.4)
    if redis_url is not None:
        ours["redis_url"] = redis_url
        # The demo runs two proxies, Redis, the mock servers and the load generator on one machine, often a
        # small CI box. A Redis call that waits over the production default of 0.5 s there fails open and
        # the shared counts stop being exact, which is what the demo sets out to show.
        ours["store_timeout_seconds"] = DEMO_STORE_TIMEOUT_SECONDS
    else:
        ours.pop("redis_url", None)

    general = dict(config.get("general_settings") or {})
    general.pop("master_key", None)
    general["custom_auth"] = "demo_auth.user_api_key_auth"
    config["general_settings"] = general
    return config
