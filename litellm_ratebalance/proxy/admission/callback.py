"""LiteLLM adapter of the priority admission limiter.

One request's path:

1. ``async_pre_call_hook``: resolve the model group's capacity (cached), the caller's pool (team, then key
   metadata; unknown priorities share the default pool), the cost (prompt tokens counted now, plus the
   output: the learned estimate capped at max_tokens, per ``token_rate_limit_type``), build the limits
   (pure policy) and make **one** store call that applies pending settles, decides and reserves
   atomically. Refused: a 429 in LiteLLM's message structure with ``retry-after`` and
   ``x-ratelimit-*`` headers. Admitted: a ticket in the request metadata and headers for the response.
2. ``async_post_call_response_headers_hook``: the admission headers on the successful response.
3. ``async_post_call_success_hook`` (a non-streaming answer, before it is sent to the client) or else
   ``async_log_success_event`` (streams, and answers without usage until logging): the correction to the
   actual usage (and a sample for the learned output estimate) joins the model group's pending batch, with
   no store call of its own: the batch travels with the next admission of that model group, or is flushed
   within 100 ms (:mod:`.settle_queue`). A cold start's corrections (reserved before anything was learned)
   are sent at once. Correcting before the answer leaves means a client that sends one request at a time
   is never decided against its previous request's reservation (LiteLLM runs success logging after the
   response, in the background).
4. ``async_post_call_failure_hook`` / ``async_log_failure_event``: give the token reservation back (and the
   request too when the failure came from a proxy hook, i.e. the provider never saw the request), queued
   the same way.

The reservation still held by each ticket is tracked in this process (the hooks of one request run in
the replica that admitted it), so a ticket is settled exactly once however many of these hooks fire,
and a success after a failed attempt still records its usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance import metrics
from litellm_ratebalance.admission.estimate import SettleBatch
from litellm_ratebalance.admission.ledger import RequestCost
from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    build_limits,
    effective_remaining,
    pool_field,
    rate_limit_headers,
    rejection_message,
    reset_seconds,
    scale_limits,
)
from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.identity import resolve_priority
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.admission.capacity import Capacity, CapacityCache
from litellm_ratebalance.proxy.admission.settle_queue import SettleQueue
from litellm_ratebalance.proxy.admission.tickets import AdmissionTicket, TicketBook
from litellm_ratebalance.proxy.request_state import find_entry, stored_headers
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime, schedule_startup_check
from litellm_ratebalance.proxy.store_metrics import late_replies
from litellm_ratebalance.proxy.tokens import actual_tokens, prompt_tokens, requested_output_tokens, usage_of
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.store.admission import AcquireResult
from litellm_ratebalance.store.keys import escape_name

__all__ = ["PriorityRateLimiter", "rate_limiter"]

logger = logging.getLogger("litellm_ratebalance.admission")

COMPONENT = "rate_limiter"
"""The component name in metrics labels and fault logs (the callback's name in config.yaml)."""

TICKET_KEY = "ratebalance_admission"
"""Request-metadata key holding the admission ticket id (and the response headers)."""

_MAX_OPEN_TICKETS = 100_000
_MIN_TICKET_SECONDS = 900.0
"""A request that runs longer than this (and two windows) is no longer corrected after the call."""

_NO_OUTPUT_CALL_TYPES = frozenset({"embedding", "aembedding", "moderation", "amoderation", "rerank", "arerank"})
"""LiteLLM call types whose responses have no output tokens: no default output estimate is reserved."""


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the limiter derives from the settings once."""

    settings: Settings
    reservations: dict[str, float | Mapping[str, object]]
    field_of: dict[str, str]
    window_ms: int
    quantile: float | None
    """``limiter.output_estimate_quantile``."""
    limits: dict[tuple[int | None, int | None, str | None], AdmissionLimits] = field(default_factory=dict)
    """Built limits by (model rpm, model tpm, priority)."""


class _Decision(NamedTuple):
    """The store's answer to one admission, the limits it was decided against, and whether this process decided
    it alone (``fail_mode: local`` while the shared store fails)."""

    result: AcquireResult
    limits: AdmissionLimits
    local: bool


@dataclass(frozen=True, slots=True)
class _Request:
    """What one request is to the admission policy (module doc, step 1)."""

    model_group: str
    """The model group (or wildcard route) whose capacity applies: the request is counted under it."""
    capacity: Capacity
    priority: str | None
    """A configured priority, or ``None`` for the shared default pool."""
    priority_label: str
    limits: AdmissionLimits
    cost: RequestCost


class PriorityRateLimiter(CustomLogger):  # type: ignore[misc]
    """Priority admission against model-group TPM/RPM (``dynamic_rate_limiter_v3`` semantics, exact).

    Config: ``litellm_settings.callbacks: ["litellm_ratebalance.rate_limiter"]``. SDK: build one, pass it to
    ``litellm.callbacks``, and wire settings/store/router with :func:`litellm_ratebalance.configure`.
    """

    def __init__(self, runtime: Runtime | None = None) -> None:
        """``runtime``: settings/store/router for this instance only (tests, several limiters in one
        process); by default the process-wide runtime."""
        super().__init__()
        self._own_runtime = runtime
        if runtime is None:
            schedule_startup_check()
        self._derived: _Derived | None = None
        self._capacity: CapacityCache | None = None
        self._tickets = TicketBook(_MAX_OPEN_TICKETS)
        self._settles = SettleQueue(self._flush)
        self._local_settles = SettleQueue(self._flush_local)
        self._admissions = metrics.counter(
            "admission_decisions",
            "Priority limiter decisions by model group, priority and result",
            ["model_group", "priority", "result", "reason"],
        )
        self._saturation = metrics.gauge(
            "admission_saturation", "Model-group saturation seen at the last decision", ["model_group"]
        )
        self._latency = metrics.hook_latency()
        self._late_replies = late_replies()
        self._estimate = metrics.gauge(
            "admission_output_estimate_tokens",
            "Learned output tokens a request of the model group reserves (before capping at max_tokens)",
            ["model_group"],
        )
        self._headroom = metrics.gauge(
            "admission_headroom_tokens",
            "Learned tokens of the model group's tpm that new reservations leave free for answers in flight",
            ["model_group"],
        )
        # Labelled children of the per-request series, looked up once (a label lookup costs about as much
        # as the rest of the hook's own bookkeeping); bounded by model groups x configured priorities.
        self._pre_call_latency = self._latency.labels(COMPONENT, "pre_call")
        self._log_success_latency = self._latency.labels(COMPONENT, "log_success")
        self._post_call_success_latency = self._latency.labels(COMPONENT, "post_call_success")
        self._admitted_counters: dict[tuple[str, str], Any] = {}
        self._gauges: dict[str, tuple[Any, Any, Any]] = {}

    def _runtime(self) -> Runtime:
        return self._own_runtime if self._own_runtime is not None else get_runtime()

    # -- derived configuration ------------------------------------------------------------------------
    def _config(self) -> _Derived:
        derived = self._derived
        settings = self._runtime().settings()
        if derived is None or derived.settings is not settings:
            reservations = settings.reservation_values()
            derived = _Derived(
                settings=settings,
                reservations=reservations,
                field_of={name: pool_field(name, escape_name(name)) for name in reservations},
                window_ms=settings.ratebalance.limiter.window_seconds * 1000,
                quantile=settings.ratebalance.limiter.output_estimate_quantile,
            )
            self._derived = derived
            self._capacity = CapacityCache(settings.ratebalance.limiter.capacity_refresh_seconds)
        return derived

    def _limits(self, derived: _Derived, capacity: Capacity, priority: str | None) -> AdmissionLimits:
        # The same for every request of one pool while the settings and the capacity stay: built once.
        key = (capacity.rpm, capacity.tpm, priority)
        found = derived.limits.get(key)
        if found is not None:
            return found
        if len(derived.limits) >= 4096:  # capacities change rarely; bounded anyway
            derived.limits.clear()
        prs = derived.settings.priority_reservation_settings
        found = derived.limits[key] = build_limits(
            rpm=capacity.rpm,
            tpm=capacity.tpm,
            priority=priority,
            reservations=derived.reservations,
            default_priority=prs.default_priority,
            saturation_threshold=prs.saturation_threshold,
            lendable=derived.settings.ratebalance.limiter.lendable,
            field_of=derived.field_of,
        )
        return found

    # -- hooks ----------------------------------------------------------------------------------------
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            await self._admit(user_api_key_dict, data, call_type)
        finally:
            self._pre_call_latency.observe(time.perf_counter() - started)
        return None

    async def _admit(self, user_api_key_dict: Any, data: dict[str, Any], call_type: Any = None) -> None:
        """One request's admission (module doc, step 1): resolve it, one store call, then refuse or note it."""
        derived = self._config_or_unavailable()
        request = self._request(derived, user_api_key_dict, data, call_type)
        if request is None:
            return  # not a model group with a limit: nothing to enforce, no store round trip at all
        decision = await self._acquire(derived, request)
        if decision is None:
            return  # store fault, failing open: admitted uncounted
        headers = self._observe(request, decision)
        if not decision.result.admitted:
            raise self._rejection(request, decision, headers)
        self._count_admitted(request, decision.local)
        self._open_ticket(data, derived, request, decision, headers)

    def _config_or_unavailable(self) -> _Derived:
        try:
            return self._config()
        except ConfigurationError as exc:
            logger.error("litellm_ratebalance rate_limiter: %s", exc)
            raise _litellm.service_unavailable(f"litellm_ratebalance is misconfigured: {exc}") from None

    def _request(
        self, derived: _Derived, user_api_key_dict: Any, data: dict[str, Any], call_type: Any
    ) -> _Request | None:
        """What the request is to the policy; ``None`` when nothing limits its model group."""
        model_group = data.get("model")
        router = self._runtime().router()
        if not isinstance(model_group, str) or router is None or self._capacity is None:
            return None
        try:
            capacity = self._capacity.get(router, model_group)
        except Exception:  # a router we do not understand must not break requests
            logger.exception("litellm_ratebalance rate_limiter: reading model capacity failed")
            return None
        if not capacity.limited:
            return None
        priority = resolve_priority(user_api_key_dict, derived.reservations)
        # Count under the model group (or wildcard route) whose capacity applies, never under the name the
        # request made up: with a route like ``openai/*`` every name it matches shares one window and one
        # set of metric labels.
        return _Request(
            model_group=capacity.model_group or model_group,
            capacity=capacity,
            priority=priority,
            priority_label=priority if priority is not None else "default",
            limits=self._limits(derived, capacity, priority),
            cost=_request_cost(model_group, data, derived.settings, call_type) if capacity.tpm else RequestCost(0),
        )

    async def _acquire(self, derived: _Derived, request: _Request) -> _Decision | None:
        """The shared store's decision (the pending settles of the model group ride along), or on a store fault
        what the fail mode says: ``None`` (open: admitted uncounted), a 503 (closed), or this process's own
        decision (local)."""
        runtime = self._runtime()
        model_group, limits = request.model_group, request.limits
        settles = await self._settles.take_after_send(model_group)
        try:
            result = await runtime.store().acquire(
                model_group, limits, request.cost, derived.window_ms, settles=settles, quantile=derived.quantile
            )
        except StoreError as exc:
            if exc.late is not None:
                # Timed out, maybe still running in Redis: whatever it reserves is given back when it answers
                # (the request goes on per the fail mode, uncounted or counted elsewhere), and the settles it
                # carried are applied by it, not sent again.
                pool = limits.pool
                exc.late.add_done_callback(lambda late: self._give_back_late(model_group, pool, late))
            elif settles is not None:
                self._settles.put_back(model_group, settles, derived.window_ms)
            if not runtime.faults.record(COMPONENT, exc, derived.settings):
                raise runtime.faults.unavailable(COMPONENT) from None
            if derived.settings.ratebalance.fail_mode != "local":
                self._admissions.labels(model_group, request.priority_label, "admitted", "store_error").inc()
                return None
            return await self._acquire_locally(runtime, derived, request)
        return _Decision(result, limits, False)

    async def _acquire_locally(self, runtime: Runtime, derived: _Derived, request: _Request) -> _Decision:
        """``fail_mode: local``: decide in this process, against its share of the limits, until the shared
        store is back."""
        limits = scale_limits(request.limits, derived.settings.ratebalance.local_fallback_share)
        settles = self._local_settles.take(request.model_group)
        result = await runtime.local_store().acquire(
            request.model_group, limits, request.cost, derived.window_ms, settles=settles, quantile=derived.quantile
        )
        return _Decision(result, limits, True)

    def _observe(self, request: _Request, decision: _Decision) -> dict[str, str]:
        """Set the model group's gauges from the decision; the ``x-ratelimit-*`` headers of the answer."""
        result, limits = decision.result, decision.limits
        saturation_gauge, estimate_gauge, headroom_gauge = self._model_gauges(request.model_group)
        saturation_gauge.set(result.saturation)
        headroom_gauge.set(result.headroom)
        if result.estimate is not None:
            estimate_gauge.set(result.estimate)
        return rate_limit_headers(
            limits=limits,
            counters=result.counters,
            strict=result.strict,
            saturation_value=result.saturation,
            priority_label=request.priority_label,
            now_ms=result.now_ms,
            window_end_ms=result.window_end_ms,
        )

    def _rejection(self, request: _Request, decision: _Decision, headers: dict[str, str]) -> Exception:
        """Count a refusal; the 429 the client gets (LiteLLM's message structure, ``retry-after``)."""
        result, limits, local = decision
        reason = result.reason.name.lower()
        self._admissions.labels(
            request.model_group, request.priority_label, "rejected", f"local_{reason}" if local else reason
        ).inc()
        remaining_requests, remaining_tokens = effective_remaining(result.counters, limits, result.strict)
        message = rejection_message(
            model=request.model_group,
            priority=request.priority,
            reason=result.reason,
            rpm=request.capacity.rpm,
            tpm=request.capacity.tpm,
            remaining=remaining_requests if result.reason.limit_type == "requests" else remaining_tokens,
            saturation_value=result.saturation,
        )
        headers["retry-after"] = str(reset_seconds(result.now_ms, result.window_end_ms))
        headers["rate_limit_type"] = result.reason.limit_type
        return _litellm.rate_limit_exception(message, headers, request.model_group)

    def _count_admitted(self, request: _Request, local: bool) -> None:
        model_group, priority_label = request.model_group, request.priority_label
        if local:
            self._admissions.labels(model_group, priority_label, "admitted", "local").inc()
            return
        admitted = self._admitted_counters.get((model_group, priority_label))
        if admitted is None:
            admitted = self._admitted_counters[(model_group, priority_label)] = self._admissions.labels(
                model_group, priority_label, "admitted", ""
            )
        admitted.inc()

    def _open_ticket(
        self, data: dict[str, Any], derived: _Derived, request: _Request, decision: _Decision, headers: dict[str, str]
    ) -> None:
        """Note the admitted request's reservation (its ticket, in the request metadata with the headers)."""
        result, limits, local = decision
        cost = request.cost
        learn_beyond = cost.fixed if cost.output_cap is not None else None
        # Late corrections still count (carried into the current window): keep tickets past their window.
        expires_at = time.monotonic() + max(2 * derived.window_ms / 1000, _MIN_TICKET_SECONDS)
        ticket_id = self._tickets.open(
            AdmissionTicket(
                request.model_group,
                limits.pool,
                result.window_start_ms,
                result.cost_tokens,
                expires_at,
                learn_beyond,
                local,
                on_prior=cost.output_cap is not None and result.estimate is None,
            )
        )
        metadata = data.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
            data["metadata"] = metadata
        metadata[TICKET_KEY] = {"id": ticket_id, "headers": headers}

    def _model_gauges(self, model_group: str) -> tuple[Any, Any, Any]:
        found = self._gauges.get(model_group)
        if found is None:
            found = self._gauges[model_group] = (
                self._saturation.labels(model_group),
                self._estimate.labels(model_group),
                self._headroom.labels(model_group),
            )
        return found

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return stored_headers(find_entry(data, TICKET_KEY)) if response is not None else None

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> Any:
        started = time.perf_counter()
        try:
            # Only an answer that carries its usage: otherwise success logging corrects it (module doc, 3).
            await self._reconcile(data, response, only_with_usage=True)
        except Exception:  # never break an answer on its way out; success logging still has the ticket then
            logger.exception("litellm_ratebalance rate_limiter: correcting a reservation failed")
        finally:
            self._post_call_success_latency.observe(time.perf_counter() - started)
        return None

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        started = time.perf_counter()
        try:
            await self._reconcile(kwargs, response_obj)
        finally:
            self._log_success_latency.observe(time.perf_counter() - started)

    async def _reconcile(self, kwargs: dict[str, Any], response_obj: Any, *, only_with_usage: bool = False) -> None:
        entry = find_entry(kwargs, TICKET_KEY)
        if entry is None:
            return
        ticket_id = str(entry.get("id"))
        if self._tickets.get(ticket_id) is None:
            return  # corrected already (or unknown)
        derived = self._config()
        used = actual_tokens(usage_of(kwargs, response_obj), derived.settings.effective_token_type)
        if used is None and only_with_usage:
            return
        ticket = self._tickets.close(ticket_id)
        if ticket is None:
            return
        if used is None:
            return  # no usage reported (e.g. some streams): the reservation stands as the estimate
        batch = self._queue_of(ticket).batch(ticket.model_group)
        batch.add(ticket.window_start_ms, ticket.pool, used - ticket.held_tokens)
        if ticket.learn_beyond is not None:
            batch.learn(used - ticket.learn_beyond)
        if ticket.on_prior:  # a cold start's correction: the other replicas must see it now (settle_queue)
            await self._queue_of(ticket).send_now(ticket.model_group)

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        started = time.perf_counter()
        try:
            entry = find_entry(kwargs, TICKET_KEY)
            if entry is not None:
                await self._release(str(entry.get("id")), kwargs.get("exception"))
        finally:
            self._latency.labels(COMPONENT, "log_failure").observe(time.perf_counter() - started)

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        started = time.perf_counter()
        try:
            entry = find_entry(request_data, TICKET_KEY)
            if entry is not None:
                await self._release(str(entry.get("id")), original_exception)
        finally:
            self._latency.labels(COMPONENT, "post_call_failure").observe(time.perf_counter() - started)
        return None

    # -- tickets ----------------------------------------------------------------------------------------
    def _queue_of(self, ticket: AdmissionTicket) -> SettleQueue:
        return self._local_settles if ticket.local else self._settles

    async def _release(self, ticket_id: str, exception: Any) -> None:
        ticket = self._tickets.release(ticket_id)
        if ticket is None:
            return
        from fastapi import HTTPException

        # A proxy hook refused the request (another limiter, a guardrail): the provider never saw it.
        give_request_back = isinstance(exception, HTTPException)
        if give_request_back:
            self._tickets.drop(ticket_id)
        elif ticket.held_tokens == 0:
            return
        self._queue_of(ticket).batch(ticket.model_group).add(
            ticket.window_start_ms, ticket.pool, -ticket.held_tokens, -1 if give_request_back else 0
        )
        if ticket.on_prior:
            await self._queue_of(ticket).send_now(ticket.model_group)

    async def _flush(self, model_group: str, batch: SettleBatch) -> bool:
        """Send one model group's pending settles (the settle queue's timer); ``False`` if not sent."""
        runtime = self._runtime()
        derived = self._config()
        try:
            await runtime.store().flush(model_group, batch, quantile=derived.quantile)
        except StoreError as exc:
            # Post-call: nothing to refuse any more; the batch waits for the next admission of its model
            # group (unless the call timed out and may still apply it), and the fail mode only decides
            # whether we warn.
            if exc.late is not None:
                exc.late.add_done_callback(self._late_outcome)
            else:
                self._settles.put_back(model_group, batch, derived.window_ms)
            runtime.faults.record(COMPONENT, exc, derived.settings)
            return False
        return True

    def _give_back_late(self, model_group: str, pool: str, late: asyncio.Future[AcquireResult]) -> None:
        """A timed-out admission answered after all: give back the request it reserved, with the next batch."""
        if self._late_outcome(late) and (result := late.result()).admitted:
            self._settles.batch(model_group).add(result.window_start_ms, pool, -result.cost_tokens, -1)

    def _late_outcome(self, late: asyncio.Future[Any]) -> bool:
        """Count a timed-out call's late outcome; True if Redis answered (what it carried was applied).

        Without an answer (an error, or none within the late wait) its settles are lost as a batch of a
        killed process would be: reservations stay as estimated until their window ends."""
        answered = not late.cancelled() and late.exception() is None
        self._late_replies.labels(COMPONENT, "answered" if answered else "lost").inc()
        return answered

    async def _flush_local(self, model_group: str, batch: SettleBatch) -> bool:
        """Apply one model group's pending settles of ``fail_mode: local`` admissions to the local store."""
        await self._runtime().local_store().flush(model_group, batch, quantile=self._config().quantile)
        return True

    async def flush_settles(self) -> None:
        """Send every pending settle now (tests, shutdown); normally they travel with admissions."""
        await self._settles.flush_all()
        await self._local_settles.flush_all()


def _request_cost(model: str, data: dict[str, Any], settings: Settings, call_type: Any) -> RequestCost:
    """What the request reserves (module doc, step 1): the prompt when the token type counts input, plus
    the output when it counts output and the call produces any."""
    token_type = settings.effective_token_type
    limiter = settings.ratebalance.limiter
    fixed = prompt_tokens(model, data) if token_type in ("input", "total") else 0
    if token_type == "input" or _produces_no_output(call_type):
        return RequestCost(fixed)
    ceiling = limiter.max_reserved_output_tokens
    if limiter.output_estimate == "max_tokens":
        return RequestCost(fixed + requested_output_tokens(data, limiter.default_output_tokens, ceiling))
    cap = requested_output_tokens(data, ceiling, ceiling)
    return RequestCost(fixed, output_cap=cap, prior=min(limiter.default_output_tokens, ceiling))


def _produces_no_output(call_type: Any) -> bool:
    """True for embeddings and the like (the proxy passes its route type, e.g. ``"aembedding"``)."""
    return str(getattr(call_type, "value", call_type)) in _NO_OUTPUT_CALL_TYPES


rate_limiter = PriorityRateLimiter()
