"""Backpressure's server signals in the background step (:mod:`.maintain`), around the board of
:mod:`litellm_ratebalance.overload.signals`:

* :func:`scrape_servers`: every deployment's metrics endpoint, at once;
* :func:`follow_signals`, per deployment once its shared counts are fresh: the GPU memory floor of a server
  that reserves its memory up front (taken while nothing runs), a rise of the server's preemption counter
  as a dropped request for the adaptive limit (``signals.preemptions_as_drops``), the signal-health gauges;
* :func:`publish_reports`: each deployment's signal report (server answering, problems) in the shared store,
  where ``status`` reads it, when it changed and every ``SIGNAL_REPORT_REFRESH_SECONDS`` (30 s; it lapses
  after ``SIGNAL_REPORT_TTL_SECONDS``, 90 s, unless renewed).

The decisions are the board's and :class:`~litellm_ratebalance.overload.signals.SignalUpkeep`'s; this module
calls them and does the I/O (store, log, metrics).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.overload.servers import PREALLOCATING, SERVER_KINDS, Problem
from litellm_ratebalance.overload.signals import SIGNAL_REPORT_REFRESH_SECONDS, SIGNAL_REPORT_TTL_SECONDS
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState
from litellm_ratebalance.proxy.backpressure.metrics import count_preemptions, set_signal_health
from litellm_ratebalance.proxy.runtime import get_runtime

__all__ = ["follow_signals", "publish_reports", "scrape_servers"]

logger = logging.getLogger("litellm_ratebalance.backpressure")

COMPONENT = "backpressure"
PREEMPTION_LOG_INTERVAL_SECONDS = 60.0
"""At most one log line per deployment about its server's preemptions per interval (the metric counts all)."""

_PROBLEMS = tuple(p.value for p in Problem)


async def scrape_servers(ctx: Context, deployments: Sequence[DeploymentState], now: float) -> None:
    """Scrape every deployment that has a ``metrics_url``, concurrently; a good answer marks its time (see
    :func:`~litellm_ratebalance.overload.signals.held_at_scrape`)."""
    scraped = [s for s in deployments if s.config.metrics_url]
    if not scraped:
        return
    timeout = ctx.settings.signals.scrape_timeout_seconds
    readings = await asyncio.gather(
        *(
            ctx.board.scrape(
                s.deployment_id,
                s.config.metrics_url or "",
                s.config.server,
                timeout,
                now,
                kv_cache_tokens=s.config.kv_cache_tokens,
            )
            for s in scraped
        ),
        return_exceptions=True,
    )
    answered = ctx.clock()  # requests ending after this are in the readings (see held_at_scrape)
    for state, reading in zip(scraped, readings, strict=True):
        if reading is not None and not isinstance(reading, BaseException):
            state.scraped(answered)


def follow_signals(ctx: Context, state: DeploymentState, now: float) -> None:
    """After the shared counts of ``state`` were refreshed: GPU memory floor, preemptions, health gauges."""
    board, deployment_id = ctx.board, state.deployment_id
    server = board.server(deployment_id)
    if board.is_failing(deployment_id):
        state.signals.idle_memory.reset()  # the server may be restarting: its reservation is read again
    elif ctx.settings.signals.nvml and server in PREALLOCATING:
        stale = ctx.settings.signals.stale_after_seconds
        metrics = board.metrics(deployment_id, now, stale)
        gpu = board.gpus(state.config.gpu_indices, now, stale)
        idle = state.inflight == 0 and metrics is not None and not metrics.running
        if idle and gpu is not None and gpu.memory_used_fraction is not None:
            state.signals.idle_memory.observe_idle(gpu.memory_used_fraction)
    rise = board.take_preemptions(deployment_id)
    if rise > 0:
        _preempted(ctx, state, rise, now)
    health = board.health(deployment_id)
    set_signal_health(
        deployment_id,
        server=server,
        servers=SERVER_KINDS,
        problems={p.value for p in health.problems} if health is not None else set(),
        known_problems=_PROBLEMS,
        kv_capacity_tokens=ctx.kv_capacity(state),
    )


def _preempted(ctx: Context, state: DeploymentState, rise: float, now: float) -> None:
    """The server pushed ``rise`` running requests back for want of KV cache since the last scrape."""
    count_preemptions(state.deployment_id, rise)
    as_drop = ctx.settings.signals.preemptions_as_drops
    if as_drop:
        # The server admitted more than its cache holds: as after an OOM, fewer requests at once.
        state.limit.update(now, 0.0, max(1, state.inflight), True)
    count = state.signals.preemptions_to_log(rise, now, PREEMPTION_LOG_INTERVAL_SECONDS)
    if count is None:
        return
    server = ctx.board.server(state.deployment_id)
    logger.warning(
        "litellm_ratebalance backpressure: the server of deployment %s preempted %d running request%s for want of "
        "KV cache (%s)%s",
        state.deployment_id,
        count,
        "" if count == 1 else "s",
        "sglang:num_retracted_requests_total" if server == "sglang" else "vllm:num_preemptions_total",
        f"; the concurrency limit backs off (now {state.limit.limit})"
        if as_drop
        else " (signals.preemptions_as_drops is off: the limit does not react)",
    )


async def publish_reports(ctx: Context, deployments: Sequence[DeploymentState], now: float) -> None:
    """Write the signal report of each scraped deployment whose report is due (changed, or
    ``SIGNAL_REPORT_REFRESH_SECONDS`` old) to the shared store; a store fault is recorded, the report retried
    at the next step."""
    runtime = get_runtime()
    ttl_ms = int(SIGNAL_REPORT_TTL_SECONDS * 1000)
    for state in deployments:
        health = ctx.board.health(state.deployment_id)
        if health is None:
            continue
        problems = [p.value for p in health.problems]
        report = (health.server, tuple(problems), tuple(f.detail for f in health.findings))
        if not state.signals.report_due(report, now, SIGNAL_REPORT_REFRESH_SECONDS):
            continue
        try:
            await runtime.store().signal_report(
                state.deployment_id,
                server=health.server,
                problems=problems,
                detail="\n".join(f"{f.problem.value}: {f.detail}" for f in health.findings),
                ttl_ms=ttl_ms,
            )
        except StoreError as exc:
            state.signals.report_failed()
            runtime.faults.record(COMPONENT, exc, runtime.settings())
