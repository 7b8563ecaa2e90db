"""Helpers of the routing tests: a settable clock shared by the balancer and the embedded store."""

from __future__ import annotations

import random
from typing import Any

from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings
from litellm_ratebalance.routing.fits import LoadFit
from litellm_ratebalance.store import MemoryStore

T0 = 1_000_000.0
"""A start time on a bucket boundary for every bucket width the tests use."""


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settings(**overrides: Any) -> RoutingSettings:
    """Test settings: no exploration, no recency weighting, no in-flight evidence, no load fit, no change
    detection, the proposal's independent weighted draw (``selection: random``) and no background refresh
    unless asked (tests call refresh())."""
    base: dict[str, Any] = {
        "refresh_interval": 300.0,
        "exploration_share": 0.0,
        # The plain algorithm unless a test asks for these additions.
        "sample_half_life_seconds": 0.0,
        "in_flight_evidence": False,
        "load_aware": False,
        "change_detection_sigma": 0.0,
        "selection": "random",
    }
    base.update(overrides)
    return RoutingSettings(**base)


def make_balancer(clock: Clock | None = None, seed: int = 0, **overrides: Any) -> tuple[RateBalancer, Clock]:
    clock = clock or Clock()
    store = MemoryStore(clock=clock)
    return RateBalancer(store, settings(**overrides), clock=clock, rng=random.Random(seed)), clock


def candidates(*ids: str) -> tuple[Candidate, ...]:
    return tuple(Candidate(i) for i in ids)


def feed(balancer: RateBalancer, group: str, deployment: str, rates: list[float], latency: float = 1.0) -> None:
    """Record one successful sample per rate (output tokens = rate x latency, no input tokens)."""
    for rate in rates:
        balancer.record(group, deployment, latency=latency, output_tokens=round(rate * latency))


def served(fit: LoadFit, now: float, load: float, rate: float, half_life: float = 0.0) -> None:
    """Add to ``fit`` a 100-token answer at ``rate`` tokens/s that met ``load`` requests in flight."""
    fit.add(now, load, 100.0, 100.0 / rate, half_life)


def two_slot_load_fit(fit: LoadFit | None = None) -> LoadFit:
    """About 200 tok/s at light load and two slots."""
    fit = fit or LoadFit()
    for load, sample in [(1.0, 200.0), (2.0, 195.0), (1.0, 205.0), (4.0, 100.0), (6.0, 66.7), (1.0, 198.0)] * 3:
        served(fit, T0, load, sample)
    return fit
