"""What a request is to backpressure before the call (:func:`profile_of`), and what it teaches after it
(:func:`learn`): latency per output token for the adaptive limit, the drain rate, the answer size for the
deployment's output estimate, and the actual tokens for the queue's fairness counters; a server error that
says it ran out of memory is an overflow the layer did not prevent (:func:`overflowed`: counted, logged). No
I/O but the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from litellm_ratebalance.identity import metadata_value, resolve_priority
from litellm_ratebalance.overload.limits import per_token_rtt
from litellm_ratebalance.overload.signals import is_overflow_error
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState, Lease, Profile
from litellm_ratebalance.proxy.backpressure.metrics import count_drop, count_overflow
from litellm_ratebalance.proxy.tokens import prompt_tokens, requested_output_tokens

__all__ = ["is_drop", "learn", "overflowed", "profile_of"]

logger = logging.getLogger("litellm_ratebalance.backpressure")

_LATENCY_SMOOTHING = 0.2
_NO_LIMIT = 10**12
"""Stands for "no max_tokens" when reading the request (a real limit is far below it)."""


def profile_of(ctx: Context, kwargs: Mapping[str, Any], messages: Any) -> Profile:
    """What the request in ``kwargs`` is to the policy: its tier (from the caller's key/team, never the body),
    prompt tokens (LiteLLM's counter, cached in the request metadata), max_tokens, fairness key and weight."""
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
    prompt = prompt_tokens(str(kwargs.get("model") or ""), view)
    requested = requested_output_tokens(view, _NO_LIMIT, _NO_LIMIT)
    weight = 1.0
    raw_weight = metadata_value(auth, "backpressure_weight")
    if raw_weight is not None:
        with contextlib.suppress(ValueError):
            parsed = float(raw_weight)
            if math.isfinite(parsed) and parsed > 0:
                weight = parsed
    return Profile(
        ctx.tiers.name(rank),
        rank,
        prompt,
        None if requested >= _NO_LIMIT else requested,
        _litellm.caller_id(auth),
        weight,
    )


def learn(
    ctx: Context,
    state: DeploymentState,
    lease: Lease,
    response_obj: Any,
    end_time: Any,
    failed: bool,
    exception: Any,
) -> None:
    """Feed a finished request to the limit, the mean latency, the output and prompt estimates and the queue's
    fairness."""
    now = ctx.clock()
    if failed:
        if is_drop(exception):
            state.limit.update(now, 0.0, state.inflight, True)
            count_drop(state.deployment_id)
            if is_overflow_error(str(exception)):
                overflowed(state, now)
        return
    ended = end_time.timestamp() if isinstance(end_time, datetime) else time.time()
    latency = max(1e-6, ended - lease.started_wall)
    prompt, output = _litellm.response_usage(response_obj)
    state.limit.update(now, per_token_rtt(latency, output), max(1, state.inflight), False)
    state.mean_latency = (
        latency
        if state.mean_latency is None
        else state.mean_latency + _LATENCY_SMOOTHING * (latency - state.mean_latency)
    )
    if prompt is not None and output is not None:
        state.finished(lease.started, now, prompt, output)  # its memory leaves the last KV-cache reading
    if ctx.tiers.is_top(lease.profile.rank):
        state.demand.served(latency)  # the top tier's time in service: its reserve of slots
    if output is not None:
        state.output.learn(output)
    if prompt is not None:
        state.prompt_scale.learn(lease.profile.prompt_tokens, prompt)
    actual = (prompt or 0) + (output or 0)
    if actual:
        state.queue.charge(lease.profile.client, actual - lease.cost, lease.profile.weight)


OVERFLOW_LOG_INTERVAL_SECONDS = 60.0
"""At most one log line per deployment about its server's out-of-memory failures per interval (the metric
counts every one)."""


def overflowed(state: DeploymentState, now: float) -> None:
    """The server failed a request for want of memory: an overflow the layer did not prevent. Counted, and
    logged at most once per :data:`OVERFLOW_LOG_INTERVAL_SECONDS` (with the count since the last line)."""
    count_overflow(state.deployment_id)
    count = state.signals.overflows.to_log(1, now, OVERFLOW_LOG_INTERVAL_SECONDS)
    if count is None:
        return
    logger.warning(
        "litellm_ratebalance backpressure: the server of deployment %s failed %d request%s for want of GPU / "
        "KV-cache memory (reserved %d tokens in flight over all replicas, %d requests, limit %d); the concurrency "
        "limit backs off",
        state.deployment_id,
        count,
        "" if count == 1 else "s",
        state.reserved_tokens,
        state.inflight,
        state.applied_limit,
    )


def is_drop(exception: Any) -> bool:
    """A failure that says the server is overloaded or broken (not the client's fault)."""
    if exception is None:
        return False
    status = _litellm.exception_status(exception)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(exception, (TimeoutError, asyncio.TimeoutError, ConnectionError))
