"""The LiteLLM surfaces this package depends on. A LiteLLM upgrade that moves one fails here, loudly,
naming what moved (see litellm_ratebalance/proxy/_litellm.py, the one module that touches internals)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

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
        ("async_post_call_success_deployment_hook", ["request_data", "response", "call_type"]),
    ],
)
def test_custom_logger_hooks_keep_their_signatures(hook: str, params: list[str]) -> None:
    from litellm.integrations.custom_logger import CustomLogger

    method = getattr(CustomLogger, hook, None)
    assert method is not None, f"CustomLogger.{hook} is gone"
    names = list(inspect.signature(method).parameters)[1:]
    assert names[: len(params)] == params, f"CustomLogger.{hook} signature changed: {names}"


@pytest.mark.parametrize("method_name", ["async_get_available_deployment", "get_available_deployment"])
def test_custom_routing_strategy_picks_keep_their_signatures(method_name: str) -> None:
    """What RateBalancedRouting (and the simulator's oracle) override; the Router calls them by keyword."""
    from litellm.types.router import CustomRoutingStrategyBase

    method = getattr(CustomRoutingStrategyBase, method_name, None)
    assert method is not None, f"CustomRoutingStrategyBase.{method_name} is gone"
    names = list(inspect.signature(method).parameters)[1:]
    assert names == ["model", "messages", "input", "specific_deployment", "request_kwargs"], (
        f"CustomRoutingStrategyBase.{method_name} signature changed: {names}"
    )


def test_proxy_still_requires_own_class_pre_call_hook() -> None:
    """The proxy runs async_pre_call_hook (and the response-headers hook) only when the class itself defines
    it: it checks ``"async_pre_call_hook" in vars(type(callback))``, so an inherited one is skipped silently."""
    from litellm_ratebalance.proxy.admission import PriorityRateLimiter

    assert "async_pre_call_hook" in vars(PriorityRateLimiter)
    assert "async_post_call_response_headers_hook" in vars(PriorityRateLimiter)


def test_user_api_key_auth_fields_the_package_reads() -> None:
    """Priorities and weights (metadata, team_metadata), the caller's identity (team_id, user_id, token) and
    the cost attribution's team label (team_alias)."""
    from litellm.proxy._types import UserAPIKeyAuth

    fields: dict[str, Any] = {
        "metadata": {"priority": "a"},
        "team_metadata": {"priority": "b"},
        "team_id": "t-1",
        "team_alias": "checkout",
        "user_id": "u-1",
        "token": "hashed",
    }
    auth = UserAPIKeyAuth(**fields)
    for name, value in fields.items():
        assert getattr(auth, name, None) == value, f"UserAPIKeyAuth.{name} moved or changed: update its readers"


# -- the request / deployment / response shapes the backpressure adapter reads (proxy/_litellm.py) -------------


class _Capture(CustomLogger):  # type: ignore[misc]
    """Records what LiteLLM hands to callbacks, for the accessors to read back."""

    def __init__(self) -> None:
        super().__init__()
        self.filtered: list[list[dict[str, Any]]] = []
        self.lookups: list[tuple[Any, dict[str, Any]]] = []  # (messages, request_kwargs) of each filter call
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
        self.lookups.append((messages, dict(request_kwargs or {})))
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


def test_callback_manager_adds_and_refuses_through_add_litellm_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """RateBalancedRouting.ensure_recorder registers its recorder through LiteLLM's manager (its duplicate and
    MAX_CALLBACKS checks); without the method it would append to the list itself."""
    import litellm

    monkeypatch.setattr(litellm, "callbacks", [])
    manager = litellm.logging_callback_manager
    assert callable(getattr(manager, "add_litellm_callback", None)), (
        "logging_callback_manager.add_litellm_callback moved"
    )
    first, same_again = CustomLogger(), CustomLogger()
    manager.add_litellm_callback(first)
    manager.add_litellm_callback(same_again)
    assert litellm.callbacks == [first], "add_litellm_callback no longer refuses an equal logger"


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


# -- the Router's entry points, by the name each version gives them ------------------------------------------


def _ids(deployments: Any) -> list[str]:
    return [str((_litellm.deployment_model_info(d) or {}).get("id")) for d in deployments]


class _CountingStrategy(CustomRoutingStrategyBase):  # type: ignore[misc]
    """A custom strategy that counts its picks: the last healthy deployment (async), the Router's own (sync)."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.async_picks = 0
        self.sync_picks = 0

    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        self.async_picks += 1
        healthy = await _litellm.healthy_deployments(
            self.router, model, request_kwargs or {}, messages=messages, input=input
        )
        return healthy[-1]  # type: ignore[no-any-return]

    def get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        self.sync_picks += 1
        return _litellm.own_sync_pick(  # type: ignore[no-any-return]
            self.router, model, messages=messages, input=input, request_kwargs=request_kwargs
        )


async def test_router_entry_points_work_without_deprecated_names(only_callback: Any) -> None:
    """Deployments, healthy lookups, a custom strategy set and taken back, and the sync pick beside it: each
    works on every supported version, and none goes through a name LiteLLM marks deprecated (1.110 renamed
    them and will remove the old ones)."""
    import warnings

    from litellm.router import Router

    only_callback(_Capture())
    router: Any = Router(model_list=[_deployment("d1"), _deployment("d2"), _deployment("o1", "other")], num_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _ids(_litellm.router_deployments(router)) == ["d1", "d2", "o1"]
        assert _ids(_litellm.group_deployments(router, "g")) == ["d1", "d2"]
        assert sorted(_ids(_litellm.group_deployments(router))) == ["d1", "d2", "o1"]
        assert sorted(_ids(await _litellm.healthy_deployments(router, "g", {}, messages=messages))) == ["d1", "d2"]

        strategy = _CountingStrategy(router)
        _litellm.set_routing_strategy(router, strategy)
        response = await router.acompletion(model="g", messages=messages)
        assert (strategy.async_picks, _litellm.response_deployment_id(response)) == (1, "d2")
        # A sync call (on a thread of its own, as a sync caller makes it): the strategy's sync pick, which
        # falls back to the Router's own pick without coming back to the strategy.
        response = await asyncio.to_thread(router.completion, model="g", messages=messages)
        assert strategy.sync_picks == 1 and _litellm.response_deployment_id(response) in {"d1", "d2"}

        _litellm.reset_routing_strategy(router)
        await router.acompletion(model="g", messages=messages)
        await asyncio.to_thread(router.completion, model="g", messages=messages)
        assert (strategy.async_picks, strategy.sync_picks) == (1, 1), "the Router still routes with the strategy"
    ours = {
        str(w.message)
        for w in seen
        if issubclass(w.category, DeprecationWarning) and "/litellm_ratebalance/" in w.filename.replace("\\", "/")
    }
    assert not ours, f"the package uses names LiteLLM deprecated: {sorted(ours)}"


async def test_own_sync_pick_leaves_out_a_deployment_cooling_down(only_callback: Any) -> None:
    from litellm.router import Router

    only_callback(_Capture())
    failing = _deployment("bad", mock_response="litellm.InternalServerError")
    router = Router(model_list=[failing, _deployment("ok")], num_retries=0, allowed_fails=0, cooldown_time=60)
    failures = 0
    for _ in range(40):  # until the Router has picked the failing one once (it picks at random): cooled down
        try:
            await router.acompletion(model="g", messages=[{"role": "user", "content": "hi"}])
        except Exception:
            failures += 1
            break
    assert failures == 1
    picked: set[str] = set()
    for _ in range(100):  # (the cooldown may be written by a task of its own: at most ~2 s)
        picked = {_ids([_litellm.own_sync_pick(router, "g")])[0] for _ in range(20)}
        if picked == {"ok"}:
            break
        await asyncio.sleep(0.02)
    assert picked == {"ok"}, "own_sync_pick() picks a deployment LiteLLM is cooling down"


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


def _router_sources() -> dict[str, str]:
    """The source of LiteLLM's Router, wherever a version keeps it: ``litellm/router.py`` (up to 1.108),
    and from 1.110 the ``litellm/router_*.py`` modules with the ``router_rust/`` package beside them."""
    from pathlib import Path

    import litellm

    root = Path(litellm.__file__).parent
    files = [*root.glob("router*.py"), *root.glob("router_rust/**/*.py")]
    return {str(f.relative_to(root)): f.read_text("utf-8") for f in files}


def test_is_fanout_lookup_knows_every_placeholder_the_router_uses() -> None:
    import re

    found = {
        (placeholder, name)
        for name, text in _router_sources().items()
        for placeholder in re.findall(r"[\"']([a-z][a-z-]*-api-fake-text)[\"']", text)
    }
    assert found, (
        "the Router's source no longer holds a '*-api-fake-text' placeholder message: find how it marks its "
        "file / batch / vector-store lookups now and update is_fanout_lookup(), or routing would narrow those "
        "fan-out lookups to one deployment"
    )
    for placeholder, name in sorted(found):
        assert _litellm.is_fanout_lookup([{"role": "user", "content": placeholder}]), (placeholder, name)


def _unreachable_deployment(deployment_id: str) -> dict[str, Any]:
    # A closed loopback port, no SDK retries: the call fails at once, after the Router's lookup.
    return {
        "model_name": "g",
        "litellm_params": {
            "model": "openai/sim",
            "api_key": "sk-none",
            "api_base": "http://127.0.0.1:9/v1",
            "max_retries": 0,
        },
        "model_info": {"id": deployment_id},
    }


async def test_file_and_batch_lookups_reach_the_filters_with_their_placeholder(only_callback: Any) -> None:
    """Driven, not read: every lookup the Router makes for a file / batch / vector-store call hands the filters
    a message that is_fanout_lookup() recognises (the calls then fail on a closed port)."""
    import io

    from litellm.router import Router

    capture = _Capture()
    only_callback(capture)
    router = Router(model_list=[_unreachable_deployment("d1"), _unreachable_deployment("d2")], num_retries=0)
    calls: dict[str, Callable[[], Any]] = {
        "acreate_file": lambda: router.acreate_file(model="g", file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="batch"),
        "aretrieve_batch": lambda: router.aretrieve_batch(model="g", batch_id="b1"),
        "acreate_batch": lambda: router.acreate_batch(
            model="g", input_file_id="f1", endpoint="/v1/chat/completions", completion_window="24h"
        ),
        "acancel_batch": lambda: router.acancel_batch(model="g", batch_id="b1"),
        "avector_store_create": lambda: router.avector_store_create(model="g", name="v"),
    }
    for name, call in calls.items():
        capture.lookups.clear()
        with pytest.raises(Exception):  # noqa: B017 (any connection error: only the lookups matter here)
            await asyncio.wait_for(call(), 30)
        assert capture.lookups, f"Router.{name} no longer runs the callbacks' async_filter_deployments"
        for messages, _ in capture.lookups:
            assert _litellm.is_fanout_lookup(messages), (
                f"Router.{name} looks deployments up with {messages!r}: update is_fanout_lookup()"
            )


@pytest.mark.parametrize(
    ("endpoint", "request_fields"),
    [
        ("acompletion", {"messages": [{"role": "user", "content": "hi"}]}),
        ("atext_completion", {"prompt": "hi"}),
    ],
)
async def test_the_priority_queues_lookup_is_told_from_the_requests_pick(
    only_callback: Any, endpoint: str, request_fields: dict[str, Any]
) -> None:
    """A request with ``priority`` waits in the Router's queue; from LiteLLM 1.110 the queue's "any healthy
    deployment?" lookup runs the callbacks' filters too. Per request exactly one lookup must read as the pick
    (not is_listing_lookup()), and narrowing there must decide the deployment that serves it."""
    from litellm.router import Router

    class NarrowThePick(_Capture):
        async def async_filter_deployments(
            self,
            model: str,
            healthy_deployments: list[Any],
            messages: Any,
            request_kwargs: dict[str, Any] | None = None,
            parent_otel_span: Any = None,
        ) -> list[Any]:
            await super().async_filter_deployments(model, healthy_deployments, messages, request_kwargs)
            if _litellm.is_listing_lookup(messages, request_kwargs):
                return healthy_deployments
            return [d for d in healthy_deployments if (_litellm.deployment_model_info(d) or {}).get("id") == "d2"]

    capture = NarrowThePick()
    only_callback(capture)
    router = Router(model_list=[_deployment("d1"), _deployment("d2")], num_retries=0)
    for _ in range(3):
        capture.lookups.clear()
        response = await getattr(router, endpoint)(model="g", priority=0, **request_fields)
        picks = [m for m, kwargs in capture.lookups if not _litellm.is_listing_lookup(m, kwargs)]
        assert len(picks) == 1, f"{len(capture.lookups)} lookups, {len(picks)} read as the pick: {capture.lookups}"
        assert _litellm.response_deployment_id(response) == "d2", "the lookup read as the pick did not decide it"


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
