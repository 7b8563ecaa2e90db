"""Helpers to drive TrafficContractsCallback through its LiteLLM hooks, as the proxy does, without HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy.contracts import TrafficContractsCallback
from litellm_ratebalance.proxy.runtime import Runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import Store

EXAMPLE_CONTRACTS: dict[str, Any] = {
    "window_seconds": 3600,  # long windows: one test never straddles a boundary (see room_in_window)
    "counter_ttl_seconds": 7200,
    "basket": {"rpm": 4, "tpm": 10000},
    "features": {
        "smart-window": {"rpm": 2, "tpm": 5000, "aliases": ["ai", "memories"]},
        "s2s": {"rpm": 10, "tpm": 20000},
        "s2s-android": {"rpm": 10, "tpm": 20000},
    },
}


def make_router(model: str = "m") -> Any:
    params = {"model": "openai/fake", "api_key": "sk-fake", "mock_response": "hi"}
    return Router(model_list=[{"model_name": model, "litellm_params": params}])


def make_callback(
    store: Store, contracts: dict[str, Any] | None = None, router: Any = None, **kwargs: Any
) -> TrafficContractsCallback:
    runtime = Runtime()
    settings = parse_settings({"ratebalance": {"traffic_contracts": contracts or EXAMPLE_CONTRACTS}})
    runtime.configure(settings=settings, store=store, router=router if router is not None else make_router())
    return TrafficContractsCallback(runtime, **kwargs)


def auth(feature: str | None = None, *, team_feature: str | None = None, tags: list[str] | None = None) -> Any:
    metadata: dict[str, Any] = {}
    if feature is not None:
        metadata["feature"] = feature
    if tags is not None:
        metadata["tags"] = tags
    return UserAPIKeyAuth(
        api_key="sk-test",
        metadata=metadata,
        team_metadata={"feature": team_feature} if team_feature is not None else None,
    )


def request(model: str = "m", *, max_tokens: int | None = 10, **metadata: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        data["max_tokens"] = max_tokens
    if metadata:
        data["metadata"] = dict(metadata)
    return data


async def call(callback: TrafficContractsCallback, data: dict[str, Any], who: Any) -> HTTPException | None:
    """Run the pre-call hook; return the 429/503 it raised, or None if the request goes on."""
    try:
        await callback.async_pre_call_hook(who, None, data, "acompletion")
    except HTTPException as exc:
        return exc
    return None


async def headers_of(callback: TrafficContractsCallback, data: dict[str, Any], response: Any = True) -> dict[str, str]:
    return await callback.async_post_call_response_headers_hook(data, auth(), response) or {}


def success_kwargs(data: dict[str, Any], total_tokens: int) -> dict[str, Any]:
    """Logging kwargs of a successful call, as LiteLLM passes them to async_log_success_event."""
    return {
        "litellm_params": {"metadata": data.get("metadata", {})},
        "standard_logging_object": {
            "prompt_tokens": total_tokens // 2,
            "completion_tokens": total_tokens - total_tokens // 2,
            "total_tokens": total_tokens,
        },
    }


async def finish(callback: TrafficContractsCallback, data: dict[str, Any], total_tokens: int) -> None:
    await callback.async_log_success_event(success_kwargs(data, total_tokens), None, None, None)
    await callback.drain()


def sample(name: str, labels: dict[str, str]) -> float:
    """The value of series ``name`` with ``labels``, summed over the labels not given (e.g. every ``cause`` of
    ``store_errors_total``); 0 when there is none."""
    return sum(
        s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == name and all(s.labels.get(key) == value for key, value in labels.items())
    )


def requests_total(feature: str, rpm_mode: str, tpm_mode: str, model: str = "m") -> float:
    return sample(
        "litellm_ratebalance_traffic_contract_requests_total",
        {"feature": feature, "model_group": model, "rpm_mode": rpm_mode, "tpm_mode": tpm_mode},
    )


async def room_in_window(window: int, margin: float = 3.0) -> None:
    """Wait until the current window has at least ``margin`` seconds left (Redis runs on this host)."""
    left = window - (time.time() % window)
    if left < margin:
        await asyncio.sleep(left + 0.05)
