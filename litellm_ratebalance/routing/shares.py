"""From a model group's view to the shares of a candidate set, with nothing in flight here.

:func:`candidate_states` reads each candidate's window, failure window and capacity (rate-limit headers,
configured tpm / rpm against the last minute's usage) off the view into
:class:`~litellm_ratebalance.routing.estimator.DeploymentState` values, corrects them for one request in
flight (load fits, configured slots) and computes the shares once
(:func:`~litellm_ratebalance.routing.estimator.compute_shares`); :func:`cached` keeps them per candidate set
until the next sync. :func:`estimates` turns shares into the figures ``status`` and the metrics show. A view
read once from the store (:func:`~litellm_ratebalance.routing.snapshot.read_view`) gives the shares every
replica starts from, without a balancer.
"""

from __future__ import annotations

from collections.abc import Sequence

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import DeploymentState, Shares, compute_shares, headroom_multiplier
from litellm_ratebalance.routing.evidence import FAILURE_STREAK, load_correction
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.types import Candidate, DeploymentEstimate
from litellm_ratebalance.routing.view import Cached, GroupView

__all__ = [
    "LOCAL_RECOMPUTE_SECONDS",
    "cached",
    "candidate_states",
    "capacity",
    "estimates",
    "load_shift",
    "settings_shares",
    "uniform",
]

LOCAL_RECOMPUTE_SECONDS = 0.05
"""Cached shares include this replica's newest samples at most this late (the next sync includes them all)."""
MAX_CACHED_SETS = 64
"""Candidate sets whose shares are kept per model group (more: the cache starts afresh)."""


def capacity(view: GroupView, settings: RoutingSettings, candidate: Candidate) -> float:
    """Headroom multiplier 0..1 of a candidate: the smallest fraction of a rate limit left (its current
    ``x-ratelimit-*`` headers; configured tpm / rpm against the last minute's usage), through
    :func:`~litellm_ratebalance.routing.estimator.headroom_multiplier`; 1 when nothing is known or
    ``rate_limit_headroom`` is 0."""
    headroom = settings.rate_limit_headroom
    if headroom <= 0:
        return 1.0
    fractions: list[float] = []
    obs = view.limits.get(candidate.id)
    if obs is not None and obs.is_current(view.derived.now_ms, settings.rate_limit_header_max_age_seconds):
        left = obs.fraction_left()
        if left is not None:
            fractions.append(left)
    usage = view.derived.usage.get(candidate.id)
    if candidate.tpm:
        fractions.append(1.0 - (usage.tokens if usage else 0) / candidate.tpm)
    if candidate.rpm:
        fractions.append(1.0 - (usage.count if usage else 0) / candidate.rpm)
    return headroom_multiplier(min(fractions), headroom) if fractions else 1.0


def settings_shares(settings: RoutingSettings, states: Sequence[DeploymentState], sla: float | None = None) -> Shares:
    """:func:`~litellm_ratebalance.routing.estimator.compute_shares` of ``states`` with ``settings``
    (``sla``: when known)."""
    return compute_shares(
        states,
        greediness=settings.greediness,
        estimator=settings.estimator,
        exploration_share=settings.exploration_share,
        failure_penalty=settings.failure_penalty,
        prior_samples=settings.prior_samples,
        sla=sla,
    )


def uniform(n: int) -> Shares:
    """Equal shares of ``n`` candidates (round-robin mode: window 0 or greediness 0)."""
    return Shares((1.0 / n,) * n, "round_robin", None, (1.0,) * n)


def candidate_states(view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate]) -> Cached:
    """The candidate set's states from the synced view, and its shares with nothing in flight here.

    A deployment failing as a whole here (:data:`~litellm_ratebalance.routing.evidence.FAILURE_STREAK`) counts
    all its recent attempts as failed; one measured before whose samples aged out of the window is stale
    (no weight, only its exploration share) when exploration can measure it again."""
    derived = view.derived
    empty = RateAggregate()
    states: list[DeploymentState] = []
    # (recent counts of the failure penalty are age-weighted, see window.derive)
    streaks = view.failure_streak
    # Stale only where exploration can measure it again: with no exploration a deployment whose samples
    # aged out would never be tried again, so it starts the bootstrap as in the proposal.
    measured = view.measured if settings.exploration_share > 0.0 else ()
    for c in candidates:
        attempts, failures = derived.failure_weights.get(c.id, (0.0, 0.0))
        if streaks.get(c.id, 0) >= FAILURE_STREAK:
            failures = attempts = max(attempts, 1.0)  # failing as a whole
        window = derived.window.get(c.id, empty)
        states.append(
            DeploymentState(
                window=window,
                recent_attempts=attempts,
                recent_failures=failures,
                capacity=capacity(view, settings, c),
                stale=window.count <= 0 and c.id in measured,
            )
        )
    loads = view.loads if settings.load_aware else None
    idle = list(states)
    if loads or any(c.slots for c in candidates):
        for i, c in enumerate(candidates):
            fit = loads.get(c.id) if loads is not None else None
            shift, slots_left = load_correction(fit, 0.0, states[i].window.mean, c.slots)
            if shift != 0.0 or slots_left != 1.0:
                state = states[i]
                idle[i] = DeploymentState(
                    window=state.window,
                    recent_attempts=state.recent_attempts,
                    recent_failures=state.recent_failures,
                    capacity=state.capacity * slots_left,
                    load_shift=shift,
                    stale=state.stale,
                )
    return Cached(settings_shares(settings, idle), tuple(states), tuple(idle), {}, {})


def cached(view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate], now: float) -> Cached:
    """The candidate set's states and idle shares as of this sync (worked out once per cache; the cache
    starts afresh :data:`LOCAL_RECOMPUTE_SECONDS` after an own sample it does not include)."""
    key = tuple(candidates)
    if view.dirty_at is not None and now - view.dirty_at >= LOCAL_RECOMPUTE_SECONDS:
        view.cache.clear()
        view.dirty_at = None
    found = view.cache.get(key)
    if found is None:
        found = candidate_states(view, settings, candidates)
        if len(view.cache) >= MAX_CACHED_SETS:
            view.cache.clear()
        view.cache[key] = found
    return found


def load_shift(view: GroupView, settings: RoutingSettings, deployment_id: str) -> float:
    """Expected rate change (tokens/s) of a deployment at its load here plus one, from its load fit."""
    fit = view.loads.get(deployment_id) if settings.load_aware else None
    if fit is None:
        return 0.0
    queue = view.in_flight.get(deployment_id)
    window = view.derived.window.get(deployment_id)
    return fit.shift(float(len(queue) + 1 if queue else 1), window.mean if window is not None else 0.0)


def estimates(
    view: GroupView, settings: RoutingSettings, candidates: Sequence[Candidate], shares: Shares
) -> dict[str, DeploymentEstimate]:
    """Per candidate: samples, mean / spread of its rates, failures, usage, capacity, in flight here, and
    its share and mode from ``shares`` (of exactly these candidates, in this order)."""
    derived = view.derived
    empty = RateAggregate()
    out: dict[str, DeploymentEstimate] = {}
    for i, c in enumerate(candidates):
        window = derived.window.get(c.id, empty)
        recent = derived.recent.get(c.id, empty)
        usage = derived.usage.get(c.id, empty)
        out[c.id] = DeploymentEstimate(
            deployment_id=c.id,
            share=shares.shares[i],
            probability=shares.probabilities[i] if shares.mode == "weighted" else None,
            samples=window.count,
            failures=window.failures,
            mean_rate=window.mean,
            std_rate=window.std,
            mean_latency=window.mean_ok_latency,
            mean_ttft=window.mean_ttft,
            recent_attempts=recent.count,
            recent_failures=recent.failures,
            tokens_last_minute=usage.tokens,
            requests_last_minute=usage.count,
            capacity=capacity(view, settings, c),
            in_flight=len(view.in_flight.get(c.id, ())),
            mode=shares.mode,
            sla=shares.sla,
            load_shift=load_shift(view, settings, c.id),
        )
    return out
