"""LiteLLM adapter of the priority admission limiter (being written)."""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

__all__ = ["PriorityRateLimiter", "rate_limiter"]


class PriorityRateLimiter(CustomLogger):  # type: ignore[misc]
    """Placeholder."""


rate_limiter = PriorityRateLimiter()
