"""Settings of cost attribution (``litellm_settings.ratebalance.cost``).

Example (``config.yaml``)::

    litellm_settings:
      callbacks: ["litellm_ratebalance.backpressure", "litellm_ratebalance.cost"]
      ratebalance:
        cost:
          gpu_hour_usd: 2.5                # local GPU-seconds also count in the USD counter
          deployments:
            gpu1: {gpus: 8}                # an 8-GPU tensor-parallel server

Every key is validated when the proxy starts (exit status 78 naming the key path and the valid range).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from litellm_ratebalance._config_base import SettingsModel

__all__ = ["CostSettings", "DeploymentCost"]

MAX_TEAM_NAME_LENGTH = 128


class DeploymentCost(SettingsModel):
    """``cost.deployments.<deployment id>``: what one local deployment's busy second is worth."""

    gpus: Annotated[float, Field(gt=0.0, le=100_000.0)] | None = None
    """GPUs the deployment occupies (a busy second is this many GPU-seconds); unset: ``cost.gpus``."""
    gpu_hour_usd: Annotated[float, Field(ge=0.0, le=1_000_000.0)] | None = None
    """Price of one GPU-hour of this deployment; unset: ``cost.gpu_hour_usd``."""


class CostSettings(SettingsModel):
    """``ratebalance.cost``: attribute each request's cost to its priority, team and feature."""

    enabled: bool = True
    gpus: Annotated[float, Field(gt=0.0, le=100_000.0)] = 1.0
    """GPUs per local deployment unless ``deployments.<id>.gpus`` says otherwise."""
    gpu_hour_usd: Annotated[float, Field(ge=0.0, le=1_000_000.0)] | None = None
    """Price of a GPU-hour. Set: local requests' GPU-seconds also count in ``cost_usd_total``
    (``source="gpu"``). Unset: local requests count in ``gpu_seconds_total`` only."""
    deployments: dict[str, DeploymentCost] = Field(default_factory=dict)
    teams: tuple[str, ...] | None = None
    """Team label values allowed (team alias or id); any other team is labelled ``other``. Unset: every team
    gets its own label value, up to ``max_teams`` per process (later ones: ``other``)."""
    max_teams: Annotated[int, Field(ge=0, le=10_000)] = 100
    """Bound on distinct team label values per process when ``teams`` is unset (series stay bounded)."""
    efficiency_half_life_seconds: Annotated[float, Field(ge=1.0, le=604_800.0)] = 600.0
    """Half-life of the GPU-seconds and output tokens behind status's GPU-seconds per 1k output tokens: the
    figure describes roughly the last few half-lives."""
    state_ttl_seconds: Annotated[int, Field(ge=60, le=2_592_000)] = 86_400
    """A deployment's shared attribution state (its sharing clock and efficiency sums) expires after this
    long without a request; must exceed the longest request (``backpressure.lease_max_age_seconds``)."""

    @field_validator("teams")
    @classmethod
    def _team_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            if not name or len(name) > MAX_TEAM_NAME_LENGTH:
                raise ValueError(f"team names must be 1 to {MAX_TEAM_NAME_LENGTH} characters (got {name!r})")
        return value

    def deployment_gpus(self, deployment_id: str) -> float:
        """GPUs of ``deployment_id`` (its override, else ``gpus``)."""
        override = self.deployments.get(deployment_id)
        return override.gpus if override is not None and override.gpus is not None else self.gpus

    def deployment_gpu_hour_usd(self, deployment_id: str) -> float | None:
        """Price of a GPU-hour of ``deployment_id`` (its override, else ``gpu_hour_usd``; ``None``: no price)."""
        override = self.deployments.get(deployment_id)
        if override is not None and override.gpu_hour_usd is not None:
            return override.gpu_hour_usd
        return self.gpu_hour_usd
