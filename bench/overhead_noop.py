"""Callbacks that do nothing, with the hooks our limiter, balancer and traffic contracts implement: what LiteLLM's
own callback machinery costs the proxy before any of our work (``bench_proxy_overhead.py``'s ``noop`` rows).

Copied next to the config.yaml of the proxies the bench starts; named in ``litellm_settings.callbacks`` as
``overhead_noop.<instance>``, the way LiteLLM loads a custom callback from a file beside its config.
"""

from __future__ import annotations

from typing import Any

from litellm.integrations.custom_logger import CustomLogger

__all__ = ["noop_balancer", "noop_contracts", "noop_limiter"]


class _NoopAdmission(CustomLogger):  # type: ignore[misc]
    """The limiter's and the contracts' hooks: pre-call admission, headers, post-call correction, outcomes."""

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        return None

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return None

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> Any:
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        return None


class _NoopRouting(CustomLogger):  # type: ignore[misc]
    """The balancer's hooks: filtering the healthy deployments (leaves them all), the deployment's outcome."""

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[Any],
        messages: list[Any] | None,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[Any]:
        return healthy_deployments

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> None:
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None


noop_limiter = _NoopAdmission()
noop_contracts = _NoopAdmission()
noop_balancer = _NoopRouting()
