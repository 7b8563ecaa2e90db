"""Settings of the routing part (``litellm_settings.ratebalance.routing``)."""

from __future__ import annotations

from litellm_ratebalance._config_base import SettingsModel

__all__ = ["RoutingSettings"]


class RoutingSettings(SettingsModel):
    """Placeholder: the routing work defines the fields."""
