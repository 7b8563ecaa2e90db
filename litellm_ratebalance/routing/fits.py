"""What this replica learns about a deployment beyond its rates: how its rate falls with load
(:class:`LoadFit`, its capacity judged per token by :class:`~litellm_ratebalance.routing.capacity.CapacityFit`)
and how its latency grows with a request's size (:class:`SizeFit`).

Both are fed successful samples with explicit times (no clock): ``add(now, ...)`` fades older samples by a
half-life. The balancer keeps one of each per deployment; :mod:`~litellm_ratebalance.routing.evidence`
reads them to correct an estimate at the current load and to judge whether a request is late for its size.
"""

from __future__ import annotations

import math
from typing import Final

from litellm_ratebalance.routing.capacity import CapacityFit

__all__ = ["PRESUMED_SLOTS", "SATURATION_MIN_WEIGHT", "SLOTS_GROWTH", "LoadFit", "SizeFit"]


def _load_level(load: float, lightest: float, levels: int) -> int:
    """Index of the load level of ``load``: 0 up to ``lightest``, then one per doubling (the last open)."""
    level = 0
    top = lightest
    while load > top and level < levels - 1:
        level += 1
        top *= 2.0
    return level


SATURATION_MIN_WEIGHT = 3.0
"""Recency-weighted samples a load level needs before its mean load counts as a load the deployment was seen
to serve (the proven load, see :meth:`LoadFit.proven_load`)."""
PRESUMED_SLOTS = 2.0
"""Slots a deployment is presumed to have while its load fit has neither learnt its slots nor seen it serve
more requests at once at full speed (``presume_slots``, see :meth:`LoadFit.presumed_slots`)."""
SLOTS_GROWTH = 2.0
"""Presumed slots per request the deployment has been seen to serve at once at full speed (slow start: the
presumption doubles as each load is proven)."""


class LoadFit:
    """How a deployment's rate depends on its load (requests in flight there), from its successful samples.

    Each sample adds a request's ``load`` (the requests in flight at the deployment during the request, itself
    included: their mean over its life), its ``work`` (tokens) and ``latency``. Times are explicit (no clock);
    samples fade with ``half_life_seconds``.

    * **Slots** (:meth:`slots`): the capacity its :class:`~litellm_ratebalance.routing.capacity.CapacityFit`
      finds once the samples show saturation (per token: what each token took at each load, so answers of very
      mixed sizes neither hide nor fake it); None while every load seen was served at about full speed (its
      capacity is then unknown, not small).
    * **The rate at a load** (:meth:`factor`, :meth:`shift`): with slots known, a request at ``load`` runs at
      ``min(1, slots / load)`` of full speed; the samples behind the deployment's window ran at their mean
      speed factor, so its window mean moves by the ratio of the two. Without slots, the load changes nothing:
      the window mean stands.
    * **Proven load** (:meth:`proven_load`): the busiest load level (mean of a level with weight enough,
      :data:`SATURATION_MIN_WEIGHT`) seen while no slots are known.

    ``carried_slots``, ``carried_proven``: what a previous fit had learnt, when a change of the deployment's
    rate was detected (its rates from before are dropped; how many requests it serves at once seldom changes
    with them). The carried slots stand until this fit's own samples explain themselves better without them;
    the carried proven load, until slots are found.
    """

    __slots__ = (
        "_derived",
        "capacity",
        "carried_proven",
        "carried_slots",
        "last",
        "level_loads",
        "level_weights",
        "samples",
    )

    UNLOADED_LOAD: Final = 2.0
    """Upper bound of the lightest load level; level ``k`` above it holds loads up to ``UNLOADED_LOAD * 2**k``."""
    LEVELS: Final = 8

    def __init__(self, carried_slots: float | None = None, carried_proven: float = 0.0) -> None:
        self.carried_slots = carried_slots
        """Slots learnt before a change of regime, standing until this fit's samples say otherwise."""
        self.carried_proven = carried_proven
        """Load seen served at full speed before a change of regime (0: none)."""
        self.samples = 0
        self.capacity = CapacityFit(carried_slots)
        """Saturation and slots, judged per token."""
        self.level_loads = [0.0] * self.LEVELS
        self.level_weights = [0.0] * self.LEVELS
        self.last = float("-inf")
        self._derived: tuple[float | None, float] = (self.capacity.slots(), carried_proven)
        """(slots, proven load) as of the last sample."""

    def add(self, now: float, load: float, work: float, latency: float, half_life_seconds: float) -> None:
        """Add one successful request of ``work`` tokens that took ``latency`` seconds at mean ``load`` requests
        in flight (itself included); ignored unless all three are positive."""
        if not (load > 0.0 and work > 0.0 and latency > 0.0):
            return
        if half_life_seconds > 0.0 and self.samples and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.level_loads = [x * factor for x in self.level_loads]
            self.level_weights = [x * factor for x in self.level_weights]
        self.last = max(self.last, now)
        self.samples += 1
        level = _load_level(load, self.UNLOADED_LOAD, self.LEVELS)
        self.level_loads[level] += load
        self.level_weights[level] += 1.0
        self.capacity.add(now, load, work, latency, half_life_seconds)
        slots = self.capacity.slots()
        proven = 0.0
        if slots is None:
            proven = self.carried_proven
            for k in range(self.LEVELS):
                weight = self.level_weights[k]
                if weight >= SATURATION_MIN_WEIGHT:
                    proven = max(proven, self.level_loads[k] / weight)
        self._derived = (slots, proven)

    def slots(self) -> float | None:
        """Requests the deployment serves at full speed, once seen saturated (or carried over); else None."""
        return self._derived[0]

    def presumed_slots(self) -> float:
        """Slots to act on while :meth:`slots` is None: :data:`SLOTS_GROWTH` times the proven load, at least
        :data:`PRESUMED_SLOTS`. (Once slots are known it is not used.)"""
        return max(PRESUMED_SLOTS, SLOTS_GROWTH * self._derived[1])

    def proven_load(self) -> float:
        """The busiest load seen served while :meth:`slots` is None, or carried over from the previous regime
        (0: none; what :meth:`presumed_slots` grows from)."""
        return self._derived[1]

    def factor(self, load: float) -> float:
        """A request's rate at ``load`` requests in flight relative to the window's mean rate: the speed factor
        ``min(1, slots / load)`` over the mean one of the samples (1 without slots)."""
        return self.capacity.factor(load) if self._derived[0] is not None else 1.0

    def slowdown(self, load: float) -> float:
        """How many times longer a request's size-dependent time is at ``load`` than at light load: ``load /
        slots`` above the slots, else 1."""
        slots = self._derived[0]
        if slots is None or load <= slots:
            return 1.0
        return load / slots

    def shift(self, load: float, mean_rate: float) -> float:
        """Expected rate at ``load`` minus ``mean_rate`` (the window's mean): negative when the deployment is
        busier than its slots, positive when it has room and its window mixes in slower, loaded samples; 0
        without slots."""
        factor = self.factor(load)
        return 0.0 if factor == 1.0 else mean_rate * (factor - 1.0)


class SizeFit:
    """How a deployment's latency grows with the size of a request, from its successful samples.

    A request's **work** is what its effective rate divides by its latency: ``output + input / ratio`` tokens.
    The fit is the recency-weighted least-squares line ``latency = base + per_token * work`` (times are
    explicit, no clock; samples fade with ``half_life_seconds``). With it, one request's latency is judged
    against what a request of its own size takes there, not against the deployment's mean rate: a short
    answer pays the fixed part of the latency on few tokens, so its rate is low without anything being wrong,
    and the spread of the rates mixes that in. :meth:`spread` is the root mean square of
    ``log(latency / predicted)`` over the samples, each against the prediction made before it was added.
    """

    __slots__ = (
        "_line",
        "cross_sum",
        "last",
        "latency_sum",
        "residual_sq_sum",
        "residual_weight",
        "weight",
        "work_sq_sum",
        "work_sum",
    )

    MIN_SAMPLES: Final = 3
    """Samples (recency-weighted) before the fit predicts anything."""
    MIN_WORK_SPREAD: Final = 0.1
    """Relative spread of the works below which the line's slope is not trusted (the line then goes through
    the origin and the mean: latency proportional to work)."""

    def __init__(self) -> None:
        self.weight = 0.0
        self.work_sum = 0.0
        self.work_sq_sum = 0.0
        self.latency_sum = 0.0
        self.cross_sum = 0.0
        self.residual_sq_sum = 0.0
        self.residual_weight = 0.0
        self.last = float("-inf")
        self._line: tuple[float, float] | None = None
        """(base seconds, seconds per unit of work) as of the last sample."""

    def add(self, now: float, work: float, latency: float, half_life_seconds: float) -> None:
        """Add one successful request of ``work`` tokens that took ``latency`` seconds (ignored unless both
        are positive)."""
        if not (work > 0.0 and latency > 0.0):
            return
        if half_life_seconds > 0.0 and self.weight > 0.0 and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.weight *= factor
            self.work_sum *= factor
            self.work_sq_sum *= factor
            self.latency_sum *= factor
            self.cross_sum *= factor
            self.residual_sq_sum *= factor
            self.residual_weight *= factor
        predicted = self.expected_latency(work)
        if predicted is not None:
            self.residual_sq_sum += math.log(latency / predicted) ** 2
            self.residual_weight += 1.0
        self.last = max(self.last, now)
        self.weight += 1.0
        self.work_sum += work
        self.work_sq_sum += work * work
        self.latency_sum += latency
        self.cross_sum += work * latency
        self._line = self._fit()

    def _fit(self) -> tuple[float, float] | None:
        weight = self.weight
        if weight < self.MIN_SAMPLES:
            return None
        mean_work = self.work_sum / weight
        mean_latency = self.latency_sum / weight
        variance = self.work_sq_sum / weight - mean_work * mean_work
        if variance > (self.MIN_WORK_SPREAD * mean_work) ** 2:
            slope = (self.cross_sum / weight - mean_work * mean_latency) / variance
            base = mean_latency - slope * mean_work
            if slope > 0.0 and base >= 0.0:
                return base, slope
        # Too little spread in size to tell a fixed part, or a line that would make some sizes free or
        # negative: latency proportional to work.
        return 0.0, mean_latency / mean_work

    def base_latency(self) -> float | None:
        """The fixed part of the latency, seconds (None: too few samples)."""
        line = self._line
        return None if line is None else line[0]

    def expected_latency(self, work: float) -> float | None:
        """Seconds a request of ``work`` tokens is expected to take (None: too few samples)."""
        line = self._line
        if line is None:
            return None
        return line[0] + line[1] * work

    def spread(self) -> float | None:
        """Root mean square of ``log(latency / predicted)`` (None: too few residuals yet)."""
        if self.residual_weight < self.MIN_SAMPLES:
            return None
        return math.sqrt(self.residual_sq_sum / self.residual_weight)
