"""A model group's shared view: the synced buckets, the store clock's offset, and this replica's own state.

Every replica routes from the same picture (give or take one refresh interval): :func:`sync` writes the
samples pending here into the store's current time bucket and reads back the buckets this replica has not
seen closed (:class:`~litellm_ratebalance.store.routing.RoutingStore`, one call); :func:`apply_snapshot`
keeps them and derives the windows (:func:`~litellm_ratebalance.routing.window.derive`). The store's clock
decides the buckets: ``offset`` is store time minus local time as of the last sync.

:class:`GroupView` also holds what only this replica knows (its requests in flight, its load and size fits,
change detection's state, the pickers' state); the modules that use each part say so.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import DeploymentState, Shares
from litellm_ratebalance.routing.fits import LoadFit, SizeFit
from litellm_ratebalance.routing.inflight import InFlight
from litellm_ratebalance.routing.records import RateAggregate, RateLimitObservation
from litellm_ratebalance.routing.types import Candidate
from litellm_ratebalance.routing.window import USAGE_WINDOW_MS, Derived, add_to, derive, one_answer, set_expected

if TYPE_CHECKING:
    from litellm_ratebalance.store.routing import RoutingSnapshot, RoutingStore

__all__ = ["Cached", "GroupView", "SyncPlan", "add_local", "apply_snapshot", "keep_pending", "note_answers", "sync"]


class Cached(NamedTuple):
    shares: Shares
    """The shares when none of the candidates has a request in flight here (``idle`` states)."""
    states: tuple[DeploymentState, ...]
    """Per candidate: what the synced view says, before any load correction."""
    idle: tuple[DeploymentState, ...]
    """``states`` with the load correction at one request (the decision's own) in flight."""
    loaded: dict[tuple[int, int], tuple[DeploymentState | None, tuple[float, float] | None]]
    """By (candidate index, requests in flight here), for a candidate whose requests in flight show nothing
    timed (no stall, none overdue): its state at that load (None: its idle state) and, in weighted mode,
    its (probability, weight). Worked out once per cache: the load fits change only with own samples, and
    those clear the cache."""
    at_load: dict[tuple[int, ...], tuple[Shares, float]]
    """By in-flight pattern (the number of requests in flight here at each candidate, negated where one of
    them is timed: stalled or overdue; then whether change detection ran): the shares worked out for it and
    the time they hold until. Without anything timed they depend on the loads only and hold for the cache's
    life, for the same reason as ``loaded``; timed evidence grows with time, so shares with it hold for
    :data:`~litellm_ratebalance.routing.shares.LOCAL_RECOMPUTE_SECONDS` (the lag the cache allows for this
    replica's own samples). At most :data:`~litellm_ratebalance.routing.live.MAX_LOAD_PATTERNS`."""


class GroupView:
    """One model group: the shared picture as of the last sync, and this replica's own state beside it."""

    __slots__ = (
        "buckets",
        "cache",
        "change_evidence",
        "changed",
        "closed_through",
        "credits",
        "cutoff_ms",
        "derived",
        "dirty_at",
        "earliest_due",
        "failure_streak",
        "finished",
        "in_flight",
        "last_answer",
        "last_attempt",
        "last_sync",
        "limits",
        "loads",
        "measured",
        "offset",
        "pending",
        "pending_limits",
        "pending_since",
        "probed_at",
        "probes",
        "ratios",
        "second_opinions",
        "single_answer",
        "sizes",
        "syncing",
        "typical_work",
        "wasted",
    )

    def __init__(self) -> None:
        self.buckets: dict[int, dict[str, RateAggregate]] = {}
        self.limits: dict[str, RateLimitObservation] = {}
        self.closed_through: int | None = None
        """Every bucket up to this index is final in ``buckets`` (no replica can write to it any more)."""
        self.offset = 0.0
        """Store clock minus local clock, seconds, as of the last sync."""
        self.last_sync = float("-inf")
        self.syncing = False
        self.pending: dict[str, RateAggregate] = {}
        self.pending_limits: dict[str, RateLimitObservation] = {}
        self.pending_since: float | None = None
        self.in_flight: dict[str, InFlight] = {}
        self.finished: dict[str, tuple[str, float, float, float]] = {}
        """By request id: answers back (``RateBalancer.finish``) whose sample is not recorded yet, as
        (deployment, start, mean load over its life, expected latency); oldest first."""
        self.ratios: dict[str, float] = {}
        self.cutoff_ms: dict[str, float] = {}
        """Per deployment: store time (ms) before which its samples are ignored (a change was detected)."""
        self.change_evidence: dict[str, RateAggregate] = {}
        """Per deployment: the rate bound that revealed its change, until a sample from after it arrives."""
        self.changed: dict[str, float] = {}
        """Per deployment: local time of its last detected change (at most one per half-life)."""
        self.dirty_at: float | None = None
        """Local time of the first own sample the cached shares do not include yet."""
        self.last_attempt: dict[str, float] = {}
        """Per deployment: local time of this replica's last pick of it."""
        self.last_answer: dict[str, float] = {}
        """Per deployment: local time at which the last successful answer of its requests here came back."""
        self.failure_streak: dict[str, int] = {}
        """Per deployment: failures recorded here since its last successful answer here (absent: none)."""
        self.probes: set[str] = set()
        """Deployments to send one request each, to re-measure them after another one changed."""
        self.probed_at = float("-inf")
        """Local time of the last round of re-measuring probes."""
        self.second_opinions: dict[str, float] = {}
        """Per deployment: local time of its last second-opinion request (see
        :func:`~litellm_ratebalance.routing.changes.probe`); dropped when a change is detected there."""
        self.single_answer: set[str] = set()
        """Deployments whose window (``derived.window_full``) holds a single answer (see
        :func:`~litellm_ratebalance.routing.window.one_answer`); kept up to date wherever the window changes,
        so a decision does not test every candidate."""
        self.loads: dict[str, LoadFit] = {}
        """Per deployment: this replica's fit of rate against load (``load_aware``)."""
        self.sizes: dict[str, SizeFit] = {}
        """Per deployment: this replica's fit of latency against request size (``in_flight_evidence``)."""
        self.earliest_due: dict[str, float] = {}
        """Per deployment: local time at or after which one of its requests in flight here, of known size, may
        be overdue for its size (no later than the true earliest: its light-load latency is used, and entries
        that left are not taken out)."""
        self.measured: set[str] = set()
        """Deployments that have had samples in this view (or usage in the last minute): one of them without
        samples in the window now is stale, not unknown (see :attr:`DeploymentState.stale`)."""
        self.credits: dict[str, float] = {}
        """Per deployment: smooth weighted round-robin credit (``selection: smooth``), in decisions."""
        self.derived = Derived()
        self.typical_work: float | None = None
        """A running estimate of the median ``work`` of the requests of known size chosen for here (see
        :meth:`~litellm_ratebalance.routing.balancer.RateBalancer.choose`); None before the first."""
        self.wasted: dict[str, collections.deque[float]] = {}
        """Per deployment (``selection: least_loaded``): local times until which this replica's recent
        failures there count as requests in flight (see
        :func:`~litellm_ratebalance.routing.selection.least_loaded_pick`)."""
        self.cache: dict[tuple[Candidate, ...], Cached] = {}
        """Per candidate set, as of the last sync (or own sample): its shares with nothing in flight here,
        and the states they came from (see :func:`~litellm_ratebalance.routing.shares.candidate_states`)."""


class SyncPlan:
    """The bucket arithmetic of a sync, worked out once from the settings."""

    __slots__ = ("bucket_ms", "bucket_ttl_ms", "limits_ttl_ms", "max_in_flight_age", "retention_buckets")

    def __init__(self, settings: RoutingSettings) -> None:
        self.bucket_ms = settings.effective_bucket_seconds * 1000
        keep_ms = max(settings.window_seconds * 1000, settings.failure_window_seconds * 1000, USAGE_WINDOW_MS)
        self.retention_buckets = -(-keep_ms // self.bucket_ms) + 1
        # A bucket must outlive the window it may be read for, plus a refresh interval of slack.
        self.bucket_ttl_ms = keep_ms + 2 * self.bucket_ms + int(settings.refresh_interval * 1000)
        self.limits_ttl_ms = int(settings.rate_limit_header_max_age_seconds * 1000) + int(
            settings.refresh_interval * 1000
        )
        # Longer than LiteLLM's default request timeout (600 s): a request still unreported then was lost.
        self.max_in_flight_age = max(float(settings.window_seconds), 900.0)

    def bucket_range(self, view: GroupView, local_now: float) -> tuple[int, int]:
        """The buckets to ask for at local time ``local_now``: from the first not yet seen closed (at most the
        retention back) to one past the current one by the store's clock as last seen."""
        current = int((local_now + view.offset) * 1000) // self.bucket_ms
        oldest = current - self.retention_buckets
        first = oldest if view.closed_through is None else max(view.closed_through + 1, oldest)
        # One bucket ahead: the guess of the store's clock may lag by a little.
        return min(first, current + 1), current + 1


async def sync(
    store: Callable[[], RoutingStore],
    model_group: str,
    view: GroupView,
    settings: RoutingSettings,
    plan: SyncPlan,
    clock: Callable[[], float],
) -> None:
    """One sync of ``view`` with the store (``store()`` resolves it): write what is pending, read the buckets
    back, apply them.

    A store error propagates after the pending samples were put back (:func:`keep_pending`); the view then
    stays as it was. ``view.syncing`` is set for the duration and ``view.last_sync`` at the end either way."""
    view.syncing = True
    deltas, view.pending = view.pending, {}
    limits, view.pending_limits = view.pending_limits, {}
    pending_since, view.pending_since = view.pending_since, None
    try:
        resolved = store()
        snapshot: RoutingSnapshot | None = None
        for _ in range(2):
            first, last = plan.bucket_range(view, clock())
            snapshot = await resolved.routing_sync(
                model_group,
                deltas,
                limits,
                first_bucket=first,
                last_bucket=last,
                bucket_ms=plan.bucket_ms,
                bucket_ttl_ms=plan.bucket_ttl_ms,
                limits_ttl_ms=plan.limits_ttl_ms,
            )
            view.offset = snapshot.now_ms / 1000.0 - clock()
            limits = {}
            if snapshot.written:
                break
        assert snapshot is not None
        if not snapshot.written:
            keep_pending(view, deltas, {}, pending_since, clock(), settings.window_seconds)
        apply_snapshot(view, snapshot, settings, plan, clock())
    except Exception as exc:
        late = exc.late if isinstance(exc, StoreError) else None
        if late is None:
            keep_pending(view, deltas, limits, pending_since, clock(), settings.window_seconds)
        else:
            # Timed out: the write may still happen. Send the samples again only if Redis says it did not
            # write them; without an answer they are dropped (statistics, not counts: a gap, never a double).
            def after(done: asyncio.Future[RoutingSnapshot]) -> None:
                if not done.cancelled() and done.exception() is None and not done.result().written:
                    keep_pending(view, deltas, limits, pending_since, clock(), settings.window_seconds)

            late.add_done_callback(after)
        raise
    finally:
        view.last_sync = clock()
        view.syncing = False


def keep_pending(
    view: GroupView,
    deltas: Mapping[str, RateAggregate],
    limits: Mapping[str, RateLimitObservation],
    pending_since: float | None,
    now: float,
    window_seconds: float,
) -> None:
    """Put unsent samples and headers back for the next sync, unless they are older than the window by
    then anyway (``now``: local time)."""
    if pending_since is not None and now - pending_since > window_seconds:
        return
    for deployment_id, delta in deltas.items():
        target = view.pending.get(deployment_id)
        if target is None:
            view.pending[deployment_id] = delta
        else:
            target.merge(delta)
    for deployment_id, obs in limits.items():
        view.pending_limits.setdefault(deployment_id, obs)
    if deltas and pending_since is not None:
        view.pending_since = min(pending_since, view.pending_since or pending_since)


def apply_snapshot(
    view: GroupView, snapshot: RoutingSnapshot, settings: RoutingSettings, plan: SyncPlan, now: float
) -> None:
    """Keep the snapshot's buckets and headers in ``view`` and derive its windows anew (``now``: local time).

    The samples still pending here (recorded while the sync was in flight) stay counted in the view, and so
    does the rate bound of a detected change until a sample from after the change arrives."""
    for index in range(snapshot.first_bucket, snapshot.last_bucket + 1):
        data = snapshot.buckets.get(index)
        if data:
            view.buckets[index] = data
        else:
            view.buckets.pop(index, None)
    current = snapshot.now_ms // plan.bucket_ms
    view.closed_through = min(snapshot.last_bucket, current - 1)
    oldest = current - plan.retention_buckets
    for index in [i for i in view.buckets if i < oldest]:
        del view.buckets[index]
    view.limits = snapshot.limits
    # A pick whose call never reported back (dropped after routing) must not count for ever.
    forgotten = now - plan.max_in_flight_age
    for queue in view.in_flight.values():
        queue.forget_before(forgotten, now)
    view.derived = derived = derive(settings, view.buckets, snapshot.now_ms, view.cutoff_ms)
    view.measured.update(derived.window_full, derived.usage)
    for deployment_id, bound in list(view.change_evidence.items()):
        if deployment_id in derived.window_full:
            del view.change_evidence[deployment_id]  # a real sample from after the change
        else:
            add_to(derived.window_full, deployment_id, bound)
            if derived.window is not derived.window_full:
                add_to(derived.window, deployment_id, bound)
    view.single_answer = {d for d, window in derived.window_full.items() if one_answer(window)}
    # Samples recorded while this sync was in flight are not in the snapshot yet: keep them in the view.
    for deployment_id, pending in view.pending.items():
        add_local(view, settings, deployment_id, pending, now)
    view.cache.clear()
    view.dirty_at = None


def add_local(
    view: GroupView, settings: RoutingSettings, deployment_id: str, sample: RateAggregate, now: float
) -> None:
    """Count a sample of this replica in the local view until a sync brings it back from the store."""
    derived = view.derived
    new = deployment_id not in derived.window
    view.measured.add(deployment_id)
    add_to(derived.window_full, deployment_id, sample)
    if derived.window is not derived.window_full:
        add_to(derived.window, deployment_id, sample)
    note_answers(view, deployment_id)
    add_to(derived.recent, deployment_id, sample)
    add_to(derived.usage, deployment_id, sample)
    attempts, failures = derived.failure_weights.get(deployment_id, (0.0, 0.0))
    derived.failure_weights[deployment_id] = (attempts + sample.count, failures + sample.failures)
    if deployment_id not in derived.expected:
        set_expected(settings, derived, deployment_id)
    if new:
        view.cache.clear()  # a candidate set may leave the bootstrap now
    elif view.dirty_at is None:
        # The cached shares lag behind this sample: recomputed within LOCAL_RECOMPUTE_SECONDS (not at every
        # finish, which at high traffic would make nearly every decision a cache miss).
        view.dirty_at = now


def note_answers(view: GroupView, deployment_id: str) -> None:
    """Bring ``view.single_answer`` up to date after the deployment's window changed."""
    if one_answer(view.derived.window_full.get(deployment_id)):
        view.single_answer.add(deployment_id)
    else:
        view.single_answer.discard(deployment_id)
