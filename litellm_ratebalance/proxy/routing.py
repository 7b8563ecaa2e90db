"""LiteLLM adapter of the routing part (placeholder: filled in by the routing work)."""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

__all__ = ["RateBalancerCallback", "rate_balancer"]


class RateBalancerCallback(CustomLogger):  # type: ignore[misc]
    """Placeholder callback: does nothing yet."""


rate_balancer = RateBalancerCallback()
