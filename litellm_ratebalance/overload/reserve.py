"""The top tier's reserve: how many slots of a deployment lower tiers leave free for the top tier's own
arrivals. Pure: the caller passes ``now`` (monotonic seconds, any origin) and the latencies.

Why: a lower tier under overload refills every slot it may use the moment one frees, so a top-tier request
finds a free slot only if it is the first to arrive since the last completion; when the top tier alone
keeps several slots busy, its requests queue behind each other for a completion. Keeping one slot free (the
tier rule of :mod:`.shedding`) is not enough then.

The rule, by Little's law: the top tier keeps ``L = λ x W`` requests in flight on average (``λ`` its arrival
rate at the deployment, ``W`` its mean time in service). With Poisson arrivals the number it has in flight
at a given moment is Poisson-distributed with mean ``L`` whatever the service-time distribution (an M/G/∞
system), so reserving the ``q``-quantile of that distribution (:func:`reserve_slots`) lets a top-tier
arrival find a slot without waiting for a completion about ``q`` of the time, while lower tiers still fill
the rest. Lower tiers may then be admitted only while ``in flight + 1 <= limit - max(0, R - top in flight)``
(see :func:`~litellm_ratebalance.overload.shedding.decide`): the top tier's own requests already in flight
count towards its reserve.

The cost is goodput when the top tier's in-flight count is below ``R``: those slots stay idle. ``q = 0``
gives ``R = 0``, the plain tier rule.

:class:`TopDemand` estimates ``λ`` and ``W`` from what one process sees; with several proxy replicas in front
of a deployment each sees part of the top tier's arrivals, and the others' rates (and top-tier requests in
flight) are added from what they publish (:mod:`.peers`, every scrape interval).
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["RATE_WINDOW_SECONDS", "SERVICE_SMOOTHING", "TopDemand", "reserve_slots"]

RATE_WINDOW_SECONDS = 30.0
"""Time constant of the arrival-rate estimate: arrivals older than this weigh ``1/e`` (a burst of the top tier
lifts the reserve within seconds; after the top tier goes quiet the reserve decays over about this long)."""

SERVICE_SMOOTHING = 0.1
"""Weight of each top-tier latency in the mean service time (about the last ten requests)."""

_POISSON_EXACT_BELOW = 200.0
"""Means up to this use the exact Poisson CDF; above it the normal approximation (the sum of the
probability mass would underflow, and the two agree within a slot there)."""


def reserve_slots(expected_inflight: float, quantile: float) -> int:
    """The smallest ``r`` with ``P(X <= r) >= quantile`` for ``X ~ Poisson(expected_inflight)``: slots that
    cover the top tier's in-flight count ``quantile`` of the time. 0 for ``quantile <= 0`` or no demand."""
    if not math.isfinite(expected_inflight) or expected_inflight <= 0 or quantile <= 0:
        return 0
    quantile = min(quantile, 0.999_999)
    mean = expected_inflight
    if mean > _POISSON_EXACT_BELOW:
        return max(0, math.ceil(NormalDist(mean, math.sqrt(mean)).inv_cdf(quantile) - 0.5))
    probability = math.exp(-mean)
    cumulative = probability
    r = 0
    while cumulative < quantile:
        r += 1
        probability *= mean / r
        cumulative += probability
    return r


class TopDemand:
    """The top tier's arrival rate and mean service time at one deployment, as one process sees them.

    The rate is an exponentially decayed count of arrivals (time constant :data:`RATE_WINDOW_SECONDS`)
    divided by the decayed length of the time observed since the first arrival, so it is unbiased from the
    second arrival on, not only after a whole window. Not thread-safe (one event loop owns it)."""

    __slots__ = ("_count", "_first", "_last", "_service", "_window")

    def __init__(self, window_seconds: float = RATE_WINDOW_SECONDS) -> None:
        if window_seconds <= 0:
            raise ValueError(f"window_seconds must be positive (got {window_seconds})")
        self._window = window_seconds
        self._count = 0.0
        self._first: float | None = None
        self._last: float | None = None
        self._service: float | None = None

    def arrive(self, now: float) -> None:
        """Count one top-tier request that asked this deployment for a slot at ``now``."""
        if self._first is None or self._last is None:
            # The first arrival starts the clock and is not counted: counting it too would put an event on the
            # edge of the observed time and overstate the rate while little time has been observed.
            self._first = self._last = now
            return
        elapsed = max(0.0, now - self._last)
        self._count = self._count * math.exp(-elapsed / self._window) + 1.0
        self._last = max(self._last, now)

    def served(self, seconds: float) -> None:
        """Fold one finished top-tier request's time in service into the mean."""
        if not math.isfinite(seconds) or seconds <= 0:
            return
        if self._service is None:
            self._service = seconds
        else:
            self._service += SERVICE_SMOOTHING * (seconds - self._service)

    @property
    def service_seconds(self) -> float | None:
        """Mean time in service of the top tier's requests (``None`` before the first)."""
        return self._service

    def rate(self, now: float) -> float:
        """Top-tier arrivals per second at ``now`` (0 before the second arrival: one event is no rate)."""
        if self._first is None or self._last is None or self._count <= 0.0:
            return 0.0
        decayed = self._count * math.exp(-max(0.0, now - self._last) / self._window)
        # The decayed length of [first, now]: what a steady rate r would have accumulated is r times this.
        observed = self._window * (1.0 - math.exp(-max(0.0, now - self._first) / self._window))
        return decayed / observed if observed > 0 else 0.0

    def expected_inflight(self, now: float, fallback_service_seconds: float | None = None) -> float:
        """``λ x W``: the top tier's mean requests in flight (Little's law); ``W`` falls back to
        ``fallback_service_seconds`` (e.g. the deployment's mean latency) before a top-tier request finished."""
        service = self._service if self._service is not None else fallback_service_seconds
        if service is None or service <= 0:
            return 0.0
        return self.rate(now) * service

    def reserve(
        self, now: float, quantile: float, fallback_service_seconds: float | None = None, other_rate: float = 0.0
    ) -> int:
        """Slots lower tiers leave for the top tier now (see the module docstring); ``other_rate``: the top
        tier's arrivals per second at the other proxy replicas of the deployment, added to this process's."""
        service = self._service if self._service is not None else fallback_service_seconds
        if service is None or service <= 0:
            return 0
        return reserve_slots((self.rate(now) + max(0.0, other_rate)) * service, quantile)
