"""How many requests a deployment serves at full speed, judged per token: :class:`CapacityFit`.

A deployment with ``c`` slots serves up to ``c`` requests at once at full speed; beyond that they share them,
and each request's size-dependent time stretches by ``load / c``. So a request of ``work`` tokens that met
``load`` requests in flight (its mean over its life, itself included) takes about

    latency = base + per_token x work x max(1, load / c)

whatever its size. For each capacity ``c`` of a fixed grid the fit keeps the recency-weighted least-squares
line of latency against ``work x max(1, load / c)`` (relative errors: each sample weighs ``1 / latency**2``),
and compares how well each explains the samples with how well "never saturated" does (``c`` infinite, the
plain size line). The deployment counts as saturated only when some ``c`` explains them better by a margin
no chance arrangement of jitter gives (:data:`EVIDENCE`), and it has then the largest ``c`` that explains them
about as well as the best one.

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
"""Recency-weighted samples at :data:`OVER` times a capacity's load or more needed before it can be found: one
slow answer at a load seen once is not evidence enough."""
OVER: Final = 1.25
"""See :data:`MIN_OVER`: a stretch of less than a quarter is within what jitter and the caller's own load
(a busy proxy answers a little later with more requests in flight) give a deployment with slots to spare."""
TIE: Final = 0.5
"""Log-likelihood ratio below which two capacities explain the samples alike (the larger one is taken)."""
NOISE_FLOOR: Final = 0.05
"""Least relative spread of latencies around a line the likelihood ratio assumes: no deployment answers more
regularly, and residuals near 0 would make any difference between two lines look decisive."""
_RESCALE_DOUBLINGS: Final = 40.0
"""Half-lives after which the sums are brought back to their true scale (see :class:`CapacityFit`)."""


class CapacityFit:
    """Recency-weighted evidence of a deployment's capacity, per token (see the module docstring).

    ``prior``: the capacity believed before these samples (e.g. learnt before the deployment's rate changed);
    it stands until the samples explain themselves better without it.

    The sums of the least-squares lines are kept for the plain line and, per capacity, as the difference the
    stretch makes: a sample changes only the capacities below its load. Fading is lazy: a sample added at
    ``t`` counts ``2 ** ((t - origin) / half-life)`` in the sums, so older ones weigh less by the same ratio
    without every sum being rescaled at every sample (they are brought back to scale now and then).
    """

    __slots__ = (
        "_a",
        "_d",
        "_dspeed",
        "_dx",
        "_dxx",
        "_dxy",
        "_e",
        "_f",
        "_index",
        "_origin",
        "_over",
        "_prior",
        "_scale",
        "_x",
        "_xx",
        "last",
    )

    def __init__(self, prior: float | None = None) -> None:
        size = len(GRID)
        self._prior = None if prior is None else min(range(size), key=lambda k: abs(math.log(GRID[k] / prior)))
        """Grid index of the capacity believed before these samples."""
        # Plain line (no saturation), each sample weighing w / latency**2: sums of 1 (f), 1 / y (d),
        # 1 / y**2 (a), work / y**2 (x), work**2 / y**2 (xx), work / y (e).
        self._f = 0.0
        self._d = 0.0
        self._a = 0.0
        self._x = 0.0
        self._xx = 0.0
        self._e = 0.0
        # Per capacity: what the stretch adds to x, xx, e; the speed factor's shortfall (1 - capacity / load)
        # summed; and the weight of the samples it stretches by OVER or more.
        self._dx = [0.0] * size
        self._dxx = [0.0] * size
        self._dxy = [0.0] * size
        self._dspeed = [0.0] * size
        self._over = [0.0] * size
        self._origin = 0.0
        self._scale = 1.0
        """The weight of a sample added at ``last`` in the sums (1 at ``origin``)."""
        self.last = float("-inf")
        self._index = self._prior
        """Grid index of :meth:`slots` (None: not saturated)."""

    @property
    def weight(self) -> float:
        """Recency-weighted samples, as of the last one."""
        return self._f / self._scale

    def add(self, now: float, load: float, work: float, latency: float, half_life_seconds: float) -> None:
        """One successful request of ``work`` tokens that took ``latency`` seconds at mean ``load`` requests in
        flight (itself included); ignored unless all three are positive."""
        if not (load > 0.0 and work > 0.0 and latency > 0.0):
            return
        if self.last == float("-inf"):
            self._origin = now
        w = 1.0
        if half_life_seconds > 0.0:
            doublings = (now - self._origin) / half_life_seconds
            if doublings > _RESCALE_DOUBLINGS:
                self._rescale(2.0**-doublings)
                self._origin = now
                doublings = 0.0
            w = 2.0**doublings
        self.last = max(self.last, now)
        self._scale = w if now >= self.last else self._scale
        inv = 1.0 / latency
        winv = w * inv
        winv2 = winv * inv
        self._f += w
        self._d += winv
        self._a += winv2
        self._x += work * winv2
        self._xx += work * work * winv2
        self._e += work * winv
        for k, c in enumerate(GRID):
            if load <= c:
                break  # (the grid rises: no capacity from here on is below this load)
            stretch = load / c
            if stretch >= OVER:
                self._over[k] += w
            grown = work * stretch
            self._dx[k] += (grown - work) * winv2
            self._dxx[k] += (grown * grown - work * work) * winv2
            self._dxy[k] += (grown - work) * winv
            self._dspeed[k] += w * (1.0 - 1.0 / stretch)
        self._index = self._judge()

    def _rescale(self, factor: float) -> None:
        self._f *= factor
        self._d *= factor
        self._a *= factor
        self._x *= factor
        self._xx *= factor
        self._e *= factor
        for values in (self._dx, self._dxx, self._dxy, self._dspeed, self._over):
            for k in range(len(values)):
                values[k] *= factor
        self._scale *= factor

    def _rss(self, b: float, c: float, e: float) -> float:
        """Weighted residual sum of squares of the best line (base >= 0, slope > 0) with the sums of work x
        stretch ``b`` (/ y**2), ``c`` (its square / y**2) and ``e`` (/ y), the others shared."""
        a, d, f = self._a, self._d, self._f
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
        scale = self._scale
        n = self._f / scale
        if n < MIN_WEIGHT:
            return prior
        plain = self._rss(self._x, self._xx, self._e)
        size = len(GRID)
        rss = [plain] * size
        best_rss = plain
        enough = MIN_OVER * scale
        over = self._over
        for k in range(size):
            if over[k] >= enough:  # (else its line is the plain one, give or take a sample or two)
                rss[k] = self._rss(self._x + self._dx[k], self._xx + self._dxx[k], self._e + self._dxy[k])
                best_rss = min(best_rss, rss[k])
        floor = self._f * NOISE_FLOOR * NOISE_FLOOR
        # Of the capacities that explain the samples about as well as the best one (a few samples at two loads
        # fit every capacity up to the lower one alike, the line's base taking the rest), the largest: the
        # samples show no fewer slots than that.
        best = -1
        for k in range(size):
            if over[k] >= enough and _likelihood_ratio(rss[k], best_rss, n, floor) < TIE:
                best = k
        if prior is not None and _likelihood_ratio(rss[prior], best_rss, n, floor) < EVIDENCE:
            # The capacity believed before stands unless some other (or none) explains the samples better by
            # the margin.
            return prior
        if best < 0 or _likelihood_ratio(plain, rss[best], n, floor) < EVIDENCE:
            return None
        return best

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
        if self._f <= 0.0:
            return speed
        return speed / (1.0 - self._dspeed[index] / self._f)


def _likelihood_ratio(worse: float, better: float, n: float, floor: float) -> float:
    """Profile log-likelihood ratio of two fits' Gaussian residuals (sums of squares, scaled alike), their
    spread unknown, at least :data:`NOISE_FLOOR` (``floor``: that spread's sum of squares, scaled alike);
    ``n`` samples."""
    return 0.5 * n * math.log(max(worse, floor) / max(better, floor))
