"""Backpressure's background step, every ``signals.scrape_interval_seconds`` (one task per process):
scrape the inference servers' metrics, read NVML, renew this process's leases (every third of their TTL),
refresh the shared in-flight counts and the gauges, exchange the learned limit, answer lengths and top-tier
demand with the other proxy replicas of each deployment (:mod:`.peers`), follow the server signals (GPU memory floor,
preemptions, signal health: :mod:`.signals`) and publish their reports for ``status``, and stop
renewing leases whose request never reported back (``lease_max_age_seconds``). A fresh measurement wakes the
queues: a KV cache that drained may let the head of a queue in.
"""

from __future__ import annotations

import asyncio
import logging

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.proxy.backpressure.admit import COMPONENT, gauges
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState
from litellm_ratebalance.proxy.backpressure.peers import exchange_peers
from litellm_ratebalance.proxy.backpressure.signals import follow_signals, publish_reports, scrape_servers
from litellm_ratebalance.proxy.runtime import get_runtime

__all__ = ["maintain_forever", "maintain_once"]

logger = logging.getLogger("litellm_ratebalance.backpressure")


async def maintain_forever(ctx: Context) -> None:
    """:func:`maintain_once` every scrape interval, forever (cancelled when the settings change or on close)."""
    task = asyncio.current_task()
    while True:
        try:
            await maintain_once(ctx)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("litellm_ratebalance backpressure: maintenance step failed")
        if task is not None and task.cancelling():
            # Cancelled during the step, and something on the way (a client library's clean-up) swallowed the
            # CancelledError: stop anyway, or whoever awaits the cancelled task waits forever.
            raise asyncio.CancelledError
        await asyncio.sleep(ctx.settings.signals.scrape_interval_seconds)


async def maintain_once(ctx: Context) -> None:
    """One maintenance step (tests call it directly instead of waiting for the interval)."""
    settings = ctx.settings
    now = ctx.clock()
    deployments = list(ctx.deployments.values())
    await scrape_servers(ctx, deployments, now)
    if settings.signals.nvml:
        for indices in {s.config.gpu_indices for s in deployments}:
            ctx.board.sample_gpus(indices, now)
    renew = now - ctx.last_renew >= settings.lease_ttl_seconds / 3
    if renew:
        ctx.last_renew = now
    runtime = get_runtime()
    ttl_ms = int(settings.lease_ttl_seconds * 1000)
    for state in deployments:
        _drop_stale_leases(ctx, state, now)
        try:
            snapshot = await runtime.store().lease_renew(
                state.deployment_id, list(state.leases) if renew else [], ttl_ms
            )
        except StoreError as exc:
            runtime.faults.record(COMPONENT, exc, runtime.settings())
            continue
        state.counts(snapshot.inflight, snapshot.reserved_tokens, ctx.clock())
        await exchange_peers(ctx, state, now)
        follow_signals(ctx, state, now)
        gauges(ctx, state, ctx.server_signals(state))
        if len(state.queue):
            state.wake.set()
    await publish_reports(ctx, deployments, now)


def _drop_stale_leases(ctx: Context, state: DeploymentState, now: float) -> None:
    max_age = ctx.settings.lease_max_age_seconds
    for lease in [lease for lease in state.leases.values() if now - lease.started > max_age]:
        # Its request never reported back (lost event): stop renewing, the store frees it after the TTL.
        logger.warning(
            "litellm_ratebalance backpressure: request %s on deployment %s never finished after %.0fs; its slot is "
            "no longer renewed",
            lease.call_id,
            state.deployment_id,
            now - lease.started,
        )
        ctx.forget(lease)
