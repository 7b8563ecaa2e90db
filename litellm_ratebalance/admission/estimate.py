"""The learned output estimate: how many tokens a request of a model group will most likely add.

Nothing here does I/O. The store keeps one histogram per model group (shared by every replica, in Redis
or in process memory) and both backends compute the estimate with the rules below; the Redis script
``store/lua/admission_acquire.lua`` implements :func:`estimate_from_histogram` and
:func:`decayed` step for step.

**What is learned.** A *sample* is what a settled request cost beyond the part of its reservation that
was counted exactly before the call: ``actual tokens - prompt tokens counted at admission`` when
``token_rate_limit_type`` is ``total``, the completion tokens when it is ``output``. So a systematic gap
between LiteLLM's prompt count and the provider's (chat template overhead) is learned too. Requests
without output (embeddings), failed requests and streams without usage teach nothing.

**Histogram.** Samples fall in log-spaced buckets, :data:`BUCKETS_PER_OCTAVE` per doubling (bucket
widths of about 19 %), each holding a count and the sum of its samples. Bounded memory: a few dozen
buckets cover 0 to 10^6 tokens. When the count reaches :data:`DECAY_AT_SAMPLES`, every count and sum is
halved, so the histogram follows a model group whose answers change, over roughly that many requests.

**Estimate.** By default the mean of the samples: a window's corrections after the call then cancel out on
average, so the tokens reserved before the calls add up to the tokens served (a quantile below the mean,
the median of skewed answer lengths for one, makes every window outrun its reservations and pay for it in
the next). With a ``quantile``: the bucket where the cumulative count first reaches ``quantile x count``,
valued at the mean of that bucket's samples (not a bucket edge), so a model that always answers the same
length is estimated exactly either way. Before the first sample the prior
(``limiter.default_output_tokens``) applies.

**Reservation** of one request: ``prompt + min(cap, estimate)``, where ``cap`` is its ``max_tokens`` /
``max_completion_tokens`` (or ``limiter.max_reserved_output_tokens`` when absent). See
:func:`reserved_output`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "BUCKETS_PER_OCTAVE",
    "DECAY_AT_SAMPLES",
    "Histogram",
    "SettleBatch",
    "bucket_of",
    "decayed",
    "estimate_from_histogram",
    "reserved_output",
]

BUCKETS_PER_OCTAVE = 4
DECAY_AT_SAMPLES = 1000
"""Samples after which the histogram halves (its memory, in requests)."""

Histogram = Mapping[int, tuple[float, float]]
"""bucket -> (count, sum of samples)."""


def bucket_of(tokens: int) -> int:
    """The histogram bucket of a sample: ``floor(log2(tokens + 1) x BUCKETS_PER_OCTAVE)``.

    Computed by the client only (Lua and Python logarithms may round differently at bucket edges); the
    store receives bucket numbers.
    """
    return int(math.log2(max(0, tokens) + 1) * BUCKETS_PER_OCTAVE)


def estimate_from_histogram(histogram: Histogram, quantile: float | None) -> float | None:
    """The learned estimate: the mean when ``quantile`` is ``None``, else at ``quantile`` (0..1); ``None``
    before any sample (see module doc)."""
    total = sum(count for count, _ in histogram.values())
    if total <= 0:
        return None
    if quantile is None:
        return sum(tokens for _, tokens in histogram.values()) / total
    target = quantile * total
    cumulative = 0.0
    chosen = 0.0
    for bucket in sorted(histogram):
        count, total_tokens = histogram[bucket]
        if count <= 0:
            continue
        cumulative += count
        chosen = total_tokens / count
        if cumulative >= target:
            break
    return chosen


def decayed(histogram: Mapping[int, tuple[float, float]], total: float) -> tuple[dict[int, tuple[float, float]], float]:
    """Halve every count and sum once ``total`` reaches :data:`DECAY_AT_SAMPLES`; else unchanged."""
    if total < DECAY_AT_SAMPLES:
        return dict(histogram), total
    return {bucket: (count / 2, tokens / 2) for bucket, (count, tokens) in histogram.items()}, total / 2


def reserved_output(cap: int, learned: float | None, prior: int) -> int:
    """Output tokens to reserve: the learned estimate (``prior`` before any sample), at most ``cap``.

    Rounded to the nearest token, the same way as the Redis script (``floor(x + 0.5)``).
    """
    estimate = float(prior) if learned is None else learned
    return min(cap, math.floor(estimate + 0.5))


@dataclass(slots=True)
class SettleBatch:
    """What one process has to tell the store about settled requests of one model group, aggregated.

    * ``deltas``: (window start ms, pool field) -> [token delta, request delta], summed over requests;
    * ``samples``: bucket -> [count, sum] of learned samples.

    Aggregating by window keeps a batch small (a few windows x pools, a few dozen buckets) however many
    requests settled, and a late settle is judged per window by its net effect (see the ledger).
    """

    deltas: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    samples: dict[int, list[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.deltas) or bool(self.samples)

    def add(self, window_start_ms: int, pool: str, token_delta: int, request_delta: int = 0) -> None:
        """Record a correction of one reservation (actual - reserved tokens; -1 request to give it back)."""
        if token_delta == 0 and request_delta == 0:
            return
        entry = self.deltas.get((window_start_ms, pool))
        if entry is None:
            self.deltas[(window_start_ms, pool)] = [token_delta, request_delta]
        else:
            entry[0] += token_delta
            entry[1] += request_delta

    def learn(self, sample_tokens: int) -> None:
        """Record one sample of the learned quantity (see module doc)."""
        sample = max(0, int(sample_tokens))
        entry = self.samples.get(bucket := bucket_of(sample))
        if entry is None:
            self.samples[bucket] = [1, sample]
        else:
            entry[0] += 1
            entry[1] += sample

    def merge(self, other: SettleBatch) -> None:
        """Add ``other`` into this batch (a batch that could not be sent goes back to the queue)."""
        for (start, pool), (tokens, requests) in other.deltas.items():
            self.add(start, pool, tokens, requests)
        for bucket, (count, total) in other.samples.items():
            entry = self.samples.setdefault(bucket, [0, 0])
            entry[0] += count
            entry[1] += total

    def drop_windows_before(self, oldest_kept_ms: int) -> None:
        """Forget corrections of windows that started before ``oldest_kept_ms`` (bounded memory)."""
        for key in [key for key in self.deltas if key[0] < oldest_kept_ms]:
            del self.deltas[key]

    def delta_items(self) -> Iterable[tuple[int, str, int, int]]:
        """(window start, pool, token delta, request delta), non-zero entries only."""
        return ((s, p, t, r) for (s, p), (t, r) in self.deltas.items() if t or r)
