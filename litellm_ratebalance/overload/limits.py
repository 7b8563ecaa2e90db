"""Pure adaptive concurrency limit: a gradient controller in the style of Envoy's adaptive concurrency
filter and Netflix concurrency-limits' Gradient2, with AIMD-style backoff on drops.

Nothing here reads a clock or does I/O: the caller passes ``now`` (seconds, any monotonic origin), the
sample's round-trip time, the deployment's in-flight count and whether the request was dropped.

The rule, one completed request at a time:

* **RTT is per output token.** The caller divides a request's latency by its output tokens
  (:func:`per_token_rtt`), so a 4000-token generation and a 50-token one compare on the same scale and a
  long generation does not read as congestion.
* **Baseline** (the no-load RTT): the lowest per-token RTT seen (when it drops, the short RTT below is
  rescaled with it, so the first samples, which may be dominated by fixed overhead, cannot read as
  congestion once lower ones arrive). It moves up only slowly
  (``baseline_drift_per_minute``) while the deployment is loaded, and follows the samples freely when a
  sample was taken at (near) no load (in flight <= ``min_limit``): a server that really became slower is
  then re-learnt, while sustained overload cannot ratchet the baseline up quickly.
* **Short RTT**: an exponentially weighted average of recent samples (weight ``smoothing``), each sample
  capped at ``OUTLIER_CAP`` (1.5) x the current value: a lone spike (a pause in the proxy, not the server)
  cannot cut the limit, a sustained rise still lifts it within a few samples.
* **Gradient** = ``clamp(tolerance * baseline / short, 0.5, 1)``: 1 while latency stays within
  ``tolerance`` of no-load, below 1 as the server queues. Never below 0.5: one slow sample at most halves
  the target.
* **Back-off**: once latency is past ``tolerance`` (gradient < 1), the new limit is
  ``(1 - smoothing) * limit + smoothing * limit * gradient``: it shrinks in proportion to the rise and does
  not probe. On a server whose per-token latency grows linearly past a knee of ``k`` slots, the limit
  settles near ``tolerance * k``.
* **Probing** while latency stays within ``tolerance``: ``+ smoothing * growth`` per sample until the first
  back-off or drop (a fast start, like TCP's slow start), then ``+ growth`` per turnover of the slots
  (``growth * min(smoothing, 1 / limit)`` per sample, like TCP's congestion avoidance): a completed request
  reports the load of its whole lifetime, so the signal lags the limit by about one turnover, and probing
  faster than that overshoots the knee before the back-off sees it. Probing while above tolerance too, as
  Gradient2 does with its additive headroom, would settle near ``tolerance * k + growth`` instead: every
  extra slot past the knee only slows every request down, since such a server's throughput is flat there.
* **App-limited**: no growth while fewer than half of the slots are in use (the limit would otherwise grow
  without evidence that the server can take it).
* **Drop** (server error, timeout, OOM): ``limit *= backoff_ratio``, at most once per
  ``drop_cooldown_seconds`` (a crash that fails every request in flight backs off once, not N times).
* Always clamped to ``[min_limit, max_limit]``; :attr:`GradientLimit.limit` is the whole number of slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["OUTLIER_CAP", "GradientLimit", "LimitConfig", "per_token_rtt"]

_MIN_RTT = 1e-9
"""Samples below a nanosecond per token are nonsense (clock steps, a zero latency): ignored, like negatives."""

OUTLIER_CAP = 1.5
"""A sample enters the short RTT as at most this multiple of it (see :meth:`GradientLimit.update`)."""


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """Parameters of :class:`GradientLimit` (validated ranges live in ``config.LimitSettings``)."""

    initial_limit: int = 8
    min_limit: int = 1
    max_limit: int = 256
    tolerance: float = 1.1
    smoothing: float = 0.2
    growth: float = 1.0
    backoff_ratio: float = 0.9
    drop_cooldown_seconds: float = 1.0
    baseline_drift_per_minute: float = 0.01

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                "need 1 <= min_limit <= initial_limit <= max_limit "
                f"(got {self.min_limit}, {self.initial_limit}, {self.max_limit})"
            )
        if self.tolerance < 1.0 or not 0.0 < self.smoothing <= 1.0 or not 0.0 < self.backoff_ratio <= 1.0:
            raise ValueError("need tolerance >= 1, 0 < smoothing <= 1 and 0 < backoff_ratio <= 1")


def per_token_rtt(latency_seconds: float, output_tokens: int | None) -> float:
    """Latency per output token (a request with no output counts as one token)."""
    return latency_seconds / max(1, output_tokens or 0)


class GradientLimit:
    """Adaptive concurrency limit of one deployment; feed it with :meth:`update` after each request."""

    __slots__ = ("_baseline", "_config", "_estimate", "_last_drop", "_last_sample", "_short", "_slow_start")

    def __init__(self, config: LimitConfig | None = None) -> None:
        self._config = config or LimitConfig()
        self._estimate = float(self._config.initial_limit)
        self._baseline: float | None = None
        self._short: float | None = None
        self._last_drop: float | None = None
        self._last_sample: float | None = None
        self._slow_start = True

    @property
    def config(self) -> LimitConfig:
        return self._config

    @property
    def limit(self) -> int:
        """Whole slots allowed now (the estimate rounded down, within bounds)."""
        return max(self._config.min_limit, min(self._config.max_limit, math.floor(self._estimate + 1e-9)))

    @property
    def estimate(self) -> float:
        """The unrounded limit."""
        return self._estimate

    @property
    def baseline_rtt(self) -> float | None:
        """The current no-load per-token RTT estimate (``None`` before the first sample)."""
        return self._baseline

    @property
    def short_rtt(self) -> float | None:
        return self._short

    def update(self, now: float, rtt: float, inflight: int, dropped: bool) -> int:
        """Account one finished request; return the new limit.

        ``rtt``: its per-token round trip (see :func:`per_token_rtt`), ignored when ``dropped``;
        ``inflight``: requests in flight at the deployment when it finished, itself included.
        """
        cfg = self._config
        if dropped:
            if self._last_drop is None or now - self._last_drop >= cfg.drop_cooldown_seconds:
                self._last_drop = now
                self._slow_start = False
                self._estimate = self._clamp(self._estimate * cfg.backoff_ratio)
            return self.limit
        if not math.isfinite(rtt) or rtt < _MIN_RTT:
            return self.limit
        self._observe(now, rtt, inflight)
        assert self._baseline is not None and self._short is not None
        gradient = min(1.0, max(0.5, cfg.tolerance * self._baseline / self._short))
        if gradient < 1.0:
            # Past tolerance: back off in proportion, no probing; the fast start is over.
            self._slow_start = False
            self._estimate = self._clamp(
                (1.0 - cfg.smoothing) * self._estimate + cfg.smoothing * self._estimate * gradient
            )
        elif inflight < self._estimate / 2:
            return self.limit  # app-limited: no evidence that more slots would be used well
        elif self._slow_start:
            self._estimate = self._clamp(self._estimate + cfg.smoothing * cfg.growth)
        else:
            # Congestion avoidance: ``growth`` slots per turnover of the slots (``limit`` samples), as TCP
            # adds one segment per round trip, so that samples from requests admitted under the last increase
            # can arrive before the next one; faster probing overshoots the knee while the signal lags.
            self._estimate = self._clamp(self._estimate + cfg.growth * min(cfg.smoothing, 1.0 / self._estimate))
        return self.limit

    def _observe(self, now: float, rtt: float, inflight: int) -> None:
        cfg = self._config
        elapsed = 0.0 if self._last_sample is None else max(0.0, now - self._last_sample)
        self._last_sample = now
        if self._baseline is None or self._short is None:
            self._baseline = self._short = rtt
            return
        # One outlier (a GC pause, a CPU-starved proxy, a retried connection) counts as at most
        # OUTLIER_CAP x the current short RTT: a lone spike then barely moves the limit, while a real slowdown,
        # sample after sample, still lifts the short RTT by up to smoothing x (OUTLIER_CAP - 1) per sample.
        if rtt < self._baseline:
            # A new no-load minimum: the short RTT so far was measured above a floor that turned out too high
            # (first samples dominated by fixed overhead, say). Rescale it with the baseline so that their
            # ratio, the congestion estimate, carries over instead of jumping and cutting the limit.
            self._short *= rtt / self._baseline
            self._baseline = rtt
        self._short += cfg.smoothing * (min(rtt, OUTLIER_CAP * self._short) - self._short)
        if rtt <= self._baseline:
            pass
        elif inflight <= cfg.min_limit:
            # Measured at (near) no load: this is the no-load RTT now, even if it went up.
            self._baseline += cfg.smoothing * (rtt - self._baseline)
        elif cfg.baseline_drift_per_minute > 0.0:
            ceiling = self._baseline * (1.0 + cfg.baseline_drift_per_minute * elapsed / 60.0)
            self._baseline = min(rtt, ceiling)

    def _clamp(self, value: float) -> float:
        return max(float(self._config.min_limit), min(float(self._config.max_limit), value))
