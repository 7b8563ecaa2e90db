"""The one module that touches LiteLLM internals (anything not in its documented callback API).

Each accessor is small, returns ``None`` (or raises ``LiteLLMSurfaceChanged`` with a clear message) when
the internal it reads has moved, and is covered by ``tests/unit/test_litellm_surface.py``, which fails
loudly on a LiteLLM upgrade that changes one of them.
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LiteLLMSurfaceChanged",
    "any_order",
    "caller_id",
    "deployment_model_group",
    "deployment_model_info",
    "discover_redis_cache",
    "exception_status",
    "failure_exception",
    "forbid_router_retry",
    "general_setting",
    "group_deployments",
    "healthy_deployments",
    "is_fanout_lookup",
    "is_listing_lookup",
    "is_queue_lookup",
    "logged_deployment_id",
    "logged_response_cost",
    "narrow_like_router",
    "own_sync_pick",
    "proxy_router",
    "rate_limit_exception",
    "request_auth",
    "request_call_id",
    "request_deployment_info",
    "request_metadata",
    "request_model_group",
    "reset_routing_strategy",
    "response_deployment_id",
    "response_usage",
    "router_deployments",
    "service_unavailable",
    "set_routing_strategy",
]


class LiteLLMSurfaceChanged(RuntimeError):
    """A LiteLLM internal this package relies on is gone or changed shape."""


def _proxy_server() -> Any | None:
    """LiteLLM's proxy server module when this process runs the proxy, else None. Looked up, never imported:
    importing it takes seconds and sets up the proxy's globals, which an SDK user's process must not get.
    Python sets a submodule as an attribute of its package once it is imported, so the attribute of the
    (light) ``litellm.proxy`` package says whether the server module is loaded."""
    import litellm.proxy

    return getattr(litellm.proxy, "proxy_server", None)


def proxy_server_loaded() -> bool:
    """Whether this process runs LiteLLM's proxy (its server module is loaded)."""
    return _proxy_server() is not None


def proxy_router() -> Any | None:
    """The proxy's current Router (it may be replaced at runtime, so never cache it for long)."""
    server = _proxy_server()
    return None if server is None else getattr(server, "llm_router", None)


def general_setting(name: str) -> Any:
    server = _proxy_server()
    general = getattr(server, "general_settings", None) if server is not None else None
    return general.get(name) if isinstance(general, Mapping) else None


def discover_redis_cache() -> Any | None:
    """The proxy's shared ``RedisCache``, looked for where LiteLLM's own limiters look, in their order:

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

        # (typed through a variable: without fastapi's types installed, e.g. in an SDK-only environment,
        # HTTPException is Any to mypy)
        fallback: Exception = HTTPException(status_code=429, detail={"error": message}, headers=dict(headers))
        return fallback
    return error_class(detail={"error": message}, headers=dict(headers), model=model)  # type: ignore[no-any-return]


def service_unavailable(message: str, headers: Mapping[str, str] | None = None) -> Exception:
    """A 503 with ``{"error": {"message": ...}}`` (fail-closed store faults, load shedding)."""
    from fastapi import HTTPException

    error: Exception = HTTPException(status_code=503, detail={"error": message}, headers=dict(headers or {}))
    return error  # (through a variable, as in rate_limit_exception)


def is_fanout_lookup(messages: object) -> bool:
    """True when the Router asks for healthy deployments to act on all of them, not to pick one.

    File, batch and vector-store calls look up the healthy deployments with one placeholder message
    (``{"role": "user", "content": "files-api-fake-text"}`` and the like) and then use every one of them;
    narrowing such a lookup to one deployment would break them. The placeholders are the same from 1.106 to
    1.110 (``litellm/router.py`` kept them up to 1.108, ``litellm/router_rust/invoke/endpoints.py`` from
    1.110); ``tests/unit/test_litellm_surface.py`` finds them wherever the Router's source keeps them.
    """
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], Mapping):
        return False
    content = messages[0].get("content")
    return isinstance(content, str) and content.endswith("-api-fake-text")


def is_queue_lookup(messages: object, request_kwargs: Mapping[str, Any] | None) -> bool:
    """True for the priority queue's look-up: not the request's pick, only "is any deployment healthy?".

    From LiteLLM 1.110 a request sent with ``priority`` waits its turn in the Router's queue, which on every
    poll lists the group's healthy deployments through the callbacks' ``async_filter_deployments`` (before
    1.110 that look-up skipped the callbacks). It hands the filters no messages though the request it passes
    carries them (``messages``; ``prompt`` for text completions), while the request's own pick, once its turn
    comes, hands them its messages. A pick recorded there would count a request in flight that is never
    sent; a refusal would be counted twice.
    """
    return (
        messages is None
        and isinstance(request_kwargs, Mapping)
        and (request_kwargs.get("messages") is not None or request_kwargs.get("prompt") is not None)
    )


def is_listing_lookup(messages: object, request_kwargs: Mapping[str, Any] | None) -> bool:
    """True when the Router's look-up of healthy deployments is not the pick of one for the request about to
    be sent: a fan-out (:func:`is_fanout_lookup`) or the priority queue's look-up (:func:`is_queue_lookup`).
    A callback's filter must then leave the list as it is and record nothing."""
    return is_fanout_lookup(messages) or is_queue_lookup(messages, request_kwargs)


def any_order(deployments: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a deployment sets ``litellm_params.order`` (a plain loop: this can run on every request)."""
    for deployment in deployments:
        params = deployment.get("litellm_params")
        if params and params.get("order") is not None:
            return True
    return False


def narrow_like_router(
    deployments: list[dict[str, Any]], request_kwargs: Mapping[str, Any] | None, *, ordered: bool | None = None
) -> list[dict[str, Any]]:
    """The deployments that would survive the Router's own narrowing *after* the callbacks' filter.

    The Router's healthy lookup (``async_get_healthy_deployments``; from 1.110 its core's selection, which
    hands the filters the same control values) runs ``async_filter_deployments`` and then keeps only the
    deployments of the lowest ``order`` (or of the target order of an order fallback), drops the ones a
    weighted failover already tried, and (unless nothing would be left) the ones that refused this request
    in an earlier retry. A callback that picks one deployment must pick among these, or the Router would
    filter its pick away. The request's control values are read, not consumed (the Router pops them later).
    ``ordered``: :func:`any_order` of the deployments, when the caller knows it.
    """
    kwargs = request_kwargs or {}
    if (
        "_target_order" not in kwargs
        and not kwargs.get("_excluded_deployment_ids")
        and not kwargs.get("_retry_skipped_deployment_ids")
        and not (any_order(deployments) if ordered is None else ordered)
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


# -- deployments and requests as the Router hands them to callbacks -------------------------------------------
# The shapes below are LiteLLM's internal conventions (not its documented callback API): where the Router keeps
# its deployment list, where it copies the chosen deployment and the caller's auth into the request, where
# the failure event carries the exception and the response the deployment id.


def router_deployments(router: Any) -> list[Mapping[str, Any]]:
    """The Router's deployment dicts (``registry().all()`` from LiteLLM 1.110, ``model_list`` before it);
    empty without a router."""
    if router is None:
        return []
    registry = getattr(router, "registry", None)
    deployments = registry().all() if callable(registry) else getattr(router, "model_list", None)
    if not isinstance(deployments, list):
        return []
    return [d for d in deployments if isinstance(d, Mapping)]


def group_deployments(router: Any, model_group: str | None = None) -> list[Mapping[str, Any]]:
    """The deployments the Router serves ``model_group`` with, the name resolved as the Router resolves it
    (the group, its aliases, routing groups, then wildcard routes); every deployment when ``model_group`` is
    None. ``registry().deployments(name)`` from LiteLLM 1.110, ``get_model_list(model_name=name)`` before."""
    registry = getattr(router, "registry", None)
    if callable(registry):
        deployments = registry().deployments(model_group)
    else:
        deployments = router.get_model_list(model_name=model_group) if model_group else router.get_model_list()
    return [d for d in deployments or () if isinstance(d, Mapping)]


# -- the Router's routing entry points, by the name each LiteLLM version gives them -------------------------------
# LiteLLM 1.110 renamed them (the old names still work there, with a DeprecationWarning on every call, and
# are to be removed): a ``select`` method and ``register_plugin`` mark a Router that has the new ones.


async def healthy_deployments(
    router: Any,
    model: str,
    request_kwargs: dict[str, Any],
    messages: Any = None,
    input: Any = None,
    specific_deployment: bool | None = False,
) -> Any:
    """The deployments a pick would choose among, after the Router's health and cooldown filtering and the
    callbacks' ``async_filter_deployments`` (a list; a dict when ``specific_deployment`` names one).
    ``select(model, request_kwargs, kind="healthy", ...)`` from LiteLLM 1.110, ``async_get_healthy_deployments``
    before. Like the Router's own pick, it takes the narrowing keys (``_target_order`` ...) out of
    ``request_kwargs``."""
    select = getattr(router, "select", None)
    if callable(select):
        return await select(
            model,
            request_kwargs,
            kind="healthy",
            messages=messages,
            input=input,
            specific_deployment=specific_deployment,
        )
    return await router.async_get_healthy_deployments(
        model=model,
        request_kwargs=request_kwargs,
        messages=messages,
        input=input,
        specific_deployment=specific_deployment,
    )


def set_routing_strategy(router: Any, strategy: Any) -> None:
    """Make ``strategy`` (a ``CustomRoutingStrategyBase``) pick every deployment the Router routes to:
    ``register_plugin`` from LiteLLM 1.110, ``set_custom_routing_strategy`` before."""
    register = getattr(router, "register_plugin", None)
    if callable(register):
        register(strategy)
    else:
        router.set_custom_routing_strategy(strategy)


def own_sync_pick(
    router: Any,
    model: str,
    messages: Any = None,
    input: Any = None,
    specific_deployment: bool | None = False,
    request_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A deployment for one of the Router's synchronous calls while a custom strategy is set, picked without
    that strategy (whose sync pick calls this).

    Up to LiteLLM 1.108 the Router's class method is its own pick (health filtering, its configured
    strategy). From 1.110 the Router's core sends every sync pick to the custom strategy and has no pick of
    its own to fall back on: the deployments the Router serves the name with (the one whose id it is, for a
    ``specific_deployment``), less those LiteLLM is cooling down (all of them when every one is), one at
    random, as ``simple-shuffle`` picks. ``ValueError`` when the name matches no deployment.
    """
    if not callable(getattr(router, "register_plugin", None)):
        return type(router).get_available_deployment(
            router,
            model=model,
            messages=messages,
            input=input,
            specific_deployment=specific_deployment,
            request_kwargs=request_kwargs,
        )
    if specific_deployment:
        named = [d for d in router_deployments(router) if (deployment_model_info(d) or {}).get("id") == model]
        if named:
            return named[0]
    deployments = group_deployments(router, model)
    if not deployments:
        raise ValueError(f"no deployment serves model {model!r}")
    ids = [str((deployment_model_info(d) or {}).get("id")) for d in deployments]
    cooling = {str(entry[0]) for entry in router.health().cooldowns.get_active_cooldowns(ids, None)}
    healthy = [d for d, deployment_id in zip(deployments, ids, strict=True) if deployment_id not in cooling]
    return random.choice(healthy or deployments)


def reset_routing_strategy(router: Any) -> None:
    """Give the Router its own routing strategy back after :func:`set_routing_strategy`.

    Up to LiteLLM 1.108, ``set_custom_routing_strategy`` set the strategy's two pick methods on the Router
    instance: removing them uncovers the class's, and the configured strategy keeps what it learnt. From
    1.110 the Router's core holds the strategy and only ``routing_strategy_init`` drops it (as a change of
    ``routing_strategy`` does): that builds the configured strategy anew, so its learnt state starts over.
    """
    if not callable(getattr(router, "register_plugin", None)):
        for name in ("get_available_deployment", "async_get_available_deployment"):
            vars(router).pop(name, None)
        return
    settings = router.settings()
    router.routing_strategy_init(settings.routing_strategy, getattr(settings, "routing_strategy_args", None) or {})


def deployment_model_info(deployment: object) -> Mapping[str, Any] | None:
    """A deployment dict's ``model_info`` (its ``id`` is the deployment id), or ``None``."""
    info = deployment.get("model_info") if isinstance(deployment, Mapping) else None
    return info if isinstance(info, Mapping) else None


def deployment_model_group(deployment: object) -> str:
    """A deployment dict's model group (``model_name``); ``""`` when absent."""
    name = deployment.get("model_name") if isinstance(deployment, Mapping) else None
    return str(name) if name else ""


def request_metadata(kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request's metadata as LiteLLM carries it to callbacks: ``metadata`` (chat/completions),
    ``litellm_metadata`` (some routes), or ``litellm_params.metadata`` (logging events)."""
    for name in ("metadata", "litellm_metadata"):
        value = kwargs.get(name)
        if isinstance(value, Mapping) and value:
            return value
    params = kwargs.get("litellm_params")
    if isinstance(params, Mapping):
        value = params.get("metadata")
        if isinstance(value, Mapping):
            return value
    return {}


def request_auth(kwargs: Mapping[str, Any]) -> Any:
    """The caller's ``UserAPIKeyAuth``: the proxy stores a copy at ``metadata.user_api_key_auth``. Only an
    object counts: a dict there (which a request body could forge) has no ``team_metadata``/``metadata``
    attributes, so identity helpers that read attributes see nothing in it."""
    return request_metadata(kwargs).get("user_api_key_auth")


def caller_id(auth: object) -> str:
    """Who is asking, for fairness between callers: ``team:<team_id>``, else ``user:<user_id>``, else
    ``key:<token>`` (the hashed key) of a ``UserAPIKeyAuth``; ``anonymous`` without one."""
    for attribute, label in (("team_id", "team"), ("user_id", "user"), ("token", "key")):
        value = getattr(auth, attribute, None)
        if isinstance(value, str) and value:
            return f"{label}:{value}"
    return "anonymous"


def request_deployment_info(kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The chosen deployment's ``model_info`` (the Router copies it into the request metadata before the
    deployment hook and the logging events); ``None`` when absent or without an ``id``."""
    info = request_metadata(kwargs).get("model_info") or kwargs.get("model_info")
    return info if isinstance(info, Mapping) and info.get("id") is not None else None


def request_model_group(kwargs: Mapping[str, Any]) -> str:
    """The model group the caller asked for (the Router sets ``metadata.model_group``), else ``model``."""
    return str(request_metadata(kwargs).get("model_group") or kwargs.get("model") or "")


def request_call_id(kwargs: Mapping[str, Any]) -> str | None:
    """``litellm_call_id``: one id per client request, kept across the Router's retries."""
    value = kwargs.get("litellm_call_id")
    return None if value is None else str(value)


def failure_exception(kwargs: object) -> Any:
    """The exception of a failure event (``kwargs["exception"]`` of ``async_log_failure_event``)."""
    return kwargs.get("exception") if isinstance(kwargs, Mapping) else None


def response_deployment_id(response: object) -> str | None:
    """The deployment that served a response (``response._hidden_params["model_id"]``)."""
    hidden = getattr(response, "_hidden_params", None)
    value = hidden.get("model_id") if isinstance(hidden, Mapping) else None
    return None if value is None else str(value)


def response_usage(response: object) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` of a response's OpenAI-style ``usage`` (``None`` each when
    absent or not a positive whole number)."""
    usage = getattr(response, "usage", None)
    return _positive_int(getattr(usage, "prompt_tokens", None)), _positive_int(
        getattr(usage, "completion_tokens", None)
    )


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return int(value)


def exception_status(exception: object) -> int | None:
    """The HTTP status LiteLLM's exceptions (and FastAPI's ``HTTPException``) carry in ``status_code``."""
    status = getattr(exception, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def forbid_router_retry(exception: Exception) -> None:
    """Ask the Router not to retry this exception inside the same request.

    ``Router.async_function_with_retries`` takes ``num_retries`` off the exception when the request did not
    set one itself (this is how per-deployment ``num_retries`` reaches it); 0 means "raise at once". A
    request that passes its own ``num_retries`` keeps it: the caller asked for those retries.
    """
    exception.num_retries = 0  # type: ignore[attr-defined]


def logged_response_cost(kwargs: object) -> float | None:
    """LiteLLM's cost of a finished call, as its success event reports it: ``standard_logging_object
    ["response_cost"]``, else ``kwargs["response_cost"]``; ``None`` when absent, not a number, or negative."""
    if not isinstance(kwargs, Mapping):
        return None
    payload = kwargs.get("standard_logging_object")
    value = payload.get("response_cost") if isinstance(payload, Mapping) else None
    if value is None:
        value = kwargs.get("response_cost")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def logged_deployment_id(kwargs: object, response: object) -> str | None:
    """The deployment that served a logged call: ``standard_logging_object["model_id"]``, else the request's
    ``model_info.id``, else the response's hidden ``model_id``."""
    if isinstance(kwargs, Mapping):
        payload = kwargs.get("standard_logging_object")
        value = payload.get("model_id") if isinstance(payload, Mapping) else None
        if value:
            return str(value)
        info = request_deployment_info(kwargs)
        if info is not None:
            return str(info["id"])
    return response_deployment_id(response)
