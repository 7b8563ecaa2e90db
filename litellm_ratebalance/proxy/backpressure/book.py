"""Backpressure's state in one process: the deployments it manages, the leases (slots) this process holds,
and the pure decision for one request against one deployment.

* :class:`Profile`: what a request is to the policy (tier, prompt, its ``max_tokens``, fairness key);
* :class:`Lease`: one slot this process took in the shared store, and the tokens it reserved there;
* :class:`DeploymentState`: one deployment's limit, last known shared counts, queue, leases, learned output;
* :class:`Context`: everything bound to one event loop and one settings object, with the lease book
  (leases by LiteLLM call id) and :meth:`Context.decide`, which feeds the pure policy
  (:func:`~litellm_ratebalance.overload.shedding.decide`) with this process's view;
* :class:`BackpressureProcess`: the one live context of this process, kept in the runtime's registry, where
  routing consults it as the deployment gate.

Nothing here does I/O: the store calls live in :mod:`.admit` and :mod:`.maintain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from litellm_ratebalance.overload.config import BackpressureSettings, DeploymentConfig, LimitSettings
from litellm_ratebalance.overload.limits import GradientLimit, LimitConfig
from litellm_ratebalance.overload.output import OutputEstimate
from litellm_ratebalance.overload.peers import Pooled
from litellm_ratebalance.overload.prompt import PromptScale
from litellm_ratebalance.overload.queue import FairQueue
from litellm_ratebalance.overload.reserve import TopDemand
from litellm_ratebalance.overload.servers import PREALLOCATING
from litellm_ratebalance.overload.shedding import DeploymentLoad, Tiers, TierThresholds, Verdict, decide
from litellm_ratebalance.overload.signals import SignalBoard, SignalUpkeep, held_at_scrape, server_signals
from litellm_ratebalance.proxy.backpressure.trace import Trace

__all__ = ["BackpressureProcess", "Context", "DeploymentState", "Lease", "Profile", "Waiter"]

logger = logging.getLogger("litellm_ratebalance.backpressure")


@dataclass(frozen=True, slots=True)
class Profile:
    """What one request is to the shedding policy (the same for every deployment it may go to)."""

    tier: str
    rank: int
    prompt_tokens: int
    max_tokens: int | None
    """The request's max_tokens / max_completion_tokens; ``None`` when it sets neither."""
    client: str
    weight: float


@dataclass(slots=True, eq=False)
class Lease:
    lease_id: str
    deployment_id: str
    call_id: str
    profile: Profile
    cost: int
    """Tokens reserved in the store: prompt + the output reserved on this deployment."""
    started_wall: float
    started: float
    attempt: object = None
    """The kwargs dict of the attempt that took it: LiteLLM hands that same dict to every callback of one
    attempt, so a second instance of the callback class in ``litellm.callbacks`` can see the slot is taken."""


@dataclass(slots=True, eq=False)
class Waiter:
    profile: Profile
    call_id: str
    future: asyncio.Future[Lease | None]


class DeploymentState:
    """This process's view of one deployment: its limit, last known shared counts, queue, leases."""

    __slots__ = (
        "config",
        "counted_at",
        "demand",
        "dispatcher",
        "freed_tokens",
        "inflight",
        "leases",
        "limit",
        "mean_latency",
        "model_group",
        "output",
        "peers",
        "prompt_scale",
        "publish_lock",
        "queue",
        "reserved_tokens",
        "scraped_at",
        "signals",
        "top_inflight",
        "typical_cost",
        "waiting_published",
        "wake",
    )

    def __init__(self, config: DeploymentConfig, model_group: str, limit_settings: LimitSettings) -> None:
        self.config = config
        self.model_group = model_group
        self.limit = GradientLimit(
            LimitConfig(
                initial_limit=config.initial_limit,
                min_limit=config.min_limit,
                max_limit=config.max_limit,
                tolerance=limit_settings.tolerance,
                smoothing=limit_settings.smoothing,
                growth=limit_settings.growth,
                backoff_ratio=limit_settings.backoff_ratio,
                drop_cooldown_seconds=limit_settings.drop_cooldown_seconds,
                baseline_drift_per_minute=limit_settings.baseline_drift_per_minute,
            )
        )
        self.inflight = 0
        self.reserved_tokens = 0
        self.counted_at = -math.inf
        self.mean_latency: float | None = None
        self.queue: FairQueue[Waiter] = FairQueue(config.queue_max_depth)
        self.leases: dict[str, Lease] = {}
        self.wake = asyncio.Event()
        self.dispatcher: asyncio.Task[None] | None = None
        self.output = OutputEstimate()
        self.prompt_scale = PromptScale()
        self.typical_cost = 0.0
        """Moving average of the tokens the requests admitted here reserved (the headroom a lower tier
        leaves for the tiers above: one typical request)."""
        self.demand = TopDemand()
        """The top tier's arrival rate and time in service here, as this process sees them (its reserve)."""
        self.top_inflight = 0
        """This process's top-tier leases on this deployment (they count towards the top tier's reserve)."""
        self.scraped_at = math.inf
        """When the last good metrics scrape of this deployment answered (monotonic seconds)."""
        self.freed_tokens = 0.0
        """KV-cache tokens that requests of this process finished since that scrape held in its reading."""
        self.signals = SignalUpkeep()
        """The GPU memory floor of its server, the signal report's and the preemption log's bookkeeping."""
        self.peers = Pooled()
        """What the other proxy replicas of this deployment published at the last exchange (see
        ``overload/peers.py``): their lowest limit, answer lengths, top-tier demand."""
        self.waiting_published: tuple[tuple[int, ...], float] = ((), -math.inf)
        """The tiers waiting in this process's queue as last published to the store, and when (monotonic)."""
        self.publish_lock = asyncio.Lock()
        """Publications of the waiting tiers go one at a time (see ``peers.publish_waiting``)."""

    @property
    def applied_limit(self) -> int:
        """The concurrency limit applied: the lowest of this process's learned limit and the other replicas'
        (every replica caps the shared lease count at the same value)."""
        return self.peers.limit_with(self.limit.limit)

    def scraped(self, now: float) -> None:
        """A metrics scrape answered at ``now``: the memory freed before it is in its reading."""
        self.scraped_at, self.freed_tokens = now, 0.0

    def finished(self, started: float, ended: float, prompt_tokens: int, output_tokens: int) -> None:
        """A request of this process ended at ``ended``: subtract what it held from the last reading."""
        self.freed_tokens += held_at_scrape(self.scraped_at, started, ended, prompt_tokens, output_tokens)

    def note_cost(self, cost: int) -> None:
        """Fold an admitted request's reservation into :attr:`typical_cost` (weight 0.1: ~10 requests)."""
        self.typical_cost = (
            float(cost) if self.typical_cost <= 0 else self.typical_cost + 0.1 * (cost - self.typical_cost)
        )

    @property
    def deployment_id(self) -> str:
        return self.config.deployment_id

    def counts(self, inflight: int, reserved_tokens: int, now: float) -> None:
        """The shared counts as the store just reported them (at ``now``, monotonic seconds)."""
        self.inflight, self.reserved_tokens = max(0, inflight), max(0, reserved_tokens)
        self.counted_at = now


@dataclass
class Context:
    """Everything bound to one event loop and one settings object (tests swap both)."""

    loop: asyncio.AbstractEventLoop
    settings: BackpressureSettings
    tiers: Tiers
    board: SignalBoard
    clock: Callable[[], float]
    """Monotonic seconds (the owner's clock: tests inject one)."""
    deployments: dict[str, DeploymentState] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    """Deployments whose ``model_info.backpressure`` is invalid (logged once; they pass unchecked)."""
    calls: dict[str, list[Lease]] = field(default_factory=dict)
    """The lease book: this process's leases by LiteLLM call id (a retried call holds one per attempt)."""
    groups: dict[str, tuple[DeploymentState | None, ...]] = field(default_factory=dict)
    """Per model group, the deployments the last routing filter saw (``None``: one we do not manage)."""
    maintenance: asyncio.Task[None] | None = None
    last_renew: float = -math.inf
    owner: Any = None
    """The callback instance whose hooks built this context (its probe, fetcher and clock are used)."""
    trace: Trace = field(default_factory=lambda: Trace(None))
    """The debug trace of admission decisions (off unless its environment variable names a file)."""
    thresholds: TierThresholds = field(init=False)

    def __post_init__(self) -> None:
        self.thresholds = TierThresholds(len(self.tiers), self.settings.shed_threshold, self.settings.hard_threshold)

    def deployment(self, model_info: Any, model_group: str) -> DeploymentState | None:
        """The state of the deployment ``model_info`` describes, created on first sight; ``None`` when it is
        not managed (no id, disabled, or an invalid ``model_info.backpressure``: logged once, passes)."""
        if not isinstance(model_info, Mapping) or model_info.get("id") is None:
            return None
        deployment_id = str(model_info["id"])
        state = self.deployments.get(deployment_id)
        if state is not None:
            return state
        if deployment_id in self.broken:
            return None
        try:
            config = self.settings.for_deployment(deployment_id, model_info)
        except Exception as exc:
            self.broken.add(deployment_id)
            logger.error("litellm_ratebalance backpressure: deployment %s is not checked: %s", deployment_id, exc)
            return None
        if not config.enabled:
            self.broken.add(deployment_id)
            return None
        state = self.deployments[deployment_id] = DeploymentState(config, model_group, self.settings.limit)
        return state

    # -- lease book -----------------------------------------------------------------------------------------
    def hold(self, state: DeploymentState, lease: Lease) -> None:
        state.leases[lease.lease_id] = lease
        self.calls.setdefault(lease.call_id, []).append(lease)
        if self.tiers.is_top(lease.profile.rank):
            state.top_inflight += 1

    def forget(self, lease: Lease) -> DeploymentState | None:
        """Take ``lease`` out of the book (no store call); its deployment's state, if still known."""
        leases = self.calls.get(lease.call_id)
        if leases is not None:
            with contextlib.suppress(ValueError):
                leases.remove(lease)
            if not leases:
                del self.calls[lease.call_id]
        state = self.deployments.get(lease.deployment_id)
        held = state is not None and state.leases.pop(lease.lease_id, None) is not None
        if state is not None and held and self.tiers.is_top(lease.profile.rank):
            state.top_inflight = max(0, state.top_inflight - 1)
        return state

    # -- the decision ---------------------------------------------------------------------------------------
    def cost(self, state: DeploymentState, profile: Profile) -> int:
        """Tokens ``profile`` reserves on ``state``: its prompt (scaled to the server's count) + the output
        reserved there."""
        settings = self.settings
        output = state.output.reserve(
            profile.max_tokens,
            mode=settings.output_estimate,
            default_output_tokens=settings.default_output_tokens,
            quantile=settings.output_estimate_quantile,
        )
        return state.prompt_scale.apply(profile.prompt_tokens) + output

    def kv_capacity(self, state: DeploymentState) -> int | None:
        """The deployment's KV-cache capacity in tokens: ``kv_cache_tokens`` where set, else what its server
        exports (``None``: neither; the token-aware check is then off)."""
        configured = state.config.kv_cache_tokens
        return configured if configured is not None else self.board.capacity(state.deployment_id)

    def server_signals(self, state: DeploymentState) -> dict[str, float]:
        now = self.clock()
        stale = self.settings.signals.stale_after_seconds
        config = state.config
        gpu = self.board.gpus(config.gpu_indices, now, stale) if self.settings.signals.nvml else None
        if gpu is not None and self.board.server(config.deployment_id) in PREALLOCATING:
            gpu = state.signals.idle_memory.above_idle(gpu)  # its memory is reserved up front (see IdleMemory)
        return server_signals(
            self.board.metrics(config.deployment_id, now, stale),
            gpu,
            kv_cache_tokens=self.kv_capacity(state),
            server_queue_limit=config.server_queue_limit,
            gpu_utilization=self.settings.signals.gpu_utilization,
            freed_tokens=state.freed_tokens,
        )

    def decide(
        self, state: DeploymentState, profile: Profile, *, queued: bool = False, waiting_elsewhere: int | None = None
    ) -> Verdict:
        """The policy's verdict for ``profile`` on ``state`` now. ``queued``: the request is the head of the
        queue (the requests waiting there are not ahead of it). ``waiting_elsewhere``: a rank the store says
        waits in another replica's queue."""
        waiting = None if queued else state.queue.top_rank()
        if waiting_elsewhere is not None:
            waiting = waiting_elsewhere if waiting is None else max(waiting, waiting_elsewhere)
        load = DeploymentLoad(
            server_signals=self.server_signals(state),
            inflight=state.inflight,
            limit=state.applied_limit,
            reserved_tokens=state.reserved_tokens,
            kv_cache_tokens=self.kv_capacity(state),
            waiting_rank=waiting,
            headroom_tokens=math.ceil(state.typical_cost * self.settings.kv_headroom_requests),
            top_reserve=self.top_reserve(state),
            top_inflight=state.top_inflight + state.peers.top_inflight,
        )
        return decide(self.thresholds, profile.rank, self.cost(state, profile), load)

    def top_reserve(self, state: DeploymentState) -> int:
        """Slots the tiers below the highest leave free for it on ``state`` now (see ``overload/reserve.py``);
        0 with a single tier or ``top_reserve_quantile: 0``."""
        quantile = self.settings.top_reserve_quantile
        if quantile <= 0 or len(self.tiers) <= 1:
            return 0
        return state.demand.reserve(self.clock(), quantile, state.mean_latency, state.peers.top_rate)

    def queue_depth(self, state: DeploymentState) -> int:
        """Requests waiting for this deployment: in our queue plus inside the server (when scraped)."""
        server = self.board.metrics(state.deployment_id, self.clock(), self.settings.signals.stale_after_seconds)
        waiting = server.waiting if server is not None and server.waiting is not None else 0.0
        return len(state.queue) + int(waiting)


class BackpressureProcess:
    """The one live context of this process, and the deployment gate routing consults (a
    :class:`~litellm_ratebalance.proxy.runtime.DeploymentGate`).

    Process-wide rather than per instance because LiteLLM keeps a single logger per class for its success /
    failure events (``logging_callback_manager`` refuses a second instance of the same class): events may
    reach another instance than the one whose hooks took the leases, so both must see the same state. It lives
    in the runtime's registry (:func:`~litellm_ratebalance.proxy.backpressure.callback.process_of`).
    """

    __slots__ = ("ctx",)

    def __init__(self) -> None:
        self.ctx: Context | None = None

    def gates_deployments(self) -> bool:
        """Whether :meth:`deployment_available` can say False for any deployment now (backpressure on, with
        deployments configured); lets the routing hook skip asking per deployment."""
        ctx = self.ctx
        return ctx is not None and ctx.settings.enabled and bool(ctx.deployments)

    def deployment_available(self, deployment_id: str, priority: str | None = None) -> bool:
        """Whether a request of ``priority`` would be admitted by this deployment now (for routing
        strategies that want to skip deployments at their limit or shedding without calling the filter).
        Unknown deployments, and everything when backpressure is off, count as available."""
        ctx = self.ctx
        if ctx is None or not ctx.settings.enabled:
            return True
        state = ctx.deployments.get(deployment_id)
        if state is None:
            return True
        rank = ctx.tiers.rank(priority if priority in ctx.tiers else None)
        profile = Profile(ctx.tiers.name(rank), rank, 0, 0, "anonymous", 1.0)
        return ctx.decide(state, profile).admitted

    def stop(self) -> None:
        """Cancel the context's background tasks (its runtime is being replaced; tests) and forget it."""
        ctx, self.ctx = self.ctx, None
        if ctx is None or ctx.loop.is_closed():
            return
        for task in [ctx.maintenance, *(s.dispatcher for s in ctx.deployments.values())]:
            if task is not None and not task.done():
                task.cancel()
