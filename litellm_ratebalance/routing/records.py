"""Routing's record types, shared by the routing core and the store: what a sync writes and reads back.

* :class:`RateAggregate`: a summary of rate samples of one deployment (count, failures, sums of rates and
  their squares, latency, tokens, time to first token, and a fixed log-spaced histogram of rates:
  :data:`BINS_PER_DECADE` bins per decade from :data:`RATE_FLOOR` up). Aggregates add, so time buckets
  merge into a window and replicas into one picture.
* :class:`RateLimitObservation`: a deployment's latest ``x-ratelimit-*`` headers
  (:func:`parse_reset_seconds` reads their reset durations).

A module of its own so that the store (:mod:`litellm_ratebalance.store.routing`) depends on these types only,
not on the rest of the routing core (the package serves its names on first use, so importing this module
loads nothing else of it). Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BINS_PER_DECADE",
    "NUM_BINS",
    "RATE_FLOOR",
    "RateAggregate",
    "RateLimitObservation",
    "bin_bounds",
    "bin_index",
    "parse_reset_seconds",
]

RATE_FLOOR = 1e-3
"""Rates below this many tokens per second (failures included) fall into bin 0 and count as 0."""
BINS_PER_DECADE = 20
_DECADES = 9
NUM_BINS = 2 + BINS_PER_DECADE * _DECADES
"""Bin 0: rate < RATE_FLOOR; bins 1..: log-spaced from RATE_FLOOR; the last bin is open-ended (>= 1e6)."""
_GROWTH = 10.0 ** (1.0 / BINS_PER_DECADE)
_LOG_GROWTH = math.log(_GROWTH)


def bin_index(rate: float) -> int:
    """Histogram bin of ``rate``; 0 for rates below :data:`RATE_FLOOR` (and for failures)."""
    if not rate >= RATE_FLOOR:  # also catches NaN
        return 0
    index = 1 + int(math.log(rate / RATE_FLOOR) / _LOG_GROWTH)
    return min(index, NUM_BINS - 1)


def bin_bounds(index: int) -> tuple[float, float]:
    """``(lower, upper)`` rate bounds of a bin; bin 0 is ``(0, 0)`` (its samples count as rate 0)."""
    if index <= 0:
        return 0.0, 0.0
    lower = RATE_FLOOR * _GROWTH ** (index - 1)
    return lower, lower * _GROWTH


_AGGREGATE_FIELDS = (
    "bins",
    "count",
    "failures",
    "ok_latency_sum",
    "rate_sq_sum",
    "rate_sum",
    "tokens",
    "ttft_count",
    "ttft_sum",
)
"""What :class:`RateAggregate` equality compares: every field."""


class RateAggregate:
    """Summary of a set of rate samples of one deployment (a time bucket, a window, pending samples).

    Aggregates are added with :meth:`merge`; nothing in them depends on the order of samples. ``bins``
    maps a bin index to its sample count (only non-empty bins are present).
    """

    __slots__ = _AGGREGATE_FIELDS

    def __init__(
        self,
        count: float = 0,
        failures: float = 0,
        rate_sum: float = 0.0,
        rate_sq_sum: float = 0.0,
        ok_latency_sum: float = 0.0,
        tokens: float = 0,
        ttft_sum: float = 0.0,
        ttft_count: float = 0,
        bins: Mapping[int, float] | None = None,
    ) -> None:
        self.count = count
        """Samples, failures included (whole numbers, except in a recency-weighted window)."""
        self.failures = failures
        self.rate_sum = rate_sum
        self.rate_sq_sum = rate_sq_sum
        self.ok_latency_sum = ok_latency_sum
        """Sum of the latencies of the successful samples (seconds)."""
        self.tokens = tokens
        """Input + output tokens (for configured tpm)."""
        self.ttft_sum = ttft_sum
        self.ttft_count = ttft_count
        self.bins: dict[int, float] = dict(bins) if bins else {}

    def add(
        self, rate: float, *, ok: bool = True, latency: float = 0.0, tokens: int = 0, ttft: float | None = None
    ) -> None:
        """Add one sample (``rate`` is ignored and 0 is used when ``ok`` is false)."""
        if not ok or not rate > 0.0:
            rate = 0.0
        self.count += 1
        if ok:
            self.ok_latency_sum += latency
        else:
            self.failures += 1
        self.rate_sum += rate
        self.rate_sq_sum += rate * rate
        self.tokens += tokens
        if ttft is not None:
            self.ttft_sum += ttft
            self.ttft_count += 1
        index = bin_index(rate)
        self.bins[index] = self.bins.get(index, 0) + 1

    def merge(self, other: RateAggregate) -> None:
        """Add ``other``'s samples to this aggregate."""
        self.count += other.count
        self.failures += other.failures
        self.rate_sum += other.rate_sum
        self.rate_sq_sum += other.rate_sq_sum
        self.ok_latency_sum += other.ok_latency_sum
        self.tokens += other.tokens
        self.ttft_sum += other.ttft_sum
        self.ttft_count += other.ttft_count
        bins = self.bins
        for index, n in other.bins.items():
            bins[index] = bins.get(index, 0) + n

    def merge_scaled(self, other: RateAggregate, factor: float) -> None:
        """Add ``other``'s samples, each counting ``factor`` (a recency weight in 0..1)."""
        if factor == 1.0:
            self.merge(other)
            return
        self.count += factor * other.count
        self.failures += factor * other.failures
        self.rate_sum += factor * other.rate_sum
        self.rate_sq_sum += factor * other.rate_sq_sum
        self.ok_latency_sum += factor * other.ok_latency_sum
        self.tokens += factor * other.tokens
        self.ttft_sum += factor * other.ttft_sum
        self.ttft_count += factor * other.ttft_count
        bins = self.bins
        for index, n in other.bins.items():
            bins[index] = bins.get(index, 0) + factor * n

    def copy(self) -> RateAggregate:
        return RateAggregate(
            self.count,
            self.failures,
            self.rate_sum,
            self.rate_sq_sum,
            self.ok_latency_sum,
            self.tokens,
            self.ttft_sum,
            self.ttft_count,
            self.bins,
        )

    @property
    def mean(self) -> float:
        return self.rate_sum / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation of the rates (as the proposal: divide by n)."""
        if not self.count:
            return 0.0
        mean = self.rate_sum / self.count
        return math.sqrt(max(self.rate_sq_sum / self.count - mean * mean, 0.0))

    def ok_moments(self) -> tuple[float, float, float] | None:
        """(weight, mean rate, variance of the rates) of the successful samples; None without any."""
        ok = self.count - self.failures
        if ok <= 1e-9:
            return None
        mean = self.rate_sum / ok
        return ok, mean, self.rate_sq_sum / ok - mean * mean

    @property
    def mean_ok_rate(self) -> float | None:
        """Mean rate of the successful samples."""
        ok = self.count - self.failures
        return self.rate_sum / ok if ok > 1e-9 else None

    @property
    def mean_ok_latency(self) -> float | None:
        ok = self.count - self.failures
        return self.ok_latency_sum / ok if ok > 1e-9 else None

    @property
    def mean_ttft(self) -> float | None:
        return self.ttft_sum / self.ttft_count if self.ttft_count else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RateAggregate):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _AGGREGATE_FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"RateAggregate(count={self.count}, failures={self.failures}, mean={self.mean:.4g}, "
            f"std={self.std:.4g}, tokens={self.tokens})"
        )


@dataclass(frozen=True, slots=True)
class RateLimitObservation:
    """The provider's ``x-ratelimit-*`` headers of a deployment's latest response (``None``: not sent)."""

    remaining_requests: float | None = None
    remaining_tokens: float | None = None
    limit_requests: float | None = None
    limit_tokens: float | None = None
    reset_seconds: float | None = None
    """Seconds until the limit resets (the smaller of the two reset headers); the observation is ignored
    after that."""
    observed_ms: int = 0
    """Store clock (Redis ``TIME``) when the observation was written; 0 before it reached the store."""

    def fraction_left(self) -> float | None:
        """Smallest remaining/limit over requests and tokens; 0 for a reported ``remaining`` of 0 without a
        limit; ``None`` when nothing usable was reported."""
        fractions: list[float] = []
        for remaining, limit in (
            (self.remaining_requests, self.limit_requests),
            (self.remaining_tokens, self.limit_tokens),
        ):
            if remaining is None:
                continue
            if limit is not None and limit > 0:
                fractions.append(min(max(remaining / limit, 0.0), 1.0))
            elif remaining <= 0:
                fractions.append(0.0)
        return min(fractions) if fractions else None

    def is_current(self, now_ms: int, max_age_seconds: float) -> bool:
        age_limit = max_age_seconds if self.reset_seconds is None else min(max_age_seconds, self.reset_seconds)
        return now_ms - self.observed_ms < age_limit * 1000.0


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_reset_seconds(value: object) -> float | None:
    """Seconds in a reset header: a number (``"12"``, ``1.5``) or a Go duration (``"6m0s"``, ``"20ms"``).

    Returns ``None`` for anything else (negative numbers included).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number if number >= 0 and math.isfinite(number) else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)
