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

The parts behind the hooks: the state and the lease book (:mod:`.book`), taking and giving back
slots with the wait queue (:mod:`.admit`), refusals and their log lines
(:mod:`.refusals`), the background step (:mod:`.maintain`), the metrics
(:mod:`.metrics`); the policy itself is pure, in :mod:`litellm_ratebalance.overload`.

Errors clients see: 503 (shed: ``memory_pressure``, ``compute_saturation``, ``queue_overflow``) or 429
(``concurrency_limit``), with ``retry-after`` from the drain rate, ``x-litellm-backpressure-reason`` and
``x-litellm-backpressure-advice`` (``retry`` | ``reroute``). Nothing else our hooks hit reaches a client:
every other failure is logged and the request passes (store faults follow ``ratebalance.fail_mode``).
LiteLLM's own log line for each refusal (an ERROR, with a traceback for a 503) is replaced by one WARNING
per reason per interval (:mod:`.refusals`); the metric counts them all.

Identity: the priority and fairness key come from the ``UserAPIKeyAuth`` the proxy puts in the request
metadata (``metadata.user_api_key_auth``, resolved like the limiter: team metadata, then key metadata),
never from the request body. SDK users of a bare Router pass one there themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance.metrics import hook_latency
from litellm_ratebalance.overload.shedding import Tiers
from litellm_ratebalance.overload.signals import Fetcher, GpuProbe, NvmlProbe, SignalBoard
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.backpressure.admit import (
    admit,
    refresh_counts,
    release,
    release_if_cancelled,
    sort_candidates,
    taken_elsewhere,
)
from litellm_ratebalance.proxy.backpressure.book import BackpressureProcess, Context
from litellm_ratebalance.proxy.backpressure.maintain import maintain_forever
from litellm_ratebalance.proxy.backpressure.maintain import maintain_once as _maintain_once
from litellm_ratebalance.proxy.backpressure.refusals import is_ours, queue_full, quiet_refusal_logs, refusal
from litellm_ratebalance.proxy.backpressure.requests import learn, profile_of
from litellm_ratebalance.proxy.backpressure.trace import Trace, verdict_fields
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime, schedule_startup_check

__all__ = ["BackpressureCallback", "backpressure", "process_of", "startup_model_info_problems"]

logger = logging.getLogger("litellm_ratebalance.backpressure")

_COMPONENT = "backpressure"


def process_of(runtime: Runtime) -> BackpressureProcess:
    """Backpressure's state in ``runtime``: its registry's deployment gate, created there on first use."""
    gate = runtime.registry.deployment_gate
    if isinstance(gate, BackpressureProcess):
        return gate
    process = BackpressureProcess()
    runtime.registry.deployment_gate = process
    runtime.registry.on_reset(process.stop)
    return process


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
        clock: Callable[[], float] = time.monotonic,
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
    def _context(self) -> Context | None:
        """The live context, rebuilt when the loop or the settings object changed; ``None`` when off.

        Another instance of this class finding the context live uses it as it is (its leases, queue and
        limits): rebuilding it would forget the slots the first one holds. The first instance's probe,
        fetcher and clock stay in use until the settings change."""
        runtime = get_runtime()
        try:
            settings = runtime.settings().ratebalance.backpressure
        except Exception as exc:  # ConfigurationError: already names the key; logged once, requests pass
            if not self._config_error_logged:
                self._config_error_logged = True
                logger.error("litellm_ratebalance backpressure is off: %s", exc)
            return None
        if not settings.enabled:
            return None
        loop = asyncio.get_running_loop()
        process = process_of(runtime)
        ctx = process.ctx
        if ctx is None or ctx.loop is not loop or ctx.settings is not settings:
            if ctx is not None and ctx.maintenance is not None and ctx.loop is loop:
                ctx.maintenance.cancel()
            probe = self._gpu_probe
            if probe is None and settings.signals.nvml:
                probe = NvmlProbe()
            board = SignalBoard(self._fetch, probe)
            ctx = Context(
                loop,
                settings,
                Tiers(settings.tiers),
                board,
                self._clock,
                owner=self,
                trace=Trace.from_environ(os.environ),
            )
            process.ctx = ctx
            # Scraping starts before the first request reaches a deployment.
            for deployment in _litellm.router_deployments(runtime.router()):
                ctx.deployment(_litellm.deployment_model_info(deployment), _litellm.deployment_model_group(deployment))
        if ctx.maintenance is None or ctx.maintenance.done():
            ctx.maintenance = loop.create_task(maintain_forever(ctx), name="litellm_ratebalance.backpressure")
        return ctx

    # -- routing --------------------------------------------------------------------------------------------
    def gates_deployments(self) -> bool:
        """:meth:`BackpressureProcess.gates_deployments` of this process."""
        return process_of(get_runtime()).gates_deployments()

    def deployment_available(self, deployment_id: str, priority: str | None = None) -> bool:
        """:meth:`BackpressureProcess.deployment_available` of this process."""
        return process_of(get_runtime()).deployment_available(deployment_id, priority)

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
            hook_latency().labels(_COMPONENT, "filter_deployments").observe(time.perf_counter() - started)

    async def _filter(
        self, model: str, healthy_deployments: list[Any], messages: Any, request_kwargs: dict[str, Any] | None
    ) -> list[Any]:
        try:
            ctx = self._context()
            if ctx is None or not healthy_deployments or _litellm.is_queue_lookup(messages, request_kwargs):
                # (the priority queue only asks whether any deployment is healthy: the request's own pick,
                # which follows, is the one to admit or refuse, and to count once)
                return healthy_deployments
            candidates = [(d, ctx.deployment(_litellm.deployment_model_info(d), model)) for d in healthy_deployments]
            if all(state is None for _, state in candidates):
                return healthy_deployments  # none of them is managed: no token counting, no decision
            ctx.groups[model] = tuple(state for _, state in candidates)
            profile = profile_of(ctx, request_kwargs or {}, messages)
            admitted, queueable, refused = sort_candidates(ctx, candidates, profile)
            if ctx.trace.enabled:
                call_id = _litellm.request_call_id(request_kwargs or {})
                for _, state in candidates:
                    if state is not None:
                        verdict = ctx.decide(state, profile)
                        ctx.trace.event("route", ctx, state, profile, call_id, **verdict_fields(verdict))
            fresh_after = ctx.clock() - ctx.settings.queue.poll_interval_seconds
            stale = [s for s, verdict, _ in refused if verdict.count_based and s.counted_at < fresh_after]
            if not admitted and not queueable and stale:
                # Our counts of other replicas' requests are up to one maintenance interval old: read them
                # fresh before refusing on them (one round trip per deployment, on the refusal path only).
                await refresh_counts(ctx, stale)
                admitted, queueable, refused = sort_candidates(ctx, candidates, profile)
            if admitted or queueable:
                return admitted or queueable
            # Every deployment refuses: answer with the one closest to taking the request.
            state, verdict, full = min(
                refused, key=lambda r: (r[1].never_fits, r[1].completions_needed / max(1, r[0].inflight))
            )
            if full:
                raise queue_full(ctx, state, verdict, profile, no_router_retry=True)
            raise refusal(ctx, state, verdict, profile, no_router_retry=True)
        except Exception as exc:
            if is_ours(exc):
                raise
            logger.exception("litellm_ratebalance backpressure: filter failed; passing the deployments through")
            return healthy_deployments

    # -- admission ------------------------------------------------------------------------------------------
    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        try:
            ctx = self._context()
            if ctx is None:
                return None
            info = _litellm.request_deployment_info(kwargs)
            state = ctx.deployment(info, _litellm.request_model_group(kwargs))
            if state is None:
                return None
            call_id = _litellm.request_call_id(kwargs) or uuid.uuid4().hex
            if any(held.attempt is kwargs for held in ctx.calls.get(call_id, ())):
                return None  # this attempt holds its slot already (the class is listed twice in callbacks)
            profile = profile_of(ctx, kwargs, kwargs.get("messages"))
            try:
                lease = await admit(ctx, state, profile, call_id)
            except Exception as exc:
                if is_ours(exc) and not taken_elsewhere(ctx, state, profile):
                    # The Router would retry this refusal on the same deployment (after a back-off, when it is
                    # the only one): nothing else in the group would take it, so the answer is final.
                    _litellm.forbid_router_retry(exc)
                raise
            if lease is not None:
                lease.attempt = kwargs
                release_if_cancelled(ctx, lease)
            return None
        except Exception as exc:
            if is_ours(exc):
                raise
            logger.exception("litellm_ratebalance backpressure: admission failed; letting the request through")
            return None

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
            if is_ours(exception):
                return  # refused by us: that attempt never held a lease
            await self._finish(kwargs, response_obj, end_time, failed=True, exception=exception)
        except Exception:
            logger.exception("litellm_ratebalance backpressure: failure accounting failed")

    async def _finish(self, kwargs: Any, response_obj: Any, end_time: Any, *, failed: bool, exception: Any) -> None:
        runtime = get_runtime()
        ctx = process_of(runtime).ctx
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
            learn(ctx, state, lease, response_obj, end_time, failed, exception)
        runtime.registry.lease_meter().lease_usage(lease.lease_id, response_obj)  # cost: the tokens of the request
        await release(ctx, lease)

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
            ctx = process_of(get_runtime()).ctx
            if response is None or ctx is None:
                return None  # refusals carry their headers themselves
            deployment_id = _litellm.response_deployment_id(response)
            state = ctx.deployments.get(deployment_id) if deployment_id is not None else None
            if state is None:
                return None
            return {
                "x-litellm-queue-depth": str(ctx.queue_depth(state)),
                "x-litellm-concurrency-limit": str(state.applied_limit),
            }
        except Exception:
            logger.exception("litellm_ratebalance backpressure: response headers failed")
            return None

    # -- background, tests, status --------------------------------------------------------------------------
    async def maintain_once(self, ctx: Context | None = None) -> None:
        """One maintenance step (tests call it directly instead of waiting for the interval)."""
        ctx = ctx or self._context()
        if ctx is not None:
            await _maintain_once(ctx)

    async def aclose(self) -> None:
        """Stop the background tasks of the current context (tests; the proxy never needs it)."""
        process = process_of(get_runtime())
        ctx = process.ctx
        if ctx is None or ctx.owner is not self:
            return
        process.ctx = None
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
        ctx = process_of(get_runtime()).ctx
        if ctx is None:
            return {}
        return {
            deployment_id: {
                "limit": state.applied_limit,
                "own_limit": state.limit.limit,
                "peer_replicas": state.peers.replicas,
                "inflight": state.inflight,
                "reserved_tokens": state.reserved_tokens,
                "queue_depth": len(state.queue),
                "local_leases": len(state.leases),
                "mean_latency_seconds": state.mean_latency,
                "baseline_rtt_per_token": state.limit.baseline_rtt,
                "short_rtt_per_token": state.limit.short_rtt,
                "output_estimate_tokens": state.output.estimate(ctx.settings.output_estimate_quantile),
                "prompt_scale": state.prompt_scale.factor,
                "top_reserve": ctx.top_reserve(state),
                "top_inflight": state.top_inflight + state.peers.top_inflight,
                "signals": ctx.server_signals(state),
                "server": ctx.board.server(deployment_id),
                "kv_cache_tokens": ctx.kv_capacity(state),
                "signal_problems": _problems(ctx, deployment_id),
            }
            for deployment_id, state in ctx.deployments.items()
        }


def _problems(ctx: Context, deployment_id: str) -> list[str]:
    health = ctx.board.health(deployment_id)
    return [] if health is None else [p.value for p in health.problems]


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
        problems += settings.deployment_problems(str(info["id"]), _litellm.deployment_model_group(deployment), info)
    return problems


backpressure = BackpressureCallback()
