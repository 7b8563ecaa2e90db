"""The shares at a decision: the cached ones of the last sync, with what this replica's requests in flight
show worked in (load, stalls, overdue requests, a slowdown they reveal).

:func:`shares_now` is the request path's one call: when nothing is in flight here at the candidates it returns
the cached shares; else it works out the in-flight pattern (:func:`~litellm_ratebalance.routing.evidence.busy_rows`)
and reuses the shares of the same pattern when they still hold, or recomputes only the candidates with
requests in flight (:func:`~litellm_ratebalance.routing.estimator.reweigh`). With ``detect`` a slowdown that
overdue requests reveal is acted on (:func:`~litellm_ratebalance.routing.changes.changed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from litellm_ratebalance.routing import evidence
from litellm_ratebalance.routing.changes import changed
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import DeploymentState, Shares, reweigh, weigh
from litellm_ratebalance.routing.evidence import BusyRow
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.shares import LOCAL_RECOMPUTE_SECONDS, cached, settings_shares
from litellm_ratebalance.routing.types import Candidate
from litellm_ratebalance.routing.view import Cached, GroupView

__all__ = ["MAX_LOAD_PATTERNS", "shares_now"]

MAX_LOAD_PATTERNS = 256
"""Shares at distinct in-flight patterns kept per cached candidate set (the numbers in flight here per
candidate; a busy replica revisits a few of them over and over)."""


def shares_now(
    view: GroupView,
    settings: RoutingSettings,
    candidates: Sequence[Candidate],
    now: float,
    *,
    detect: bool = False,
    known: Cached | None = None,
) -> Shares:
    """Shares of a candidate set now: the cached ones of this sync (``known``, when the caller has them),
    adjusted for what the requests in flight here show (stalls, overdue requests, load) when there are any.
    ``detect``: act on a slowdown the overdue requests reveal (decisions; not status reads)."""
    if known is None:
        known = cached(view, settings, candidates, now)
    shares = known.shares
    if not view.in_flight:
        return shares
    busy = evidence.busy_rows(view, settings, candidates, now)
    if busy is None:
        return shares  # nothing in flight here: the cached shares already hold the idle load correction
    pattern, timed, rows = busy
    if timed:
        pattern = (*pattern, detect)  # change detection changes timed evidence only
    seen = known.at_load.get(pattern)
    if seen is not None and now < seen[1]:
        return seen[0]  # the same pattern in flight as a decision shortly before
    sla = shares.sla if shares.mode == "weighted" else None
    live = _live_states(view, settings, candidates, known, now, rows, detect=detect, sla=sla)
    if live is None:
        result = shares
    else:
        states, weighed = live
        if weighed is not None:
            result = reweigh(shares, states, weighed, exploration_share=settings.exploration_share)
        else:
            # The SLA comes from finished samples only (unchanged since the sync); in bootstrap mode
            # overdue samples may complete the set, and then the SLA is computed from them too.
            result = settings_shares(settings, states, sla)
    if len(known.at_load) >= MAX_LOAD_PATTERNS:
        known.at_load.clear()
    known.at_load[pattern] = (result, now + LOCAL_RECOMPUTE_SECONDS if timed else math.inf)
    return result


def _live_states(
    view: GroupView,
    settings: RoutingSettings,
    candidates: Sequence[Candidate],
    known: Cached,
    now: float,
    rows: Sequence[BusyRow],
    *,
    detect: bool,
    sla: float | None,
) -> tuple[list[DeploymentState], dict[int, tuple[float, float]] | None] | None:
    """The cached idle states with this replica's in-flight evidence added, and (in weighted mode, given
    the ``sla``) the :func:`~litellm_ratebalance.routing.estimator.weigh` result of each one that differs
    from its idle state, by index (None: the shares must be computed afresh); None when no state differs.
    Only the candidates in ``rows`` (with requests in flight here) are worked out again: O(candidates) plus
    at most :data:`~litellm_ratebalance.routing.evidence.MAX_OVERDUE_SAMPLES` requests per candidate."""
    out: list[DeploymentState] | None = None
    weighed: dict[int, tuple[float, float]] | None = {} if sla is not None else None
    memo = known.loaded
    look = _Look(view, settings, known, now, sla)
    for row in rows:
        i, queue, oldest, _, _, timed = row
        c = candidates[i]
        if timed:
            state_at_load, weight = _evidence_state(look, c, row, detect)
        else:
            # Nothing timed to see (stalled or overdue): the state depends on the load only.
            busy = len(queue)
            found = memo.get((i, busy))
            if found is None:
                found = memo[(i, busy)] = _evidence_state(look, c, (i, queue, oldest, None, None, False), False)
            state_at_load, weight = found
        if state_at_load is None:
            continue
        if out is None:
            out = list(known.idle)
        out[i] = state_at_load
        if weighed is not None:
            if weight is None:
                weighed = None
            else:
                weighed[i] = weight
    return None if out is None else (out, weighed)


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look at the requests in flight here works from: the group's view, the settings, the cached
    states of the candidate set, the time, and the SLA the shares are weighed against (None: not weighed)."""

    view: GroupView
    settings: RoutingSettings
    known: Cached
    now: float
    sla: float | None


def _evidence_state(
    look: _Look, candidate: Candidate, row: BusyRow, detect: bool
) -> tuple[DeploymentState | None, tuple[float, float] | None]:
    """One candidate's state with its requests in flight here (``row``, :data:`~litellm_ratebalance.routing.
    evidence.BusyRow`; None: its idle state stands), and its ``weigh`` result given the SLA. The row's stall
    cut-off and (latency, work) for overdue evidence are None where there is none to look for. Given the SLA,
    the bound of an overdue request at a deployment without successful samples of its own is capped below it
    (:data:`~litellm_ratebalance.routing.evidence.UNMEASURED_BOUND`). ``detect``: act on a slowdown the
    overdue requests reveal."""
    view, settings, known, now, sla = look.view, look.settings, look.known, look.now, look.sla
    index, queue, oldest, stall_limit, expected, _ = row
    deployment_id = candidate.id
    derived = view.derived
    state = known.states[index]
    load = float(len(queue))
    # (the fit is looked up once, for the load correction and the slowdown of overdue requests)
    fit = view.loads.get(deployment_id) if settings.load_aware else None
    correction = evidence.load_correction(
        fit, load, state.window.mean, candidate.slots, presume=settings.load_aware and settings.presume_slots
    )
    stalled = evidence.stalled_count(queue, oldest, stall_limit)
    overdue: RateAggregate | None = None
    late: list[evidence.Late] = []
    if expected is not None:
        latency, work = expected
        mean_rate = work / latency
        slowdown = 1.0 if fit is None else fit.slowdown(load)
        late, view.earliest_due[deployment_id] = evidence.late_requests(queue, now, latency, slowdown)
    if late:
        if len(late) > 1:
            late.sort(reverse=True)  # the latest first
        sigma = settings.change_detection_sigma
        found = None
        if detect and sigma > 0:
            sizes = view.sizes.get(deployment_id)
            size_spread = sizes.spread() if sizes is not None else None
            window_full = derived.window_full.get(deployment_id)
            found = evidence.slowdown_evidence(
                sigma, late[: evidence.JOINT_EVIDENCE], mean_rate, now, size_spread, window_full
            )
        # Its latest requests are far slower than its samples: changed before the first of them was due
        # (the samples that finished since then are of the new regime, or straddle it).
        if found is not None and changed(view, settings, deployment_id, now, found[1], found[0]):
            state_window = derived.window.get(deployment_id) or RateAggregate()
        else:
            state_window = state.window
        # Without a successful sample of its own the bound comes from the group's typical work: an upper
        # bound, not a measurement, so it is not taken to beat the SLA before an answer does.
        ceiling = evidence.UNMEASURED_BOUND * sla if sla is not None and deployment_id not in derived.expected else None
        overdue = evidence.overdue_window(state_window, late, mean_rate, ceiling)
    shift, slots_left = correction
    unchanged = shift == 0.0 and stalled == 0 and overdue is None and slots_left == 1.0
    if unchanged and state is known.idle[index]:
        return None, None
    whole = evidence.whole_stall(
        stalled,
        stall_limit,
        len(late),
        expected[0] if expected is not None else None,
        view.last_answer.get(deployment_id, -math.inf),
        now,
    )
    new_state = evidence.with_evidence(
        state, overdue if overdue is not None else state.window, correction, stalled, len(late), whole
    )
    weight = None
    if sla is not None and new_state.window.count > 0:
        s = settings
        weight = weigh(new_state, sla, s.greediness, s.estimator, s.failure_penalty, s.prior_samples)
    return new_state, weight
