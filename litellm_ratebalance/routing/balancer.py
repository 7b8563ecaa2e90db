"""The rate balancer's core, independent of LiteLLM: choose a deployment, record how it went.

Request path (:meth:`RateBalancer.choose`): no store round trip. Each model group has a local view, the
window aggregates of the last sync, from which the shares of a candidate set are computed once per sync
(:func:`~litellm_ratebalance.routing.estimator.compute_shares`) and cached; a decision is a cache lookup,
a staleness check and a weighted draw, O(deployments) whatever the number of samples in the window.

Write-behind (:meth:`RateBalancer.record`): a finished request becomes a sample in the group's pending
aggregate (fixed size per deployment). When the view is older than ``refresh_interval``, the next choose or
record starts one background sync per group: one store call that writes the pending aggregates into the
current time bucket and reads back the buckets this replica has not seen closed, so every replica routes
from the same picture (give or take one refresh interval).

Local only (per replica): the requests in flight, used for stall detection, a request in flight much
longer than the deployment's mean latency counts as a recent failure until it finishes.

Not thread-safe: one instance belongs to one event loop (LiteLLM's proxy and async SDK calls).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast

from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import (
    MIN_LATENCY_SECONDS,
    DeploymentState,
    LoadFit,
    RateAggregate,
    RateLimitObservation,
    Shares,
    SizeFit,
    compute_shares,
    effective_rate,
    headroom_multiplier,
    recency_weight,
    reweigh,
    weigh,
)

if TYPE_CHECKING:
    from litellm_ratebalance.store.routing import RoutingSnapshot, RoutingStore

__all__ = ["Candidate", "DeploymentEstimate", "RateBalancer", "routing_status"]

logger = logging.getLogger("litellm_ratebalance")

_USAGE_WINDOW_MS = 60_000
"""Configured tpm / rpm are per minute: usage is summed over the last minute of buckets."""
_MAX_IN_FLIGHT = 4096
_MAX_CACHED_SETS = 64
_MAX_LOAD_PATTERNS = 256
"""Shares at distinct in-flight patterns kept per cached candidate set (the numbers in flight here per
candidate; a busy replica revisits a few of them over and over)."""
_STALL_QUORUM = 3
"""Requests overdue together, with no answer from their deployment for a typical latency, that show it has
stalled as a whole."""
_MAX_STALL_SCAN = 1024
_FAILURE_STREAK = 4
"""Failures in a row recorded here, with no successful answer between them, that show a deployment is
failing as a whole: its recent attempts then count as all failed until it answers again (its recent failure
share alone is diluted by the successes before the failures began, for a few failure half-lives). Four in a
row come by chance once in 256 runs of four requests to a deployment that fails a quarter of them."""
_MEDIAN_STEP = math.exp(0.05)
"""Factor by which the running median of request sizes moves per request (see :func:`_small_request`)."""
_SMALL_BOOST = 2.0
"""Exploration draws per small request, relative to ``exploration_share``: half the sized requests are small."""
_LOCAL_RECOMPUTE_SECONDS = 0.05
"""Cached shares include this replica's newest samples at most this late (the next sync includes them all)."""
_SLOTS_HEADROOM = 0.5
"""Below this fraction of its learnt slots free, a saturated deployment's share shrinks linearly."""
_CHANGE_MIN_SAMPLES = 3.0
"""Successful samples (recency-weighted) a deployment needs before a sample can say that it changed."""
_MAX_OVERDUE_SAMPLES = 32
"""In-flight requests per deployment turned into overdue samples at a decision (the oldest ones)."""


_MAX_DUE_SCAN = 128
"""In-flight requests per deployment looked at for being overdue at a decision (the oldest ones)."""

_JOINT_EVIDENCE = 4
"""At most this many overdue requests of one deployment are taken together as evidence of a slowdown (more
would let a deployment that is merely busy, all its requests a little slow, read as changed)."""

_MIN_LOG_SPREAD = 0.1
"""Least spread of ``log(latency / predicted)`` a change is measured against (10 %: no deployment is that
regular, and a handful of residuals can look tighter than it is)."""

_UNMEASURED_BOUND = 0.9
"""The rate bound of an overdue request at a deployment without successful samples of its own is capped at
this fraction of the SLA."""


class Candidate(NamedTuple):
    """One deployment a request may go to."""

    id: str
    input_to_output_ratio: float | None = None
    """The deployment's own ratio (e.g. ``model_info.input_to_output_ratio``); None: the group's."""
    tpm: float | None = None
    """Configured tokens per minute; the share shrinks as the last minute's usage nears it."""
    rpm: float | None = None
    slots: float | None = None
    """Configured requests it serves at full speed (``model_info.slots``); stands for the slots the load fit
    would learn: the share shrinks as this replica's requests in flight fill them, to 0 when full."""


@dataclass(frozen=True, slots=True)
class DeploymentEstimate:
    """What the balancer currently believes about one deployment (for status output and metrics)."""

    deployment_id: str
    share: float | None
    """Choice probability among the candidate set asked about (None when not a candidate)."""
    probability: float | None
    """Estimated probability of beating the SLA (None in bootstrap / round-robin mode)."""
    samples: float
    """Samples in the window, recency-weighted when ``sample_half_life_seconds`` is on (so not whole)."""
    failures: float
    mean_rate: float
    std_rate: float
    mean_latency: float | None
    mean_ttft: float | None
    recent_attempts: float
    recent_failures: float
    tokens_last_minute: float
    requests_last_minute: float
    capacity: float
    in_flight: int
    mode: str
    sla: float | None
    load_shift: float = 0.0
    """Expected rate change (tokens/s) at the current load from this replica's load fit (``load_aware``)."""


class _Derived:
    """What a sync leaves for the decisions until the next one."""

    __slots__ = (
        "expected",
        "failure_weights",
        "now_ms",
        "pooled_expected",
        "recent",
        "stall_after",
        "usage",
        "window",
        "window_full",
    )

    def __init__(self) -> None:
        self.now_ms = 0
        self.window: dict[str, RateAggregate] = {}
        """Per deployment: the samples the estimator uses (adaptive window when enabled)."""
        self.window_full: dict[str, RateAggregate] = {}
        self.recent: dict[str, RateAggregate] = {}
        self.failure_weights: dict[str, tuple[float, float]] = {}
        """Per deployment: (attempts, failures) of the failure window, each bucket weighted by its age."""
        self.usage: dict[str, RateAggregate] = {}
        self.stall_after: dict[str, float] = {}
        """Per deployment: seconds in flight after which a request counts as stalled."""
        self.expected: dict[str, tuple[float, float]] = {}
        """Per deployment: (mean latency s, mean work = latency x rate, tokens) of its successful samples."""
        self.pooled_expected: tuple[float, float] | None = None
        """The same over every deployment's samples (for one without successful samples yet)."""


_ANONYMOUS_PICKS = itertools.count()
"""Private keys of picks made without a request id (see :class:`_InFlight`)."""


class _InFlight(dict[object, tuple[float, float, float]]):
    """This replica's requests in flight at one deployment, oldest first: key -> (start, load area at start,
    expected latency: seconds a request of its size takes there at light load, or 0 when unknown).

    The key is the request's id when the caller knows it (LiteLLM's ``litellm_trace_id``), so a finished
    request removes its own entry; picks without an id get a private key and a finish without a known id
    removes the oldest entry (requests do not finish in order, so ages are then underestimated, never
    overestimated). A dict (insertion order = start order) so that size and truth tests cost nothing.

    The **load area** is the integral over time of the number of requests in flight here, kept up to date at
    every change of that number (times are the caller's, explicit). :meth:`take` turns it into the mean load a
    request shared the deployment with over its whole life, itself included: the loads it met and left
    alone read a request low whenever a crowd came and went while it ran, which under processor sharing is
    exactly when it is slowed down.
    """

    __slots__ = ("_area", "_since")

    def __init__(self) -> None:
        super().__init__()
        self._area = 0.0
        self._since = -math.inf

    def _advance(self, now: float) -> float:
        """The load area up to ``now`` (a time before the last change counts as that change's time)."""
        if now > self._since:
            if self and self._since > -math.inf:
                self._area += len(self) * (now - self._since)
            self._since = now
        return self._area

    def add(self, now: float, request_id: str | None, expected_latency: float = 0.0) -> None:
        area = self._advance(now)
        if len(self) >= _MAX_IN_FLIGHT:
            del self[next(iter(self))]
        key: object = request_id if request_id is not None else next(_ANONYMOUS_PICKS)
        self.pop(key, None)  # the same request again (a retry here): it starts anew
        self[key] = (now, area, expected_latency)

    def take(self, request_id: str | None, now: float) -> tuple[float, float, float] | None:
        """Remove the request's entry (the oldest when its id is unknown) at ``now``; its (start, mean load
        over its life, itself included, expected latency). A request with no time in flight gets the load
        it leaves, itself included."""
        key: object | None = request_id if request_id is not None and request_id in self else None
        if key is None:
            if not self:
                return None
            key = next(iter(self))
        area = self._advance(now)
        load = float(len(self))
        start, area_at_start, expected = self.pop(key)
        if now > start and area > area_at_start:
            load = (area - area_at_start) / (now - start)
        return start, max(load, 1.0), expected

    def forget_before(self, cutoff: float, now: float) -> None:
        self._advance(now)
        while self:
            key = next(iter(self))
            if self[key][0] >= cutoff:
                return
            del self[key]


_BusyRow = tuple[int, _InFlight, float, float | None, tuple[float, float] | None, bool]
"""A candidate with requests in flight here: (index, its queue, oldest start, stall cut-off, expected (latency,
work) for overdue evidence, whether anything there is timed). See :meth:`RateBalancer._busy`."""


class _Cached(NamedTuple):
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
    :data:`_LOCAL_RECOMPUTE_SECONDS` (the lag the cache allows for this replica's own samples). At most
    :data:`_MAX_LOAD_PATTERNS`."""


class _GroupView:
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
        self.in_flight: dict[str, _InFlight] = {}
        self.finished: dict[str, tuple[str, float, float, float]] = {}
        """By request id: answers back (:meth:`RateBalancer.finish`) whose sample is not recorded yet, as
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
        """Per deployment: local time of its last second-opinion request (see :meth:`RateBalancer._probe`);
        dropped when a change is detected there."""
        self.single_answer: set[str] = set()
        """Deployments whose window (``derived.window_full``) holds a single answer (see :func:`_one_answer`);
        kept up to date wherever the window changes, so a decision does not test every candidate."""
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
        self.derived = _Derived()
        self.typical_work: float | None = None
        """A running estimate of the median ``work`` of the requests of known size chosen for here (see
        :meth:`RateBalancer.choose`); None before the first."""
        self.wasted: dict[str, collections.deque[float]] = {}
        """Per deployment (``selection: least_loaded``): local times until which this replica's recent
        failures there count as requests in flight (see :meth:`RateBalancer._least_loaded_pick`)."""
        self.cache: dict[tuple[Candidate, ...], _Cached] = {}
        """Per candidate set, as of the last sync (or own sample): its shares with nothing in flight here,
        and the states they came from (see :meth:`RateBalancer._compute`)."""


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
        self.settings = settings or RoutingSettings()
        self._store = store
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_store_error = on_store_error
        self._views: dict[str, _GroupView] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        s = self.settings
        self._round_robin = s.round_robin
        self._smooth = s.selection == "smooth"
        self._least_loaded = s.selection == "least_loaded"
        self._bucket_ms = s.effective_bucket_seconds * 1000
        self._window_ms = s.window_seconds * 1000
        self._recent_ms = s.failure_window_seconds * 1000
        keep_ms = max(self._window_ms, self._recent_ms, _USAGE_WINDOW_MS)
        self._retention_buckets = -(-keep_ms // self._bucket_ms) + 1
        # A bucket must outlive the window it may be read for, plus a refresh interval of slack.
        self._bucket_ttl_ms = keep_ms + 2 * self._bucket_ms + int(s.refresh_interval * 1000)
        self._limits_ttl_ms = int(s.rate_limit_header_max_age_seconds * 1000) + int(s.refresh_interval * 1000)
        self._last_error_log = float("-inf")
        # Longer than LiteLLM's default request timeout (600 s): a request still unreported then was lost.
        self._max_in_flight_age = max(float(s.window_seconds), 900.0)
        self._sample_half_life_ms = s.effective_sample_half_life * 1000.0
        self._track_in_flight = s.stall_latency_factor > 0 or s.in_flight_evidence or s.load_aware
        self._change_sigma = s.change_detection_sigma
        self._change_cooldown = s.effective_sample_half_life or float(s.window_seconds) / 4.0
        # How a deployment's rate depends on its load is a property of its capacity, which changes slower than
        # its rate: the fit fades over a whole window.
        self._load_half_life = float(s.window_seconds)
        # How latency grows with a request's size changes with its rate: the fit fades like the samples.
        self._size_half_life = self._change_cooldown

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
        if n == 1:
            index = 0
        else:
            cached = self._cached(view, candidates, now)
            computed = self._shares(view, candidates, now, detect=True, cached=cached)
            shares: Sequence[float] = computed.shares
            # Re-measuring and exploring go to requests of at most the typical size: a small request measures
            # a deployment as well as a large one, and a large one sent to a slow deployment is the request
            # that waits longest (the tail of the latency). Sizes unknown: every request may go.
            # (a size that is not a positive finite number counts as unknown: it must not poison the median)
            sized = work is not None and 0.0 < work < math.inf
            small = _small_request(view, work) if work is not None and sized else True
            probe = self._probe(view, candidates, now) if small else None
            if probe is not None:
                index = probe
            elif self._least_loaded:
                exploit = computed.exploit or shares
                index = self._least_loaded_pick(view, candidates, exploit, now, cached.idle, explore=small, sized=sized)
            elif self._smooth:
                if computed.mode == "bootstrap":
                    shares = self._bootstrap_picks(view, candidates, shares)
                index = _smooth_pick(view.credits, candidates, shares)
            else:
                index = self._draw(shares)
        chosen = candidates[index]
        view.last_attempt[chosen.id] = now
        if chosen.input_to_output_ratio is not None:
            view.ratios[chosen.id] = chosen.input_to_output_ratio
        if self._track_in_flight:
            queue = view.in_flight.get(chosen.id)
            if queue is None:
                queue = view.in_flight[chosen.id] = _InFlight()
            expected_latency = 0.0
            if work is not None and work > 0.0:
                size_fit = view.sizes.get(chosen.id)
                if size_fit is not None:
                    expected_latency = size_fit.expected_latency(work) or 0.0
            if expected_latency > 0.0:
                due = now + expected_latency
                earliest = view.earliest_due.get(chosen.id)
                if not queue or earliest is None or due < earliest:
                    view.earliest_due[chosen.id] = due
            queue.add(now, request_id, expected_latency)
        return index

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
        ratio = self.settings.ratio_for(model_group, input_to_output_ratio or view.ratios.get(deployment_id))
        rate = effective_rate(output_tokens, input_tokens, latency, ratio) if ok else 0.0
        work = output_tokens + input_tokens / ratio
        sample = RateAggregate()
        sample.add(rate, ok=ok, latency=latency, tokens=input_tokens + output_tokens, ttft=ttft)
        aggregate = view.pending.get(deployment_id)
        if aggregate is None:
            view.pending[deployment_id] = sample.copy()
        else:
            aggregate.merge(sample)
        if ok:
            view.last_answer[deployment_id] = now
            if view.failure_streak.pop(deployment_id, 0) >= _FAILURE_STREAK:
                view.cache.clear()  # it answers again: its failure share alone counts from now on
        else:
            streak = view.failure_streak[deployment_id] = view.failure_streak.get(deployment_id, 0) + 1
            if streak == _FAILURE_STREAK:
                view.cache.clear()  # failing as a whole: out of the shares at the next decision
        if ok and self._change_sigma > 0 and self._surprising(view, deployment_id, rate, load, work, latency):
            self._changed(view, deployment_id, now, now - latency)
        # The local view sees its own sample at once (the shared one at the next sync): a deployment has
        # samples as soon as one of its requests finished here, and a failure counts from this moment.
        self._add_local(view, deployment_id, sample)
        size_fit = view.sizes.get(deployment_id)
        if ok and self.settings.in_flight_evidence and rate > 0.0:
            if size_fit is None:
                size_fit = view.sizes[deployment_id] = SizeFit()
            # Fitted at light load: the part of the latency the load explains is taken out.
            size_fit.add(now, work, latency / self._slowdown(view, deployment_id, load), self._size_half_life)
        if ok and self.settings.load_aware and rate > 0.0:
            fit = view.loads.get(deployment_id)
            if fit is None:
                fit = view.loads[deployment_id] = LoadFit()
            base_latency = size_fit.base_latency() if size_fit is not None else None
            fit.add(now, load, rate, self._load_half_life, work=work, latency=latency, base_latency=base_latency)
        if not ok and self._least_loaded:
            # A failure took the place of a request that would have been in flight for a typical latency:
            # it counts as in flight for the rest of that time, so a deployment that fails at once does not
            # look idle (a failure that took longer, e.g. a timeout, was counted while it was in flight).
            expected = view.derived.expected.get(deployment_id) or view.derived.pooled_expected
            rest = (expected[0] if expected else 1.0) - latency
            if rest > 0.0:
                wasted = view.wasted.get(deployment_id)
                if wasted is None:
                    wasted = view.wasted[deployment_id] = collections.deque(maxlen=_MAX_IN_FLIGHT)
                wasted.append(now + rest)
        if rate_limits is not None:
            view.pending_limits[deployment_id] = rate_limits
        if view.pending_since is None:
            view.pending_since = now
        self._maybe_sync(model_group, view, now)

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
        if len(finished) >= _MAX_IN_FLIGHT:
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
        shares = self._shares(self._view(model_group), candidates, self._clock())
        return {c.id: share for c, share in zip(candidates, shares.shares, strict=True)}

    def estimates(
        self, model_group: str, candidates: Sequence[Candidate] | None = None
    ) -> dict[str, DeploymentEstimate]:
        """Per deployment: samples, mean / spread of its rates, failures, capacity, share and mode."""
        candidates = self._candidates_or_known(model_group, candidates)
        view = self._view(model_group)
        if not candidates:
            return {}
        now = self._clock()
        if self._round_robin:
            shares = Shares((1.0 / len(candidates),) * len(candidates), "round_robin", None, (1.0,) * len(candidates))
        else:
            shares = self._shares(view, candidates, now)
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
                capacity=self._capacity(view, c),
                in_flight=len(view.in_flight.get(c.id, ())),
                mode=shares.mode,
                sla=shares.sla,
                load_shift=self._load_shift(view, c.id),
            )
        return out

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

    def _maybe_sync(self, model_group: str, view: _GroupView, now: float) -> None:
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

    async def _sync(self, model_group: str, view: _GroupView) -> None:
        view.syncing = True
        deltas, view.pending = view.pending, {}
        limits, view.pending_limits = view.pending_limits, {}
        pending_since, view.pending_since = view.pending_since, None
        try:
            store = self._resolve_store()
            snapshot: RoutingSnapshot | None = None
            for _ in range(2):
                first, last = self._bucket_range(view)
                snapshot = await store.routing_sync(
                    model_group,
                    deltas,
                    limits,
                    first_bucket=first,
                    last_bucket=last,
                    bucket_ms=self._bucket_ms,
                    bucket_ttl_ms=self._bucket_ttl_ms,
                    limits_ttl_ms=self._limits_ttl_ms,
                )
                view.offset = snapshot.now_ms / 1000.0 - self._clock()
                limits = {}
                if snapshot.written:
                    break
            assert snapshot is not None
            if not snapshot.written:
                self._keep_pending(view, deltas, {}, pending_since)
            self._apply(view, snapshot)
        except Exception as exc:
            self._keep_pending(view, deltas, limits, pending_since)
            self._store_error(exc)
        finally:
            view.last_sync = self._clock()
            view.syncing = False

    def _resolve_store(self) -> RoutingStore:
        if hasattr(self._store, "routing_sync"):
            return cast("RoutingStore", self._store)
        factory: Callable[[], RoutingStore] = self._store  # type: ignore[assignment]
        return factory()

    def _bucket_range(self, view: _GroupView) -> tuple[int, int]:
        current = int((self._clock() + view.offset) * 1000) // self._bucket_ms
        oldest = current - self._retention_buckets
        first = oldest if view.closed_through is None else max(view.closed_through + 1, oldest)
        # One bucket ahead: the guess of the store's clock may lag by a little.
        return min(first, current + 1), current + 1

    def _keep_pending(
        self,
        view: _GroupView,
        deltas: Mapping[str, RateAggregate],
        limits: Mapping[str, RateLimitObservation],
        pending_since: float | None,
    ) -> None:
        # Keep unsent samples for the next sync, unless they are older than the window by then anyway.
        if pending_since is not None and self._clock() - pending_since > self.settings.window_seconds:
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

    def _apply(self, view: _GroupView, snapshot: RoutingSnapshot) -> None:
        for index in range(snapshot.first_bucket, snapshot.last_bucket + 1):
            data = snapshot.buckets.get(index)
            if data:
                view.buckets[index] = data
            else:
                view.buckets.pop(index, None)
        current = snapshot.now_ms // self._bucket_ms
        view.closed_through = min(snapshot.last_bucket, current - 1)
        oldest = current - self._retention_buckets
        for index in [i for i in view.buckets if i < oldest]:
            del view.buckets[index]
        view.limits = snapshot.limits
        # A pick whose call never reported back (dropped after routing) must not count for ever.
        now = self._clock()
        forgotten = now - self._max_in_flight_age
        for queue in view.in_flight.values():
            queue.forget_before(forgotten, now)
        view.derived = derived = self._derive(view.buckets, snapshot.now_ms, view.cutoff_ms)
        view.measured.update(derived.window_full, derived.usage)
        for deployment_id, bound in list(view.change_evidence.items()):
            if deployment_id in derived.window_full:
                del view.change_evidence[deployment_id]  # a real sample from after the change
            else:
                _add_to(derived.window_full, deployment_id, bound)
                if derived.window is not derived.window_full:
                    _add_to(derived.window, deployment_id, bound)
        view.single_answer = {d for d, window in derived.window_full.items() if _one_answer(window)}
        # Samples recorded while this sync was in flight are not in the snapshot yet: keep them in the view.
        for deployment_id, pending in view.pending.items():
            self._add_local(view, deployment_id, pending)
        view.cache.clear()
        view.dirty_at = None

    def _add_local(self, view: _GroupView, deployment_id: str, sample: RateAggregate) -> None:
        """Count a sample of this replica in the local view until a sync brings it back from the store."""
        derived = view.derived
        new = deployment_id not in derived.window
        view.measured.add(deployment_id)
        _add_to(derived.window_full, deployment_id, sample)
        if derived.window is not derived.window_full:
            _add_to(derived.window, deployment_id, sample)
        _note_answers(view, deployment_id)
        _add_to(derived.recent, deployment_id, sample)
        _add_to(derived.usage, deployment_id, sample)
        attempts, failures = derived.failure_weights.get(deployment_id, (0.0, 0.0))
        derived.failure_weights[deployment_id] = (attempts + sample.count, failures + sample.failures)
        if deployment_id not in derived.expected:
            self._set_expected(derived, deployment_id)
        if new:
            view.cache.clear()  # a candidate set may leave the bootstrap now
        elif view.dirty_at is None:
            # The cached shares lag behind this sample: recomputed within _LOCAL_RECOMPUTE_SECONDS (not at
            # every finish, which at high traffic would make nearly every decision a cache miss).
            view.dirty_at = self._clock()

    def _set_expected(self, derived: _Derived, deployment_id: str) -> None:
        window = derived.window_full.get(deployment_id)
        latency = window.mean_ok_latency if window is not None else None
        rate = window.mean_ok_rate if window is not None else None
        if latency is not None and latency <= 0.0:
            latency = None  # (only samples written without a latency, e.g. by another replica: unknown)
        if latency is not None and rate is not None:
            derived.expected[deployment_id] = (latency, latency * rate)
        if derived.pooled_expected is None and latency is not None and rate is not None:
            derived.pooled_expected = (latency, latency * rate)
        stall = self.settings.stall_min_seconds
        if latency is not None:
            stall = max(stall, self.settings.stall_latency_factor * latency)
        derived.stall_after[deployment_id] = stall

    def _derive(
        self,
        buckets: Mapping[int, Mapping[str, RateAggregate]],
        now_ms: int,
        cutoff_ms: Mapping[str, float] | None = None,
    ) -> _Derived:
        """Window, recent and usage aggregates per deployment as of store time ``now_ms``.

        A bucket belongs to a window of length W when it ends after ``now - W``. In the window a bucket's
        samples count ``recency_weight(age of its middle)``; usage (for tpm / rpm) counts them fully.
        """
        derived = _Derived()
        derived.now_ms = now_ms
        width = self._bucket_ms
        adaptive = self.settings.adaptive_window
        min_samples = self.settings.adaptive_min_samples
        half_life_ms = self.settings.failure_half_life_seconds * 1000.0
        sample_half_life_ms = self._sample_half_life_ms
        for index in sorted(buckets, reverse=True):  # newest first, for the adaptive window
            end = (index + 1) * width
            in_window = end > now_ms - self._window_ms
            in_recent = end > now_ms - self._recent_ms
            in_usage = end > now_ms - _USAGE_WINDOW_MS
            if not (in_window or in_recent or in_usage):
                continue
            age_ms = max(now_ms - (end - width / 2), 0.0)
            decay = 1.0
            if half_life_ms > 0:
                # Age of the bucket's middle: the newest failures count most, so a deployment that starts
                # failing loses its share within a few half-lives, not after the whole failure window.
                decay = 0.5 ** (age_ms / half_life_ms)
            weight = recency_weight(age_ms, sample_half_life_ms)
            for deployment_id, agg in buckets[index].items():
                if in_window and cutoff_ms and end <= cutoff_ms.get(deployment_id, -1.0):
                    in_window_here = False  # from before a detected change of this deployment
                else:
                    in_window_here = in_window
                if in_window_here:
                    _add_to(derived.window_full, deployment_id, agg, weight)
                    if adaptive:
                        chosen = derived.window.get(deployment_id)
                        if chosen is None or chosen.count < min_samples:
                            _add_to(derived.window, deployment_id, agg, weight)
                if in_recent:
                    _add_to(derived.recent, deployment_id, agg)
                    attempts, failures = derived.failure_weights.get(deployment_id, (0.0, 0.0))
                    derived.failure_weights[deployment_id] = (
                        attempts + decay * agg.count,
                        failures + decay * agg.failures,
                    )
                if in_usage:
                    _add_to(derived.usage, deployment_id, agg)
        if not adaptive:
            derived.window = derived.window_full
        latency_sum = work_sum = ok_sum = 0.0
        for deployment_id, agg in derived.window_full.items():
            self._set_expected(derived, deployment_id)
            ok = agg.count - agg.failures
            if deployment_id in derived.expected and ok > 0:
                latency, work = derived.expected[deployment_id]
                latency_sum += ok * latency
                work_sum += ok * work
                ok_sum += ok
        derived.pooled_expected = (latency_sum / ok_sum, work_sum / ok_sum) if ok_sum > 0 else None
        return derived

    # -- shares ---------------------------------------------------------------------------------------
    def _cached(self, view: _GroupView, candidates: Sequence[Candidate], now: float) -> _Cached:
        """The candidate set's states and idle shares as of this sync (worked out once per cache)."""
        key = tuple(candidates)
        if view.dirty_at is not None and now - view.dirty_at >= _LOCAL_RECOMPUTE_SECONDS:
            view.cache.clear()
            view.dirty_at = None
        cached = view.cache.get(key)
        if cached is None:
            cached = self._compute(view, candidates)
            if len(view.cache) >= _MAX_CACHED_SETS:
                view.cache.clear()
            view.cache[key] = cached
        return cached

    def _shares(
        self,
        view: _GroupView,
        candidates: Sequence[Candidate],
        now: float,
        *,
        detect: bool = False,
        cached: _Cached | None = None,
    ) -> Shares:
        """Shares of a candidate set now: the cached ones of this sync (``cached``, when the caller has
        them), adjusted for what the requests in flight here show (stalls, overdue requests, load) when
        there are any."""
        if cached is None:
            cached = self._cached(view, candidates, now)
        shares = cached.shares
        if not view.in_flight:
            return shares
        busy = self._busy(view, candidates, now)
        if busy is None:
            return shares  # nothing in flight here: the cached shares already hold the idle load correction
        pattern, timed, rows = busy
        if timed:
            pattern = (*pattern, detect)  # change detection changes timed evidence only
        known = cached.at_load.get(pattern)
        if known is not None and now < known[1]:
            return known[0]  # the same pattern in flight as a decision shortly before
        sla = shares.sla if shares.mode == "weighted" else None
        live = self._live_states(view, candidates, cached, now, rows, detect=detect, sla=sla)
        s = self.settings
        if live is None:
            result = shares
        else:
            states, weighed = live
            if weighed is not None:
                result = reweigh(shares, states, weighed, exploration_share=s.exploration_share)
            else:
                # The SLA comes from finished samples only (unchanged since the sync); in bootstrap mode
                # overdue samples may complete the set, and then the SLA is computed from them too.
                result = self._compute_shares(states, sla)
        if len(cached.at_load) >= _MAX_LOAD_PATTERNS:
            cached.at_load.clear()
        cached.at_load[pattern] = (result, now + _LOCAL_RECOMPUTE_SECONDS if timed else math.inf)
        return result

    def _busy(
        self, view: _GroupView, candidates: Sequence[Candidate], now: float
    ) -> tuple[tuple[int, ...], bool, list[_BusyRow]] | None:
        """(in-flight pattern, whether anything is timed, rows); None when no candidate has a request in
        flight here. The pattern: the number of requests in flight here at each candidate, negated where
        something there is timed (stalled or overdue). A row per candidate with requests in flight here:
        (index, queue, oldest start, stall cut-off, expected (latency, work) for overdue evidence, whether
        anything there is timed). O(candidates)."""
        s = self.settings
        derived = view.derived
        stall_after = derived.stall_after if s.stall_latency_factor > 0 else None
        default_stall = s.stall_min_seconds
        expected_by = derived.expected if s.in_flight_evidence else None
        pooled_expected = derived.pooled_expected
        in_flight = view.in_flight
        earliest_due = view.earliest_due
        rows: list[_BusyRow] = []
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

    def _live_states(
        self,
        view: _GroupView,
        candidates: Sequence[Candidate],
        cached: _Cached,
        now: float,
        rows: Sequence[_BusyRow],
        *,
        detect: bool = False,
        sla: float | None = None,
    ) -> tuple[list[DeploymentState], dict[int, tuple[float, float]] | None] | None:
        """The cached idle states with this replica's in-flight evidence added, and (in weighted mode, given
        the ``sla``) the :func:`weigh` result of each one that differs from its idle state, by index (None:
        the shares must be computed afresh); None when no state differs.

        ``rows``: the candidates with requests in flight here (:meth:`_busy`). A candidate with nothing in
        flight here keeps its cached idle state; only the ones in ``rows`` are worked out again.

        Per candidate: requests in flight longer than ``stall_after`` count as failures happening now
        (stall detection); with ``in_flight_evidence`` each request in flight longer than it was expected
        to take (a request of its size there, when its size is known; else the deployment's mean latency) is
        a sample of rate ``mean rate / lateness``, ``lateness = age / expected latency`` (the most it can
        still achieve); with
        ``load_aware`` the estimate moves to the current load (:class:`LoadFit`). O(candidates) plus at most
        :data:`_MAX_OVERDUE_SAMPLES` requests per candidate.

        Given the ``sla`` (weighted mode), the bound of an overdue request at a deployment without successful
        samples of its own is capped below it (:data:`_UNMEASURED_BOUND`).
        """
        out: list[DeploymentState] | None = None
        weighed: dict[int, tuple[float, float]] | None = {} if sla is not None else None
        memo = cached.loaded
        # (a candidate without a row has nothing in flight here: its idle state is in the cached shares)
        for i, queue, oldest, stall_limit, expected, timed in rows:
            c = candidates[i]
            busy = len(queue)
            if timed:
                state_at_load, weight = self._evidence_state(
                    view,
                    c.id,
                    i,
                    cached,
                    queue,
                    oldest,
                    now,
                    stall_limit,
                    expected,
                    detect=detect,
                    sla=sla,
                    slots=c.slots,
                )
            else:
                # Nothing timed to see (stalled or overdue): the state depends on the load only.
                known = memo.get((i, busy))
                if known is None:
                    known = memo[(i, busy)] = self._evidence_state(
                        view, c.id, i, cached, queue, oldest, now, None, None, detect=False, sla=sla, slots=c.slots
                    )
                state_at_load, weight = known
            if state_at_load is None:
                continue
            if out is None:
                out = list(cached.idle)
            out[i] = state_at_load
            if weighed is not None:
                if weight is None:
                    weighed = None
                else:
                    weighed[i] = weight
        return None if out is None else (out, weighed)

    def _evidence_state(
        self,
        view: _GroupView,
        deployment_id: str,
        index: int,
        cached: _Cached,
        queue: _InFlight,
        oldest: float,
        now: float,
        stall_limit: float | None,
        expected: tuple[float, float] | None,
        *,
        detect: bool,
        sla: float | None,
        slots: float | None = None,
    ) -> tuple[DeploymentState | None, tuple[float, float] | None]:
        """One candidate's state with its requests in flight here (None: its idle state stands), and its
        :func:`weigh` result given the ``sla``. ``stall_limit`` / ``expected``: the stall cut-off and the
        (latency, work) for overdue evidence, or None where there is none to look for. ``slots``: the
        candidate's configured slots, if any."""
        s = self.settings
        derived = view.derived
        state = cached.states[index]
        load = float(len(queue))
        # (the fit is looked up once, for the load correction and the slowdown of overdue requests)
        fit = view.loads.get(deployment_id) if s.load_aware else None
        shift, spread, slots_left = _load_correction(fit, load, state.window.mean, slots)
        stalled = 0
        if stall_limit is not None and oldest <= stall_limit:
            for started, _, _ in queue.values():
                if started > stall_limit or stalled >= _MAX_STALL_SCAN:
                    break
                stalled += 1
        overdue: RateAggregate | None = None
        # (lateness, age, whether its size was known) of each overdue request: lateness = age / the latency it
        # was expected to take (one of its size when known, else the deployment's mean latency).
        late: list[tuple[float, float, bool]] = []
        if expected is not None:
            latency, work = expected
            earliest_due = math.inf
            mean_rate = work / latency
            # A request of known size is expected to take its light-load latency times what the load costs
            # now (the load may have grown since it started: judging it by the load it met would read a
            # deployment filling up its slots as one that slowed down).
            slowdown = 1.0 if fit is None else fit.slowdown(load)
            for scanned, (started, _, light_latency) in enumerate(queue.values()):  # oldest first
                if scanned >= _MAX_DUE_SCAN:
                    break
                sized = light_latency > 0.0
                own_latency = light_latency * slowdown
                due_after = own_latency if sized else latency
                age = now - started
                if age > due_after:
                    if len(late) < _MAX_OVERDUE_SAMPLES:
                        late.append((age / due_after, age, sized))
                elif sized and started + light_latency < earliest_due:
                    earliest_due = started + light_latency  # (no later than its due time at any load)
            view.earliest_due[deployment_id] = earliest_due
        if late:
            if len(late) > 1:
                late.sort(reverse=True)  # the latest first
            evidence = (
                self._slowdown_evidence(view, deployment_id, late[:_JOINT_EVIDENCE], mean_rate, now)
                if detect and self._change_sigma > 0
                else None
            )
            # Its latest requests are far slower than its samples: changed before the first of them was due
            # (the samples that finished since then are of the new regime, or straddle it).
            if evidence is not None and self._changed(view, deployment_id, now, evidence[1], evidence[0]):
                state_window = derived.window.get(deployment_id) or RateAggregate()
            else:
                state_window = state.window
            overdue = state_window.copy()
            # Without a successful sample of its own the bound comes from the group's typical work: an upper
            # bound, not a measurement, so it is not taken to beat the SLA before an answer does.
            ceiling = _UNMEASURED_BOUND * sla if sla is not None and deployment_id not in derived.expected else None
            for lateness, age, _ in late:
                # The most it can still achieve: the typical rate, slowed by how late it is already.
                bound = mean_rate / lateness
                if ceiling is not None and bound > ceiling:
                    bound = ceiling
                overdue.add(bound, latency=age)
        unchanged = shift == 0.0 and spread is None and stalled == 0 and overdue is None and slots_left == 1.0
        if unchanged and state is cached.idle[index]:
            return None, None
        # A stalled request is a failure happening now: full weight. The deployment as a whole has stalled,
        # and its recent attempts count as failed until it answers again, when no answer at all has come
        # back here while requests are stuck there (for as long as the stall cut-off), or while several are
        # overdue together (for a typical latency: each of them would have answered by then more often
        # than not). Its overdue requests then count as attempts too, so its failure share is 1 even when
        # nothing of it was recorded within the failure window.
        last_answer = view.last_answer.get(deployment_id, -math.inf)
        whole_stall = (stalled > 0 and stall_limit is not None and last_answer < stall_limit) or (
            expected is not None and len(late) >= _STALL_QUORUM and last_answer < now - expected[0]
        )
        attempts = state.recent_attempts + (max(stalled, len(late)) if whole_stall else stalled)
        # (positional: this runs on every decision that works in-flight evidence out afresh)
        new_state = DeploymentState(
            overdue if overdue is not None else state.window,  # window
            attempts,  # recent_attempts
            attempts if whole_stall else state.recent_failures + stalled,  # recent_failures
            state.capacity * slots_left,  # capacity
            shift,  # load_shift
            spread,  # load_spread
            state.stale,  # stale
        )
        weight = None
        if sla is not None and new_state.window.count > 0:
            weight = weigh(new_state, sla, s.greediness, s.estimator, s.failure_penalty, s.prior_samples)
        return new_state, weight

    def _slowdown(self, view: _GroupView, deployment_id: str, load: float) -> float:
        """:meth:`LoadFit.slowdown` of the deployment at ``load`` (1 without a load fit)."""
        fit = view.loads.get(deployment_id) if self.settings.load_aware else None
        return 1.0 if fit is None else fit.slowdown(load)

    def _load_shift(self, view: _GroupView, deployment_id: str) -> float:
        fit = view.loads.get(deployment_id) if self.settings.load_aware else None
        if fit is None:
            return 0.0
        queue = view.in_flight.get(deployment_id)
        window = view.derived.window.get(deployment_id)
        return fit.shift(float(len(queue) + 1 if queue else 1), window.mean if window is not None else 0.0)

    def _compute(self, view: _GroupView, candidates: Sequence[Candidate]) -> _Cached:
        """The candidate set's states from the synced view, and its shares with nothing in flight here."""
        derived = view.derived
        empty = RateAggregate()
        states: list[DeploymentState] = []
        # (recent counts of the failure penalty are age-weighted, see _derive)
        streaks = view.failure_streak
        # Stale only where exploration can measure it again: with no exploration a deployment whose samples
        # aged out would never be tried again, so it starts the bootstrap as in the proposal.
        measured = view.measured if self.settings.exploration_share > 0.0 else ()
        for c in candidates:
            attempts, failures = derived.failure_weights.get(c.id, (0.0, 0.0))
            if streaks.get(c.id, 0) >= _FAILURE_STREAK:
                failures = attempts = max(attempts, 1.0)  # failing as a whole (see _FAILURE_STREAK)
            window = derived.window.get(c.id, empty)
            states.append(
                DeploymentState(
                    window=window,
                    recent_attempts=attempts,
                    recent_failures=failures,
                    capacity=self._capacity(view, c),
                    stale=window.count <= 0 and c.id in measured,
                )
            )
        s = self.settings
        loads = view.loads if s.load_aware else None
        idle = list(states)
        if loads or any(c.slots for c in candidates):
            for i, c in enumerate(candidates):
                fit = loads.get(c.id) if loads is not None else None
                shift, spread, slots_left = _load_correction(fit, 0.0, states[i].window.mean, c.slots)
                if shift != 0.0 or spread is not None or slots_left != 1.0:
                    state = states[i]
                    idle[i] = DeploymentState(
                        window=state.window,
                        recent_attempts=state.recent_attempts,
                        recent_failures=state.recent_failures,
                        capacity=state.capacity * slots_left,
                        load_shift=shift,
                        load_spread=spread,
                        stale=state.stale,
                    )
        return _Cached(self._compute_shares(idle), tuple(states), tuple(idle), {}, {})

    def _compute_shares(self, states: Sequence[DeploymentState], sla: float | None = None) -> Shares:
        """:func:`compute_shares` of ``states`` with this balancer's settings (``sla``: when known)."""
        s = self.settings
        return compute_shares(
            states,
            greediness=s.greediness,
            estimator=s.estimator,
            exploration_share=s.exploration_share,
            failure_penalty=s.failure_penalty,
            prior_samples=s.prior_samples,
            sla=sla,
        )

    def _capacity(self, view: _GroupView, candidate: Candidate) -> float:
        headroom = self.settings.rate_limit_headroom
        if headroom <= 0:
            return 1.0
        fractions: list[float] = []
        obs = view.limits.get(candidate.id)
        if obs is not None and obs.is_current(view.derived.now_ms, self.settings.rate_limit_header_max_age_seconds):
            left = obs.fraction_left()
            if left is not None:
                fractions.append(left)
        usage = view.derived.usage.get(candidate.id)
        if candidate.tpm:
            fractions.append(1.0 - (usage.tokens if usage else 0) / candidate.tpm)
        if candidate.rpm:
            fractions.append(1.0 - (usage.count if usage else 0) / candidate.rpm)
        return headroom_multiplier(min(fractions), headroom) if fractions else 1.0

    # -- change detection -----------------------------------------------------------------------------
    def _surprising(
        self, view: _GroupView, deployment_id: str, rate: float, load: float, work: float, latency: float
    ) -> bool:
        """Whether a finished request of ``work`` tokens that took ``latency`` seconds at ``load`` requests in
        flight is far outside what the deployment was expected to give. Judged, in this order, by the first
        that knows its spread: its size fit (``log(latency / predicted)`` beyond ``change_detection_sigma``
        spreads, the prediction for a request of that size, slowed by what the load fit says the load
        costs), its load fit (the rate at that load), its recency-weighted window (see
        :func:`_change_scale`). So a short answer that is slow only for being short, or a deployment slowed
        or sped up by its own load, has not changed."""
        size_fit = view.sizes.get(deployment_id)
        if size_fit is not None and work > 0.0 and latency > 0.0:
            predicted = size_fit.expected_latency(work)
            size_spread = size_fit.spread()
            if predicted is not None and size_spread is not None:
                predicted *= self._slowdown(view, deployment_id, load)
                cut = self._change_sigma * max(size_spread, _MIN_LOG_SPREAD)
                return abs(math.log(latency / predicted)) > cut
        fit = view.loads.get(deployment_id) if self.settings.load_aware else None
        if fit is not None:
            expected = fit.expected_rate(load)
            spread = fit.spread()
            if expected is not None and spread is not None:
                return abs(rate - expected) > self._change_sigma * max(spread, 0.1 * expected)
        scale = _change_scale(view, deployment_id)
        return scale is not None and abs(rate - scale[0]) > self._change_sigma * scale[1]

    def _slowdown_evidence(
        self,
        view: _GroupView,
        deployment_id: str,
        late: Sequence[tuple[float, float, bool]],
        mean_rate: float,
        now: float,
    ) -> tuple[float, float] | None:
        """(rate bound standing for the deployment, local time at which the first of them was due) when its
        ``m`` latest overdue requests (``late``: (lateness, age, size known), the latest first; lateness = age
        / expected latency) show, for some ``m``, that it has slowed down; else ``None``.

        Requests of known size were expected to take what one of their size takes there (:class:`SizeFit`):
        once the fit knows its spread, the mean of the ``m`` largest ``log(lateness)`` among them must exceed
        ``change_detection_sigma`` times that spread (at least :data:`_MIN_LOG_SPREAD`) over ``sqrt(m)``.
        Failing that, over all of them, the mean of the ``m`` smallest rate bounds ``mean_rate / lateness``
        must lie ``change_detection_sigma`` standard errors (``spread / sqrt(m)``, see :func:`_change_scale`)
        below the deployment's window mean. The bound returned is ``mean_rate`` over the mean lateness of the
        ``m`` requests.

        One request must be ``sigma`` spreads slow to count; ``m`` slow requests together need only
        ``sigma / sqrt(m)`` each, as for the mean of ``m`` samples. A deployment that slowed down has several
        requests in flight when its first answer is still due, so this can see the change once they are
        ``sigma / sqrt(m)`` spreads slow instead of ``sigma``. An overdue request's lateness is a lower bound
        of the one it will have, so the test errs on the side of no change."""
        if not late:
            return None
        size_fit = view.sizes.get(deployment_id)
        size_spread = size_fit.spread() if size_fit is not None else None
        if size_spread is not None:
            cut = self._change_sigma * max(size_spread, _MIN_LOG_SPREAD)
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
        scale = _change_scale(view, deployment_id)
        if scale is None:
            return None
        mean, spread = scale
        total = 0.0
        first_due = now
        for m, (lateness, age, _) in enumerate(late, start=1):
            total += mean_rate / lateness
            first_due = min(first_due, now - age + age / lateness)
            if mean - total / m > self._change_sigma * spread / math.sqrt(m):
                return total / m, first_due
        return None

    def _changed(
        self, view: _GroupView, deployment_id: str, now: float, since: float, evidence: float | None = None
    ) -> bool:
        """A deployment's rate changed at local time ``since``: forget its samples from before, and have every
        other deployment re-measured with one request (a change seldom comes alone, and the ones that got
        little traffic are known only from old samples). False (nothing done) within a half-life of the
        deployment's previous change."""
        last = view.changed.get(deployment_id)
        if last is not None and now - last < self._change_cooldown:
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
            if carried is not None:
                view.loads[deployment_id] = LoadFit(carried_slots=carried)
        view.sizes.pop(deployment_id, None)
        view.second_opinions.pop(deployment_id, None)
        if evidence is not None:
            # The rate bound that revealed the change stands for the deployment until a sample from after
            # the change arrives (with no sample at all it would be stale: no weight, exploration aside).
            bound = RateAggregate()
            bound.add(evidence)
            view.change_evidence[deployment_id] = bound
            _add_to(derived.window_full, deployment_id, bound)
            if derived.window is not derived.window_full:
                _add_to(derived.window, deployment_id, bound)
        _note_answers(view, deployment_id)
        if now - view.probed_at >= self._change_cooldown:
            # One round of re-measuring per half-life and group: the changes it reveals in turn must not
            # start another round at once (each would send a request to every deployment again).
            view.probed_at = now
            known = set(derived.window_full) | view.measured | {d for d, q in view.in_flight.items() if q}
            view.probes = {d for d in known if d != deployment_id}
        view.cache.clear()
        return True

    def _probe(self, view: _GroupView, candidates: Sequence[Candidate], now: float) -> int | None:
        """Index of a candidate due for a re-measuring request (None: none due), unless it has a request in
        flight already: after another deployment changed, each one once; a deployment whose window holds a
        single answer (no spread to fit, so one answer slowed by a hiccup would write it off until exploration
        finds it again), once per ``window_seconds`` and after each change detected there; and a deployment
        whose recent attempts mostly failed (or that is failing as a whole, see :data:`_FAILURE_STREAK`),
        once per ``failure_half_life_seconds`` (so its recovery is seen within a few seconds, at the cost of
        one request each time it is still failing). :meth:`choose` asks only for requests of at most the
        typical size: a due probe waits for the next of those."""
        if view.probes:
            for i, c in enumerate(candidates):
                if c.id in view.probes:
                    view.probes.discard(c.id)
                    if not view.in_flight.get(c.id):
                        return i
        single = view.single_answer
        if single:
            asked = view.second_opinions
            ask_again_after = now - self.settings.window_seconds
            for i, c in enumerate(candidates):
                due = c.id in single and asked.get(c.id, ask_again_after) <= ask_again_after
                if due and not view.in_flight.get(c.id):
                    asked[c.id] = now
                    return i
        retry_after = self.settings.failure_half_life_seconds
        if retry_after <= 0 or self.settings.failure_penalty <= 0:
            return None
        weights = view.derived.failure_weights
        if not weights:
            return None
        streaks = view.failure_streak
        for i, c in enumerate(candidates):
            attempts, failures = weights.get(c.id, (0.0, 0.0))
            if failures > 0.5 * attempts > 0.0 or streaks.get(c.id, 0) >= _FAILURE_STREAK:
                due = now - view.last_attempt.get(c.id, now) >= retry_after
                if due and not view.in_flight.get(c.id):
                    return i
        return None

    def _bootstrap_picks(
        self, view: _GroupView, candidates: Sequence[Candidate], shares: Sequence[float]
    ) -> Sequence[float]:
        """Bootstrap shares for the smooth pick: a candidate without samples that has a request in flight here
        already had its chance (its answer ends the bootstrap), so the picks go evenly to the others until it
        answers; when that leaves none, evenly to the candidates with the fewest requests in flight here. The
        shares reported (:meth:`weights`) stay equal."""
        window = view.derived.window
        in_flight = view.in_flight
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

    def _least_loaded_pick(
        self,
        view: _GroupView,
        candidates: Sequence[Candidate],
        shares: Sequence[float],
        now: float,
        idle_states: Sequence[DeploymentState],
        *,
        explore: bool = True,
        sized: bool = False,
    ) -> int:
        """``selection: least_loaded`` (weighted least connections): the candidate with the fewest requests
        in flight here for its share, ``(in flight + 1) / share``, ties drawn at random; with none in flight
        here at any candidate, the one with a share whose expected rate is highest. A failure logged
        here counts as in flight for the deployment's typical latency (a deployment that fails at once
        would otherwise look idle and draw every request). ``shares`` are the ones without the exploration
        part; the ``exploration_share`` of the decisions is a uniform draw instead, so each candidate keeps
        being measured whatever its load here. Only requests with ``explore`` set are drawn for it; when
        requests are ``sized``, those are the half at most the typical size (see :func:`_small_request`), so
        they are drawn twice as often and the share of decisions stays the same. O(candidates)."""
        rng = self._rng
        if explore and rng.random() < self.settings.exploration_share * (_SMALL_BOOST if sized else 1.0):
            return rng.randrange(len(candidates))
        in_flight = view.in_flight
        wasted_by = view.wasted
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
            return self._draw(shares)
        if idle:
            # Nothing in flight here: no load to balance. The lowest score is then the largest share, the
            # probability of beating an SLA that the deployment with the most samples sets; with one
            # request at a time a faster deployment just behind it in share would never get the samples
            # that could put it ahead. Greedy by what the oracle looks at instead: the expected rate.
            return _best_expected_rate(idle_states, shares, best)
        return best

    def _draw(self, shares: Sequence[float]) -> int:
        point = self._rng.random()
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

    # -- helpers --------------------------------------------------------------------------------------
    def _view(self, model_group: str) -> _GroupView:
        view = self._views.get(model_group)
        if view is None:
            view = self._views[model_group] = _GroupView()
        return view

    def _candidates_or_known(self, model_group: str, candidates: Sequence[Candidate] | None) -> list[Candidate]:
        if candidates is not None:
            return list(candidates)
        view = self._views.get(model_group)
        if view is None:
            return []
        known = set(view.derived.window_full) | set(view.derived.usage) | set(view.in_flight)
        return [Candidate(d, view.ratios.get(d)) for d in sorted(known)]


_CREDIT_LIMIT = 1.0
"""Bound of a smooth round-robin credit, in decisions: a deployment whose share fell sharply (or that was not a
candidate for a while) neither owes nor is owed more than one pick."""


def _small_request(view: _GroupView, work: float) -> bool:
    """Whether a request of ``work`` (positive, finite) is at most the typical size here (True while no size
    is known yet); moves the typical size (a running median) toward it. The median moves by a fixed
    fraction per request, up or down, so it settles where half the requests are above it."""
    typical = view.typical_work
    if typical is None:
        view.typical_work = work
        return True
    view.typical_work = typical * (_MEDIAN_STEP if work > typical else 1.0 / _MEDIAN_STEP)
    return work <= typical


def _smooth_pick(credits: dict[str, float], candidates: Sequence[Candidate], shares: Sequence[float]) -> int:
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
    credits[candidates[best].id] = max(best_credit - total, -_CREDIT_LIMIT)
    if best_credit > _CREDIT_LIMIT:
        # Clamp the owed side too (after choosing), so a sudden share change settles within a pick.
        for i, c in enumerate(candidates):
            if i != best and credits.get(c.id, 0.0) > _CREDIT_LIMIT:
                credits[c.id] = _CREDIT_LIMIT
    return best


def _load_correction(
    fit: LoadFit | None,
    busy: float,
    window_mean: float,
    configured_slots: float | None = None,
) -> tuple[float, float | None, float]:
    """(load shift, load spread, slots-left multiplier) of a deployment with ``busy`` requests in flight
    here, for the decision that would add one more; (0, None, 1) without a load fit or configured slots.
    Configured slots stand for the learnt ones. ``fit``: the deployment's load fit (None: none, or load
    awareness off)."""
    slots = configured_slots if configured_slots is not None else fit.slots() if fit is not None else None
    # Configured, or seen saturated: scale the share down as the slots fill up (to 0 when full).
    slots_left = 1.0 if slots is None else headroom_multiplier(max(slots - busy, 0.0) / slots, _SLOTS_HEADROOM)
    if fit is None:
        return 0.0, None, slots_left
    return fit.shift(busy + 1.0, window_mean), fit.spread(), slots_left


def _change_scale(view: _GroupView, deployment_id: str) -> tuple[float, float] | None:
    """(mean, spread) a change is measured against: the deployment's recency-weighted window mean and its
    standard deviation (at least 10 % of the mean); ``None`` with too few successful samples to say."""
    window = view.derived.window_full.get(deployment_id)
    if window is None or window.count - window.failures < _CHANGE_MIN_SAMPLES:
        return None
    mean = window.mean_ok_rate
    if mean is None:
        return None
    return mean, max(window.std, 0.1 * mean)


def _best_expected_rate(idle_states: Sequence[DeploymentState], shares: Sequence[float], fallback: int) -> int:
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


def _one_answer(window: RateAggregate | None) -> bool:
    """Whether ``window`` holds successful answers that all gave the same rate (one answer, in practice):
    the normal fit of such a window is a point mass, which beats an SLA either surely or never."""
    moments = window.ok_moments() if window is not None else None
    if moments is None:
        return False
    _, mean, variance = moments
    return variance <= 1e-12 * max(1.0, mean * mean)


def _note_answers(view: _GroupView, deployment_id: str) -> None:
    """Bring ``view.single_answer`` up to date after the deployment's window changed."""
    if _one_answer(view.derived.window_full.get(deployment_id)):
        view.single_answer.add(deployment_id)
    else:
        view.single_answer.discard(deployment_id)


def _add_to(target: dict[str, RateAggregate], deployment_id: str, agg: RateAggregate, weight: float = 1.0) -> None:
    existing = target.get(deployment_id)
    if existing is None:
        existing = target[deployment_id] = RateAggregate()
    existing.merge_scaled(agg, weight)


async def routing_status(
    store: RoutingStore,
    settings: RoutingSettings,
    model_group: str,
    deployments: Sequence[str | Candidate],
) -> list[DeploymentEstimate]:
    """What routing currently believes about ``deployments`` of ``model_group``, read from the store alone.

    For the ``status`` command and dashboards: no live Router and no proxy needed. One read of the shared
    statistics (nothing is written), then per deployment, in the order given: estimated rate (``mean_rate``,
    ``std_rate``, recency-weighted as routing uses them), ``samples``, failures, and ``share``, the choice
    probability among exactly these deployments computed as routing computes it from the shared view
    (rate-limit headers included; configured tpm / rpm only when passed as :class:`Candidate`). What only a
    serving replica knows (its requests in flight, its load fit) is not part of it, so a replica's live
    weights can differ while requests are in flight there.
    """
    balancer = await read_balancer(store, settings, model_group)
    candidates = [d if isinstance(d, Candidate) else Candidate(str(d)) for d in deployments]
    estimates = balancer.estimates(model_group, candidates)
    return [estimates[c.id] for c in candidates]


async def read_balancer(
    store: RoutingStore,
    settings: RoutingSettings,
    model_group: str,
    *,
    on_store_error: Callable[[BaseException], None] | None = None,
) -> RateBalancer:
    """A balancer of its own holding the shared view of ``model_group``, read once from the store (nothing is
    written): what :func:`routing_status` answers from, and the ``status`` command when it needs more than
    that (the deployments the store knows, store faults reported through ``on_store_error``)."""
    balancer = RateBalancer(store, settings, on_store_error=on_store_error)
    await balancer.refresh(model_group)
    if abs(balancer._view(model_group).offset) * 1000 >= balancer._bucket_ms:
        # The store's clock is not this machine's: the first read asked for the wrong buckets.
        await balancer.refresh(model_group)
    return balancer
