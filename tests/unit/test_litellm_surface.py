"""The LiteLLM surfaces this package depends on. A LiteLLM upgrade that moves one fails here, loudly,
naming what moved (see litellm_ratebalance/proxy/_litellm.py, the one module that touches internals)."""

from __future__ import annotations

import inspect

import pytest


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
    import litellm
    from litellm.proxy._types import UserAPIKeyAuth

    assert callable(getattr(litellm.Router, "get_model_list", None))
    auth = UserAPIKeyAuth(metadata={"priority": "a"}, team_metadata={"priority": "b"})
    assert auth.metadata == {"priority": "a"} and auth.team_metadata == {"priority": "b"}
