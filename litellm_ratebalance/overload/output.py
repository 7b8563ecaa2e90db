"""The output a request reserves in a deployment's KV cache: learned from the answers the deployment gave.

Nothing here reads a clock or does I/O. One :class:`OutputEstimate` per deployment and process learns the
completion tokens of its successful answers in the histogram of :mod:`litellm_ratebalance.admission.estimate`
(log-spaced buckets, halved every :data:`~litellm_ratebalance.admission.estimate.DECAY_AT_SAMPLES` samples,
so it follows a model whose answers change), pooled with what the other proxy replicas of the deployment learned
(:meth:`OutputEstimate.set_peers`, see :mod:`.peers`), and :meth:`OutputEstimate.reserve` turns it into the output
tokens one request reserves:

* ``learned`` (default): the mean of the learned answers (``quantile``: that quantile instead), at most the
  request's ``max_tokens``; ``default_output_tokens`` (at most ``max_tokens``) until
  :data:`MIN_SAMPLES` answers are learned. A client's ``max_tokens`` far above its answers, or none at
  all, then reserves what the answers use, not the ceiling.
* ``max_tokens``: the request's ``max_tokens``, else ``default_output_tokens`` (the ceiling; leaves the
  cache part empty when answers stop early).

Why the mean is safe for memory: a running request holds its prompt and the tokens generated *so far*, on
average about half of its answer, while its reservation counts the whole expected answer. The reservations
of a batch therefore exceed its measured usage on average; single long answers are covered by that margin,
by the gap between the tier's threshold and the cache's end, and by the measured KV-cache usage, which the
policy takes instead of the reservations whenever it is higher (see :mod:`.shedding`).
"""

from __future__ import annotations

import math
from typing import Literal

from litellm_ratebalance.admission.estimate import bucket_of, decayed, estimate_from_histogram
from litellm_ratebalance.overload.peers import pooled_histogram

__all__ = ["MIN_SAMPLES", "OutputEstimate", "OutputMode"]

OutputMode = Literal["learned", "max_tokens"]

MIN_SAMPLES = 10
"""Answers learned before the estimate replaces ``default_output_tokens``: a handful of samples of a skewed
length distribution would set the reservation of the next few hundred requests by chance."""


class OutputEstimate:
    """Learned completion tokens of one deployment (not thread-safe: one event loop owns it)."""

    __slots__ = ("_buckets", "_count", "_peer_count", "_peers")

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[float, float]] = {}
        self._count = 0.0
        self._peers: dict[int, tuple[float, float]] = {}
        self._peer_count = 0.0

    def histogram(self) -> dict[int, tuple[float, float]]:
        """What this process learned: bucket -> (count, sum of tokens), decayed (a copy, to share)."""
        return dict(self._buckets)

    def set_peers(self, histogram: dict[int, tuple[float, float]]) -> None:
        """The other replicas' answers of this deployment (their histograms summed), pooled with this
        process's own in :meth:`estimate` until the next call replaces them."""
        self._peers = dict(histogram)
        self._peer_count = sum(count for count, _ in histogram.values())

    @property
    def samples(self) -> float:
        """Samples held (decayed: halves each time it reaches the decay mark)."""
        return self._count

    def learn(self, completion_tokens: int) -> None:
        """Record one successful answer's completion tokens (negative counts as 0)."""
        tokens = max(0, int(completion_tokens))
        bucket = bucket_of(tokens)
        count, total = self._buckets.get(bucket, (0.0, 0.0))
        self._buckets[bucket] = (count + 1, total + tokens)
        self._count += 1
        self._buckets, self._count = decayed(self._buckets, self._count)

    def estimate(self, quantile: float | None = None) -> float | None:
        """The learned answer size (mean, or ``quantile``) over this process's answers and its peers'
        (:meth:`set_peers`); ``None`` before :data:`MIN_SAMPLES` answers."""
        if self._count + self._peer_count < MIN_SAMPLES:
            return None
        if not self._peers:
            return estimate_from_histogram(self._buckets, quantile)
        return estimate_from_histogram(pooled_histogram(self._buckets, self._peers), quantile)

    def reserve(
        self, max_tokens: int | None, *, mode: OutputMode, default_output_tokens: int, quantile: float | None = None
    ) -> int:
        """Output tokens one request reserves (see the module docstring); ``max_tokens`` ``None``: unset."""
        if mode == "max_tokens":
            return default_output_tokens if max_tokens is None else max_tokens
        learned = self.estimate(quantile)
        expected = float(default_output_tokens) if learned is None else learned
        reserved = math.floor(expected + 0.5)
        return reserved if max_tokens is None else min(max_tokens, reserved)
