"""LiteLLM adapter of the traffic-contract tracker.

Config: ``litellm_settings.callbacks: ["litellm_ratebalance.traffic_contracts"]``; settings under
``litellm_settings.ratebalance.traffic_contracts`` (see :mod:`litellm_ratebalance.contracts.config`).

One request's path:

1. ``async_pre_call_hook``: resolve the feature (trust rules in
   :func:`~litellm_ratebalance.contracts.policy.resolve_feature`), estimate its tokens when a TPM
   contract applies, and make **one** store call that classifies the RPM and TPM modes and counts the
   request atomically (a request whose action is ``reject`` is not counted). Then: the modes and the
   feature go into LiteLLM's logging metadata (``traffic_contract_*`` keys, also inside
   ``spend_logs_metadata``, which the standard logging payload carries to Langfuse, Datadog, spend
   logs); the Prometheus counter is incremented; the mode's action is applied (429, lower
   ``max_tokens``, or a bounded jittered wait).
2. ``async_post_call_response_headers_hook``: ``x-traffic-contract-feature`` / ``-rpm-mode`` /
   ``-tpm-mode`` on the response (rejected ones included).
3. ``async_log_success_event`` / ``async_log_failure_event`` / ``async_post_call_failure_hook``:
   reconcile the TPM estimate to the actual usage: the amounts join this process's pending reconciles
   (:mod:`.settles`), sent for all requests of a window together in one store call, in a
   background task, at most 100 ms later (so a slow Redis never holds LiteLLM's logging worker either).

Store faults: ``fail_open`` (default) serves the request with modes ``unknown`` (the fault is counted
and logged at most once per ``fault_log_interval_seconds``); ``fail_open: false`` answers 503. Nothing
else this adapter raises reaches a client: unexpected errors are logged and the request goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance import metrics
from litellm_ratebalance.contracts.config import BASKET_FIELD, TrafficContractSettings
from litellm_ratebalance.contracts.policy import (
    Action,
    ContractAdmission,
    ContractBook,
    ContractLimits,
    Mode,
    action_for,
    capped_max_tokens,
    delay_seconds,
    rejection_message,
    resolve_feature,
)
from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.contracts.settles import ContractSettleQueue, Deltas
from litellm_ratebalance.proxy.request_state import find_entry, stored_headers
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime, schedule_startup_check
from litellm_ratebalance.proxy.store_metrics import late_replies
from litellm_ratebalance.proxy.tokens import actual_tokens, estimate_tokens, usage_of
from litellm_ratebalance.settings import Settings

__all__ = [
    "FEATURE_HEADER",
    "LOG_FEATURE_KEY",
    "LOG_RPM_MODE_KEY",
    "LOG_TPM_MODE_KEY",
    "RPM_MODE_HEADER",
    "TPM_MODE_HEADER",
    "TrafficContractsCallback",
    "traffic_contracts",
]

logger = logging.getLogger("litellm_ratebalance.contracts")

COMPONENT = "traffic_contracts"
ENTRY_KEY = "ratebalance_traffic_contract"
"""Request-metadata key of our per-request entry (ticket id and response headers)."""
FEATURE_HEADER = "x-traffic-contract-feature"
RPM_MODE_HEADER = "x-traffic-contract-rpm-mode"
TPM_MODE_HEADER = "x-traffic-contract-tpm-mode"
LOG_FEATURE_KEY = "traffic_contract_feature"
LOG_RPM_MODE_KEY = "traffic_contract_rpm_mode"
LOG_TPM_MODE_KEY = "traffic_contract_tpm_mode"
UNKNOWN_MODE = "unknown"
"""Mode label when the store could not be asked (fail open)."""
OTHER_MODEL = "other"
"""Model label of a model name the router does not know (bounded label cardinality)."""

_MAX_OPEN_TICKETS = 100_000
_MAX_PENDING_TASKS = 10_000
_OUTPUT_CAPPABLE_CALLS = frozenset(
    {"completion", "acompletion", "text_completion", "atext_completion", "responses", "aresponses"}
)
_OUTPUT_TOKEN_PARAMS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(slots=True)
class _Ticket:
    """A counted request whose TPM estimate is still to reconcile (this process only)."""

    feature: str
    window_start: int
    held_tokens: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the adapter derives from the settings once."""

    settings: Settings
    contracts: TrafficContractSettings
    book: ContractBook
    actions: Mapping[Mode, Action]
    reject_modes: frozenset[Mode]
    fault_settings: Settings
    """``settings`` with ``fail_mode`` set from ``traffic_contracts.fail_open`` (for fault accounting)."""


def _derive(settings: Settings) -> _Derived:
    contracts = settings.ratebalance.traffic_contracts
    actions = {
        Mode.BORROWED: Action.from_settings(contracts.enforcement.borrowed),
        Mode.DEGRADED: Action.from_settings(contracts.enforcement.degraded),
    }
    fail_mode = "open" if contracts.fail_open else "closed"
    fault_settings = settings
    if settings.ratebalance.fail_mode != fail_mode:
        fault_settings = settings.model_copy(
            update={"ratebalance": settings.ratebalance.model_copy(update={"fail_mode": fail_mode})}
        )
    return _Derived(
        settings=settings,
        contracts=contracts,
        book=ContractBook.from_settings(contracts),
        actions=actions,
        reject_modes=frozenset(mode for mode, action in actions.items() if action.kind == "reject"),
        fault_settings=fault_settings,
    )


class TrafficContractsCallback(CustomLogger):  # type: ignore[misc]
    """Per-feature and basket RPM/TPM contracts per fixed window, labelled normal / borrowed / degraded.

    Config users reference the ready instance ``litellm_ratebalance.traffic_contracts``. SDK users build
    one, add it to ``litellm.callbacks`` and wire settings/store with :func:`litellm_ratebalance.configure`
    (or hand a :class:`Runtime` to this instance only).
    """

    def __init__(
        self,
        runtime: Runtime | None = None,
        *,
        uniform: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``runtime``: settings/store/router for this instance only (tests, several in one process);
        ``uniform`` / ``sleep``: the jitter source and wait of the ``delay`` action (tests pass fakes).

        With the process-wide runtime, in the proxy, an invalid setting (of any of our components) ends the
        process at start-up with status 78 and the key path, even when this is our only callback listed
        (:func:`~litellm_ratebalance.proxy.runtime.schedule_startup_check`). With its own ``runtime`` (SDK,
        tests) nothing is scheduled: settings are validated on first use."""
        super().__init__()
        self._own_runtime = runtime
        if runtime is None:
            schedule_startup_check()
        self._uniform = uniform
        self._sleep = sleep
        self._derived: _Derived | None = None
        self._tickets: OrderedDict[str, _Ticket] = OrderedDict()
        # Ticket ids only need to be unique in this process (the tickets live here), not random.
        self._ticket_ids = itertools.count()
        self._settles = ContractSettleQueue(self._send_settles)
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests = metrics.counter(
            "traffic_contract_requests",
            "Requests by traffic-contract feature, model group and RPM/TPM mode",
            ["feature", "model_group", "rpm_mode", "tpm_mode"],
        )
        self._actions = metrics.counter(
            "traffic_contract_actions",
            "Enforcement actions applied to requests over their traffic contract",
            ["feature", "action"],
        )
        self._usage = metrics.gauge(
            "traffic_contract_usage",
            "Current window's requests (kind=rpm) or tokens recorded plus in flight (kind=tpm), per feature "
            "and __basket__, as of this process's latest request",
            ["feature", "kind"],
        )
        self._limit = metrics.gauge(
            "traffic_contract_limit",
            "Configured traffic contract per window, per feature and __basket__ (absent: no contract)",
            ["feature", "kind"],
        )
        self._latency = metrics.hook_latency()
        self._late_replies = late_replies()
        # Labelled children of the per-request series, looked up once each (a label lookup costs about as
        # much as the rest of the hook's own bookkeeping); bounded by features x model groups x modes.
        self._pre_call_latency = self._latency.labels(COMPONENT, "pre_call")
        self._log_success_latency = self._latency.labels(COMPONENT, "log_success")
        self._request_counters: dict[tuple[str, str, str, str], Any] = {}
        self._usage_gauges: dict[str, tuple[Any, Any]] = {}

    def _runtime(self) -> Runtime:
        return self._own_runtime if self._own_runtime is not None else get_runtime()

    def _config(self) -> _Derived:
        settings = self._runtime().settings()
        derived = self._derived
        if derived is None or derived.settings is not settings:
            derived = _derive(settings)
            self._derived = derived
            self._publish_limits(derived)
        return derived

    def _publish_limits(self, derived: _Derived) -> None:
        for feature, (rpm, tpm) in derived.book.features.items():
            self._set_limit(feature, rpm, tpm)
        self._set_limit(BASKET_FIELD, derived.book.basket_rpm, derived.book.basket_tpm)

    def _set_limit(self, feature: str, rpm: int | None, tpm: int | None) -> None:
        for kind, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None:
                self._limit.labels(feature, kind).set(value)

    # -- hooks ------------------------------------------------------------------------------------------
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            await self._check(user_api_key_dict, data, str(call_type))
        except HTTPException:
            raise  # our documented 429 / 503
        except Exception:
            logger.exception("litellm_ratebalance traffic_contracts: pre-call check failed; request served")
        finally:
            self._pre_call_latency.observe(time.perf_counter() - started)
        return None

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return stored_headers(find_entry(data, ENTRY_KEY))

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        started = time.perf_counter()
        try:
            entry = find_entry(kwargs, ENTRY_KEY)
            ticket = self._tickets.pop(str(entry.get("id")), None) if entry is not None else None
            if ticket is not None:
                used = actual_tokens(usage_of(kwargs, response_obj), "total")
                # No usage reported (some streams): the estimate stands as the request's usage.
                held = ticket.held_tokens
                self._settles.add(ticket.window_start, ticket.feature, held, held if used is None else used)
        except Exception:
            logger.exception("litellm_ratebalance traffic_contracts: reconciling usage failed")
        finally:
            self._log_success_latency.observe(time.perf_counter() - started)

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        started = time.perf_counter()
        self._release(kwargs)
        self._latency.labels(COMPONENT, "log_failure").observe(time.perf_counter() - started)

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        started = time.perf_counter()
        self._release(request_data)
        self._latency.labels(COMPONENT, "post_call_failure").observe(time.perf_counter() - started)
        return None

    async def drain(self) -> None:
        """Send the pending reconciles now and wait for them (tests, graceful shutdown)."""
        while self._settles or self._tasks:
            self._settles.flush_now()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- pre-call ---------------------------------------------------------------------------------------
    async def _check(self, auth: Any, data: dict[str, Any], call_type: str) -> None:
        runtime = self._runtime()
        try:
            derived = self._config()
        except ConfigurationError as exc:
            logger.error("litellm_ratebalance traffic_contracts: %s", exc)
            raise _litellm.service_unavailable(f"litellm_ratebalance is misconfigured: {exc}") from None
        contracts = derived.contracts
        resolution = resolve_feature(
            derived.book,
            request_feature=_body_feature(data),
            key_feature=_auth_metadata(auth, "metadata", "feature"),
            team_feature=_auth_metadata(auth, "team_metadata", "feature"),
            request_tags=_request_tags(data),
            admin_tags=_admin_tags(auth),
            trust_request_feature=contracts.trust_request_feature,
        )
        feature = resolution.feature
        model = _model_label(runtime.router(), data.get("model"))
        limits = derived.book.limits(feature)
        estimate = self._estimate(data, contracts, limits)
        try:
            admission = await runtime.store().contract_admit(
                feature,
                limits,
                estimate,
                window_seconds=contracts.window_seconds,
                ttl_seconds=contracts.counter_ttl_seconds,
                reject_modes=derived.reject_modes,
            )
        except StoreError as exc:
            served = runtime.faults.record(COMPONENT, exc, derived.fault_settings)
            if exc.late is not None:
                late = exc.late
                late.add_done_callback(lambda _: self._late_admission(late, feature, estimate, served=served))
            if not served:
                raise runtime.faults.unavailable(COMPONENT) from None
            self._count_request(feature, model, UNKNOWN_MODE, UNKNOWN_MODE)
            _annotate(data, feature, UNKNOWN_MODE, UNKNOWN_MODE)
            return
        rpm_mode, tpm_mode = admission.rpm_mode.label, admission.tpm_mode.label
        self._count_request(feature, model, rpm_mode, tpm_mode)
        self._record_usage(feature, admission)
        headers = _annotate(data, feature, rpm_mode, tpm_mode)
        action = action_for(admission.mode, derived.actions)
        if not admission.counted:
            self._actions.labels(feature, "reject").inc()
            raise _litellm.rate_limit_exception(
                rejection_message(feature, admission, limits),
                {**headers, "retry-after": str(admission.retry_after_seconds)},
                str(data.get("model") or ""),
            )
        self._remember(feature, admission, estimate, data, contracts)
        if action.kind == "cap_max_tokens" and action.cap is not None:
            if _cap_output(data, action.cap, call_type):
                self._actions.labels(feature, "cap_max_tokens").inc()
        elif action.kind == "delay":
            self._actions.labels(feature, "delay").inc()
            await self._sleep(delay_seconds(action, self._uniform()))

    def _estimate(self, data: Mapping[str, Any], contracts: TrafficContractSettings, limits: ContractLimits) -> int:
        if not limits.has_tpm:
            return 0  # nothing to classify tokens against: skip the token counting
        model = data.get("model")
        return estimate_tokens(
            model if isinstance(model, str) else "",
            data,
            "total",
            contracts.default_output_tokens,
            contracts.max_estimated_output_tokens,
        )

    def _late_admission(
        self, late: asyncio.Future[ContractAdmission | None], feature: str, estimate: int, *, served: bool
    ) -> None:
        """A timed-out admission answered after all. If it counted the request, its token estimate leaves
        flight now: recorded as the request's usage when the request was served (fail open; its actual usage
        is not tracked, as for a stream without usage), released when it was refused (503)."""
        answered = not late.cancelled() and late.exception() is None
        self._late_replies.labels(COMPONENT, "answered" if answered else "lost").inc()
        admission = late.result() if answered else None
        if admission is not None and admission.counted and estimate > 0:
            self._settles.add(admission.window_start, feature, estimate, estimate if served else 0)

    def _count_request(self, feature: str, model: str, rpm_mode: str, tpm_mode: str) -> None:
        key = (feature, model, rpm_mode, tpm_mode)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self._requests.labels(*key)
        counter.inc()

    def _usage_of(self, feature: str) -> tuple[Any, Any]:
        """The (rpm, tpm) usage gauges of a feature or the basket."""
        found = self._usage_gauges.get(feature)
        if found is None:
            found = self._usage_gauges[feature] = (
                self._usage.labels(feature, "rpm"),
                self._usage.labels(feature, "tpm"),
            )
        return found

    def _record_usage(self, feature: str, admission: ContractAdmission) -> None:
        feature_rpm, feature_tpm = self._usage_of(feature)
        basket_rpm, basket_tpm = self._usage_of(BASKET_FIELD)
        feature_rpm.set(admission.feature_requests)
        basket_rpm.set(admission.basket_requests)
        feature_tpm.set(admission.feature_tokens)
        basket_tpm.set(admission.basket_tokens)

    # -- tickets and reconcile --------------------------------------------------------------------------
    def _remember(
        self,
        feature: str,
        admission: ContractAdmission,
        estimate: int,
        data: dict[str, Any],
        contracts: TrafficContractSettings,
    ) -> None:
        tickets = self._tickets
        now = time.monotonic()
        # A ticket past its window's counter lifetime can no longer be reconciled: forget it, so requests
        # that never report back cannot grow this map.
        while tickets and (len(tickets) >= _MAX_OPEN_TICKETS or next(iter(tickets.values())).expires_at < now):
            tickets.popitem(last=False)
        ticket_id = str(next(self._ticket_ids))
        tickets[ticket_id] = _Ticket(feature, admission.window_start, estimate, now + contracts.counter_ttl_seconds)
        entry = find_entry(data, ENTRY_KEY)
        if entry is not None:
            entry["id"] = ticket_id

    def _release(self, container: Mapping[str, Any]) -> None:
        """A failed attempt: give its estimate back once; the ticket stays for a later success (retries)."""
        try:
            entry = find_entry(container, ENTRY_KEY)
            ticket = self._tickets.get(str(entry.get("id"))) if entry is not None else None
            if ticket is None or ticket.held_tokens == 0:
                return
            held, ticket.held_tokens = ticket.held_tokens, 0
            self._settles.add(ticket.window_start, ticket.feature, held, 0)
        except Exception:
            logger.exception("litellm_ratebalance traffic_contracts: releasing an estimate failed")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if len(self._tasks) >= _MAX_PENDING_TASKS:
            work.close()  # Redis far behind: drop this reconcile rather than pile up tasks
            logger.warning("litellm_ratebalance traffic_contracts: too many pending reconciles; one dropped")
            return
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_settles(self, window_start: int, deltas: Deltas) -> None:
        self._spawn(self._settle(window_start, deltas))

    async def _settle(self, window_start: int, deltas: Deltas) -> None:
        runtime = self._runtime()
        try:
            settled = await runtime.store().contract_settle_many(window_start, deltas)
        except StoreError as exc:
            # After the call there is nothing left to refuse: the fault is only counted and logged.
            runtime.faults.record(COMPONENT, exc, self._config().fault_settings)
            return
        except Exception:
            logger.exception("litellm_ratebalance traffic_contracts: reconciling usage failed")
            return
        if settled.applied:
            for feature, tokens in settled.feature_tokens.items():
                self._usage_of(feature)[1].set(tokens)
            self._usage_of(BASKET_FIELD)[1].set(settled.basket_tokens)


# -- request data helpers ---------------------------------------------------------------------------------


def _metadata_slot(data: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's metadata dict of this request (``litellm_metadata`` on the routes that use it)."""
    name = "litellm_metadata" if "litellm_metadata" in data else "metadata"
    metadata = data.get(name)
    if not isinstance(metadata, dict):
        metadata = {}
        data[name] = metadata
    return metadata


def _annotate(data: dict[str, Any], feature: str, rpm_mode: str, tpm_mode: str) -> dict[str, str]:
    """Put the feature and modes in the logging metadata and our entry; return the response headers."""
    metadata = _metadata_slot(data)
    fields = {LOG_FEATURE_KEY: feature, LOG_RPM_MODE_KEY: rpm_mode, LOG_TPM_MODE_KEY: tpm_mode}
    metadata.update(fields)
    # spend_logs_metadata is the one free-form dict the standard logging payload keeps; copy it, since
    # LiteLLM may have put the key's own dict there.
    spend = metadata.get("spend_logs_metadata")
    if spend is None or isinstance(spend, Mapping):
        metadata["spend_logs_metadata"] = {**(spend or {}), **fields}
    headers = {FEATURE_HEADER: feature, RPM_MODE_HEADER: rpm_mode, TPM_MODE_HEADER: tpm_mode}
    metadata[ENTRY_KEY] = {"headers": headers}
    return headers


def _body_feature(data: Mapping[str, Any]) -> object:
    """``metadata.feature`` as the client sent it (LiteLLM itself never writes that key)."""
    for name in ("metadata", "litellm_metadata"):
        metadata = data.get(name)
        if isinstance(metadata, Mapping) and metadata.get("feature") is not None:
            return metadata.get("feature")
    return None


def _auth_metadata(auth: Any, attribute: str, name: str) -> object:
    metadata = getattr(auth, attribute, None)
    return metadata.get(name) if isinstance(metadata, Mapping) else None


def _tag_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _request_tags(data: Mapping[str, Any]) -> list[object]:
    """Tags of the request: body ``tags``, ``metadata.tags`` (LiteLLM merges header and key/team tags there)."""
    tags = _tag_list(data.get("tags"))
    for name in ("metadata", "litellm_metadata"):
        metadata = data.get(name)
        if isinstance(metadata, Mapping):
            tags.extend(_tag_list(metadata.get("tags")))
    return tags


def _admin_tags(auth: Any) -> list[object]:
    """Tags an admin set on the key or the team (trusted whatever ``trust_request_feature`` says)."""
    return _tag_list(_auth_metadata(auth, "metadata", "tags")) + _tag_list(
        _auth_metadata(auth, "team_metadata", "tags")
    )


def _model_label(router: Any, model: object) -> str:
    """The model group as a metric label: only names the router serves, so clients cannot add labels."""
    if not isinstance(model, str) or router is None:
        return OTHER_MODEL
    names = getattr(router, "model_names", None)
    aliases = getattr(router, "model_group_alias", None)
    if isinstance(names, set | frozenset | list | tuple | dict) and model in names:
        return model
    if isinstance(aliases, Mapping) and model in aliases:
        return model
    return OTHER_MODEL


def _cap_output(data: dict[str, Any], cap: int, call_type: str) -> bool:
    """Lower the request's output-token limit to at most ``cap``; False if the call has none to cap."""
    present = [name for name in _OUTPUT_TOKEN_PARAMS if name in data]
    if not present:
        if call_type not in _OUTPUT_CAPPABLE_CALLS:
            return False
        present = ["max_output_tokens" if "responses" in call_type else "max_tokens"]
    for name in present:
        data[name] = capped_max_tokens(data.get(name), cap)
    return True


traffic_contracts = TrafficContractsCallback()
