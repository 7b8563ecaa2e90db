"""The rate balancer's core, independent of LiteLLM: choose a deployment, record how it went.

:class:`RateBalancer` is a thin facade over the routing modules:

* :mod:`~litellm_ratebalance.routing.view`: each model group's shared view (synced buckets, store clock
  offset) and the write-behind of samples; :mod:`~litellm_ratebalance.routing.window` derives its windows;
* :mod:`~litellm_ratebalance.routing.shares`: shares of a candidate set from the view, cached per sync;
* :mod:`~litellm_ratebalance.routing.evidence` and :mod:`~litellm_ratebalance.routing.live`: what this
  replica's requests in flight show (load, stalls, overdue requests), worked into the shares at a decision;
  :mod:`~litellm_ratebalance.routing.changes`: change detection's consequences and re-measuring probes;
* :mod:`~litellm_ratebalance.routing.selection`: the pickers.

Request path (:meth:`RateBalancer.choose`): no store round trip; a decision is a cache lookup, the in-flight
adjustment when requests are in flight here, and a pick, O(deployments) whatever the number of samples.

Write-behind (:meth:`RateBalancer.record`): a finished request becomes a sample in the group's pending
aggregate. When the view is older than ``refresh_interval``, the next choose or record starts one background
sync per group (one store call), so every replica routes from the same picture.

Not thread-safe: one instance belongs to one event loop (LiteLLM's proxy and async SDK calls).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from litellm_ratebalance.routing import changes, evidence, selection
from litellm_ratebalance.routing import view as views
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import MIN_LATENCY_SECONDS, effective_rate
from litellm_ratebalance.routing.fits import LoadFit, SizeFit
from litellm_ratebalance.routing.inflight import MAX_IN_FLIGHT, InFlight
from litellm_ratebalance.routing.live import shares_now
from litellm_ratebalance.routing.records import RateAggregate, RateLimitObservation
from litellm_ratebalance.routing.shares import cached, estimates, uniform
from litellm_ratebalance.routing.snapshot import known_candidates
from litellm_ratebalance.routing.types import Candidate, DeploymentEstimate
from litellm_ratebalance.routing.view import GroupView

if TYPE_CHECKING:
    from litellm_ratebalance.store.routing import RoutingStore

__all__ = ["RateBalancer"]

logger = logging.getLogger("litellm_ratebalance.routing")


class RateBalancer:
    """Rate-balanced choice among deployments, from statistics shared through a :class:`RoutingStore`.

    ``store`` may be a callable returning the store (resolved at each sync: the proxy's store is found
    lazily). ``clock`` gives local seconds (injectable for tests); store-side times come from the store.
    ``on_store_error`` is called with the exception when a sync fails (the view then stays as it was and
    pending samples are kept for the next sync).
    """

    def __init__(
        self,
        store: RoutingStore | Callable[[], RoutingStore],
        settings: RoutingSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        on_store_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = s = settings or RoutingSettings()
        self._store = store
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_store_error = on_store_error
        self._views: dict[str, GroupView] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._plan = views.SyncPlan(s)
        self._round_robin = s.round_robin
        self._smooth = s.selection == "smooth"
        self._least_loaded = s.selection == "least_loaded"
        self._last_error_log = float("-inf")
        self._track_in_flight = s.stall_latency_factor > 0 or s.in_flight_evidence or s.load_aware
        # How a deployment's rate depends on its load is a property of its capacity, which changes slower than
        # its rate: the fit fades over a whole window.
        self._load_half_life = float(s.window_seconds)
        # How latency grows with a request's size changes with its rate: the fit fades like the samples.
        self._size_half_life = changes.change_cooldown(s)

    # -- request path ---------------------------------------------------------------------------------
    def choose(
        self,
        model_group: str,
        candidates: Sequence[Candidate],
        request_id: str | None = None,
        *,
        work: float | None = None,
    ) -> int:
        """Index in ``candidates`` of the deployment to use; the pick is counted as in flight until
        :meth:`record` (or :meth:`release`) is called for that deployment, with the same ``request_id`` when
        one is given. ``work``: the most the request can cost, ``max_tokens + input_tokens / ratio`` tokens,
        when the caller knows its ``max_tokens`` (its latency is then judged against requests of its size while
        it is in flight). Never awaits, never touches the store."""
        n = len(candidates)
        if n == 0:
            raise ValueError("choose() needs at least one candidate")
        if self._round_robin:
            return self._rng.randrange(n) if n > 1 else 0
        now = self._clock()
        view = self._view(model_group)
        self._maybe_sync(model_group, view, now)
        s = self.settings
        if n == 1:
            index = 0
        else:
            known = cached(view, s, candidates, now)
            computed = shares_now(view, s, candidates, now, detect=True, known=known)
            shares: Sequence[float] = computed.shares
            # Re-measuring and exploring go to requests of at most the typical size: a small request measures
            # a deployment as well as a large one, and a large one sent to a slow deployment is the request
            # that waits longest (the tail of the latency). Sizes unknown: every request may go.
            # (a size that is not a positive finite number counts as unknown: it must not poison the median)
            sized = work is not None and 0.0 < work < math.inf
            small = True
            if work is not None and sized:
                small, view.typical_work = selection.small_request(view.typical_work, work)
            probe = changes.probe(view, s, candidates, now) if small and s.remeasure else None
            if probe is not None:
                index = probe
            elif self._least_loaded:
                exploit = computed.exploit or shares
                # (requests drawn for exploration are the small half when sized: drawn twice as often, the
                # same share of decisions, and no long answer sent just to measure a slow deployment)
                exploration = s.exploration_share * (selection.SMALL_BOOST if sized else 1.0) if small else None
                index = selection.least_loaded_pick(
                    self._rng, exploration, view.in_flight, view.wasted, candidates, exploit, now, known.idle
                )
            elif self._smooth:
                if computed.mode == "bootstrap":
                    shares = selection.bootstrap_picks(view.derived.window, view.in_flight, candidates, shares)
                index = selection.smooth_pick(view.credits, candidates, shares)
            else:
                index = selection.draw(self._rng, shares)
        chosen = candidates[index]
        view.last_attempt[chosen.id] = now
        if chosen.input_to_output_ratio is not None:
            view.ratios[chosen.id] = chosen.input_to_output_ratio
        if self._track_in_flight:
            self._book(view, chosen.id, now, request_id, work)
        return index

    def _book(
        self, view: GroupView, deployment_id: str, now: float, request_id: str | None, work: float | None
    ) -> None:
        """Count a pick as in flight, with the latency a request of its size is expected to take there."""
        queue = view.in_flight.get(deployment_id)
        if queue is None:
            queue = view.in_flight[deployment_id] = InFlight()
        expected_latency = 0.0
        if work is not None and work > 0.0:
            size_fit = view.sizes.get(deployment_id)
            if size_fit is not None:
                expected_latency = size_fit.expected_latency(work) or 0.0
        if expected_latency > 0.0:
            due = now + expected_latency
            earliest = view.earliest_due.get(deployment_id)
            if not queue or earliest is None or due < earliest:
                view.earliest_due[deployment_id] = due
        queue.add(now, request_id, expected_latency)

    def record(
        self,
        model_group: str,
        deployment_id: str,
        *,
        latency: float,
        input_tokens: int = 0,
        output_tokens: int = 0,
        ok: bool = True,
        ttft: float | None = None,
        input_to_output_ratio: float | None = None,
        rate_limits: RateLimitObservation | None = None,
        request_id: str | None = None,
    ) -> None:
        """Record one finished request (``ok=False`` for an error, timeout or 429: a zero-rate sample).

        ``ttft``: time to first token of a stream, seconds. ``rate_limits``: the response's
        ``x-ratelimit-*`` headers. Cheap and synchronous; the sample reaches the store at the next sync.
        """
        if self._round_robin:
            return
        s = self.settings
        # An answer takes some time: a zero (or negative) latency, e.g. from log times that coincide, is
        # taken as the shortest one the rates use, so no expected latency, size fit or overdue test divides
        # by zero (a failure's latency only says how long it was in flight).
        latency = max(latency, MIN_LATENCY_SECONDS) if ok else max(latency, 0.0)
        now = self._clock()
        view = self._view(model_group)
        done = view.finished.pop(request_id, None) if request_id is not None and view.finished else None
        if done is not None and done[0] == deployment_id:
            entry: tuple[float, float, float] | None = done[1:4]
        else:
            queue = view.in_flight.get(deployment_id)
            entry = queue.take(request_id, now) if queue else None
        # The load this request shared the deployment with (1, alone, when its pick is not known here).
        load = entry[1] if entry is not None else 1.0
        ratio = s.ratio_for(model_group, input_to_output_ratio or view.ratios.get(deployment_id))
        rate = effective_rate(output_tokens, input_tokens, latency, ratio) if ok else 0.0
        work = output_tokens + input_tokens / ratio
        sample = RateAggregate()
        sample.add(rate, ok=ok, latency=latency, tokens=input_tokens + output_tokens, ttft=ttft)
        aggregate = view.pending.get(deployment_id)
        if aggregate is None:
            view.pending[deployment_id] = sample.copy()
        else:
            aggregate.merge(sample)
        self._note_outcome(view, deployment_id, ok, now)
        loads = view.loads.get(deployment_id) if s.load_aware else None
        if ok and loads is None and s.load_aware and rate > 0.0:
            loads = view.loads[deployment_id] = LoadFit()
        if ok and loads is not None and rate > 0.0:
            # Into the load fit first: an answer slowed by a load beyond the slots it reveals is no change.
            loads.add(now, load, work, latency, self._load_half_life)
        if ok and s.change_detection_sigma > 0:
            window = view.derived.window_full.get(deployment_id)
            surprise = evidence.surprising(
                s.change_detection_sigma, rate, load, work, latency, view.sizes.get(deployment_id), loads, window
            )
            if surprise and changes.changed(view, s, deployment_id, now, now - latency):
                loads = view.loads.get(deployment_id) if s.load_aware else None
                if loads is not None and rate > 0.0:
                    loads.add(now, load, work, latency, self._load_half_life)  # the first of the new regime
        # The local view sees its own sample at once (the shared one at the next sync): a deployment has
        # samples as soon as one of its requests finished here, and a failure counts from this moment.
        views.add_local(view, s, deployment_id, sample, now)
        size_fit = view.sizes.get(deployment_id)
        if ok and s.in_flight_evidence and rate > 0.0:
            if size_fit is None:
                size_fit = view.sizes[deployment_id] = SizeFit()
            # Fitted at light load: the part of the latency the load explains is taken out.
            slowdown = 1.0 if loads is None else loads.slowdown(load)
            size_fit.add(now, work, latency / slowdown, self._size_half_life)
        if not ok and self._least_loaded:
            self._waste(view, deployment_id, latency, now)
        if rate_limits is not None:
            view.pending_limits[deployment_id] = rate_limits
        if view.pending_since is None:
            view.pending_since = now
        self._maybe_sync(model_group, view, now)

    @staticmethod
    def _note_outcome(view: GroupView, deployment_id: str, ok: bool, now: float) -> None:
        """Keep the deployment's last answer and failure streak here up to date."""
        if ok:
            view.last_answer[deployment_id] = now
            if view.failure_streak.pop(deployment_id, 0) >= evidence.FAILURE_STREAK:
                view.cache.clear()  # it answers again: its failure share alone counts from now on
        else:
            streak = view.failure_streak[deployment_id] = view.failure_streak.get(deployment_id, 0) + 1
            if streak == evidence.FAILURE_STREAK:
                view.cache.clear()  # failing as a whole: out of the shares at the next decision

    @staticmethod
    def _waste(view: GroupView, deployment_id: str, latency: float, now: float) -> None:
        """A failure took the place of a request that would have been in flight for a typical latency: it
        counts as in flight for the rest of that time (``least_loaded``), so a deployment that fails at once
        does not look idle (a failure that took longer, e.g. a timeout, was counted while it was in flight)."""
        expected = view.derived.expected.get(deployment_id) or view.derived.pooled_expected
        rest = (expected[0] if expected else 1.0) - latency
        if rest > 0.0:
            wasted = view.wasted.get(deployment_id)
            if wasted is None:
                wasted = view.wasted[deployment_id] = collections.deque(maxlen=MAX_IN_FLIGHT)
            wasted.append(now + rest)

    def finish(self, model_group: str, deployment_id: str, request_id: str | None) -> None:
        """The answer of request ``request_id`` is back; its sample comes later (:meth:`record`).

        LiteLLM logs a success in the background, often after the caller has sent its next request: until
        then the request would still count as in flight here, so a deployment answering one request at a
        time would look busy at every pick. From this call on it does not; :meth:`record` still dates the
        sample and its load from the request's own start and finish. Without a ``request_id`` nothing is
        done (its record could not be matched), nor unless ``end_pick_on_answer`` is set."""
        if request_id is None or not self.settings.end_pick_on_answer:
            return
        view = self._views.get(model_group)
        queue = view.in_flight.get(deployment_id) if view is not None else None
        if view is None or not queue or request_id not in queue:
            return
        entry = queue.take(request_id, self._clock())
        if entry is None:
            return
        finished = view.finished
        if len(finished) >= MAX_IN_FLIGHT:
            del finished[next(iter(finished))]  # records that never came (the oldest)
        finished[request_id] = (deployment_id, *entry)

    def release(self, model_group: str, deployment_id: str, request_id: str | None = None) -> None:
        """Forget one request in flight at the deployment without recording a sample (the request, not the
        deployment, was at fault)."""
        view = self._views.get(model_group)
        if view is not None and request_id is not None and view.finished.pop(request_id, None) is not None:
            return
        queue = view.in_flight.get(deployment_id) if view is not None else None
        if queue:
            queue.take(request_id, self._clock())

    # -- status ---------------------------------------------------------------------------------------
    def weights(self, model_group: str, candidates: Sequence[Candidate] | None = None) -> dict[str, float]:
        """Current choice probability per deployment id (all deployments seen, when no candidates)."""
        candidates = self._candidates_or_known(model_group, candidates)
        if not candidates:
            return {}
        if self._round_robin:
            return {c.id: 1.0 / len(candidates) for c in candidates}
        shares = shares_now(self._view(model_group), self.settings, candidates, self._clock())
        return {c.id: share for c, share in zip(candidates, shares.shares, strict=True)}

    def estimates(
        self, model_group: str, candidates: Sequence[Candidate] | None = None
    ) -> dict[str, DeploymentEstimate]:
        """Per deployment: samples, mean / spread of its rates, failures, capacity, share and mode."""
        candidates = self._candidates_or_known(model_group, candidates)
        view = self._view(model_group)
        if not candidates:
            return {}
        if self._round_robin:
            shares = uniform(len(candidates))
        else:
            shares = shares_now(view, self.settings, candidates, self._clock())
        return estimates(view, self.settings, candidates, shares)

    def model_groups(self) -> list[str]:
        return sorted(self._views)

    # -- synchronisation ------------------------------------------------------------------------------
    async def refresh(self, model_group: str) -> None:
        """Sync one model group with the store now (tests, status output, a warm-up), after any background
        sync in flight has finished."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._sync(model_group, self._view(model_group))

    async def refresh_all(self) -> None:
        for model_group in list(self._views):
            await self.refresh(model_group)

    async def aclose(self) -> None:
        """Flush what is pending and wait for background syncs (shutdown, tests)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for model_group, view in list(self._views.items()):
            if view.pending or view.pending_limits:
                await self._sync(model_group, view)

    def _maybe_sync(self, model_group: str, view: GroupView, now: float) -> None:
        if view.syncing or now - view.last_sync < self.settings.refresh_interval:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside an event loop: refresh() is the way then
            return
        view.syncing = True
        task = loop.create_task(self._sync(model_group, view))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync(self, model_group: str, view: GroupView) -> None:
        try:
            await views.sync(self._resolve_store, model_group, view, self.settings, self._plan, self._clock)
        except Exception as exc:
            self._store_error(exc)

    def _resolve_store(self) -> RoutingStore:
        if hasattr(self._store, "routing_sync"):
            return cast("RoutingStore", self._store)
        factory: Callable[[], RoutingStore] = self._store  # type: ignore[assignment]
        return factory()

    def _store_error(self, exc: BaseException) -> None:
        if self._on_store_error is not None:
            try:
                self._on_store_error(exc)
            except Exception:  # a reporting hook must never break routing
                logger.exception("litellm_ratebalance routing: on_store_error hook failed")
            return
        now = time.monotonic()
        if now - self._last_error_log >= 30.0:
            self._last_error_log = now
            logger.warning("litellm_ratebalance routing: store sync failed, routing on the last view: %s", exc)

    # -- helpers --------------------------------------------------------------------------------------
    def _changed(self, view: GroupView, deployment_id: str, now: float, since: float) -> bool:
        """:func:`~litellm_ratebalance.routing.changes.changed` with this balancer's settings."""
        return changes.changed(view, self.settings, deployment_id, now, since)

    def _view(self, model_group: str) -> GroupView:
        view = self._views.get(model_group)
        if view is None:
            view = self._views[model_group] = GroupView()
        return view

    def _candidates_or_known(self, model_group: str, candidates: Sequence[Candidate] | None) -> list[Candidate]:
        if candidates is not None:
            return list(candidates)
        view = self._views.get(model_group)
        return [] if view is None else known_candidates(view)
