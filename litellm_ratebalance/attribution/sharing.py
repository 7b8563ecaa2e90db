"""GPU time of local deployments shared among the requests in flight: a processor-sharing integral.

The estimator. A deployment is busy while at least one request is in flight on it (counted across every
proxy replica: backpressure's leases). While ``n`` requests are in flight, each is charged ``1 / n`` of
every busy second, so the deployment's integral

    I(t) = integral from epoch to t of [n(s) > 0] / n(s) ds            (seconds)

grows by ``dt / n`` over an interval with ``n`` in flight, and a request in flight from ``t0`` to ``t1``
used ``I(t1) - I(t0)`` busy-seconds, times the deployment's GPUs. Summed over all requests this is exactly
the busy time: nothing is charged twice, no busy second is left out. It is the right split when the server
gives every running request the same share of each step (continuous batching decodes one token per running
request per step); see docs/cost.md for where it errs.

:func:`advance` is the whole update: the store applies it at every mark (start or end of a request) with
its own clock, reading ``n`` after the change, so each interval is divided by the count that held during
it. An integral restarted (its shared state expired, or the store lost it) has a new ``epoch``; a request
whose two marks fall in different epochs cannot be measured (:func:`gpu_share` returns ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Efficiency", "Mark", "SharingClock", "advance", "decayed", "gpu_share"]


@dataclass(frozen=True, slots=True)
class SharingClock:
    """One deployment's processor-sharing integral, as of its last mark."""

    epoch_ms: int
    """When this integral started (store clock, ms)."""
    at_ms: int
    """Time of the last mark (ms)."""
    inflight: int
    """Requests in flight since the last mark (all replicas)."""
    integral: float
    """Busy-seconds per request in flight, summed from the epoch to ``at_ms``."""


@dataclass(frozen=True, slots=True)
class Mark:
    """The integral read at one end of a request."""

    epoch_ms: int
    integral: float


def advance(clock: SharingClock | None, now_ms: int, inflight_now: int) -> SharingClock:
    """The clock at ``now_ms``, where ``inflight_now`` requests are in flight from now on.

    The interval since the last mark held ``clock.inflight`` requests (every change of the count comes with a
    mark), so it adds ``dt / clock.inflight`` seconds; an idle interval adds nothing. Time never runs back: a
    ``now_ms`` before the last mark adds nothing and keeps the later time. No clock yet: a new epoch at
    ``now_ms``.
    """
    if clock is None:
        return SharingClock(now_ms, now_ms, max(0, inflight_now), 0.0)
    elapsed_ms = max(0, now_ms - clock.at_ms)
    integral = clock.integral
    if clock.inflight > 0:
        integral += elapsed_ms / 1000.0 / clock.inflight
    return SharingClock(clock.epoch_ms, max(now_ms, clock.at_ms), max(0, inflight_now), integral)


def gpu_share(start: Mark, end: Mark, gpus: float) -> float | None:
    """GPU-seconds of a request whose start and end marks are ``start`` and ``end`` on a deployment of
    ``gpus`` GPUs; ``None`` when the marks belong to different epochs (the integral restarted in between)."""
    if start.epoch_ms != end.epoch_ms:
        return None
    return max(0.0, end.integral - start.integral) * gpus


def decayed(value: float, elapsed_seconds: float, half_life_seconds: float) -> float:
    """``value`` after ``elapsed_seconds`` of exponential decay with ``half_life_seconds`` (no growth for a
    negative elapsed time)."""
    return float(value * 0.5 ** (max(0.0, elapsed_seconds) / half_life_seconds))


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Decayed sums of a deployment's attributed GPU-seconds and its output tokens (same decay, so their
    ratio weighs recent requests most)."""

    gpu_seconds: float
    output_tokens: float

    def per_1k_output_tokens(self) -> float | None:
        """GPU-seconds per 1000 output tokens; ``None`` without output tokens to divide by."""
        if self.output_tokens < 1e-9:
            return None
        return 1000.0 * self.gpu_seconds / self.output_tokens
