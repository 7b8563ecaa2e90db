"""The values the routing core takes and gives: a :class:`Candidate` deployment, a :class:`DeploymentEstimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Candidate", "DeploymentEstimate"]


class Candidate(NamedTuple):
    """One deployment a request may go to."""

    id: str
    input_to_output_ratio: float | None = None
    """The deployment's own ratio (e.g. ``model_info.input_to_output_ratio``); None: the group's."""
    tpm: float | None = None
    """Configured tokens per minute; the share shrinks as the last minute's usage nears it."""
    rpm: float | None = None
    slots: float | None = None
    """Configured requests it serves at full speed (``model_info.slots``); stands for the slots the load fit
    would learn: the share shrinks as this replica's requests in flight fill them, to 0 when full."""


@dataclass(frozen=True, slots=True)
class DeploymentEstimate:
    """What the balancer currently believes about one deployment (for status output and metrics)."""

    deployment_id: str
    share: float | None
    """Choice probability among the candidate set asked about (None when not a candidate)."""
    probability: float | None
    """Estimated probability of beating the SLA (None in bootstrap / round-robin mode)."""
    samples: float
    """Samples in the window, recency-weighted when ``sample_half_life_seconds`` is on (so not whole)."""
    failures: float
    mean_rate: float
    std_rate: float
    mean_latency: float | None
    mean_ttft: float | None
    recent_attempts: float
    recent_failures: float
    tokens_last_minute: float
    requests_last_minute: float
    capacity: float
    in_flight: int
    mode: str
    sla: float | None
    load_shift: float = 0.0
    """Expected rate change (tokens/s) at the current load from this replica's load fit (``load_aware``)."""
