"""What this replica learns about a deployment beyond its rates: how its rate falls with load
(:class:`LoadFit`) and how its latency grows with a request's size (:class:`SizeFit`).

Both are fed successful samples with explicit times (no clock): ``add(now, ...)`` fades older samples by a
half-life. The balancer keeps one of each per deployment; :mod:`~litellm_ratebalance.routing.evidence`
reads them to correct an estimate at the current load and to judge whether a request is late for its size.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["PRESUMED_SLOTS", "SATURATION_EVIDENCE", "SATURATION_MIN_WEIGHT", "SLOTS_GROWTH", "LoadFit", "SizeFit"]


def _load_level(load: float, lightest: float, levels: int) -> int:
    """Index of the load level of ``load``: 0 up to ``lightest``, then one per doubling (the last open)."""
    level = 0
    top = lightest
    while load > top and level < levels - 1:
        level += 1
        top *= 2.0
    return level


SATURATION_EVIDENCE = 0.8
"""A deployment counts as seen saturated when its peak throughput is below this share of what its busiest
load would give at the unloaded rate."""
SATURATION_MIN_WEIGHT = 3.0
"""Recency-weighted samples a load level needs to count in the peak throughput and the busiest load: the mean
of one or two answers of mixed sizes can sit 25 % below the light-load rate on a deployment with slots to
spare. (The light-load rate itself needs only ``LoadFit.MIN_LEVEL_WEIGHT``: a deployment with few slots is
seldom seen nearly idle.)"""
PRESUMED_SLOTS = 2.0
"""Slots a deployment is presumed to have while its load fit has neither learnt its slots nor seen it serve
more requests at once at full speed (see :meth:`LoadFit.presumed_slots`)."""
SLOTS_GROWTH = 2.0
"""Presumed slots per request the deployment has been seen to serve at once at full speed (slow start: the
presumption doubles as each load is proven)."""


class LoadFit:
    """How a deployment's rate depends on its load (requests in flight there), from its successful samples.

    Each sample adds ``(load, rate)``, ``load`` = the requests in flight at the deployment during the
    request, itself included (their mean over the request's life). Recency-weighted figures (times
    are explicit, no clock; they fade with ``half_life_seconds``):

    * the **peak throughput**, the highest ``mean load x mean rate`` of a load level: a deployment with ``c``
      slots at ``r`` tokens/s each peaks at about ``c x r``, so at a load above ``c`` each request gets about
      ``peak / load``. Level means, not single samples: one answer that met a crowd which left at once
      would set a peak far above what the deployment serves, hiding its saturation;
    * the **light-load rate**: the mean rate of the samples at the lightest load level seen (levels: a load
      of at most :data:`UNLOADED_LOAD`, then doubling ranges above it). For a deployment that is sometimes
      nearly idle that is its unloaded rate; one that is never idle (every sample met a few requests) is
      judged by its lightest loads, so its load fit does not go blank while it is busy.

    :meth:`expected_rate` at a load is the smaller of the two once the peak shows the deployment saturated,
    before that the mean rate seen at that load's level; :meth:`shift` is how far it is from the
    deployment's window mean. So a deployment with few slots is not piled onto, gets its full rate back in
    the estimate when it is idle, and one with many slots is not held back once it has been seen busy. At a
    load above any level seen, an unsaturated fit predicts nothing (the window mean stands).

    ``carried_slots``: the slots a deployment's previous fit had learnt, when a change of its rate was
    detected (its rates from before are dropped, its capacity seldom changes with them). They stand until
    this fit sees saturation of its own, or sees the deployment busier than them and no slower for it.
    ``carried_proven``: likewise, the load the previous fit had seen served at full speed.

    While no slots are known, :meth:`presumed_slots` stands for them: a few (:data:`PRESUMED_SLOTS`), or
    :data:`SLOTS_GROWTH` times the busiest load seen served at full speed, whichever is more. So a deployment
    whose capacity is unknown is not piled onto before its fit can tell a few slots from many; the
    presumption grows as fast as the deployment proves it keeps its rate under more requests.
    """

    __slots__ = (
        "_derived",
        "base_latency",
        "carried_proven",
        "carried_slots",
        "last",
        "level_latencies",
        "level_loads",
        "level_sized",
        "level_sums",
        "level_weights",
        "level_works",
        "residual_sq_sum",
        "residual_weight",
        "samples",
    )

    MIN_SAMPLES: Final = 3
    """Samples before the fit says anything."""
    UNLOADED_LOAD: Final = 2.0
    """Upper bound of the lightest load level; level ``k`` above it holds loads up to ``UNLOADED_LOAD * 2**k``."""
    LEVELS: Final = 8
    MIN_LEVEL_WEIGHT: Final = 0.5
    """Recency-weighted samples a load level needs before its mean rate stands for anything (the light-load
    rate, or the prediction at a load of that level)."""

    def __init__(self, carried_slots: float | None = None, carried_proven: float = 0.0) -> None:
        self.carried_slots = carried_slots
        """Slots learnt before a change of regime, standing until this fit learns its own."""
        self.carried_proven = carried_proven
        """Load seen served at full speed before a change of regime (0: none)."""
        self.samples = 0
        self.level_sums = [0.0] * self.LEVELS
        self.level_loads = [0.0] * self.LEVELS
        self.level_weights = [0.0] * self.LEVELS
        self.level_works = [0.0] * self.LEVELS
        self.level_latencies = [0.0] * self.LEVELS
        self.level_sized = [0.0] * self.LEVELS
        self.base_latency = 0.0
        """The part of a request's latency that does not depend on its size (seconds), as last given."""
        self.residual_sq_sum = 0.0
        self.residual_weight = 0.0
        self.last = float("-inf")
        self._derived: tuple[float | None, float | None, float | None, float | None, float] = (
            None,
            None,
            carried_slots,
            None,
            carried_proven,
        )
        """(light-load rate, top of its load level, slots, spread, proven load) as of the last sample."""

    def add(
        self,
        now: float,
        load: float,
        rate: float,
        half_life_seconds: float,
        *,
        work: float | None = None,
        latency: float | None = None,
        base_latency: float | None = None,
    ) -> None:
        """Add one successful sample: ``rate`` at ``load`` requests in flight. With its ``work`` and
        ``latency`` (both positive) it also counts in how many slots a saturated deployment has, judged on
        the part of the latency above ``base_latency`` (the size fit's fixed part, when known): that is the
        part the load stretches, and the fixed part, counted in, makes a saturated deployment look to lose
        less than it does, its slots more than it has."""
        if half_life_seconds > 0.0 and self.samples and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.level_sums = [x * factor for x in self.level_sums]
            self.level_loads = [x * factor for x in self.level_loads]
            self.level_weights = [x * factor for x in self.level_weights]
            self.level_works = [x * factor for x in self.level_works]
            self.level_latencies = [x * factor for x in self.level_latencies]
            self.level_sized = [x * factor for x in self.level_sized]
            self.residual_sq_sum *= factor
            self.residual_weight *= factor
        predicted = self.expected_rate(load)
        if predicted is not None:
            # How far samples fall from the prediction at their own load: the spread left once load is known.
            self.residual_sq_sum += (rate - predicted) ** 2
            self.residual_weight += 1.0
        self.last = max(self.last, now)
        self.samples += 1
        level = _load_level(load, self.UNLOADED_LOAD, self.LEVELS)
        self.level_sums[level] += rate
        self.level_loads[level] += load
        self.level_weights[level] += 1.0
        if work is not None and latency is not None and work > 0.0 and latency > 0.0:
            self.level_works[level] += work
            self.level_latencies[level] += latency
            self.level_sized[level] += 1.0
        if base_latency is not None and base_latency >= 0.0:
            self.base_latency = base_latency
        light = self._light()
        slots, proven = self._slots(light)
        self._derived = (*light, slots, self._spread(), max(proven, self.carried_proven))

    def _throughput(self) -> tuple[float, float]:
        """(peak, busiest load): the highest ``mean load x mean rate`` of a load level with weight enough
        (:data:`SATURATION_MIN_WEIGHT`), and the highest mean load of such a level. Level means, not single
        samples: one answer that met a crowd which left at once would otherwise set a peak far above what the
        deployment can serve."""
        peak = 0.0
        busiest = 0.0
        for level in range(self.LEVELS):
            weight = self.level_weights[level]
            if weight >= SATURATION_MIN_WEIGHT:
                load = self.level_loads[level] / weight
                peak = max(peak, load * self.level_sums[level] / weight)
                busiest = max(busiest, load)
        return peak, busiest

    def expected_rate(self, load: float) -> float | None:
        """Rate one request is expected to get at ``load`` requests in flight (None: unknown): the light-load
        rate up to the top of its load level, capped by ``slots x light-load rate / load`` (``peak / load``)
        once the deployment has been seen saturated, or carries slots. Before that, above the light-load
        level: the mean rate seen at ``load``'s own level (at most the light-load rate) when that level has
        samples enough, else None (a load never seen says nothing either way)."""
        rate, ceiling, slots, _, _ = self._derived
        if rate is None or ceiling is None or load <= 0 or self.samples < self.MIN_SAMPLES:
            return None
        if slots is None:
            if load <= ceiling:
                return rate
            # Busier than the light level and never seen saturated by the peak test: what this deployment
            # gave at about this load is the best guess. (The peak test alone misses a deployment whose
            # lightest samples were already slowed down, e.g. a 2-slot one first measured at 4 in flight:
            # its peak / light-load rate then stays near its busiest load.)
            seen = self._level_mean(_load_level(load, self.UNLOADED_LOAD, self.LEVELS))
            return None if seen is None else min(rate, seen)
        return min(rate, rate * slots / load)

    def slowdown(self, load: float) -> float:
        """How many times longer a request takes at ``load`` than at light load: ``light-load rate /
        expected_rate(load)``, at least 1; 1 when the fit does not know."""
        light = self._derived[0]
        expected = self.expected_rate(load)
        if light is None or expected is None or expected <= 0.0 or expected >= light:
            return 1.0
        return light / expected

    def _level_mean(self, level: int) -> float | None:
        """Recency-weighted mean rate of the samples at load level ``level`` (None: too little weight)."""
        weight = self.level_weights[level]
        return self.level_sums[level] / weight if weight > self.MIN_LEVEL_WEIGHT else None

    def _light(self) -> tuple[float | None, float | None]:
        """(light-load rate, top of its load level), or (None, None) without a level of enough weight."""
        for level in range(self.LEVELS):
            mean = self._level_mean(level)
            if mean is not None:
                return mean, self.UNLOADED_LOAD * 2.0**level
        return None, None

    def slots(self) -> float | None:
        """:meth:`_slots` as of the last sample (kept: it is read at every decision)."""
        return self._derived[2]

    def spread(self) -> float | None:
        """:meth:`_spread` as of the last sample."""
        return self._derived[3]

    def presumed_slots(self) -> float:
        """Slots to act on while :meth:`slots` is None: :data:`SLOTS_GROWTH` times the busiest load (mean of a
        load level with weight enough) the deployment has been seen to serve at full speed, at least
        :data:`PRESUMED_SLOTS`. (Once the fit has seen saturation it is not used: :meth:`slots` says.)"""
        return max(PRESUMED_SLOTS, SLOTS_GROWTH * self._derived[4])

    def proven_load(self) -> float:
        """The busiest load seen served at full speed while :meth:`slots` is None, or carried over from the
        previous regime (0: none; what :meth:`presumed_slots` grows from)."""
        return self._derived[4]

    def _slots(self, light: tuple[float | None, float | None]) -> tuple[float | None, float]:
        """(slots, proven load). Slots: requests the deployment serves at full speed, ``peak / light-load
        rate``, once it has been seen saturated (busier than that, and slower for it); else the carried slots
        while no load beyond them has been seen; else None: every load seen was served at about full speed
        (its capacity is then unknown, not small). Proven load: that busiest load seen at full speed when
        the slots are None, else 0.

        Whether it is saturated is judged on the samples' own rates; how many slots it then has, on the
        load-stretched part of the latency (:meth:`_stretched_rates`) where the samples have sizes, if that
        says fewer. Not the other way round: taking the fixed part out of the latencies also magnifies their
        noise, and a saturation test on that alone called deployments with slots to spare saturated (stable
        and drift lost about 2 % of their mean rate in benchmark runs)."""
        rate = light[0]
        if self.samples < self.MIN_SAMPLES or rate is None or rate <= 0.0:
            return self.carried_slots, 0.0
        peak, busiest = self._throughput()
        slots = peak / rate
        if slots < SATURATION_EVIDENCE * busiest:
            stretched = self._stretched_rates()
            if stretched is not None and stretched[0] > 0.0:
                slots = min(slots, stretched[0] / stretched[1])
            return slots, 0.0
        # Not seen saturated in this regime: the slots carried over stand while it has not been seen busier.
        carried = self.carried_slots
        if carried is not None and busiest < carried:
            return carried, 0.0
        return None, busiest

    def _stretched_rates(self) -> tuple[float, float] | None:
        """(peak, light-load rate) as :meth:`_throughput` and :meth:`_light` give them, but
        from each level's pooled ``work / (latency - base latency)`` (its sized samples' sums, so one short
        answer with next to nothing above the base cannot swing it); None when the lightest level with
        weight enough has no sized samples. A level whose latencies are hardly above the base (a tenth or
        less) counts that tenth: the base is an estimate, and a pool with nothing left above it says little."""
        light_rate: float | None = None
        peak = 0.0
        for level in range(self.LEVELS):
            weight = self.level_weights[level]
            if weight <= self.MIN_LEVEL_WEIGHT:
                continue
            sized = self.level_sized[level]
            if sized <= self.MIN_LEVEL_WEIGHT:
                if light_rate is None:
                    return None
                continue
            latency = self.level_latencies[level]
            stretched = self.level_works[level] / max(latency - sized * self.base_latency, 0.1 * latency)
            if light_rate is None:
                light_rate = stretched
            if weight >= SATURATION_MIN_WEIGHT and sized >= SATURATION_MIN_WEIGHT:
                peak = max(peak, self.level_loads[level] / weight * stretched)
        if light_rate is None or light_rate <= 0.0:
            return None
        return peak, light_rate

    def _spread(self) -> float | None:
        """Root mean square distance of the samples from the prediction at their load (None: too few)."""
        if self.residual_weight < self.MIN_SAMPLES:
            return None
        return math.sqrt(self.residual_sq_sum / self.residual_weight)

    def shift(self, load: float, mean_rate: float) -> float:
        """``expected_rate(load) - mean_rate`` (0 when unknown): negative when the deployment is busier than
        its learnt slots, positive (up to its unloaded rate) when it has room and its window mixes in
        slower, loaded samples."""
        expected = self.expected_rate(load)
        if expected is None:
            return 0.0
        return expected - mean_rate


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
