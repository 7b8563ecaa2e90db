"""LiteLLM adapter of the priority admission limiter.

One request's path:

1. ``async_pre_call_hook``: resolve the model group's capacity (cached), the caller's pool (team, then key
   metadata; unknown priorities share the default pool), the token estimate (prompt + requested output,
   per ``token_rate_limit_type``), build the limits (pure policy) and make **one** store call that decides
   and reserves atomically. Refused: a 429 in LiteLLM's message structure with ``retry-after`` and
   ``x-ratelimit-*`` headers. Admitted: a ticket in the request metadata and headers for the response.
2. ``async_post_call_response_headers_hook``: the admission headers on the successful response.
3. ``async_log_success_event``: **one** store call reconciling the reservation to the actual usage
   (LiteLLM runs logging callbacks off the response path).
4. ``async_post_call_failure_hook`` / ``async_log_failure_event``: give the token reservation back (and the
   request too when the failure came from a proxy hook, i.e. the provider never saw the request).

The reservation still held by each ticket is tracked in this process (the hooks of one request run in
the replica that admitted it), so a ticket is settled exactly once however many of these hooks fire,
and a success after a failed attempt still records its usage.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance import metrics
from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    build_limits,
    effective_remaining,
    pool_field,
    rate_limit_headers,
    rejection_message,
    reset_seconds,
)
from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.capacity import Capacity, CapacityCache
from litellm_ratebalance.proxy.identity import resolve_priority
from litellm_ratebalance.proxy.request_state import find_entry, stored_headers
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime, schedule_startup_check
from litellm_ratebalance.proxy.tokens import actual_tokens, estimate_tokens, usage_of
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.store.keys import escape_name

__all__ = ["PriorityRateLimiter", "rate_limiter"]

logger = logging.getLogger("litellm_ratebalance")

COMPONENT = "rate_limiter"
"""The component name in metrics labels and fault logs (the callback's name in config.yaml)."""

TICKET_KEY = "ratebalance_admission"
"""Request-metadata key holding the admission ticket id (and the response headers)."""

_MAX_OPEN_TICKETS = 100_000

_NO_OUTPUT_CALL_TYPES = frozenset({"embedding", "aembedding", "moderation", "amoderation", "rerank", "arerank"})
"""LiteLLM call types whose responses have no output tokens: no default output estimate is reserved."""


@dataclass(slots=True)
class _Ticket:
    model_group: str
    pool: str
    window_start_ms: int
    held_tokens: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the limiter derives from the settings once."""

    settings: Settings
    reservations: dict[str, float | Mapping[str, object]]
    field_of: dict[str, str]
    window_ms: int


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
        self._tickets: OrderedDict[str, _Ticket] = OrderedDict()
        self._admissions = metrics.counter(
            "admission_decisions",
            "Priority limiter decisions by model group, priority and result",
            ["model_group", "priority", "result", "reason"],
        )
        self._saturation = metrics.gauge(
            "admission_saturation", "Model-group saturation seen at the last decision", ["model_group"]
        )
        self._latency = metrics.histogram("hook_latency_seconds", "Time spent in our hooks", ["component", "hook"])

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
            )
            self._derived = derived
            self._capacity = CapacityCache(settings.ratebalance.limiter.capacity_refresh_seconds)
        return derived

    def _limits(self, derived: _Derived, capacity: Capacity, priority: str | None) -> AdmissionLimits:
        prs = derived.settings.priority_reservation_settings
        return build_limits(
            rpm=capacity.rpm,
            tpm=capacity.tpm,
            priority=priority,
            reservations=derived.reservations,
            default_priority=prs.default_priority,
            saturation_threshold=prs.saturation_threshold,
            lendable=derived.settings.ratebalance.limiter.lendable,
            field_of=derived.field_of,
        )

    # -- hooks ----------------------------------------------------------------------------------------
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            await self._admit(user_api_key_dict, data, call_type)
        finally:
            self._latency.labels(COMPONENT, "pre_call").observe(time.perf_counter() - started)
        return None

    async def _admit(self, user_api_key_dict: Any, data: dict[str, Any], call_type: Any = None) -> None:
        runtime = self._runtime()
        try:
            derived = self._config()
        except ConfigurationError as exc:
            logger.error("litellm_ratebalance rate_limiter: %s", exc)
            raise _litellm.service_unavailable(f"litellm_ratebalance is misconfigured: {exc}") from None
        model_group = data.get("model")
        router = runtime.router()
        if not isinstance(model_group, str) or router is None or self._capacity is None:
            return
        try:
            capacity = self._capacity.get(router, model_group)
        except Exception:  # a router we do not understand must not break requests
            logger.exception("litellm_ratebalance rate_limiter: reading model capacity failed")
            return
        if not capacity.limited:
            return  # nothing to enforce: no store round trip at all
        # Count under the model group (or wildcard route) whose capacity applies, never under the name the
        # request made up: with a route like ``openai/*`` every name it matches shares one window and one
        # set of metric labels.
        requested_model, model_group = model_group, capacity.model_group or model_group
        priority = resolve_priority(user_api_key_dict, derived.reservations)
        priority_label = priority if priority is not None else "default"
        limits = self._limits(derived, capacity, priority)
        limiter_settings = derived.settings.ratebalance.limiter
        cost = (
            estimate_tokens(
                requested_model,
                data,
                derived.settings.effective_token_type,
                0 if _produces_no_output(call_type) else limiter_settings.default_output_tokens,
                limiter_settings.max_reserved_output_tokens,
            )
            if capacity.tpm is not None
            else 0
        )
        try:
            result = await runtime.store().acquire(model_group, limits, cost, derived.window_ms)
        except StoreError as exc:
            if runtime.faults.record(COMPONENT, exc, derived.settings):
                self._admissions.labels(model_group, priority_label, "admitted", "store_error").inc()
                return
            raise runtime.faults.unavailable(COMPONENT) from None
        self._saturation.labels(model_group).set(result.saturation)
        headers = rate_limit_headers(
            limits=limits,
            counters=result.counters,
            strict=result.strict,
            saturation_value=result.saturation,
            priority_label=priority_label,
            now_ms=result.now_ms,
            window_end_ms=result.window_end_ms,
        )
        if not result.admitted:
            self._admissions.labels(model_group, priority_label, "rejected", result.reason.name.lower()).inc()
            remaining_requests, remaining_tokens = effective_remaining(result.counters, limits, result.strict)
            message = rejection_message(
                model=model_group,
                priority=priority,
                reason=result.reason,
                rpm=capacity.rpm,
                tpm=capacity.tpm,
                remaining=remaining_requests if result.reason.limit_type == "requests" else remaining_tokens,
                saturation_value=result.saturation,
            )
            headers["retry-after"] = str(reset_seconds(result.now_ms, result.window_end_ms))
            headers["rate_limit_type"] = result.reason.limit_type
            raise _litellm.rate_limit_exception(message, headers, model_group)
        self._admissions.labels(model_group, priority_label, "admitted", "").inc()
        ticket_id = uuid.uuid4().hex
        self._remember(
            ticket_id,
            _Ticket(model_group, limits.pool, result.window_start_ms, cost, time.monotonic() + 2 * derived.window_ms),
        )
        metadata = data.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
            data["metadata"] = metadata
        metadata[TICKET_KEY] = {"id": ticket_id, "headers": headers}

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return stored_headers(find_entry(data, TICKET_KEY)) if response is not None else None

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        started = time.perf_counter()
        try:
            await self._reconcile(kwargs, response_obj)
        finally:
            self._latency.labels(COMPONENT, "log_success").observe(time.perf_counter() - started)

    async def _reconcile(self, kwargs: dict[str, Any], response_obj: Any) -> None:
        entry = find_entry(kwargs, TICKET_KEY)
        if entry is None:
            return
        ticket = self._take(str(entry.get("id")), keep_window=True)
        if ticket is None:
            return
        derived = self._config()
        used = actual_tokens(usage_of(kwargs, response_obj), derived.settings.effective_token_type)
        if used is None:
            return  # no usage reported (e.g. some streams): the reservation stands as the estimate
        await self._settle(ticket, used - ticket.held_tokens, 0)

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
    def _remember(self, ticket_id: str, ticket: _Ticket) -> None:
        tickets = self._tickets
        now = time.monotonic()
        # Tickets whose window has long ended can no longer be settled (the store drops late settles);
        # forget them so a request that never reports back cannot leak memory.
        while tickets and (len(tickets) >= _MAX_OPEN_TICKETS or next(iter(tickets.values())).expires_at < now):
            tickets.popitem(last=False)
        tickets[ticket_id] = ticket

    def _take(self, ticket_id: str, *, keep_window: bool) -> _Ticket | None:
        """Remove the held reservation of a ticket; a later success still finds its window (held 0)."""
        ticket = self._tickets.get(ticket_id)
        if ticket is None:
            return None
        if keep_window:
            del self._tickets[ticket_id]
            return ticket
        held = ticket.held_tokens
        ticket.held_tokens = 0
        return _Ticket(ticket.model_group, ticket.pool, ticket.window_start_ms, held, ticket.expires_at)

    async def _release(self, ticket_id: str, exception: Any) -> None:
        ticket = self._take(ticket_id, keep_window=False)
        if ticket is None:
            return
        from fastapi import HTTPException

        # A proxy hook refused the request (another limiter, a guardrail): the provider never saw it.
        give_request_back = isinstance(exception, HTTPException)
        if give_request_back:
            self._tickets.pop(ticket_id, None)
        await self._settle(ticket, -ticket.held_tokens, -1 if give_request_back else 0)

    async def _settle(self, ticket: _Ticket, token_delta: int, request_delta: int) -> None:
        if token_delta == 0 and request_delta == 0:
            return
        runtime = self._runtime()
        try:
            await runtime.store().settle(
                ticket.model_group, ticket.pool, ticket.window_start_ms, token_delta, request_delta
            )
        except StoreError as exc:
            # Post-call: nothing to refuse any more; fail mode only decides whether we warn.
            runtime.faults.record(COMPONENT, exc, self._config().settings)
        except Exception:
            logger.exception("litellm_ratebalance rate_limiter: settling a reservation failed")


def _produces_no_output(call_type: Any) -> bool:
    """True for embeddings and the like (the proxy passes its route type, e.g. ``"aembedding"``)."""
    return str(getattr(call_type, "value", call_type)) in _NO_OUTPUT_CALL_TYPES


rate_limiter = PriorityRateLimiter()
