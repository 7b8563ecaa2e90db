"""Backpressure's refusals: the exception a client gets, and how the proxy's log reports it.

:func:`refusal` builds the 503 / 429 of one refused request: ``retry-after`` from the drain rate,
``x-litellm-backpressure-reason`` / ``-advice``, the queue depth and limit, and a message naming the model
group, deployment, tier, what is full and the advice. Every exception built here carries :data:`MARK` (its
value: the reason), so our own failure events and LiteLLM's log lines about them are recognised, and is
counted in the ``backpressure_refusals`` metric.

LiteLLM logs every failed request on its proxy logger, as an ERROR with a traceback for a 5xx.
:func:`quiet_refusal_logs` installs :class:`RefusalLogFilter`, which turns its report of a refusal of ours
into one WARNING per reason per :data:`REFUSAL_LOG_INTERVAL_SECONDS`, without traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from litellm_ratebalance.overload.shedding import Reason, Verdict, advice, retry_after_seconds
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState, Profile
from litellm_ratebalance.proxy.backpressure.metrics import count_refusal
from litellm_ratebalance.proxy.backpressure.trace import verdict_fields

__all__ = [
    "LITELLM_LOGGERS",
    "MARK",
    "REFUSAL_LOG",
    "REFUSAL_LOG_INTERVAL_SECONDS",
    "RefusalLogFilter",
    "is_ours",
    "queue_full",
    "queue_timeout",
    "quiet_refusal_logs",
    "refusal",
]

logger = logging.getLogger("litellm_ratebalance.backpressure")

MARK = "litellm_ratebalance_backpressure"
"""Attribute set on every exception we raise (its value: the reason), so our own failure events are known."""


def is_ours(exception: object) -> bool:
    """Whether ``exception`` is a refusal built here (or a store fault we marked)."""
    return bool(getattr(exception, MARK, None))


def refusal(
    ctx: Context,
    state: DeploymentState,
    verdict: Verdict,
    profile: Profile,
    *,
    reason: Reason | None = None,
    status: int | None = None,
    detail: str | None = None,
    no_router_retry: bool = False,
) -> Exception:
    """The exception refusing ``profile`` on ``state`` (``reason`` / ``status`` / ``detail`` override the
    verdict's); ``no_router_retry`` marks it final for the Router (nothing else would take the request)."""
    settings = ctx.settings
    reason = reason or verdict.reason or Reason.COMPUTE_SATURATION
    status = status or verdict.status or 503
    depth = ctx.queue_depth(state)
    needed = verdict.completions_needed + (len(state.queue) if reason is not Reason.MEMORY_PRESSURE else 0)
    retry_after = retry_after_seconds(needed, state.inflight, state.mean_latency, cap=settings.max_retry_after_seconds)
    what = advice(verdict, retry_after, settings.max_retry_after_seconds)
    limit = state.applied_limit
    if detail is None:
        detail = _describe(ctx, state, verdict, reason, profile, limit)
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
    setattr(exc, MARK, reason.value)
    if no_router_retry:
        # Every deployment refused already: retrying inside the proxy would only delay the answer the
        # client needs to back off.
        _litellm.forbid_router_retry(exc)
    count_refusal(state.model_group, profile.tier, reason.value)
    if ctx.trace.enabled:
        ctx.trace.event(
            "refuse", ctx, state, profile, None, status=status, refused=reason.value, **verdict_fields(verdict)
        )
    return exc


def _describe(
    ctx: Context, state: DeploymentState, verdict: Verdict, reason: Reason, profile: Profile, limit: int
) -> str:
    if verdict.higher_waiting:
        return (
            f"requests of a higher priority tier are waiting for this deployment and get its next free "
            f"{'KV-cache tokens' if reason is Reason.MEMORY_PRESSURE else 'slots'} first"
        )
    if reason is Reason.MEMORY_PRESSURE and verdict.token_cap is not None and verdict.signal == "kv_cache":
        measured = ctx.server_signals(state).get("kv_cache")
        reading = "" if measured is None else f", the server's kv_cache reads {measured:.2f}"
        return (
            f"not enough KV-cache headroom for ~{ctx.cost(state, profile)} tokens (prompt + expected output): "
            f"{state.reserved_tokens} tokens reserved in flight{reading}, this tier may use {verdict.token_cap} of "
            f"{ctx.kv_capacity(state)}"
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


def queue_full(
    ctx: Context, state: DeploymentState, verdict: Verdict, profile: Profile, *, no_router_retry: bool = False
) -> Exception:
    """503 ``queue_overflow``: the deployment's wait queue has no room."""
    return refusal(
        ctx,
        state,
        verdict,
        profile,
        reason=Reason.QUEUE_OVERFLOW,
        status=503,
        detail=f"the deployment is full ({state.applied_limit} slots, or its KV cache) and the wait queue is full "
        f"({state.queue.max_depth} requests)",
        no_router_retry=no_router_retry,
    )


def queue_timeout(ctx: Context, state: DeploymentState, profile: Profile, waited: float) -> Exception:
    """503 ``queue_overflow``: the request waited ``queue_max_wait_seconds`` without getting in."""
    return refusal(
        ctx,
        state,
        ctx.decide(state, profile, queued=True),
        profile,
        reason=Reason.QUEUE_OVERFLOW,
        status=503,
        detail=f"waited {waited:.1f}s in the queue (queue_max_wait_seconds "
        f"{state.config.queue_max_wait_seconds:g}) and neither a slot of {state.applied_limit} nor the KV-cache "
        "tokens it needs came free",
    )


# -- how refusals are logged -------------------------------------------------------------------------------
REFUSAL_LOG_INTERVAL_SECONDS = 30.0
"""At most one WARNING per refusal reason per this many seconds; every refusal is counted in the
``backpressure_refusals`` metric whether it is logged or not."""
LITELLM_LOGGERS = ("LiteLLM Proxy", "LiteLLM Router")
"""``litellm._logging.verbose_proxy_logger`` and ``verbose_router_logger``, by name: the proxy logs every
failed request on the first, with a traceback for a 5xx, so each 503 refusal would otherwise be an ERROR and
~50 lines of traceback. Checked by tests/integration/test_backpressure_log_noise.py (the names) and
tests/e2e/test_backpressure_logs_e2e.py (the proxy's output)."""


class RefusalLogFilter(logging.Filter):
    """Turns LiteLLM's report of a refusal of ours into one WARNING per reason per interval.

    A record on a LiteLLM logger whose exception (``exc_info``, or an argument of the message) carries our
    mark is dropped. For the first such record of a reason in ``interval`` seconds, one WARNING without
    traceback is logged on this package's logger instead: the refusal's message, and how many refusals of
    that reason went unlogged since the previous warning. Other records pass unchanged. A refusal is the
    designed answer to overload (its status, reason and advice reach the client), not an error of the
    proxy; a fault of ours is never marked and keeps LiteLLM's ERROR.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        refused = _marked_exception(record)
        if refused is None:
            return True
        reason = str(getattr(refused, MARK))
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return False
        self._last[reason] = now
        unlogged = self._unlogged.pop(reason, 0)
        detail: Any = getattr(refused, "detail", None)
        message = detail.get("error") if isinstance(detail, Mapping) else None
        # The message names the component and the reason already ("litellm_ratebalance backpressure (<reason>): ...").
        logger.warning(
            "%s [answered %s; refusals are logged once per reason per %.0fs: %d more of this reason since the "
            "last warning; all are counted in backpressure_refusals]",
            message if isinstance(message, str) else refused,
            getattr(refused, "status_code", None) or "with an error",
            self._interval,
            unlogged,
        )
        return False


def _marked_exception(record: logging.LogRecord) -> BaseException | None:
    candidates: list[object] = [record.exc_info[1]] if record.exc_info else []
    if isinstance(record.args, tuple):
        candidates.extend(record.args)
    for candidate in candidates:
        if isinstance(candidate, BaseException) and getattr(candidate, MARK, None):
            return candidate
    return None


REFUSAL_LOG = RefusalLogFilter(REFUSAL_LOG_INTERVAL_SECONDS)


def quiet_refusal_logs() -> None:
    """Install the refusal filter on LiteLLM's proxy and router loggers (idempotent; one filter, so one
    interval per reason for the whole process)."""
    for name in LITELLM_LOGGERS:
        logging.getLogger(name).addFilter(REFUSAL_LOG)  # (addFilter ignores a filter already there)
