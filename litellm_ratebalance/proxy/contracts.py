"""LiteLLM adapter of the contracts part (placeholder: filled in by the contracts work)."""

from __future__ import annotations

from litellm.integrations.custom_logger import CustomLogger

__all__ = ["TrafficContractsCallback", "traffic_contracts"]


class TrafficContractsCallback(CustomLogger):  # type: ignore[misc]
    """Placeholder callback: does nothing yet."""


traffic_contracts = TrafficContractsCallback()
