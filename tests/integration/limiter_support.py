"""Helpers to drive PriorityRateLimiter through its LiteLLM hooks, as the proxy does, without HTTP."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router

from litellm_ratebalance.proxy.admission import PriorityRateLimiter
from litellm_ratebalance.proxy.runtime import Runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import Store


def make_router(model: str = "m", *, rpm: int | None = None, tpm: int | None = None, deployments: int = 1) -> Any:
    model_list = []
    for index in range(deployments):
        params: dict[str, Any] = {"model": "openai/fake", "api_key": "sk-fake", "mock_response": "hi"}
        if rpm is not None:
            params["rpm"] = rpm // deployments
        if tpm is not None:
            params["tpm"] = tpm // deployments
        model_list.append({"model_name": model, "litellm_params": params, "model_info": {"id": f"{model}-{index}"}})
    return Router(model_list=model_list)


def make_limiter(store: Store, router: Any, litellm_settings: dict[str, Any] | None = None) -> PriorityRateLimiter:
    runtime = Runtime()
    runtime.configure(settings=parse_settings(litellm_settings or {}), store=store, router=router)
    return PriorityRateLimiter(runtime)


def auth(priority: str | None = None, *, team_priority: str | None = None) -> UserAPIKeyAuth:
    return UserAPIKeyAuth(
        api_key="sk-test",
        metadata={"priority": priority} if priority is not None else {},
        team_metadata={"priority": team_priority} if team_priority is not None else None,
    )


def request(model: str = "m", *, max_tokens: int | None = 10, content: str = "hi") -> dict[str, Any]:
    data: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        data["max_tokens"] = max_tokens
    return data


async def call(limiter: PriorityRateLimiter, data: dict[str, Any], who: UserAPIKeyAuth) -> HTTPException | None:
    """Run the pre-call hook; return the 429/503 it raised, or None if admitted."""
    try:
        await limiter.async_pre_call_hook(who, None, data, "acompletion")
    except HTTPException as exc:
        return exc
    return None


async def finish(limiter: PriorityRateLimiter, data: dict[str, Any], total_tokens: int, *, flush: bool = True) -> None:
    """Report a successful call that used ``total_tokens`` (as LiteLLM's success logging does); ``flush``
    sends the correction at once instead of with the next admission (or the flush timer)."""
    kwargs = {
        "litellm_params": {"metadata": data.get("metadata", {})},
        "standard_logging_object": {
            "prompt_tokens": total_tokens // 2,
            "completion_tokens": total_tokens - total_tokens // 2,
            "total_tokens": total_tokens,
        },
    }
    await limiter.async_log_success_event(kwargs, None, None, None)
    if flush:
        await limiter.flush_settles()
