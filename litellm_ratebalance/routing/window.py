"""A model group's windows as of one store time: a pure function of the synced buckets and ``now``.

:func:`derive` turns the buckets of a sync (per bucket index, per deployment, a
:class:`~litellm_ratebalance.routing.records.RateAggregate`) into :class:`Derived`: per deployment its window
(recency-weighted, the adaptive window when enabled), its failure window (age-weighted attempts and
failures), its usage of the last minute (for configured tpm / rpm) and the latency and work a typical request
of it takes. The decisions until the next sync read nothing else of the store.

A bucket belongs to a window of length ``W`` when it ends after ``now - W``.
"""

from __future__ import annotations

from collections.abc import Mapping

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import recency_weight
from litellm_ratebalance.routing.records import RateAggregate

__all__ = ["USAGE_WINDOW_MS", "Derived", "add_to", "derive", "one_answer", "set_expected"]

USAGE_WINDOW_MS = 60_000
"""Configured tpm / rpm are per minute: usage is summed over the last minute of buckets."""


class Derived:
    """What a sync leaves for the decisions until the next one."""

    __slots__ = (
        "expected",
        "failure_weights",
        "now_ms",
        "pooled_expected",
        "recent",
        "stall_after",
        "usage",
        "window",
        "window_full",
    )

    def __init__(self) -> None:
        self.now_ms = 0
        self.window: dict[str, RateAggregate] = {}
        """Per deployment: the samples the estimator uses (adaptive window when enabled)."""
        self.window_full: dict[str, RateAggregate] = {}
        self.recent: dict[str, RateAggregate] = {}
        self.failure_weights: dict[str, tuple[float, float]] = {}
        """Per deployment: (attempts, failures) of the failure window, each bucket weighted by its age."""
        self.usage: dict[str, RateAggregate] = {}
        self.stall_after: dict[str, float] = {}
        """Per deployment: seconds in flight after which a request counts as stalled."""
        self.expected: dict[str, tuple[float, float]] = {}
        """Per deployment: (mean latency s, mean work = latency x rate, tokens) of its successful samples."""
        self.pooled_expected: tuple[float, float] | None = None
        """The same over every deployment's samples (for one without successful samples yet)."""


def add_to(target: dict[str, RateAggregate], deployment_id: str, agg: RateAggregate, weight: float = 1.0) -> None:
    """Merge ``agg`` (each sample counting ``weight``) into ``target[deployment_id]``, created when missing."""
    existing = target.get(deployment_id)
    if existing is None:
        existing = target[deployment_id] = RateAggregate()
    existing.merge_scaled(agg, weight)


def one_answer(window: RateAggregate | None) -> bool:
    """Whether ``window`` holds successful answers that all gave the same rate (one answer, in practice):
    the normal fit of such a window is a point mass, which beats an SLA either surely or never."""
    moments = window.ok_moments() if window is not None else None
    if moments is None:
        return False
    _, mean, variance = moments
    return variance <= 1e-12 * max(1.0, mean * mean)


def set_expected(settings: RoutingSettings, derived: Derived, deployment_id: str) -> None:
    """Work out the deployment's typical (latency, work) and stall cut-off from its window in ``derived``."""
    window = derived.window_full.get(deployment_id)
    latency = window.mean_ok_latency if window is not None else None
    rate = window.mean_ok_rate if window is not None else None
    if latency is not None and latency <= 0.0:
        latency = None  # (only samples written without a latency, e.g. by another replica: unknown)
    if latency is not None and rate is not None:
        derived.expected[deployment_id] = (latency, latency * rate)
    if derived.pooled_expected is None and latency is not None and rate is not None:
        derived.pooled_expected = (latency, latency * rate)
    stall = settings.stall_min_seconds
    if latency is not None:
        stall = max(stall, settings.stall_latency_factor * latency)
    derived.stall_after[deployment_id] = stall


def derive(
    settings: RoutingSettings,
    buckets: Mapping[int, Mapping[str, RateAggregate]],
    now_ms: int,
    cutoff_ms: Mapping[str, float] | None = None,
) -> Derived:
    """Window, recent and usage aggregates per deployment as of store time ``now_ms``.

    In the window a bucket's samples count ``recency_weight(age of its middle)``; in the failure window
    ``0.5 ** (age / failure half-life)``; usage (for tpm / rpm) counts them fully. ``cutoff_ms``: per
    deployment, the store time before which its samples are left out of the window (a change was detected).
    """
    derived = Derived()
    derived.now_ms = now_ms
    width = settings.effective_bucket_seconds * 1000
    window_ms = settings.window_seconds * 1000
    recent_ms = settings.failure_window_seconds * 1000
    adaptive = settings.adaptive_window
    min_samples = settings.adaptive_min_samples
    half_life_ms = settings.failure_half_life_seconds * 1000.0
    sample_half_life_ms = settings.effective_sample_half_life * 1000.0
    for index in sorted(buckets, reverse=True):  # newest first, for the adaptive window
        end = (index + 1) * width
        in_window = end > now_ms - window_ms
        in_recent = end > now_ms - recent_ms
        in_usage = end > now_ms - USAGE_WINDOW_MS
        if not (in_window or in_recent or in_usage):
            continue
        age_ms = max(now_ms - (end - width / 2), 0.0)
        decay = 1.0
        if half_life_ms > 0:
            # Age of the bucket's middle: the newest failures count most, so a deployment that starts
            # failing loses its share within a few half-lives, not after the whole failure window.
            decay = 0.5 ** (age_ms / half_life_ms)
        weight = recency_weight(age_ms, sample_half_life_ms)
        for deployment_id, agg in buckets[index].items():
            if in_window and cutoff_ms and end <= cutoff_ms.get(deployment_id, -1.0):
                in_window_here = False  # from before a detected change of this deployment
            else:
                in_window_here = in_window
            if in_window_here:
                add_to(derived.window_full, deployment_id, agg, weight)
                if adaptive:
                    chosen = derived.window.get(deployment_id)
                    if chosen is None or chosen.count < min_samples:
                        add_to(derived.window, deployment_id, agg, weight)
            if in_recent:
                add_to(derived.recent, deployment_id, agg)
                attempts, failures = derived.failure_weights.get(deployment_id, (0.0, 0.0))
                derived.failure_weights[deployment_id] = (
                    attempts + decay * agg.count,
                    failures + decay * agg.failures,
                )
            if in_usage:
                add_to(derived.usage, deployment_id, agg)
    if not adaptive:
        derived.window = derived.window_full
    latency_sum = work_sum = ok_sum = 0.0
    for deployment_id, agg in derived.window_full.items():
        set_expected(settings, derived, deployment_id)
        ok = agg.count - agg.failures
        if deployment_id in derived.expected and ok > 0:
            latency, work = derived.expected[deployment_id]
            latency_sum += ok * latency
            work_sum += ok * work
            ok_sum += ok
    derived.pooled_expected = (latency_sum / ok_sum, work_sum / ok_sum) if ok_sum > 0 else None
    return derived
