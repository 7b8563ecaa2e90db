"""How many requests a deployment serves at full speed, judged per token: :class:`CapacityFit`.

A deployment with ``c`` slots serves up to ``c`` requests at once at full speed; beyond that they share them,
and each request's size-dependent time stretches by ``load / c``. So a request of ``work`` tokens that met
``load`` requests in flight (its mean over its life, itself included) takes about

    latency = base + per_token x work x max(1, load / c)

whatever its size. For each capacity ``c`` of a fixed grid the fit keeps the recency-weighted least-squares
line of latency against ``work x max(1, load / c)`` (relative errors: each sample weighs ``1 / latency**2``),
and compares how well each explains the samples with how well "never saturated" does (``c`` infinite, the
plain size line). The deployment counts as saturated only when some ``c`` explains them better by a margin
no chance arrangement of jitter gives (:data:`EVIDENCE`), and it has then the ``c`` that explains them best.

Judged per token, a busy load level of long answers and a light one of short answers are compared for what
each token took, not for their mean rates: requests of very mixed sizes neither hide saturation nor fake it.
Samples are added with explicit times (no clock) and fade with a half-life.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["EVIDENCE", "GRID", "CapacityFit"]

GRID: Final[tuple[float, ...]] = tuple(float(2.0 ** (k / 2.0)) for k in range(15))
"""Capacities tried, 1 to 128 slots, each ``sqrt(2)`` times the one before."""
EVIDENCE: Final = 3.0
"""Log-likelihood ratio (Gaussian residuals, spread unknown) by which the best capacity must explain the
samples better than no saturation at all."""
MIN_WEIGHT: Final = 4.0
"""Recency-weighted samples before the fit judges anything."""
MIN_OVER: Final = 2.0
"""Recency-weighted samples above a capacity's load needed before it can be found: one slow answer at a load
seen once is not evidence enough."""
TIE: Final = 0.5
"""Log-likelihood ratio below which two capacities explain the samples alike (the larger one is taken)."""
NOISE_FLOOR: Final = 0.05
"""Least relative spread of latencies around a line the likelihood ratio assumes: no deployment answers more
regularly, and residuals near 0 would make any difference between two lines look decisive."""


class CapacityFit:
    """Recency-weighted evidence of a deployment's capacity, per token (see the module docstring).

    ``slots()``: the capacity that explains the samples best once they show saturation (None before);
    ``busiest()``: the highest load a sample met (recency-weighted mean of the loads above the lightest
    level is not kept: the highest load seen, fading with its samples).
    """

    __slots__ = (
        "_index",
        "_n",
        "_over",
        "_prior",
        "_speed",
        "_x",
        "_xx",
        "_xy",
        "_y1",
        "_y2",
        "last",
        "weight",
    )

    def __init__(self, prior: float | None = None) -> None:
        size = len(GRID) + 1  # the last column: no saturation (c infinite)
        self._prior = None if prior is None else min(range(len(GRID)), key=lambda k: abs(math.log(GRID[k] / prior)))
        """Grid index of the capacity believed before these samples (e.g. learnt before the deployment's rate
        changed): it stands until the samples explain themselves better without it (:data:`EVIDENCE`)."""
        self.weight = 0.0
        """Recency-weighted samples."""
        self._n = 0.0  # sum of weights x 1            (F: sum of (y/y)^2)
        self._y1 = 0.0  # sum of weights / y            (D)
        self._y2 = 0.0  # sum of weights / y^2          (A)
        self._x = [0.0] * size  # sum of weights x / y^2  (B)
        self._xx = [0.0] * size  # sum of weights x^2 / y^2 (C)
        self._xy = [0.0] * size  # sum of weights x / y  (E)
        self._over = [0.0] * size  # weight of samples with load above the capacity
        self._speed = [0.0] * size  # sum of weights x min(1, capacity / load): the samples' speed factor
        self.last = float("-inf")
        self._index = self._prior
        """Grid index of :meth:`slots` (None: not saturated)."""

    def add(self, now: float, load: float, work: float, latency: float, half_life_seconds: float) -> None:
        """One successful request of ``work`` tokens that took ``latency`` seconds at mean ``load`` requests in
        flight (itself included); ignored unless all three are positive."""
        if not (load > 0.0 and work > 0.0 and latency > 0.0):
            return
        if half_life_seconds > 0.0 and self.weight > 0.0 and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.weight *= factor
            self._n *= factor
            self._y1 *= factor
            self._y2 *= factor
            x_sums, xx_sums, xy_sums, over, speed = self._x, self._xx, self._xy, self._over, self._speed
            for k in range(len(x_sums)):
                x_sums[k] *= factor
                xx_sums[k] *= factor
                xy_sums[k] *= factor
                over[k] *= factor
                speed[k] *= factor
        self.last = max(self.last, now)
        inv = 1.0 / latency
        inv2 = inv * inv
        self.weight += 1.0
        self._n += 1.0
        self._y1 += inv
        self._y2 += inv2
        last = len(GRID)
        for k in range(last + 1):
            stretch = 1.0
            if k < last:
                c = GRID[k]
                if load > c:
                    stretch = load / c
                    self._over[k] += 1.0
            x = work * stretch
            self._speed[k] += 1.0 / stretch
            self._x[k] += x * inv2
            self._xx[k] += x * x * inv2
            self._xy[k] += x * inv
        self._index = self._judge()

    def _rss(self, k: int) -> float:
        """Weighted residual sum of squares of the best line (base >= 0, slope > 0) for column ``k``."""
        a, b, c, d, e, f = self._y2, self._x[k], self._xx[k], self._y1, self._xy[k], self._n
        det = a * c - b * b
        if det > 1e-12 * a * c and a > 0.0:
            slope = (a * e - b * d) / det
            base = (d - slope * b) / a
            if slope > 0.0 and base >= 0.0:
                return max(f - base * d - slope * e, 0.0)
        if c <= 0.0:
            return f
        # The base at 0: latency proportional to the stretched work.
        return max(f - e * e / c, 0.0)

    def _judge(self) -> int | None:
        prior = self._prior
        if self.weight < MIN_WEIGHT:
            return prior
        last = len(GRID)
        n = self._n
        plain = self._rss(last)
        rss = [plain] * last
        best_rss = plain
        for k in range(last):
            if self._over[k] >= MIN_OVER:  # (else its line is the plain one, give or take a sample or two)
                rss[k] = self._rss(k)
                best_rss = min(best_rss, rss[k])
        # Of the capacities that explain the samples about as well as the best one (a few samples at two loads
        # fit every capacity up to the lower one alike, the line's base taking the rest), the largest: the
        # samples show no fewer slots than that.
        best = -1
        for k in range(last):
            if self._over[k] >= MIN_OVER and self._likelihood_ratio(rss[k], best_rss, n) < TIE:
                best = k
        if prior is not None and self._likelihood_ratio(rss[prior], best_rss, n) < EVIDENCE:
            # The capacity believed before stands unless some other (or none) explains the samples better by
            # the margin.
            return prior
        if best < 0 or self._likelihood_ratio(plain, rss[best], n) < EVIDENCE:
            return None
        return best

    @staticmethod
    def _likelihood_ratio(worse: float, better: float, n: float) -> float:
        """Profile log-likelihood ratio of two fits' Gaussian residuals, their spread unknown (at least
        :data:`NOISE_FLOOR`)."""
        floor = n * NOISE_FLOOR * NOISE_FLOOR
        return 0.5 * n * math.log(max(worse, floor) / max(better, floor))

    def slots(self) -> float | None:
        """The capacity that explains the samples best, once they show the deployment saturated (else None)."""
        index = self._index
        return None if index is None else GRID[index]

    def factor(self, load: float) -> float:
        """With :meth:`slots` known: a request's speed at ``load`` (``min(1, slots / load)``) over the mean speed
        the samples had, at the loads they met (1 before any sample); 1 while not saturated."""
        index = self._index
        if index is None or load <= 0.0:
            return 1.0
        speed = min(1.0, GRID[index] / load)
        if self.weight <= 0.0:
            return speed
        return speed / (self._speed[index] / self.weight)
