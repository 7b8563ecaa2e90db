"""Settings of the contracts part (``litellm_settings.ratebalance.traffic_contracts``)."""

from __future__ import annotations

from litellm_ratebalance._config_base import SettingsModel

__all__ = ["TrafficContractSettings"]


class TrafficContractSettings(SettingsModel):
    """Placeholder: the contracts work defines the fields."""
