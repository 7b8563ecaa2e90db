"""What the balancer does when the evidence says a deployment changed, and the re-measuring it asks for.

:func:`changed` forgets a deployment's samples from before a detected change (and its load and size fits,
keeping the slots learnt) and schedules one re-measuring request to every other deployment. :func:`probe`
names the candidate due for such a request: after a change elsewhere, a deployment known from a single
answer, a deployment whose recent attempts mostly failed. Both write to the model group's view.
"""

from __future__ import annotations

from collections.abc import Sequence

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.evidence import FAILURE_STREAK
from litellm_ratebalance.routing.fits import PRESUMED_SLOTS, LoadFit
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.types import Candidate
from litellm_ratebalance.routing.view import GroupView, note_answers
from litellm_ratebalance.routing.window import add_to

__all__ = ["change_cooldown", "changed", "probe"]


def change_cooldown(settings: RoutingSettings) -> float:
    """Seconds between two detected changes of one deployment (and two rounds of re-measuring per group):
    the sample half-life, or a quarter of the window when recency weighting is off."""
    return settings.effective_sample_half_life or float(settings.window_seconds) / 4.0


def changed(
    view: GroupView,
    settings: RoutingSettings,
    deployment_id: str,
    now: float,
    since: float,
    evidence: float | None = None,
) -> bool:
    """A deployment's rate changed at local time ``since``: forget its samples from before, and have every
    other deployment re-measured with one request (a change seldom comes alone, and the ones that got
    little traffic are known only from old samples). ``evidence``: the rate bound that revealed the change
    (it stands for the deployment until a sample from after the change arrives). False (nothing done) within
    :func:`change_cooldown` of the deployment's previous change."""
    cooldown = change_cooldown(settings)
    last = view.changed.get(deployment_id)
    if last is not None and now - last < cooldown:
        return False
    view.changed[deployment_id] = now
    view.cutoff_ms[deployment_id] = (since + view.offset) * 1000.0
    derived = view.derived
    for target in (derived.window_full, derived.window):
        target.pop(deployment_id, None)
    old_fit = view.loads.pop(deployment_id, None)  # its load and size fits mix both regimes too
    if old_fit is not None:
        # How many requests it serves at full speed is a property of its hardware, which a change of rate
        # seldom is: the slots learnt stand until the new regime shows its own.
        carried = old_fit.slots()
        proven = old_fit.proven_load() if carried is None else 0.0
        if carried is not None or old_fit.presumed_slots() > PRESUMED_SLOTS:
            view.loads[deployment_id] = LoadFit(carried_slots=carried, carried_proven=proven)
    view.sizes.pop(deployment_id, None)
    view.second_opinions.pop(deployment_id, None)
    if evidence is not None:
        # (with no sample at all it would be stale: no weight, exploration aside)
        bound = RateAggregate()
        bound.add(evidence)
        view.change_evidence[deployment_id] = bound
        add_to(derived.window_full, deployment_id, bound)
        if derived.window is not derived.window_full:
            add_to(derived.window, deployment_id, bound)
    note_answers(view, deployment_id)
    if now - view.probed_at >= cooldown:
        # One round of re-measuring per half-life and group: the changes it reveals in turn must not
        # start another round at once (each would send a request to every deployment again).
        view.probed_at = now
        known = set(derived.window_full) | view.measured | {d for d, q in view.in_flight.items() if q}
        view.probes = {d for d in known if d != deployment_id}
    view.cache.clear()
    return True


def probe(view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate], now: float) -> int | None:
    """Index of a candidate due for a re-measuring request (None: none due), unless it has a request in
    flight already: after another deployment changed, each one once; a deployment whose window holds a
    single answer (no spread to fit, so one answer slowed by a hiccup would write it off until exploration
    finds it again), once per ``window_seconds`` and after each change detected there; and a deployment
    whose recent attempts mostly failed (or that is failing as a whole, see
    :data:`~litellm_ratebalance.routing.evidence.FAILURE_STREAK`), once per ``failure_half_life_seconds`` (so
    its recovery is seen within a few seconds, at the cost of one request each time it is still failing).
    The balancer asks only for requests of at most the typical size: a due probe waits for the next of
    those. Marks the probe it names as sent."""
    if view.probes:
        for i, c in enumerate(candidates):
            if c.id in view.probes:
                view.probes.discard(c.id)
                if not view.in_flight.get(c.id):
                    return i
    single = view.single_answer
    if single:
        asked = view.second_opinions
        ask_again_after = now - settings.window_seconds
        for i, c in enumerate(candidates):
            due = c.id in single and asked.get(c.id, ask_again_after) <= ask_again_after
            if due and not view.in_flight.get(c.id):
                asked[c.id] = now
                return i
    retry_after = settings.failure_half_life_seconds
    if retry_after <= 0 or settings.failure_penalty <= 0:
        return None
    weights = view.derived.failure_weights
    if not weights:
        return None
    streaks = view.failure_streak
    for i, c in enumerate(candidates):
        attempts, failures = weights.get(c.id, (0.0, 0.0))
        if failures > 0.5 * attempts > 0.0 or streaks.get(c.id, 0) >= FAILURE_STREAK:
            due = now - view.last_attempt.get(c.id, now) >= retry_after
            if due and not view.in_flight.get(c.id):
                return i
    return None
