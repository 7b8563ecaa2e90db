"""What this replica tells the other proxy replicas of a deployment, and what it takes from them (the pooling
rules are :mod:`litellm_ratebalance.overload.peers`; the store operations :mod:`litellm_ratebalance.store.peers`):

* :func:`publish_waiting`: the tiers waiting in this process's queue, whenever they change and every third of
  :data:`~litellm_ratebalance.overload.peers.WAITING_TTL_SECONDS` while they wait (a request calls it as it
  joins the queue, the dispatcher on every turn); the lease acquire of a lower tier is refused in every
  replica meanwhile;
* :func:`exchange_peers`: this process's learned limit, answer lengths and top-tier demand of a deployment
  out, the other live replicas' in (the background step calls it every scrape interval).

Store faults are recorded like every other backpressure store call and change nothing here: the last pooled
view stands, and waiting entries are published again at the next turn.
"""

from __future__ import annotations

import time

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.overload.peers import WAITING_TTL_SECONDS, PeerState, peer_ttl_seconds, pool
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState
from litellm_ratebalance.proxy.replica_report import replica_name
from litellm_ratebalance.proxy.runtime import get_runtime

__all__ = ["exchange_peers", "publish_waiting"]

COMPONENT = "backpressure"


async def publish_waiting(ctx: Context, state: DeploymentState) -> None:
    """Publish the tiers that can hold others back (above the lowest) waiting in ``state``'s queue, when they
    changed or a third of their time-to-live passed since they were last published.

    Called by a request as it joins the queue and by the dispatcher on every turn; one at a time per deployment
    (``state.publish_lock``), each reading the queue when its turn comes, so the last write is the queue's
    latest state even when two writes would otherwise reach the store in the other order."""
    async with state.publish_lock:
        ranks = tuple(rank for rank in state.queue.ranks() if rank > 0)
        now = ctx.clock()
        published, at = state.waiting_published
        if ranks == published and (not ranks or now - at < WAITING_TTL_SECONDS / 3):
            return
        runtime = get_runtime()
        sent = time.time() if ctx.trace.enabled else 0.0  # (the trace's only)
        try:
            await runtime.store().waiting_publish(
                state.deployment_id, replica_name(), ranks, int(WAITING_TTL_SECONDS * 1000)
            )
        except StoreError as exc:
            runtime.faults.record(COMPONENT, exc, runtime.settings())
            return
        state.waiting_published = (ranks, now)
        if ctx.trace.enabled:
            # From ``t`` (the write is in the store) until the next publication's ``sent``, every replica's
            # lower-tier lease acquire sent meanwhile meets these ranks.
            ctx.trace.event("publish", ctx, state, ranks=list(ranks), sent=sent)


async def exchange_peers(ctx: Context, state: DeploymentState, now: float) -> None:
    """Publish this process's state of ``state``'s deployment and pool the other replicas' into it."""
    mine = PeerState(
        limit=state.limit.limit,
        output=state.output.histogram(),
        top_rate=state.demand.rate(now),
        top_inflight=state.top_inflight,
    )
    ttl = peer_ttl_seconds(ctx.settings.signals.scrape_interval_seconds)
    runtime = get_runtime()
    try:
        others = await runtime.store().peer_exchange(
            state.deployment_id, replica_name(), mine.encode(), int(ttl * 1000)
        )
    except StoreError as exc:
        runtime.faults.record(COMPONENT, exc, runtime.settings())
        return
    state.peers = pool(others.values())
    state.output.set_peers(state.peers.output)
