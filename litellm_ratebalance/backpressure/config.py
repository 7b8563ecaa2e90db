"""Settings of the backpressure part (``litellm_settings.ratebalance.backpressure``)."""

from __future__ import annotations

from litellm_ratebalance._config_base import SettingsModel

__all__ = ["BackpressureSettings"]


class BackpressureSettings(SettingsModel):
    """Placeholder: the backpressure work defines the fields."""
