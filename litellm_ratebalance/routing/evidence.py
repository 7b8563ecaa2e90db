"""What this replica's own requests say about a deployment: pure functions of a window, the in-flight book
and ``now``.

* **Load** (:func:`load_correction`): a deployment's estimate moved to the load it has here, from its load fit
  or its configured slots; its share shrinks as the slots fill up.
* **Stalls** (:func:`stalled_count`): a request in flight longer than the deployment's stall cut-off
  (``stall_latency_factor`` x its mean latency, at least ``stall_min_seconds``) counts as a failure
  happening now. The deployment has stalled as a whole (:func:`whole_stall`) when no answer came back here
  for that long while such a request is out, or for a typical latency while :data:`STALL_QUORUM` requests
  are overdue together: its recent attempts then count as all failed.
* **Overdue requests** (:func:`late_requests`, :func:`overdue_window`): a request in flight longer than it
  was expected to take (one of its size there, when its ``max_tokens`` was known; else the deployment's
  mean latency) is a sample of rate ``mean rate / lateness``, the most it can still achieve.
* **Failing as a whole**: :data:`FAILURE_STREAK` failures in a row here, no answer between them.
* **Change detection** (:func:`surprising` for a finished request, :func:`slowdown_evidence` for overdue
  ones): a deployment whose rate moved by ``change_detection_sigma`` spreads has changed.

Nothing here writes anything; :mod:`~litellm_ratebalance.routing.live` applies what these say.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import DeploymentState, headroom_multiplier
from litellm_ratebalance.routing.fits import PRESUMED_SLOTS, LoadFit, SizeFit
from litellm_ratebalance.routing.inflight import InFlight
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.types import Candidate
from litellm_ratebalance.routing.view import GroupView

__all__ = [
    "FAILURE_STREAK",
    "STALL_QUORUM",
    "BusyRow",
    "busy_rows",
    "change_scale",
    "late_requests",
    "load_correction",
    "overdue_window",
    "slowdown_evidence",
    "stalled_count",
    "surprising",
    "whole_stall",
    "with_evidence",
]

FAILURE_STREAK = 4
"""Failures in a row recorded here, with no successful answer between them, that show a deployment is
failing as a whole: its recent attempts then count as all failed until it answers again (its recent failure
share alone is diluted by the successes before the failures began, for a few failure half-lives). Four in a
row come by chance once in 256 runs of four requests to a deployment that fails a quarter of them."""
STALL_QUORUM = 3
"""Requests overdue together, with no answer from their deployment for a typical latency, that show it has
stalled as a whole."""
MAX_STALL_SCAN = 1024
"""Requests per deployment counted as stalled at a decision (the oldest ones)."""
SLOTS_HEADROOM = 0.5
"""Below this fraction of its learnt slots free, a saturated deployment's share shrinks linearly."""
CHANGE_MIN_SAMPLES = 3.0
"""Successful samples (recency-weighted) a deployment needs before a sample can say that it changed."""
MAX_OVERDUE_SAMPLES = 32
"""In-flight requests per deployment turned into overdue samples at a decision (the oldest ones)."""
MAX_DUE_SCAN = 128
"""In-flight requests per deployment looked at for being overdue at a decision (the oldest ones)."""
JOINT_EVIDENCE = 4
"""At most this many overdue requests of one deployment are taken together as evidence of a slowdown (more
would let a deployment that is merely busy, all its requests a little slow, read as changed)."""
MIN_LOG_SPREAD = 0.1
"""Least spread of ``log(latency / predicted)`` a change is measured against (10 %: no deployment is that
regular, and a handful of residuals can look tighter than it is)."""
UNMEASURED_BOUND = 0.9
"""The rate bound of an overdue request at a deployment without successful samples of its own is capped at
this fraction of the SLA."""

BusyRow = tuple[int, InFlight, float, float | None, tuple[float, float] | None, bool]
"""A candidate with requests in flight here: (index, its queue, oldest start, stall cut-off, expected (latency,
work) for overdue evidence, whether anything there is timed). See :func:`busy_rows`."""

Late = tuple[float, float, bool]
"""An overdue request: (lateness = age / the latency it was expected to take, age s, whether its size was
known)."""


def load_correction(
    fit: LoadFit | None,
    busy: float,
    window_mean: float,
    configured_slots: float | None = None,
    *,
    presume: bool = False,
) -> tuple[float, float]:
    """(load shift, slots-left multiplier) of a deployment with ``busy`` requests in flight here, for the
    decision that would add one more; (0, 1) without a load fit or configured slots
    (and without ``presume``). Configured slots stand for the learnt ones. ``fit``: the deployment's load
    fit (None: none yet, or load awareness off). ``presume`` (load awareness on): with neither configured
    nor learnt slots, the fit's presumed slots (:meth:`~litellm_ratebalance.routing.fits.LoadFit.presumed_slots`;
    :data:`~litellm_ratebalance.routing.fits.PRESUMED_SLOTS` without a fit) stand for them."""
    slots = configured_slots if configured_slots is not None else fit.slots() if fit is not None else None
    if slots is None and presume:
        slots = fit.presumed_slots() if fit is not None else PRESUMED_SLOTS
    # Configured, or seen saturated: scale the share down as the slots fill up (to 0 when full).
    slots_left = 1.0 if slots is None else headroom_multiplier(max(slots - busy, 0.0) / slots, SLOTS_HEADROOM)
    if fit is None:
        return 0.0, slots_left
    return fit.shift(busy + 1.0, window_mean), slots_left


def busy_rows(
    view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate], now: float
) -> tuple[tuple[int, ...], bool, list[BusyRow]] | None:
    """(in-flight pattern, whether anything is timed, rows); None when no candidate has a request in
    flight here. The pattern: the number of requests in flight here at each candidate, negated where
    something there is timed (stalled or overdue). A row per candidate with requests in flight here
    (:data:`BusyRow`). O(candidates)."""
    derived = view.derived
    stall_after = derived.stall_after if settings.stall_latency_factor > 0 else None
    default_stall = settings.stall_min_seconds
    expected_by = derived.expected if settings.in_flight_evidence else None
    pooled_expected = derived.pooled_expected
    in_flight = view.in_flight
    earliest_due = view.earliest_due
    rows: list[BusyRow] = []
    counts: list[int] = []
    any_timed = False
    # (inlined lookups: this runs on every decision with requests in flight here)
    for i, c in enumerate(candidates):
        queue = in_flight.get(c.id)
        if not queue:
            counts.append(0)
            continue
        oldest = next(iter(queue.values()))[0]  # (entries are kept in start order)
        stall_limit = None if stall_after is None else now - stall_after.get(c.id, default_stall)
        expected = None if expected_by is None else (expected_by.get(c.id) or pooled_expected)
        timed = (stall_limit is not None and oldest <= stall_limit) or (
            expected is not None and (oldest < now - expected[0] or earliest_due.get(c.id, math.inf) <= now)
        )
        if timed:
            any_timed = True
            counts.append(-len(queue))
        else:
            counts.append(len(queue))
        rows.append((i, queue, oldest, stall_limit, expected, timed))
    if not rows:
        return None
    return tuple(counts), any_timed, rows


def stalled_count(queue: InFlight, oldest: float, stall_limit: float | None) -> int:
    """Requests of ``queue`` that started at or before ``stall_limit`` (at most :data:`MAX_STALL_SCAN`)."""
    stalled = 0
    if stall_limit is not None and oldest <= stall_limit:
        for started, _, _ in queue.values():
            if started > stall_limit or stalled >= MAX_STALL_SCAN:
                break
            stalled += 1
    return stalled


def late_requests(queue: InFlight, now: float, latency: float, slowdown: float) -> tuple[list[Late], float]:
    """The overdue requests of ``queue`` at ``now`` (at most :data:`MAX_OVERDUE_SAMPLES`, oldest first), and
    the earliest time one of the others, of known size, may be due (``inf``: none).

    A request of known size is expected to take its light-load latency times ``slowdown``, what the load costs
    now (the load may have grown since it started: judging it by the load it met would read a deployment
    filling up its slots as one that slowed down); one of unknown size, ``latency`` (the deployment's mean)."""
    late: list[Late] = []
    earliest_due = math.inf
    for scanned, (started, _, light_latency) in enumerate(queue.values()):  # oldest first
        if scanned >= MAX_DUE_SCAN:
            break
        sized = light_latency > 0.0
        due_after = light_latency * slowdown if sized else latency
        age = now - started
        if age > due_after:
            if len(late) < MAX_OVERDUE_SAMPLES:
                late.append((age / due_after, age, sized))
        elif sized and started + light_latency < earliest_due:
            earliest_due = started + light_latency  # (no later than its due time at any load)
    return late, earliest_due


def overdue_window(
    window: RateAggregate, late: Sequence[Late], mean_rate: float, ceiling: float | None
) -> RateAggregate:
    """``window`` with each overdue request added as a sample of rate ``mean_rate / lateness`` (capped at
    ``ceiling`` when given): the typical rate, slowed by how late it is already."""
    overdue = window.copy()
    for lateness, age, _ in late:
        bound = mean_rate / lateness
        if ceiling is not None and bound > ceiling:
            bound = ceiling
        overdue.add(bound, latency=age)
    return overdue


def whole_stall(
    stalled: int, stall_limit: float | None, late: int, expected_latency: float | None, last_answer: float, now: float
) -> bool:
    """Whether the deployment has stalled as a whole: no answer back here since ``stall_limit`` while
    ``stalled`` requests are stuck there, or none for a typical latency while :data:`STALL_QUORUM` or more are
    ``late`` together (each of them would have answered by then more often than not)."""
    return (stalled > 0 and stall_limit is not None and last_answer < stall_limit) or (
        expected_latency is not None and late >= STALL_QUORUM and last_answer < now - expected_latency
    )


def with_evidence(
    state: DeploymentState,
    window: RateAggregate,
    load: tuple[float, float],
    stalled: int,
    late: int,
    whole: bool,
) -> DeploymentState:
    """``state`` with the in-flight evidence: ``window`` (with the overdue samples), the ``load`` correction
    (shift, slots left), and the stalled requests as failures happening now; when the deployment has
    stalled as a whole, its overdue requests count as attempts too and every recent attempt as failed."""
    attempts = state.recent_attempts + (max(stalled, late) if whole else stalled)
    shift, slots_left = load
    # (positional: this runs on every decision that works in-flight evidence out afresh)
    return DeploymentState(
        window,  # window
        attempts,  # recent_attempts
        attempts if whole else state.recent_failures + stalled,  # recent_failures
        state.capacity * slots_left,  # capacity
        shift,  # load_shift
        state.stale,  # stale
    )


def change_scale(window: RateAggregate | None) -> tuple[float, float] | None:
    """(mean, spread) a change is measured against: a recency-weighted window's mean rate of answers and its
    standard deviation (at least 10 % of the mean); ``None`` with too few successful samples to say."""
    if window is None or window.count - window.failures < CHANGE_MIN_SAMPLES:
        return None
    mean = window.mean_ok_rate
    if mean is None:
        return None
    return mean, max(window.std, 0.1 * mean)


def surprising(
    sigma: float,
    rate: float,
    load: float,
    work: float,
    latency: float,
    sizes: SizeFit | None,
    loads: LoadFit | None,
    window: RateAggregate | None,
) -> bool:
    """Whether a finished request of ``work`` tokens that took ``latency`` seconds (``rate``) at ``load``
    requests in flight is more than ``sigma`` spreads outside what the deployment was expected to give.
    Judged by its size fit once that knows its spread (``log(latency / predicted)``, the prediction for a
    request of that size slowed by what the load fit says the load costs), else by its recency-weighted
    ``window`` (:func:`change_scale`), both moved to the sample's load by the load fit's speed factor. So a
    short answer that is slow only for being short, or a deployment slowed or sped up by its own load, has
    not changed. ``loads``: None when load awareness is off."""
    if sizes is not None and work > 0.0 and latency > 0.0:
        predicted = sizes.expected_latency(work)
        size_spread = sizes.spread()
        if predicted is not None and size_spread is not None:
            predicted *= 1.0 if loads is None else loads.slowdown(load)
            return abs(math.log(latency / predicted)) > sigma * max(size_spread, MIN_LOG_SPREAD)
    scale = change_scale(window)
    if scale is None:
        return False
    # The window's mean and spread moved to this sample's load (by the speed factor of known slots).
    factor = 1.0 if loads is None else loads.factor(load)
    return abs(rate - scale[0] * factor) > sigma * scale[1] * factor


def slowdown_evidence(
    sigma: float,
    late: Sequence[Late],
    mean_rate: float,
    now: float,
    size_spread: float | None,
    window: RateAggregate | None,
) -> tuple[float, float] | None:
    """(rate bound standing for the deployment, local time at which the first of them was due) when its
    ``m`` latest overdue requests (``late``, the latest first) show, for some ``m``, that it has slowed down;
    else ``None``.

    Requests of known size were expected to take what one of their size takes there: once the size fit knows
    its spread (``size_spread``), the mean of the ``m`` largest ``log(lateness)`` among them must exceed
    ``sigma`` times that spread (at least :data:`MIN_LOG_SPREAD`) over ``sqrt(m)``. Failing that, over all of
    them, the mean of the ``m`` smallest rate bounds ``mean_rate / lateness`` must lie ``sigma`` standard
    errors (``spread / sqrt(m)``, see :func:`change_scale` of the deployment's ``window``) below the window
    mean. The bound returned is ``mean_rate`` over the mean lateness of the ``m`` requests.

    One request must be ``sigma`` spreads slow to count; ``m`` slow requests together need only ``sigma /
    sqrt(m)`` each, as for the mean of ``m`` samples: a deployment that slowed down has several requests in
    flight when its first answer is still due. An overdue request's lateness is a lower bound of the one it
    will have, so the test errs on the side of no change."""
    if not late:
        return None
    if size_spread is not None:
        cut = sigma * max(size_spread, MIN_LOG_SPREAD)
        log_total = 0.0
        lateness_total = 0.0
        first_due = now
        m = 0
        for lateness, age, sized in late:
            if not sized:
                continue
            m += 1
            log_total += math.log(lateness)
            lateness_total += lateness
            first_due = min(first_due, now - age + age / lateness)
            if log_total / m > cut / math.sqrt(m):
                return mean_rate * m / lateness_total, first_due
    scale = change_scale(window)
    if scale is None:
        return None
    mean, spread = scale
    total = 0.0
    first_due = now
    for m, (lateness, age, _) in enumerate(late, start=1):
        total += mean_rate / lateness
        first_due = min(first_due, now - age + age / lateness)
        if mean - total / m > sigma * spread / math.sqrt(m):
            return total / m, first_due
    return None
