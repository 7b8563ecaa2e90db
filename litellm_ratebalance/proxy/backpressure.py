"""LiteLLM adapter of the backpressure part: admission per deployment of local inference servers.

Config: ``litellm_settings.callbacks: ["litellm_ratebalance.backpressure"]`` (list it before
``litellm_ratebalance.rate_balancer``), settings under ``litellm_settings.ratebalance.backpressure``,
per-deployment keys in ``model_info.backpressure``. See docs/backpressure.md.

Which hooks, and why (LiteLLM picks the deployment *after* ``async_pre_call_hook``):

* ``async_filter_deployments`` (routing, after health/cooldown filtering): drops every deployment that
  would shed this request or is at its concurrency limit, so no routing strategy (the rate balancer
  included, when it runs after us) picks one. If every deployment refuses, the request gets the refusal of
  the deployment closest to taking it (smallest retry-after), marked so the router does not retry it.
  Where queueing is enabled and the only refusals are full slots, the deployments stay in the list and
  the request waits for a slot in the next hook.
* ``async_pre_call_deployment_hook`` (deployment chosen, just before the call): takes the slot
  atomically in the shared store (a lease), after re-checking shedding; races lost since the filter give
  a 429 / queue wait here. The router may retry that on another deployment.
* ``async_post_call_success_deployment_hook`` (non-streaming response received): release the lease and
  feed the limit algorithm (latency per output token) at once, not after LiteLLM's logging queue.
* ``async_log_success_event`` / ``async_log_failure_event``: the same for streams and failures (a drop on
  a server error / timeout). A refusal raised in the deployment hook is marked final for the Router
  (``num_retries = 0``) when no other deployment of the group would take the request.
* All LiteLLM internals (request metadata layout, deployment dicts, hidden params, the Router's retry
  attribute) are read through ``proxy/_litellm.py``.
* ``async_post_call_response_headers_hook``: ``x-litellm-queue-depth`` and ``x-litellm-concurrency-limit``
  on successful responses.
* One background task per process (started on first use) scrapes the inference servers' metrics, reads
  NVML, renews this process's leases and refreshes the shared in-flight counts.

Errors clients see: 503 (shed: ``memory_pressure``, ``compute_saturation``, ``queue_overflow``) or 429
(``concurrency_limit``), with ``retry-after`` from the drain rate, ``x-litellm-backpressure-reason`` and
``x-litellm-backpressure-advice`` (``retry`` | ``reroute``). Nothing else our hooks hit reaches a client:
every other failure is logged and the request passes (store faults follow ``ratebalance.fail_mode``).
LiteLLM's own log line for each refusal (an ERROR, with a traceback for a 503) is replaced by one WARNING
per reason per :data:`REFUSAL_LOG_INTERVAL_SECONDS` (:func:`quiet_refusal_logs`); the metric counts them all.

Identity: the priority and fairness key come from the ``UserAPIKeyAuth`` the proxy puts in the request
metadata (``metadata.user_api_key_auth``, resolved like the limiter: team metadata, then key metadata),
never from the request body. SDK users of a bare Router pass one there themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance import metrics
from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.overload.config import BackpressureSettings, DeploymentConfig
from litellm_ratebalance.overload.limits import GradientLimit, LimitConfig, per_token_rtt
from litellm_ratebalance.overload.queue import FairQueue
from litellm_ratebalance.overload.shedding import (
    Reason,
    Tiers,
    Verdict,
    advice,
    decide,
    retry_after_seconds,
)
from litellm_ratebalance.overload.signals import Fetcher, GpuProbe, NvmlProbe, SignalBoard, server_signals
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.identity import metadata_value, resolve_priority
from litellm_ratebalance.proxy.runtime import get_runtime, schedule_startup_check
from litellm_ratebalance.proxy.tokens import estimate_tokens
from litellm_ratebalance.store.concurrency import LeaseRefusal

__all__ = ["BackpressureCallback", "backpressure"]

logger = logging.getLogger("litellm_ratebalance.backpressure")

_COMPONENT = "backpressure"
_MARK = "litellm_ratebalance_backpressure"
"""Attribute set on every exception we raise (its value: the reason), so our own failure events are known."""
_LATENCY_SMOOTHING = 0.2
_MAX_REQUEST_TOKENS = 10**9
"""No clamp in practice: an absurd max_tokens must read as \"never fits\" (reroute), not be trimmed."""


@dataclass(frozen=True, slots=True)
class _Profile:
    """What one request is to the shedding policy."""

    tier: str
    rank: int
    cost: int
    """Tokens the request may hold in the KV cache: prompt + max_tokens (or the default output)."""
    client: str
    weight: float


@dataclass(slots=True, eq=False)
class _Lease:
    lease_id: str
    deployment_id: str
    call_id: str
    profile: _Profile
    started_wall: float
    started: float
    attempt: object = None
    """The kwargs dict of the attempt that took it: LiteLLM hands that same dict to every callback of one
    attempt, so a second instance of this class in ``litellm.callbacks`` can see the slot is taken."""


@dataclass(slots=True, eq=False)
class _Waiter:
    profile: _Profile
    call_id: str
    future: asyncio.Future[_Lease | None]


class _Deployment:
    """This process's view of one deployment: its limit, last known shared counts, queue, leases."""

    __slots__ = (
        "config",
        "counted_at",
        "dispatcher",
        "inflight",
        "leases",
        "limit",
        "mean_latency",
        "model_group",
        "queue",
        "reserved_tokens",
        "wake",
    )

    def __init__(self, config: DeploymentConfig, model_group: str, limit_settings: Any) -> None:
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
        self.queue: FairQueue[_Waiter] = FairQueue(config.queue_max_depth)
        self.leases: dict[str, _Lease] = {}
        self.wake = asyncio.Event()
        self.dispatcher: asyncio.Task[None] | None = None

    @property
    def deployment_id(self) -> str:
        return self.config.deployment_id

    def counts(self, inflight: int, reserved_tokens: int, now: float) -> None:
        """The shared counts as the store just reported them (at ``now``, monotonic seconds)."""
        self.inflight, self.reserved_tokens = max(0, inflight), max(0, reserved_tokens)
        self.counted_at = now


@dataclass
class _Context:
    """Everything bound to one event loop and one settings object (tests swap both)."""

    loop: asyncio.AbstractEventLoop
    settings: BackpressureSettings
    tiers: Tiers
    board: SignalBoard
    deployments: dict[str, _Deployment] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    """Deployments whose ``model_info.backpressure`` is invalid (logged once; they pass unchecked)."""
    calls: dict[str, list[_Lease]] = field(default_factory=dict)
    groups: dict[str, tuple[_Deployment | None, ...]] = field(default_factory=dict)
    """Per model group, the deployments the last routing filter saw (``None``: one we do not manage)."""
    maintenance: asyncio.Task[None] | None = None
    last_renew: float = -math.inf
    owner: Any = None
    """The callback instance whose hooks built this context (its probe, fetcher and clock are used)."""


class _Process:
    """The one live context of this process.

    Process-wide rather than per instance because LiteLLM keeps a single logger per class for its success /
    failure events (``logging_callback_manager`` refuses a second instance of the same class): events may
    reach another instance than the one whose hooks took the leases, so both must see the same state.
    """

    ctx: _Context | None = None


_PROCESS = _Process()


class BackpressureCallback(CustomLogger):  # type: ignore[misc]
    """Admission per deployment for local inference servers (see the module docstring).

    Built with no arguments by LiteLLM; tests may pass ``gpu_probe`` (default: NVML when
    ``signals.nvml`` is on), ``fetch`` (the metrics HTTP client) and ``clock`` (monotonic seconds).

    In the proxy, building one schedules the start-up check (:func:`~litellm_ratebalance.proxy.runtime.
    schedule_startup_check`): once the config is applied, an invalid ``litellm_settings`` value (of any of
    our components) or ``model_info.backpressure`` block ends the process with status 78 and the key path,
    whether or not another callback of ours is listed.
    """

    def __init__(
        self,
        *,
        gpu_probe: GpuProbe | None = None,
        fetch: Fetcher | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        super().__init__()
        self._gpu_probe = gpu_probe
        self._fetch = fetch
        self._clock = clock
        self._config_error_logged = False
        # Settings are read lazily (LiteLLM builds this before the rest of the config is applied), so this only
        # schedules the check; it does nothing outside the proxy. This instance may be the only one of ours.
        schedule_startup_check(model_list_check=startup_model_info_problems)
        quiet_refusal_logs()

    # -- context --------------------------------------------------------------------------------------------
    def _context(self) -> _Context | None:
        """The live context, rebuilt when the loop or the settings object changed; ``None`` when off.

        Another instance of this class finding the context live uses it as it is (its leases, queue and
        limits): rebuilding it would forget the slots the first one holds. The first instance's probe,
        fetcher and clock stay in use until the settings change."""
        try:
            settings = get_runtime().settings().ratebalance.backpressure
        except Exception as exc:  # ConfigurationError: already names the key; logged once, requests pass
            if not self._config_error_logged:
                self._config_error_logged = True
                logger.error("litellm_ratebalance backpressure is off: %s", exc)
            return None
        if not settings.enabled:
            return None
        loop = asyncio.get_running_loop()
        ctx = _PROCESS.ctx
        if ctx is None or ctx.loop is not loop or ctx.settings is not settings:
            if ctx is not None and ctx.maintenance is not None and ctx.loop is loop:
                ctx.maintenance.cancel()
            probe = self._gpu_probe
            if probe is None and settings.signals.nvml:
                probe = NvmlProbe()
            ctx = _Context(loop, settings, Tiers(settings.tiers), SignalBoard(self._fetch, probe), owner=self)
            _PROCESS.ctx = ctx
            self._register_router_deployments(ctx)
        if ctx.maintenance is None or ctx.maintenance.done():
            ctx.maintenance = loop.create_task(self._maintain(ctx), name="litellm_ratebalance.backpressure")
        return ctx

    def _register_router_deployments(self, ctx: _Context) -> None:
        # Scraping starts before the first request reaches a deployment.
        router = get_runtime().router()
        for deployment in _litellm.router_deployments(router):
            self._deployment(
                ctx, _litellm.deployment_model_info(deployment), _litellm.deployment_model_group(deployment)
            )

    def _deployment(self, ctx: _Context, model_info: Any, model_group: str) -> _Deployment | None:
        if not isinstance(model_info, Mapping) or model_info.get("id") is None:
            return None
        deployment_id = str(model_info["id"])
        state = ctx.deployments.get(deployment_id)
        if state is not None:
            return state
        if deployment_id in ctx.broken:
            return None
        try:
            config = ctx.settings.for_deployment(deployment_id, model_info)
        except Exception as exc:
            ctx.broken.add(deployment_id)
            logger.error("litellm_ratebalance backpressure: deployment %s is not checked: %s", deployment_id, exc)
            return None
        if not config.enabled:
            ctx.broken.add(deployment_id)
            return None
        state = _Deployment(config, model_group, ctx.settings.limit)
        ctx.deployments[deployment_id] = state
        return state

    # -- request profile and decisions ----------------------------------------------------------------------
    def _profile(self, ctx: _Context, kwargs: Mapping[str, Any], messages: Any) -> _Profile:
        settings = ctx.settings
        auth = _litellm.request_auth(kwargs)
        rank = ctx.tiers.rank(resolve_priority(auth, ctx.tiers))
        # The filter gets the messages beside the kwargs; the count is cached in the request metadata, so
        # the deployment hook (and the limiter, when it ran first) do not tokenise again.
        view: dict[str, Any] = dict(kwargs)
        if messages is not None:
            view["messages"] = messages
        metadata = kwargs.get("metadata")
        if isinstance(metadata, dict):
            view["metadata"] = metadata
        cost = estimate_tokens(
            str(kwargs.get("model") or ""), view, "total", settings.default_output_tokens, _MAX_REQUEST_TOKENS
        )
        client = _litellm.caller_id(auth)
        weight = 1.0
        raw_weight = metadata_value(auth, "backpressure_weight")
        if raw_weight is not None:
            with contextlib.suppress(ValueError):
                parsed = float(raw_weight)
                if math.isfinite(parsed) and parsed > 0:
                    weight = parsed
        return _Profile(ctx.tiers.name(rank), rank, cost, client, weight)

    def _server_signals(self, ctx: _Context, state: _Deployment) -> dict[str, float]:
        now = self._clock()
        stale = ctx.settings.signals.stale_after_seconds
        config = state.config
        return server_signals(
            ctx.board.metrics(config.deployment_id, now, stale),
            ctx.board.gpus(config.gpu_indices, now, stale) if ctx.settings.signals.nvml else None,
            kv_cache_tokens=config.kv_cache_tokens,
            server_queue_limit=config.server_queue_limit,
            gpu_utilization=ctx.settings.signals.gpu_utilization,
        )

    def _decide(self, ctx: _Context, state: _Deployment, profile: _Profile) -> Verdict:
        settings = ctx.settings
        return decide(
            rank=profile.rank,
            n_tiers=len(ctx.tiers),
            shed_threshold=settings.shed_threshold,
            hard_threshold=settings.hard_threshold,
            server_signals=self._server_signals(ctx, state),
            inflight=state.inflight,
            limit=state.limit.limit,
            cost_tokens=profile.cost,
            reserved_tokens=state.reserved_tokens,
            kv_cache_tokens=state.config.kv_cache_tokens,
        )

    def _queue_depth(self, ctx: _Context, state: _Deployment) -> int:
        """Requests waiting for this deployment: in our queue plus inside the server (when scraped)."""
        server = ctx.board.metrics(state.deployment_id, self._clock(), ctx.settings.signals.stale_after_seconds)
        waiting = server.waiting if server is not None and server.waiting is not None else 0.0
        return len(state.queue) + int(waiting)

    def gates_deployments(self) -> bool:
        """Whether :meth:`deployment_available` can say False for any deployment now (backpressure on, with
        deployments configured); lets the routing hook skip asking per deployment."""
        ctx = _PROCESS.ctx
        return ctx is not None and ctx.settings.enabled and bool(ctx.deployments)

    def deployment_available(self, deployment_id: str, priority: str | None = None) -> bool:
        """Whether a request of ``priority`` would be admitted by this deployment now (for routing
        strategies that want to skip deployments at their limit or shedding without calling the filter).
        Unknown deployments, and everything when backpressure is off, count as available."""
        ctx = _PROCESS.ctx
        if ctx is None or not ctx.settings.enabled:
            return True
        state = ctx.deployments.get(deployment_id)
        if state is None:
            return True
        rank = ctx.tiers.rank(priority if priority in ctx.tiers else None)
        profile = _Profile(ctx.tiers.name(rank), rank, 0, "anonymous", 1.0)
        return self._decide(ctx, state, profile).admitted

    # -- refusals -------------------------------------------------------------------------------------------
    def _refusal(
        self,
        ctx: _Context,
        state: _Deployment,
        verdict: Verdict,
        profile: _Profile,
        *,
        reason: Reason | None = None,
        status: int | None = None,
        detail: str | None = None,
        no_router_retry: bool = False,
    ) -> Exception:
        settings = ctx.settings
        reason = reason or verdict.reason or Reason.COMPUTE_SATURATION
        status = status or verdict.status or 503
        depth = self._queue_depth(ctx, state)
        needed = verdict.completions_needed + (len(state.queue) if reason is not Reason.MEMORY_PRESSURE else 0)
        retry_after = retry_after_seconds(
            needed, state.inflight, state.mean_latency, cap=settings.max_retry_after_seconds
        )
        what = advice(verdict, retry_after, settings.max_retry_after_seconds)
        limit = state.limit.limit
        if detail is None:
            detail = self._describe(state, verdict, reason, profile, limit)
        if what == "retry":
            hint = f"retry after {retry_after}s"
        else:
            hint = "reroute: send it to another deployment or model group (retrying here will not succeed soon)"
        message = (
            f"litellm_ratebalance backpressure ({reason.value}): model group {state.model_group!r}, deployment "
            f"{state.deployment_id!r}, priority tier {profile.tier!r}: {detail}; {hint}"
        )
        headers = {
            "retry-after": str(retry_after),
            "x-litellm-backpressure-reason": reason.value,
            "x-litellm-backpressure-advice": what,
            "x-litellm-queue-depth": str(depth),
            "x-litellm-concurrency-limit": str(limit),
        }
        if status == 429:
            exc = _litellm.rate_limit_exception(message, headers, state.model_group)
        else:
            exc = _litellm.service_unavailable(message, headers)
        setattr(exc, _MARK, reason.value)
        if no_router_retry:
            # Every deployment refused already: retrying inside the proxy would only delay the answer the
            # client needs to back off.
            _litellm.forbid_router_retry(exc)
        metrics.counter(
            "backpressure_refusals",
            "Requests refused by backpressure, by model group, priority tier and reason",
            ["model_group", "tier", "reason"],
        ).labels(state.model_group, profile.tier, reason.value).inc()
        return exc

    @staticmethod
    def _describe(state: _Deployment, verdict: Verdict, reason: Reason, profile: _Profile, limit: int) -> str:
        if reason is Reason.MEMORY_PRESSURE and verdict.token_cap is not None:
            return (
                f"not enough KV-cache headroom for ~{profile.cost} tokens (prompt + max_tokens): "
                f"{state.reserved_tokens} tokens reserved in flight, this tier may use {verdict.token_cap} of "
                f"{state.config.kv_cache_tokens}"
            )
        if reason is Reason.CONCURRENCY_LIMIT:
            return f"all {limit} concurrency slots are in use"
        if verdict.signal == "concurrency":
            return (
                f"{state.inflight} of {limit} concurrency slots are in use and this tier may use {verdict.slots}; "
                "the rest is kept for higher priority tiers"
            )
        return (
            f"utilisation {verdict.utilisation:.2f} ({verdict.signal}) is at or above {verdict.threshold:.2f}, "
            "the shedding threshold of this tier"
        )

    # -- hooks ----------------------------------------------------------------------------------------------
    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[Any],
        messages: Any,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[Any]:
        started = time.perf_counter()
        try:
            return await self._filter(model, healthy_deployments, messages, request_kwargs)
        finally:
            _hook_latency().labels(_COMPONENT, "filter_deployments").observe(time.perf_counter() - started)

    async def _filter(
        self, model: str, healthy_deployments: list[Any], messages: Any, request_kwargs: dict[str, Any] | None
    ) -> list[Any]:
        try:
            ctx = self._context()
            if ctx is None or not healthy_deployments:
                return healthy_deployments
            candidates = [
                (d, self._deployment(ctx, _litellm.deployment_model_info(d), model)) for d in healthy_deployments
            ]
            if all(state is None for _, state in candidates):
                return healthy_deployments  # none of them is managed: no token counting, no decision
            ctx.groups[model] = tuple(state for _, state in candidates)
            profile = self._profile(ctx, request_kwargs or {}, messages)
            admitted, queueable, refused = self._sort(ctx, candidates, profile)
            fresh_after = self._clock() - ctx.settings.queue.poll_interval_seconds
            stale = [s for s, verdict, _ in refused if _count_based(verdict) and s.counted_at < fresh_after]
            if not admitted and not queueable and stale:
                # Our counts of other replicas' requests are up to one maintenance interval old: read them
                # fresh before refusing on them (one round trip per deployment, on the refusal path only).
                await self._refresh_counts(ctx, stale)
                admitted, queueable, refused = self._sort(ctx, candidates, profile)
            if admitted or queueable:
                return admitted or queueable
            # Every deployment refuses: answer with the one closest to taking the request.
            state, verdict, queue_full = min(
                refused, key=lambda r: (r[1].never_fits, r[1].completions_needed / max(1, r[0].inflight))
            )
            if queue_full:
                raise self._queue_full(ctx, state, verdict, profile, no_router_retry=True)
            raise self._refusal(ctx, state, verdict, profile, no_router_retry=True)
        except Exception as exc:
            if getattr(exc, _MARK, None):
                raise
            logger.exception("litellm_ratebalance backpressure: filter failed; passing the deployments through")
            return healthy_deployments

    def _sort(
        self, ctx: _Context, candidates: list[tuple[Any, _Deployment | None]], profile: _Profile
    ) -> tuple[list[Any], list[Any], list[tuple[_Deployment, Verdict, bool]]]:
        """Split deployments into admitting, queueable (at the limit, room in the queue) and refusing ones
        (with their verdict, and whether the refusal is a full queue)."""
        admitted: list[Any] = []
        queueable: list[Any] = []
        refused: list[tuple[_Deployment, Verdict, bool]] = []
        for deployment, state in candidates:
            if state is None:
                admitted.append(deployment)
                continue
            verdict = self._decide(ctx, state, profile)
            if verdict.admitted:
                admitted.append(deployment)
            elif verdict.queueable and state.config.queue_enabled:
                if len(state.queue) < state.queue.max_depth:
                    queueable.append(deployment)
                else:
                    refused.append((state, verdict, True))
            else:
                refused.append((state, verdict, False))
        return admitted, queueable, refused

    async def _refresh_counts(self, ctx: _Context, states: list[_Deployment]) -> None:
        runtime = get_runtime()
        snapshots = await asyncio.gather(
            *(runtime.store().concurrency_snapshot(s.deployment_id) for s in states), return_exceptions=True
        )
        for state, snapshot in zip(states, snapshots, strict=True):
            if isinstance(snapshot, StoreError):
                runtime.faults.record(_COMPONENT, snapshot, runtime.settings())
            elif isinstance(snapshot, BaseException):
                raise snapshot
            else:
                state.counts(snapshot.inflight, snapshot.reserved_tokens, self._clock())

    def _queue_full(
        self, ctx: _Context, state: _Deployment, verdict: Verdict, profile: _Profile, *, no_router_retry: bool = False
    ) -> Exception:
        return self._refusal(
            ctx,
            state,
            verdict,
            profile,
            reason=Reason.QUEUE_OVERFLOW,
            status=503,
            detail=f"all {state.limit.limit} slots are in use and the wait queue is full "
            f"({state.queue.max_depth} requests)",
            no_router_retry=no_router_retry,
        )

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        try:
            ctx = self._context()
            if ctx is None:
                return None
            info = _litellm.request_deployment_info(kwargs)
            state = self._deployment(ctx, info, _litellm.request_model_group(kwargs))
            if state is None:
                return None
            call_id = _litellm.request_call_id(kwargs) or uuid.uuid4().hex
            if any(held.attempt is kwargs for held in ctx.calls.get(call_id, ())):
                return None  # this attempt holds its slot already (the class is listed twice in callbacks)
            profile = self._profile(ctx, kwargs, kwargs.get("messages"))
            try:
                lease = await self._admit(ctx, state, profile, call_id)
            except Exception as exc:
                if getattr(exc, _MARK, None) and not self._taken_elsewhere(ctx, state, profile):
                    # The Router would retry this refusal on the same deployment (after a back-off, when it is
                    # the only one): nothing else in the group would take it, so the answer is final.
                    _litellm.forbid_router_retry(exc)
                raise
            if lease is not None:
                lease.attempt = kwargs
                self._release_if_cancelled(ctx, lease)
            return None
        except Exception as exc:
            if getattr(exc, _MARK, None):
                raise
            logger.exception("litellm_ratebalance backpressure: admission failed; letting the request through")
            return None

    def _taken_elsewhere(self, ctx: _Context, state: _Deployment, profile: _Profile) -> bool:
        """Whether another deployment of ``state``'s model group would take this request now (by this
        process's view of the deployments the last routing filter saw), so that the Router's retry of a
        refusal here can succeed. True when the group is unknown or has a deployment we do not manage."""
        members = ctx.groups.get(state.model_group)
        if members is None:
            return True
        for member in members:
            if member is None:
                return True
            if member is state:
                continue
            verdict = self._decide(ctx, member, profile)
            if verdict.admitted or (verdict.queueable and member.config.queue_enabled):
                return True
        return False

    def _release_if_cancelled(self, ctx: _Context, lease: _Lease) -> None:
        """A cancelled request (client gone, router timeout) gets no success or failure event from LiteLLM:
        give its slot back when the task that holds it ends cancelled."""
        task = asyncio.current_task()
        if task is None:
            return

        def done(finished: asyncio.Task[Any]) -> None:
            state = ctx.deployments.get(lease.deployment_id)
            if (
                finished.cancelled()
                and state is not None
                and lease.lease_id in state.leases
                and not ctx.loop.is_closed()
            ):
                ctx.loop.create_task(self._release(ctx, lease))

        task.add_done_callback(done)

    async def _admit(self, ctx: _Context, state: _Deployment, profile: _Profile, call_id: str) -> _Lease | None:
        """Take a slot (waiting in the queue where that is allowed) or raise the refusal; ``None`` when the
        store failed and fail_mode is open (admitted without a lease)."""
        verdict = self._decide(ctx, state, profile)
        queue_on = state.config.queue_enabled
        if not verdict.admitted and not (verdict.queueable and queue_on):
            raise self._refusal(ctx, state, verdict, profile)
        if queue_on and len(state.queue) and ctx.tiers.is_top(profile.rank):
            # Others of this tier are already waiting for a slot: take a place behind them, not ahead.
            return await self._wait_in_queue(ctx, state, profile, call_id)
        outcome = await self._try_lease(ctx, state, profile, call_id, verdict)
        if isinstance(outcome, Verdict):
            if outcome.queueable and queue_on:
                return await self._wait_in_queue(ctx, state, profile, call_id)
            raise self._refusal(ctx, state, outcome, profile)
        return outcome

    async def _try_lease(
        self, ctx: _Context, state: _Deployment, profile: _Profile, call_id: str, verdict: Verdict
    ) -> _Lease | Verdict | None:
        """One atomic attempt: the lease, ``None`` (store fault, fail open: admitted unaccounted), or the
        verdict that refuses it given the store's fresh counts."""
        lease_id = uuid.uuid4().hex
        runtime = get_runtime()
        try:
            result = await runtime.store().lease_acquire(
                state.deployment_id,
                lease_id,
                slot_cap=verdict.slots,
                ttl_ms=int(ctx.settings.lease_ttl_seconds * 1000),
                cost_tokens=profile.cost,
                token_cap=verdict.token_cap,
            )
        except StoreError as exc:
            if runtime.faults.record(_COMPONENT, exc, runtime.settings()):
                return None
            unavailable = runtime.faults.unavailable(_COMPONENT)
            setattr(unavailable, _MARK, "store_unavailable")
            raise unavailable from exc
        state.counts(result.inflight, result.reserved_tokens, self._clock())
        if result.acquired:
            lease = _Lease(lease_id, state.deployment_id, call_id, profile, time.time(), self._clock())
            state.leases[lease_id] = lease
            ctx.calls.setdefault(call_id, []).append(lease)
            self._gauges(state)
            return lease
        fresh = self._decide(ctx, state, profile)
        if not fresh.admitted:
            return fresh
        # The store refused on counts our cached view does not show yet (another replica): say what it said.
        if result.refusal is LeaseRefusal.TOKENS:
            return Verdict(
                False,
                Reason.MEMORY_PRESSURE,
                503,
                threshold=fresh.threshold,
                signal="kv_cache",
                completions_needed=1.0,
                slots=fresh.slots,
                token_cap=fresh.token_cap,
            )
        top = ctx.tiers.is_top(profile.rank)
        return Verdict(
            False,
            Reason.CONCURRENCY_LIMIT if top else Reason.COMPUTE_SATURATION,
            429 if top else 503,
            threshold=fresh.threshold,
            signal="concurrency",
            completions_needed=1.0,
            slots=fresh.slots,
            token_cap=fresh.token_cap,
        )

    # -- queue ----------------------------------------------------------------------------------------------
    async def _wait_in_queue(self, ctx: _Context, state: _Deployment, profile: _Profile, call_id: str) -> _Lease | None:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(profile, call_id, loop.create_future())
        max_wait = state.config.queue_max_wait_seconds
        entry = state.queue.push(
            waiter,
            client=profile.client,
            rank=profile.rank,
            cost=profile.cost,
            now=self._clock(),
            max_wait=max_wait,
            weight=profile.weight,
        )
        if entry is None:
            raise self._queue_full(ctx, state, self._decide(ctx, state, profile), profile)
        self._gauges(state)
        if state.dispatcher is None or state.dispatcher.done():
            state.dispatcher = loop.create_task(self._dispatch(ctx, state))
        state.wake.set()
        started = self._clock()
        try:
            # The dispatcher resolves the future (lease, or a refusal) or expires it at its deadline;
            # the extra second only guards against a dispatcher that died.
            return await asyncio.wait_for(asyncio.shield(waiter.future), max_wait + 1.0)
        except asyncio.TimeoutError:
            state.queue.remove(entry)
            waiter.future.cancel()
            raise self._queue_timeout(ctx, state, profile, self._clock() - started) from None
        except asyncio.CancelledError:
            state.queue.remove(entry)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                lease = waiter.future.result()
                if lease is not None:
                    await self._release(ctx, lease)
            waiter.future.cancel()
            raise
        finally:
            metrics.histogram(
                "backpressure_queue_wait_seconds",
                "Time requests waited in a deployment's backpressure queue",
                ["deployment"],
                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            ).labels(state.deployment_id).observe(self._clock() - started)
            self._gauges(state)

    def _queue_timeout(self, ctx: _Context, state: _Deployment, profile: _Profile, waited: float) -> Exception:
        verdict = self._decide(ctx, state, profile)
        return self._refusal(
            ctx,
            state,
            verdict,
            profile,
            reason=Reason.QUEUE_OVERFLOW,
            status=503,
            detail=f"waited {waited:.1f}s in the queue (queue_max_wait_seconds "
            f"{state.config.queue_max_wait_seconds:g}) and no slot of {state.limit.limit} came free",
        )

    async def _dispatch(self, ctx: _Context, state: _Deployment) -> None:
        """Serve the queue head while anything waits; every turn takes a slot, refuses, or sleeps."""
        poll = ctx.settings.queue.poll_interval_seconds
        while len(state.queue):
            now = self._clock()
            for expired in state.queue.expire(now):
                if not expired.item.future.done():
                    waited = now - expired.enqueued_at
                    expired.item.future.set_exception(self._queue_timeout(ctx, state, expired.item.profile, waited))
            entry = state.queue.peek()
            if entry is None:
                break
            waiter = entry.item
            if waiter.future.done():
                state.queue.remove(entry)
                continue
            state.wake.clear()  # before the attempt: a release during it must wake the wait below
            verdict = self._decide(ctx, state, waiter.profile)
            if not verdict.admitted and not verdict.queueable:
                state.queue.remove(entry)
                waiter.future.set_exception(self._refusal(ctx, state, verdict, waiter.profile))
                continue
            try:
                outcome = await self._try_lease(ctx, state, waiter.profile, waiter.call_id, verdict)
            except Exception as exc:  # fail-closed store fault (marked) or a bug: hand it to the waiter
                state.queue.remove(entry)
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
            if isinstance(outcome, Verdict) and outcome.queueable:
                next_deadline = state.queue.next_deadline()
                timeout = poll if next_deadline is None else max(0.0, min(poll, next_deadline - self._clock()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(state.wake.wait(), timeout)
                continue
            if isinstance(outcome, Verdict):
                state.queue.remove(entry)
                waiter.future.set_exception(self._refusal(ctx, state, outcome, waiter.profile))
                continue
            state.queue.pop(entry)
            if waiter.future.done():
                if outcome is not None:
                    await self._release(ctx, outcome)  # the waiter gave up while we took its slot
            else:
                waiter.future.set_result(outcome)

    # -- completion -----------------------------------------------------------------------------------------
    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> Any:
        """A finished non-streaming response gives its slot back here, as soon as the deployment answered:
        the success event comes later, through LiteLLM's logging queue, and a slot held until then is a
        slot the next request waits for (and a latency sample that counts the proxy's logging work)."""
        try:
            if isinstance(request_data, Mapping) and not request_data.get("stream") and response is not None:
                await self._finish(request_data, response, None, failed=False, exception=None)
        except Exception:
            logger.exception("litellm_ratebalance backpressure: early release failed")
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        try:
            await self._finish(kwargs, response_obj, end_time, failed=False, exception=None)
        except Exception:
            logger.exception("litellm_ratebalance backpressure: success accounting failed")

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        try:
            exception = _litellm.failure_exception(kwargs)
            if getattr(exception, _MARK, None):
                return  # refused by us: that attempt never held a lease
            await self._finish(kwargs, response_obj, end_time, failed=True, exception=exception)
        except Exception:
            logger.exception("litellm_ratebalance backpressure: failure accounting failed")

    async def _finish(self, kwargs: Any, response_obj: Any, end_time: Any, *, failed: bool, exception: Any) -> None:
        ctx = _PROCESS.ctx
        if ctx is None or not isinstance(kwargs, Mapping) or ctx.loop is not asyncio.get_running_loop():
            return
        call_id = _litellm.request_call_id(kwargs)
        leases = ctx.calls.get(call_id) if call_id is not None else None
        if not leases:
            return
        info = _litellm.request_deployment_info(kwargs)
        deployment_id = (info or {}).get("id") or _litellm.response_deployment_id(response_obj)
        # Retries reuse the call id: release the oldest lease of this call on this deployment (events of one
        # call arrive in attempt order; whichever lease goes, the count stays right).
        lease = next(
            (item for item in leases if deployment_id is None or item.deployment_id == str(deployment_id)), None
        )
        if lease is None:
            return
        state = ctx.deployments.get(lease.deployment_id)
        if state is not None:
            self._learn(state, lease, response_obj, end_time, failed, exception)
        await self._release(ctx, lease)

    def _learn(
        self, state: _Deployment, lease: _Lease, response_obj: Any, end_time: Any, failed: bool, exception: Any
    ) -> None:
        now = self._clock()
        if failed:
            if _is_drop(exception):
                state.limit.update(now, 0.0, state.inflight, True)
                metrics.counter(
                    "backpressure_drops", "Requests that failed on the server side (limit backs off)", ["deployment"]
                ).labels(state.deployment_id).inc()
            return
        ended = end_time.timestamp() if isinstance(end_time, datetime) else time.time()
        latency = max(1e-6, ended - lease.started_wall)
        prompt_tokens, output_tokens = _litellm.response_usage(response_obj)
        state.limit.update(now, per_token_rtt(latency, output_tokens), max(1, state.inflight), False)
        state.mean_latency = (
            latency
            if state.mean_latency is None
            else state.mean_latency + _LATENCY_SMOOTHING * (latency - state.mean_latency)
        )
        actual = (prompt_tokens or 0) + (output_tokens or 0)
        if actual:
            state.queue.charge(lease.profile.client, actual - lease.profile.cost, lease.profile.weight)

    async def _release(self, ctx: _Context, lease: _Lease) -> None:
        state = ctx.deployments.get(lease.deployment_id)
        leases = ctx.calls.get(lease.call_id)
        if leases is not None:
            with contextlib.suppress(ValueError):
                leases.remove(lease)
            if not leases:
                del ctx.calls[lease.call_id]
        if state is None:
            return
        state.leases.pop(lease.lease_id, None)
        runtime = get_runtime()
        try:
            snapshot = await runtime.store().lease_release(lease.deployment_id, lease.lease_id)
            state.counts(snapshot.inflight, snapshot.reserved_tokens, self._clock())
        except StoreError as exc:
            # Not renewed any more: the lease lapses after its TTL even if this release never lands.
            runtime.faults.record(_COMPONENT, exc, runtime.settings())
            state.counts(state.inflight - 1, state.reserved_tokens - lease.profile.cost, state.counted_at)
        state.wake.set()
        self._gauges(state)

    # -- headers --------------------------------------------------------------------------------------------
    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        try:
            ctx = _PROCESS.ctx
            if response is None or ctx is None:
                return None  # refusals carry their headers themselves
            deployment_id = _litellm.response_deployment_id(response)
            state = ctx.deployments.get(deployment_id) if deployment_id is not None else None
            if state is None:
                return None
            return {
                "x-litellm-queue-depth": str(self._queue_depth(ctx, state)),
                "x-litellm-concurrency-limit": str(state.limit.limit),
            }
        except Exception:
            logger.exception("litellm_ratebalance backpressure: response headers failed")
            return None

    # -- background -----------------------------------------------------------------------------------------
    async def _maintain(self, ctx: _Context) -> None:
        """Scrape signals, read GPUs, renew leases, refresh shared counts: every scrape interval, forever
        (one task per process; cancelled with :meth:`aclose` or when the settings change)."""
        while True:
            try:
                await self.maintain_once(ctx)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("litellm_ratebalance backpressure: maintenance step failed")
            await asyncio.sleep(ctx.settings.signals.scrape_interval_seconds)

    async def maintain_once(self, ctx: _Context | None = None) -> None:
        """One maintenance step (tests call it directly instead of waiting for the interval)."""
        ctx = ctx or self._context()
        if ctx is None:
            return
        settings = ctx.settings
        now = self._clock()
        deployments = list(ctx.deployments.values())
        scrapes = [
            ctx.board.scrape(
                s.deployment_id, s.config.metrics_url, s.config.server, settings.signals.scrape_timeout_seconds, now
            )
            for s in deployments
            if s.config.metrics_url
        ]
        if scrapes:
            await asyncio.gather(*scrapes, return_exceptions=True)
        if settings.signals.nvml:
            for indices in {s.config.gpu_indices for s in deployments}:
                ctx.board.sample_gpus(indices, now)
        renew = now - ctx.last_renew >= settings.lease_ttl_seconds / 3
        if renew:
            ctx.last_renew = now
        runtime = get_runtime()
        ttl_ms = int(settings.lease_ttl_seconds * 1000)
        for state in deployments:
            self._drop_stale_leases(ctx, state, now)
            try:
                snapshot = await runtime.store().lease_renew(
                    state.deployment_id, list(state.leases) if renew else [], ttl_ms
                )
            except StoreError as exc:
                runtime.faults.record(_COMPONENT, exc, runtime.settings())
                continue
            state.counts(snapshot.inflight, snapshot.reserved_tokens, self._clock())
            self._gauges(state, self._server_signals(ctx, state))

    def _drop_stale_leases(self, ctx: _Context, state: _Deployment, now: float) -> None:
        max_age = ctx.settings.lease_max_age_seconds
        for lease in [lease for lease in state.leases.values() if now - lease.started > max_age]:
            # Its request never reported back (lost event): stop renewing, the store frees it after the TTL.
            logger.warning(
                "litellm_ratebalance backpressure: request %s on deployment %s never finished after %.0fs; its "
                "slot is no longer renewed",
                lease.call_id,
                state.deployment_id,
                now - lease.started,
            )
            state.leases.pop(lease.lease_id, None)
            leases = ctx.calls.get(lease.call_id)
            if leases is not None:
                with contextlib.suppress(ValueError):
                    leases.remove(lease)
                if not leases:
                    del ctx.calls[lease.call_id]

    def _gauges(self, state: _Deployment, signals: Mapping[str, float] | None = None) -> None:
        label = state.deployment_id
        metrics.gauge(
            "backpressure_concurrency_limit", "Adaptive concurrency limit per deployment", ["deployment"]
        ).labels(label).set(state.limit.limit)
        metrics.gauge(
            "backpressure_inflight", "Requests in flight per deployment (all replicas)", ["deployment"]
        ).labels(label).set(state.inflight)
        metrics.gauge("backpressure_queue_depth", "Requests waiting in this process's queue", ["deployment"]).labels(
            label
        ).set(len(state.queue))
        if signals is not None:
            gauge = metrics.gauge(
                "backpressure_utilization", "Backpressure signals per deployment (1.0 = full)", ["deployment", "signal"]
            )
            for name, value in signals.items():
                gauge.labels(label, name).set(value)

    async def aclose(self) -> None:
        """Stop the background tasks of the current context (tests; the proxy never needs it)."""
        ctx = _PROCESS.ctx
        if ctx is None or ctx.owner is not self:
            return
        _PROCESS.ctx = None
        tasks = [ctx.maintenance, *(s.dispatcher for s in ctx.deployments.values())]
        for task in tasks:
            if task is not None and not task.done():
                task.cancel()
        for task in tasks:
            if task is not None and ctx.loop is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """This process's view per deployment (status output, tests)."""
        ctx = _PROCESS.ctx
        if ctx is None:
            return {}
        return {
            deployment_id: {
                "limit": state.limit.limit,
                "inflight": state.inflight,
                "reserved_tokens": state.reserved_tokens,
                "queue_depth": len(state.queue),
                "local_leases": len(state.leases),
                "mean_latency_seconds": state.mean_latency,
                "baseline_rtt_per_token": state.limit.baseline_rtt,
                "short_rtt_per_token": state.limit.short_rtt,
                "signals": self._server_signals(ctx, state),
            }
            for deployment_id, state in ctx.deployments.items()
        }


def _count_based(verdict: Verdict) -> bool:
    """A refusal that rests on the shared in-flight counts (slots, reserved tokens), not on server signals."""
    return verdict.signal == "concurrency" or (
        verdict.reason is Reason.MEMORY_PRESSURE and verdict.token_cap is not None
    )


def _is_drop(exception: Any) -> bool:
    """A failure that says the server is overloaded or broken (not the client's fault)."""
    if exception is None:
        return False
    status = _litellm.exception_status(exception)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(exception, (TimeoutError, asyncio.TimeoutError, ConnectionError))


# -- how refusals are logged -------------------------------------------------------------------------------
REFUSAL_LOG_INTERVAL_SECONDS = 30.0
"""At most one WARNING per refusal reason per this many seconds; every refusal is counted in the
``backpressure_refusals`` metric whether it is logged or not."""
_LITELLM_LOGGERS = ("LiteLLM Proxy", "LiteLLM Router")
"""``litellm._logging.verbose_proxy_logger`` and ``verbose_router_logger``, by name: the proxy logs every
failed request on the first, with a traceback for a 5xx, so each 503 refusal would otherwise be an ERROR and
~50 lines of traceback. Checked by tests/integration/test_backpressure_log_noise.py (the names) and
tests/e2e/test_backpressure_logs_e2e.py (the proxy's output)."""


class _RefusalLogFilter(logging.Filter):
    """Turns LiteLLM's report of a refusal of ours into one WARNING per reason per interval.

    A record on a LiteLLM logger whose exception (``exc_info``, or an argument of the message) carries our
    mark is dropped. For the first such record of a reason in ``interval`` seconds, one WARNING without
    traceback is logged on this package's logger instead: the refusal's message, and how many refusals of
    that reason went unlogged since the previous warning. Other records pass unchanged. A refusal is the
    designed answer to overload (its status, reason and advice reach the client), not an error of the
    proxy; a fault of ours is never marked and keeps LiteLLM's ERROR.
    """

    def __init__(self, interval: float, clock: Any = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        refusal = _marked_exception(record)
        if refusal is None:
            return True
        reason = str(getattr(refusal, _MARK))
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return False
        self._last[reason] = now
        unlogged = self._unlogged.pop(reason, 0)
        detail = getattr(refusal, "detail", None)
        message = detail.get("error") if isinstance(detail, Mapping) else None
        # The message names the component and the reason already ("litellm_ratebalance backpressure (<reason>): ...").
        logger.warning(
            "%s [answered %s; refusals are logged once per reason per %.0fs: %d more of this reason since the "
            "last warning; all are counted in backpressure_refusals]",
            message if isinstance(message, str) else refusal,
            getattr(refusal, "status_code", None) or "with an error",
            self._interval,
            unlogged,
        )
        return False


def _marked_exception(record: logging.LogRecord) -> BaseException | None:
    candidates: list[object] = [record.exc_info[1]] if record.exc_info else []
    if isinstance(record.args, tuple):
        candidates.extend(record.args)
    for candidate in candidates:
        if isinstance(candidate, BaseException) and getattr(candidate, _MARK, None):
            return candidate
    return None


_REFUSAL_LOG = _RefusalLogFilter(REFUSAL_LOG_INTERVAL_SECONDS)


def quiet_refusal_logs() -> None:
    """Install the refusal filter on LiteLLM's proxy and router loggers (idempotent; one filter, so one
    interval per reason for the whole process)."""
    for name in _LITELLM_LOGGERS:
        logging.getLogger(name).addFilter(_REFUSAL_LOG)  # (addFilter ignores a filter already there)


def startup_model_info_problems(model_list: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every invalid ``model_info.backpressure`` block (and ``deployments.<id>`` override) of ``model_list``,
    one line each: ``deployment <id> (model_name <group>): model_info.backpressure.<key>: <what is valid>``.

    Run by the start-up check after the settings validated, so reading them here does not raise. A block
    that would fail here at the first request instead leaves its deployment unprotected (logged once); at
    start-up it is refused, like any other invalid setting. Deployments without an id are skipped (the
    Router gives every deployment one)."""
    settings = get_runtime().settings().ratebalance.backpressure
    problems: list[str] = []
    for deployment in model_list:
        info = _litellm.deployment_model_info(deployment)
        if info is None or info.get("id") is None:
            continue
        deployment_id = str(info["id"])
        try:
            settings.for_deployment(deployment_id, info)
        except ConfigurationError as exc:
            where = f"deployment {deployment_id} (model_name {_litellm.deployment_model_group(deployment)})"
            # The error reads "invalid configuration:" then one "deployment '<id>': <key>: <text>" line per problem.
            for line in str(exc).splitlines()[1:]:
                problems.append(f"{where}: {line.strip().removeprefix(f'deployment {deployment_id!r}: ')}")
    return problems


backpressure = BackpressureCallback()


def _hook_latency() -> Any:
    """The shared hook latency histogram (the same family the limiter and the contracts observe)."""
    return metrics.histogram("hook_latency_seconds", "Time spent in our hooks", ["component", "hook"])
