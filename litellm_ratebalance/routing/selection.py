"""How a decision follows the shares: pure pickers given the shares, the loads here and an rng.

* ``random`` (:func:`draw`): an independent weighted draw per decision (the proposal).
* ``smooth`` (:func:`smooth_pick`): smooth weighted round robin; in bootstrap each unmeasured candidate gets
  one request, the rest go to the others (:func:`bootstrap_picks`).
* ``least_loaded`` (:func:`least_loaded_pick`, the default): weighted least connections,
  ``(in flight + 1) / share``; an ``exploration_share`` of the decisions is a uniform draw; with nothing in
  flight, greedy by expected rate (:func:`best_expected_rate`).

:func:`small_request` keeps the running median of request sizes that decides which requests may explore.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Mapping, Sequence

from litellm_ratebalance.routing.estimator import DeploymentState
from litellm_ratebalance.routing.inflight import InFlight
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.types import Candidate

__all__ = [
    "best_expected_rate",
    "bootstrap_picks",
    "draw",
    "least_loaded_pick",
    "small_request",
    "smooth_pick",
]

CREDIT_LIMIT = 1.0
"""Bound of a smooth round-robin credit, in decisions: a deployment whose share fell sharply (or that was not a
candidate for a while) neither owes nor is owed more than one pick."""
MEDIAN_STEP = math.exp(0.05)
"""Factor by which the running median of request sizes moves per request (see :func:`small_request`)."""
SMALL_BOOST = 2.0
"""Exploration draws per small request, relative to ``exploration_share``: half the sized requests are small."""


def draw(rng: random.Random, shares: Sequence[float]) -> int:
    """An index drawn with probability ``shares[index]`` (shares summing to 1)."""
    point = rng.random()
    cumulative = 0.0
    for index, share in enumerate(shares):
        cumulative += share
        if point < cumulative:
            return index
    # Rounding left the sum a hair below 1: the last candidate with a share takes the remainder.
    for index in range(len(shares) - 1, -1, -1):
        if shares[index] > 0:
            return index
    return len(shares) - 1


def small_request(typical: float | None, work: float) -> tuple[bool, float]:
    """(whether a request of ``work`` (positive, finite) is at most the ``typical`` size, True while no size
    is known yet; the typical size moved toward it). The typical size is a running median: it moves by a fixed
    fraction per request, up or down, so it settles where half the requests are above it."""
    if typical is None:
        return True, work
    return work <= typical, typical * (MEDIAN_STEP if work > typical else 1.0 / MEDIAN_STEP)


def smooth_pick(credits: dict[str, float], candidates: Sequence[Candidate], shares: Sequence[float]) -> int:
    """Smooth weighted round robin: every candidate gains its share, the one with the most credit (the first
    on a tie) is picked and pays the total. Over any run of decisions with fixed shares each candidate gets
    its share of the picks to within one pick, with no bursts; a candidate with share 0 is never picked
    unless every share is 0 (then the first one is). O(candidates)."""
    total = 0.0
    best = -1
    best_credit = 0.0
    for i, c in enumerate(candidates):
        share = shares[i]
        if share <= 0.0:
            continue
        total += share
        credit = credits.get(c.id, 0.0) + share
        credits[c.id] = credit
        if best < 0 or credit > best_credit:
            best, best_credit = i, credit
    if best < 0:
        return 0
    credits[candidates[best].id] = max(best_credit - total, -CREDIT_LIMIT)
    if best_credit > CREDIT_LIMIT:
        # Clamp the owed side too (after choosing), so a sudden share change settles within a pick.
        for i, c in enumerate(candidates):
            if i != best and credits.get(c.id, 0.0) > CREDIT_LIMIT:
                credits[c.id] = CREDIT_LIMIT
    return best


def bootstrap_picks(
    window: Mapping[str, RateAggregate],
    in_flight: Mapping[str, InFlight],
    candidates: Sequence[Candidate],
    shares: Sequence[float],
) -> Sequence[float]:
    """Bootstrap shares for the smooth pick: a candidate without samples in ``window`` that has a request in
    flight here already had its chance (its answer ends the bootstrap), so the picks go evenly to the others
    until it answers; when that leaves none, evenly to the candidates with the fewest requests in flight
    here. (The shares reported stay equal.)"""
    picks: list[float] | None = None
    for i, c in enumerate(candidates):
        agg = window.get(c.id)
        if (agg is None or agg.count <= 0) and in_flight.get(c.id):
            if picks is None:
                picks = list(shares)
            picks[i] = 0.0
    if picks is None:
        return shares
    if not any(p > 0.0 for p in picks):
        busy = [len(in_flight.get(c.id) or ()) for c in candidates]
        least = min(busy)
        picks = [1.0 if b == least else 0.0 for b in busy]
    return picks


def least_loaded_pick(
    rng: random.Random,
    exploration: float | None,
    in_flight: Mapping[str, InFlight],
    wasted_by: Mapping[str, collections.deque[float]],
    candidates: Sequence[Candidate],
    shares: Sequence[float],
    now: float,
    idle_states: Sequence[DeploymentState],
) -> int:
    """Weighted least connections: the candidate with the fewest requests in flight here for its share,
    ``(in flight + 1) / share``, ties drawn at random; with none in flight here at any candidate, the one
    with a share whose expected rate is highest (:func:`best_expected_rate`). ``wasted_by``: per deployment,
    local times until which a recent failure there counts as in flight (a deployment that fails at once
    would otherwise look idle and draw every request; expired ones are dropped). ``shares``: without the
    exploration part; ``exploration``: the probability of a uniform draw instead (None: this request is not
    drawn for it), so each candidate keeps being measured whatever its load here. O(candidates)."""
    if exploration is not None and rng.random() < exploration:
        return rng.randrange(len(candidates))
    best = -1
    best_score = math.inf
    ties = 0
    idle = True
    for i, c in enumerate(candidates):
        share = shares[i]
        if share <= 0.0:
            continue
        queue = in_flight.get(c.id)
        busy = len(queue) if queue else 0
        wasted = wasted_by.get(c.id)
        if wasted:
            while wasted and wasted[0] <= now:
                wasted.popleft()
            busy += len(wasted)
        if busy:
            idle = False
        score = (busy + 1.0) / share
        if score < best_score * (1.0 - 1e-9):
            best, best_score, ties = i, score, 1
        elif score <= best_score * (1.0 + 1e-9):
            ties += 1
            if rng.randrange(ties) == 0:  # an even draw among equal scores
                best = i
    if best < 0:
        return draw(rng, shares)
    if idle:
        # Nothing in flight here: no load to balance. The lowest score is then the largest share, the
        # probability of beating an SLA that the deployment with the most samples sets; with one
        # request at a time a faster deployment just behind it in share would never get the samples
        # that could put it ahead. Greedy by what the oracle looks at instead: the expected rate.
        return best_expected_rate(idle_states, shares, best)
    return best


def best_expected_rate(idle_states: Sequence[DeploymentState], shares: Sequence[float], fallback: int) -> int:
    """Index of the candidate with a share whose window promises the highest mean rate at one request in
    flight (failures as rate 0, the load fit's correction added); ``fallback`` when one of them has no
    samples (bootstrap or stale)."""
    best = fallback
    best_rate = -math.inf
    for i, state in enumerate(idle_states):
        if shares[i] <= 0.0:
            continue
        window = state.window
        if window.count <= 0.0:
            return fallback
        rate = (window.rate_sum + (window.count - window.failures) * state.load_shift) / window.count
        if rate > best_rate:
            best, best_rate = i, rate
    return best
