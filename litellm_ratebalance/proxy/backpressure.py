"""LiteLLM adapter of the backpressure part (placeholder: filled in by the backpressure work)."""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

__all__ = ["BackpressureCallback", "backpressure"]


class BackpressureCallback(CustomLogger):  # type: ignore[misc]
    """Placeholder callback: does nothing yet."""


backpressure = BackpressureCallback()
