"""The LiteLLM surfaces this package depends on. A LiteLLM upgrade that moves one fails here, loudly,
naming what moved (see litellm_ratebalance/proxy/_litellm.py, the one module that touches internals)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance.proxy import _litellm


def test_proxy_server_globals_exist() -> None:
    from litellm.proxy import proxy_server

    for name in ("llm_router", "general_settings", "redis_usage_cache", "proxy_logging_obj"):
        assert hasattr(proxy_server, name), f"litellm.proxy.proxy_server.{name} is gone: update proxy/_litellm.py"
    internal = proxy_server.proxy_logging_obj.internal_usage_cache
    assert hasattr(internal, "dual_cache"), "proxy_logging_obj.internal_usage_cache.dual_cache moved"
    assert hasattr(internal.dual_cache, "redis_cache"), "DualCache.redis_cache moved"


def test_redis_cache_gives_an_async_client() -> None:
    from litellm.caching.redis_cache import RedisCache

    assert callable(getattr(RedisCache, "init_async_client", None)), "RedisCache.init_async_client is gone"


def test_rate_limit_error_builds_a_429_with_headers() -> None:
    from litellm_ratebalance.proxy._litellm import rate_limit_exception

    exc = rate_limit_exception("msg", {"retry-after": "3"}, "m")
    assert getattr(exc, "status_code", None) == 429
    assert getattr(exc, "headers", None) == {"retry-after": "3"}
    assert getattr(exc, "detail", None) == {"error": "msg"}
    from litellm.proxy.common_utils.proxy_rate_limit_error import ProxyRateLimitError

    assert isinstance(exc, ProxyRateLimitError), "ProxyRateLimitError moved: 429s lose type throttling_error"


@pytest.mark.parametrize(
    ("hook", "params"),
    [
        ("async_pre_call_hook", ["user_api_key_dict", "cache", "data", "call_type"]),
        ("async_post_call_response_headers_hook", ["data", "user_api_key_dict", "response"]),
        ("async_filter_deployments", ["model", "healthy_deployments", "messages"]),
        ("async_pre_call_deployment_hook", ["kwargs", "call_type"]),
        ("async_log_success_event", ["kwargs", "response_obj", "start_time", "end_time"]),
        ("async_log_failure_event", ["kwargs", "response_obj", "start_time", "end_time"]),
        ("async_post_call_failure_hook", ["request_data", "original_exception", "user_api_key_dict"]),
    ],
)
def test_custom_logger_hooks_keep_their_signatures(hook: str, params: list[str]) -> None:
    from litellm.integrations.custom_logger import CustomLogger

    method = getattr(CustomLogger, hook, None)
    assert method is not None, f"CustomLogger.{hook} is gone"
    names = list(inspect.signature(method).parameters)[1:]
    assert names[: len(params)] == params, f"CustomLogger.{hook} signature changed: {names}"


def test_proxy_still_requires_own_class_pre_call_hook() -> None:
    """The proxy runs async_pre_call_hook only when the class itself defines it (LITELLM-NOTES)."""
    from litellm_ratebalance.proxy.limiter import PriorityRateLimiter

    assert "async_pre_call_hook" in vars(PriorityRateLimiter)
    assert "async_post_call_response_headers_hook" in vars(PriorityRateLimiter)


def test_router_and_auth_fields() -> None:
    from litellm.proxy._types import UserAPIKeyAuth
    from litellm.router import Router

    assert callable(getattr(Router, "get_model_list", None))
    auth = UserAPIKeyAuth(metadata={"priority": "a"}, team_metadata={"priority": "b"})
    assert auth.metadata == {"priority": "a"} and auth.team_metadata == {"priority": "b"}


# -- the request / deployment / response shapes the backpressure adapter reads (proxy/_litellm.py) -------------


class _Capture(CustomLogger):  # type: ignore[misc]
    """Records what LiteLLM hands to callbacks, for the accessors to read back."""

    def __init__(self) -> None:
        super().__init__()
        self.filtered: list[list[dict[str, Any]]] = []
        self.deployment_kwargs: list[dict[str, Any]] = []
        self.success: list[tuple[dict[str, Any], Any]] = []
        self.failure: list[dict[str, Any]] = []

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[Any],
        messages: Any,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[Any]:
        self.filtered.append(list(healthy_deployments))
        return healthy_deployments

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        self.deployment_kwargs.append(kwargs)
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self.success.append((kwargs, response_obj))

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self.failure.append(kwargs)


def _deployment(deployment_id: str, group: str = "g", **params: Any) -> dict[str, Any]:
    return {
        "model_name": group,
        "litellm_params": {"model": "openai/sim", "api_key": "sk-none", "mock_response": "hello", **params},
        "model_info": {"id": deployment_id},
    }


@pytest.fixture
def only_callback() -> Iterator[Callable[[CustomLogger], None]]:
    """``only_callback(cb)``: make ``cb`` LiteLLM's only callback for the test (restored afterwards)."""
    import litellm

    saved = (list(litellm.callbacks), list(litellm._async_success_callback), list(litellm._async_failure_callback))

    def install(callback: CustomLogger) -> None:
        litellm.callbacks = [callback]
        litellm._async_success_callback = []
        litellm._async_failure_callback = []

    yield install
    litellm.callbacks, litellm._async_success_callback, litellm._async_failure_callback = (
        saved[0],
        saved[1],
        saved[2],
    )


async def _events_settle(capture: _Capture, successes: int = 0, failures: int = 0) -> None:
    for _ in range(100):  # logging events are dispatched as tasks; bounded wait (at most ~2 s)
        if len(capture.success) >= successes and len(capture.failure) >= failures:
            return
        await asyncio.sleep(0.02)


def test_router_deployment_dicts() -> None:
    from litellm.router import Router

    router = Router(model_list=[_deployment("d1"), _deployment("d2", "other")])
    deployments = _litellm.router_deployments(router)
    assert [_litellm.deployment_model_group(d) for d in deployments] == ["g", "other"], (
        "Router.model_list no longer lists deployment dicts with model_name: update router_deployments()"
    )
    assert [(_litellm.deployment_model_info(d) or {}).get("id") for d in deployments] == ["d1", "d2"], (
        "deployment dicts lost model_info.id: update deployment_model_info()"
    )
    assert _litellm.router_deployments(None) == []


async def test_request_shape_seen_by_the_deployment_hook_and_the_success_event(only_callback: Any) -> None:
    from litellm.proxy._types import UserAPIKeyAuth
    from litellm.router import Router

    capture = _Capture()
    only_callback(capture)
    router = Router(model_list=[_deployment("d1")], num_retries=0)
    auth = UserAPIKeyAuth(token="hashed", team_id="team-1", metadata={"priority": "p"})
    response = await router.acompletion(
        model="g", messages=[{"role": "user", "content": "hi"}], max_tokens=5, metadata={"user_api_key_auth": auth}
    )
    await _events_settle(capture, successes=1)

    (filtered,) = capture.filtered
    assert [(_litellm.deployment_model_info(d) or {}).get("id") for d in filtered] == ["d1"], (
        "async_filter_deployments no longer receives deployment dicts with model_info.id"
    )
    (kwargs,) = capture.deployment_kwargs
    info = _litellm.request_deployment_info(kwargs)
    assert info is not None and info["id"] == "d1", (
        "the Router no longer copies the chosen deployment's model_info into the request metadata: "
        "update request_deployment_info()"
    )
    assert _litellm.request_model_group(kwargs) == "g", "metadata.model_group moved: update request_model_group()"
    call_id = _litellm.request_call_id(kwargs)
    assert call_id, "litellm_call_id is gone from the deployment hook's kwargs: update request_call_id()"
    assert _litellm.request_auth(kwargs) is auth, "metadata.user_api_key_auth moved: update request_auth()"
    assert _litellm.caller_id(auth) == "team:team-1"
    assert _litellm.caller_id(UserAPIKeyAuth(token="hashed")) == "key:hashed"
    assert _litellm.caller_id(None) == "anonymous"

    assert _litellm.response_deployment_id(response) == "d1", (
        "response._hidden_params['model_id'] moved: update response_deployment_id()"
    )
    prompt_tokens, completion_tokens = _litellm.response_usage(response)
    assert prompt_tokens and completion_tokens, "response.usage lost prompt/completion_tokens: update response_usage()"
    (event_kwargs, event_response) = capture.success[0]
    assert _litellm.request_call_id(event_kwargs) == call_id, "the success event's litellm_call_id differs"
    assert (_litellm.request_deployment_info(event_kwargs) or {}).get("id") == "d1", (
        "the success event's kwargs lost the deployment's model_info: update request_deployment_info()"
    )
    assert _litellm.response_deployment_id(event_response) == "d1"


async def test_failure_event_carries_the_exception_and_its_status(only_callback: Any) -> None:
    from litellm.router import Router

    capture = _Capture()
    only_callback(capture)
    router = Router(model_list=[_deployment("d1", mock_response="litellm.InternalServerError")], num_retries=0)
    with pytest.raises(Exception) as raised:
        await router.acompletion(model="g", messages=[{"role": "user", "content": "hi"}])
    await _events_settle(capture, failures=1)
    assert capture.failure, "no async_log_failure_event for a failed call"
    exception = _litellm.failure_exception(capture.failure[0])
    assert exception is not None, "kwargs['exception'] is gone from failure events: update failure_exception()"
    assert _litellm.exception_status(exception) == 500, "LiteLLM exceptions lost status_code"
    assert _litellm.exception_status(raised.value) == 500
    assert _litellm.request_call_id(capture.failure[0]), "failure events lost litellm_call_id"
    assert _litellm.exception_status(ValueError()) is None


class _Refuse(CustomLogger):  # type: ignore[misc]
    """Refuses every attempt in the deployment hook with a 429 (optionally marked as not to retry)."""

    def __init__(self, forbid: bool) -> None:
        super().__init__()
        self.forbid = forbid
        self.attempts = 0

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        self.attempts += 1
        exc = _litellm.rate_limit_exception("full", {"retry-after": "1"}, "g")
        if self.forbid:
            _litellm.forbid_router_retry(exc)
        raise exc


@pytest.mark.parametrize("forbid", [False, True])
async def test_router_reads_num_retries_off_the_exception(only_callback: Any, forbid: bool) -> None:
    from litellm.router import Router

    refuse = _Refuse(forbid)
    only_callback(refuse)
    # Two deployments: the Router retries at once (no back-off sleep) while another one is healthy.
    router = Router(model_list=[_deployment("d1"), _deployment("d2")], num_retries=2)
    with pytest.raises(Exception) as raised:
        await router.acompletion(model="g", messages=[{"role": "user", "content": "hi"}])
    assert _litellm.exception_status(raised.value) == 429
    if forbid:
        assert refuse.attempts == 1, (
            f"Router made {refuse.attempts} attempts of a refusal marked num_retries=0: it no longer reads "
            "num_retries off the exception; update forbid_router_retry()"
        )
    else:  # the Router stops early once every deployment is cooling down, so "more than one" is the contract
        assert refuse.attempts > 1, "Router no longer retries a 429 from the deployment hook"


def test_service_unavailable_is_a_503_with_headers() -> None:
    exc = _litellm.service_unavailable("busy", {"retry-after": "2"})
    assert (getattr(exc, "status_code", None), getattr(exc, "headers", None)) == (503, {"retry-after": "2"})
    assert getattr(exc, "detail", None) == {"error": "busy"}


def test_logging_callback_manager_keeps_one_instance_per_class() -> None:
    """Why backpressure keeps one process-wide state: LiteLLM registers one logger instance per class."""
    import litellm

    from litellm_ratebalance.proxy.backpressure import BackpressureCallback

    target: list[Any] = []
    manager = litellm.logging_callback_manager
    manager._safe_add_callback_to_list(callback=BackpressureCallback(), parent_list=target)
    manager._safe_add_callback_to_list(callback=BackpressureCallback(), parent_list=target)
    assert len(target) == 1, "LiteLLM now registers several instances of one logger class: revisit _Process"


def test_backpressure_defines_its_hooks_on_its_own_class() -> None:
    from litellm_ratebalance.proxy.backpressure import BackpressureCallback

    for hook in (
        "async_filter_deployments",
        "async_pre_call_deployment_hook",
        "async_post_call_response_headers_hook",
        "async_log_success_event",
        "async_log_failure_event",
    ):
        assert hook in vars(BackpressureCallback), f"BackpressureCallback.{hook} must be defined on the class"


# -- proxy_server globals ----------------------------------------------------------------------------------


def test_proxy_router_and_general_setting_read_the_live_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    from litellm.proxy import proxy_server

    marker = object()
    monkeypatch.setattr(proxy_server, "llm_router", marker)
    monkeypatch.setattr(proxy_server, "general_settings", {"fail_closed_rate_limit_enforcement": True})
    assert _litellm.proxy_router() is marker
    assert _litellm.general_setting("fail_closed_rate_limit_enforcement") is True
    assert _litellm.general_setting("absent") is None


def test_discover_redis_cache_follows_litellms_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from litellm.proxy import proxy_server

    class Cache:
        def init_async_client(self) -> None: ...

    usage, internal, router_cache = Cache(), Cache(), Cache()
    logging_obj = SimpleNamespace(
        internal_usage_cache=SimpleNamespace(dual_cache=SimpleNamespace(redis_cache=internal))
    )
    router = SimpleNamespace(cache=SimpleNamespace(redis_cache=router_cache))
    monkeypatch.setattr(proxy_server, "proxy_logging_obj", logging_obj)
    monkeypatch.setattr(proxy_server, "llm_router", router)
    monkeypatch.setattr(proxy_server, "redis_usage_cache", usage)
    assert _litellm.discover_redis_cache() is usage
    monkeypatch.setattr(proxy_server, "redis_usage_cache", None)
    assert _litellm.discover_redis_cache() is internal
    logging_obj.internal_usage_cache.dual_cache.redis_cache = None
    assert _litellm.discover_redis_cache() is router_cache
    router.cache.redis_cache = None
    assert _litellm.discover_redis_cache() is None


# -- routing accessors -------------------------------------------------------------------------------------


def test_is_fanout_lookup_knows_every_placeholder_the_router_uses() -> None:
    import re

    import litellm.router

    placeholders = set(re.findall(r'"content": "([a-z-]+-api-fake-text)"', inspect.getsource(litellm.router)))
    assert placeholders, (
        "the Router no longer marks file/batch/vector-store lookups with a '*-api-fake-text' placeholder "
        "message: update is_fanout_lookup() or routing would narrow those fan-out lookups to one deployment"
    )
    for content in placeholders:
        assert _litellm.is_fanout_lookup([{"role": "user", "content": content}]), content


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hello"}],
        [{"role": "user", "content": "files-api-fake-text"}, {"role": "user", "content": "x"}],
        [{"role": "user", "content": ["files-api-fake-text"]}],
        None,
        "files-api-fake-text",
        [],
    ],
)
def test_is_fanout_lookup_is_false_for_ordinary_requests(messages: object) -> None:
    assert not _litellm.is_fanout_lookup(messages)


def _ordered_router() -> Any:
    from litellm.router import Router

    return Router(
        model_list=[_deployment("a", order=1), _deployment("b", order=1), _deployment("c", order=2)], num_retries=0
    )


@pytest.mark.parametrize(
    "controls",
    [
        {},
        {"_target_order": 2},
        {"_excluded_deployment_ids": ["a"]},
        {"_retry_skipped_deployment_ids": ("a",)},
        {"_retry_skipped_deployment_ids": ("a", "b")},  # every order-1 one skipped: the Router keeps them
        {"_target_order": 1, "_excluded_deployment_ids": ["b"], "_retry_skipped_deployment_ids": ("a",)},
    ],
)
async def test_narrow_like_router_matches_the_routers_own_narrowing(
    only_callback: Any, controls: dict[str, Any]
) -> None:
    capture = _Capture()
    only_callback(capture)
    router = _ordered_router()
    messages = [{"role": "user", "content": "hi"}]
    request_kwargs = {"metadata": {}, **controls}
    healthy = await router.async_get_healthy_deployments(
        model="g", request_kwargs=dict(request_kwargs), messages=messages
    )
    (seen_by_filter,) = capture.filtered
    ours = _litellm.narrow_like_router(seen_by_filter, request_kwargs)
    ids = sorted((_litellm.deployment_model_info(d) or {})["id"] for d in ours)
    assert ids == sorted((_litellm.deployment_model_info(d) or {})["id"] for d in healthy), (
        f"the Router narrows {controls} differently after the callbacks' filter: update narrow_like_router()"
    )
    assert request_kwargs == {"metadata": {}, **controls}, "narrow_like_router must not consume the controls"


def test_narrow_like_router_returns_the_same_list_when_nothing_narrows() -> None:
    deployments = [_deployment("a"), _deployment("b")]
    assert _litellm.narrow_like_router(deployments, None) is deployments
    assert _litellm.narrow_like_router(deployments, {"metadata": {}}) is deployments
