"""A straightforward implementation of the proposal's algorithm, kept as the reference for parity tests.

It walks every sample of the window at each decision, as the proposal does: effective rates from the
samples, the pooled ``greediness`` percentile with ``numpy.percentile``, a normal fit per deployment
with ``scipy.stats.norm`` (or the share of its samples above the SLA for the ``empirical`` variant),
weights normalised to choice probabilities.

Deviations from the proposal's code, each the documented behaviour of the package:

* a deployment whose samples are identical (zero spread) gets 1, 1/2 or 0 as its mean is above, at or
  below the SLA (the proposal's code turned the NaN of a zero-scale normal into weight 1);
* all-zero weights fall back to equal chances (``random.choices`` raises on them);
* a failed request (our addition: the proposal records none) is a sample of rate 0, and the normal fit
  is of the successful samples only, its probability times their share of the samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats


@dataclass
class Sample:
    latency: float
    timestamp: float
    output_tokens: int = 1
    input_tokens: int = 0
    ok: bool = True

    def rate(self, ratio: float) -> float:
        if not self.ok:
            return 0.0
        return (self.output_tokens + self.input_tokens / ratio) / max(self.latency, 1e-3)


@dataclass
class ReferenceBalancer:
    """The proposal's balancer over explicit samples (``now`` passed in, no clock)."""

    deployments: Sequence[str]
    window_seconds: float = 120.0
    ratio: float = 250.0
    greediness: float = 0.5
    estimator: str = "normal"
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    half_life: float = 0.0
    """Recency weighting (our addition, ``sample_half_life_seconds``): 0 is the proposal."""

    def record(self, deployment: str, sample: Sample) -> None:
        self.samples.setdefault(deployment, []).append(sample)

    def rates(self, now: float) -> list[list[float]]:
        return [
            [s.rate(self.ratio) for s in self.samples.get(d, []) if now - s.timestamp < self.window_seconds]
            for d in self.deployments
        ]

    def weights(self, now: float) -> list[float]:
        if self.half_life > 0:
            return weighted_reference_weights(self.weighted_rates(now), self.greediness, self.estimator)
        return reference_weights(self.rates(now), self.greediness, self.estimator)

    def weighted_rates(self, now: float) -> list[list[tuple[float, float]]]:
        """(rate, recency weight ``0.5 ** (age / half_life)``) of every sample in the window."""
        return [
            [
                (s.rate(self.ratio), 0.5 ** ((now - s.timestamp) / self.half_life))
                for s in self.samples.get(d, [])
                if now - s.timestamp < self.window_seconds
            ]
            for d in self.deployments
        ]

    def choose(self, now: float) -> int:
        weights = self.weights(now)
        return self.rng.choices(range(len(weights)), weights)[0]


def reference_weights(rates: Sequence[Sequence[float]], greediness: float, estimator: str = "normal") -> list[float]:
    """Choice probabilities from per-deployment effective rates (the proposal's rules)."""
    n = len(rates)
    if greediness <= 0 or not all(rates):
        return [1.0 / n] * n
    pooled = [r for per in rates for r in per]
    sla = float(np.percentile(pooled, greediness * 100))
    weights = [_probability(per, sla, estimator) for per in rates]
    total = sum(weights)
    if total <= 0:
        return [1.0 / n] * n
    return [w / total for w in weights]


def _probability(rates: Sequence[float], sla: float, estimator: str) -> float:
    if estimator == "empirical":
        return sum(1 for r in rates if r > sla) / len(rates)
    return _weighted_probability([(r, 1.0) for r in rates], sla, estimator)


def shares_by_name(names: Sequence[str], weights: Sequence[float]) -> Mapping[str, float]:
    return dict(zip(names, weights, strict=True))


def weighted_reference_weights(
    rates: Sequence[Sequence[tuple[float, float]]], greediness: float, estimator: str = "normal"
) -> list[float]:
    """:func:`reference_weights` with a weight per sample: the pooled percentile ranks samples by their
    weights (rank ``q * (W - 1)`` of the total weight ``W``, linear between neighbours), the normal fit and
    the share above the SLA are weighted means."""
    n = len(rates)
    if greediness <= 0 or not all(rates):
        return [1.0 / n] * n
    pooled = sorted(pair for per in rates for pair in per)
    total = sum(w for _, w in pooled)
    rank = greediness * max(total - 1.0, 0.0)
    low = math.floor(rank)

    def at(k: float) -> float:
        seen = 0.0
        for rate, w in pooled:
            seen += w
            if k < seen:
                return rate
        return pooled[-1][0]

    sla = at(low) + (rank - low) * (at(low + 1) - at(low))
    weights = [_weighted_probability(per, sla, estimator) for per in rates]
    weight_sum = sum(weights)
    if weight_sum <= 0:
        return [1.0 / n] * n
    return [w / weight_sum for w in weights]


def _weighted_probability(rates: Sequence[tuple[float, float]], sla: float, estimator: str) -> float:
    total = sum(w for _, w in rates)
    if estimator == "empirical":
        return sum(w for r, w in rates if r > sla) / total
    answered = [(r, w) for r, w in rates if r > 0.0]  # a successful sample's rate is never 0 here
    ok_total = sum(w for _, w in answered)
    if ok_total <= 0:
        return 0.0
    ok_share = ok_total / total
    mu = sum(r * w for r, w in answered) / ok_total
    sigma = (sum(w * (r - mu) ** 2 for r, w in answered) / ok_total) ** 0.5
    if sigma <= 1e-12 * max(1.0, abs(mu)):
        if math.isclose(mu, sla, rel_tol=1e-9, abs_tol=1e-12):
            return 0.5 * ok_share
        return ok_share if mu > sla else 0.0
    return ok_share * float(1 - stats.norm.cdf(sla, loc=mu, scale=sigma))
