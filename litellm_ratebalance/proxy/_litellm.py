"""The one module that touches LiteLLM internals (anything not in its documented callback API).

Each accessor is small, returns ``None`` (or raises ``LiteLLMSurfaceChanged`` with a clear message) when
the internal it reads has moved, and is covered by ``tests/unit/test_litellm_surface.py``, which fails
loudly on a LiteLLM upgrade that changes one of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = [
    "LiteLLMSurfaceChanged",
    "discover_redis_cache",
    "general_setting",
    "is_fanout_lookup",
    "narrow_like_router",
    "proxy_router",
    "rate_limit_exception",
]


class LiteLLMSurfaceChanged(RuntimeError):
    """A LiteLLM internal this package relies on is gone or changed shape."""


def _proxy_server() -> Any | None:
    try:
        return importlib.import_module("litellm.proxy.proxy_server")
    except Exception:  # SDK install without the proxy extra
        return None


def proxy_router() -> Any | None:
    """The proxy's current Router (it may be replaced at runtime, so never cache it for long)."""
    server = _proxy_server()
    return None if server is None else getattr(server, "llm_router", None)


def general_setting(name: str) -> Any:
    server = _proxy_server()
    general = getattr(server, "general_settings", None) if server is not None else None
    return general.get(name) if isinstance(general, Mapping) else None


def discover_redis_cache() -> Any | None:
    """The proxy's shared ``RedisCache``, in LiteLLM's own order of precedence (see LITELLM-NOTES.md):

    1. ``proxy_server.redis_usage_cache`` (what LiteLLM's limiters use),
    2. ``proxy_logging_obj.internal_usage_cache.dual_cache.redis_cache``,
    3. the router's own Redis (``router_settings.redis_host/port``).
    """
    server = _proxy_server()
    if server is None:
        return None
    candidates: list[Any] = [getattr(server, "redis_usage_cache", None)]
    logging_obj = getattr(server, "proxy_logging_obj", None)
    internal = getattr(logging_obj, "internal_usage_cache", None)
    dual = getattr(internal, "dual_cache", None)
    candidates.append(getattr(dual, "redis_cache", None))
    router = getattr(server, "llm_router", None)
    router_cache = getattr(router, "cache", None)
    candidates.append(getattr(router_cache, "redis_cache", None))
    for candidate in candidates:
        if candidate is not None and hasattr(candidate, "init_async_client"):
            return candidate
    return None


def rate_limit_exception(message: str, headers: Mapping[str, str], model: str) -> Exception:
    """A 429 the proxy sends as ``{"error": {"message", "type": "throttling_error", "code": "429"}}``.

    LiteLLM's own limiters raise ``ProxyRateLimitError``; on versions without it we fall back to a
    FastAPI ``HTTPException`` (same status and headers, LiteLLM then labels the type itself).
    """
    try:
        module = importlib.import_module("litellm.proxy.common_utils.proxy_rate_limit_error")
        error_class = module.ProxyRateLimitError
    except (ImportError, AttributeError):
        from fastapi import HTTPException

        return HTTPException(status_code=429, detail={"error": message}, headers=dict(headers))
    return error_class(detail={"error": message}, headers=dict(headers), model=model)  # type: ignore[no-any-return]


def service_unavailable(message: str, headers: Mapping[str, str] | None = None) -> Exception:
    """A 503 with ``{"error": {"message": ...}}`` (fail-closed store faults, load shedding)."""
    from fastapi import HTTPException

    return HTTPException(status_code=503, detail={"error": message}, headers=dict(headers or {}))


def is_fanout_lookup(messages: object) -> bool:
    """True when the Router asks for healthy deployments to act on all of them, not to pick one.

    File, batch and vector-store calls look up the healthy deployments with one placeholder message
    (``{"role": "user", "content": "files-api-fake-text"}`` and the like) and then use every one of them;
    narrowing such a lookup to one deployment would break them.
    """
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], Mapping):
        return False
    content = messages[0].get("content")
    return isinstance(content, str) and content.endswith("-api-fake-text")


def narrow_like_router(
    deployments: list[dict[str, Any]], request_kwargs: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The deployments that would survive the Router's own narrowing *after* the callbacks' filter.

    ``Router.async_get_healthy_deployments`` runs ``async_filter_deployments`` and then keeps only the
    deployments of the lowest ``order`` (or of the target order of an order fallback), drops the ones a
    weighted failover already tried, and (unless nothing would be left) the ones that refused this request
    in an earlier retry. A callback that picks one deployment must pick among these, or the Router would
    filter its pick away. The request's control values are read, not consumed (the Router pops them later).
    """
    kwargs = request_kwargs or {}
    if (
        "_target_order" not in kwargs
        and not kwargs.get("_excluded_deployment_ids")
        and not kwargs.get("_retry_skipped_deployment_ids")
        and not any((d.get("litellm_params") or {}).get("order") is not None for d in deployments)
    ):
        return deployments  # the common case, on the request path: nothing to narrow
    try:
        from litellm.utils import get_excluded_filtered_deployments, get_order_filtered_deployments
    except ImportError:
        return deployments
    narrowed: list[dict[str, Any]] = get_order_filtered_deployments(
        deployments, target_order=kwargs.get("_target_order")
    )
    narrowed = get_excluded_filtered_deployments(
        narrowed, excluded_deployment_ids=kwargs.get("_excluded_deployment_ids")
    )
    skipped = kwargs.get("_retry_skipped_deployment_ids")
    if isinstance(skipped, (tuple, list, set, frozenset)) and skipped:
        narrowed = get_excluded_filtered_deployments(narrowed, excluded_deployment_ids=skipped) or narrowed
    return narrowed
