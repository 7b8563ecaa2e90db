"""Taking and giving back a deployment's slots: the store calls, the wait queue and its dispatcher.

* :func:`admit`: the policy's verdict, then one atomic ``lease_acquire`` in the shared store (slot cap and
  token cap of the request's tier); a top-tier request that finds the slots or the KV cache full waits in
  the deployment's queue (:func:`wait_in_queue`) where that is enabled, else the refusal is raised.
* The queue's **dispatcher** (one task per deployment while anything waits) serves the head: highest tier
  first, then the fairest client (:class:`~litellm_ratebalance.overload.queue.FairQueue`). The head waits
  until it fits, for a slot and for its tokens alike; while it waits, requests of lower tiers are refused
  (:func:`~litellm_ratebalance.overload.shedding.decide`, rule 4), so what drains goes to it. Local releases
  wake it at once; other replicas' releases are seen at the next ``queue.poll_interval_seconds``. The tiers
  waiting here are published to the store (:func:`~.peers.publish_waiting`, by each request as it joins the
  queue and by the dispatcher), where every replica's lease acquire of a lower tier is refused while they
  wait.
* :func:`release`: gives a lease back (also when the task holding it is cancelled).

Store faults follow ``ratebalance.fail_mode``: open admits without a lease, closed refuses with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.overload.shedding import Verdict, store_refusal
from litellm_ratebalance.proxy.backpressure.book import Context, DeploymentState, Lease, Profile, Waiter
from litellm_ratebalance.proxy.backpressure.metrics import observe_queue_wait, set_gauges
from litellm_ratebalance.proxy.backpressure.peers import publish_waiting
from litellm_ratebalance.proxy.backpressure.refusals import MARK, queue_full, queue_timeout, refusal
from litellm_ratebalance.proxy.backpressure.trace import verdict_fields
from litellm_ratebalance.proxy.runtime import get_runtime
from litellm_ratebalance.proxy.store_metrics import late_replies
from litellm_ratebalance.store.concurrency import LeaseRefusal, LeaseResult

__all__ = [
    "COMPONENT",
    "admit",
    "gauges",
    "refresh_counts",
    "release",
    "release_if_cancelled",
    "release_late_lease",
    "sort_candidates",
    "taken_elsewhere",
]

COMPONENT = "backpressure"


def gauges(ctx: Context, state: DeploymentState, signals: dict[str, float] | None = None) -> None:
    set_gauges(
        state.deployment_id,
        limit=state.applied_limit,
        inflight=state.inflight,
        queue_depth=len(state.queue),
        signals=signals,
        output_estimate=None if signals is None else float(ctx.cost(state, _NO_PROMPT)),
        prompt_scale=None if signals is None else state.prompt_scale.factor,
    )


_NO_PROMPT = Profile("", 0, 0, None, "", 1.0)
"""A request without prompt or max_tokens: its cost is the output a deployment reserves by default."""


async def admit(ctx: Context, state: DeploymentState, profile: Profile, call_id: str) -> Lease | None:
    """Take a slot (waiting in the queue where that is allowed) or raise the refusal; ``None`` when the
    store failed and fail_mode is open (admitted without a lease)."""
    if ctx.tiers.is_top(profile.rank):
        state.demand.arrive(ctx.clock())  # the top tier's arrival rate: its reserve of slots
    verdict = ctx.decide(state, profile)
    if ctx.trace.enabled:
        ctx.trace.event("arrive", ctx, state, profile, call_id, **verdict_fields(verdict))
    queue_on = state.config.queue_enabled
    if not verdict.admitted and not (verdict.queueable and queue_on):
        raise refusal(ctx, state, verdict, profile)
    if queue_on and len(state.queue) and ctx.tiers.is_top(profile.rank):
        # Others of this tier are already waiting: take a place behind them, not ahead.
        return await wait_in_queue(ctx, state, profile, call_id)
    if not verdict.admitted:
        return await wait_in_queue(ctx, state, profile, call_id)
    outcome = await _try_lease(ctx, state, profile, call_id, verdict)
    if isinstance(outcome, Verdict):
        if outcome.queueable and queue_on:
            return await wait_in_queue(ctx, state, profile, call_id)
        raise refusal(ctx, state, outcome, profile)
    return outcome


async def _try_lease(
    ctx: Context, state: DeploymentState, profile: Profile, call_id: str, verdict: Verdict, *, how: str = "direct"
) -> Lease | Verdict | None:
    """One atomic attempt: the lease, ``None`` (store fault, fail open: admitted unaccounted), or the
    verdict that refuses it given the store's fresh counts. ``how`` (``direct`` or ``queue``) only goes to the
    trace."""
    lease_id = uuid.uuid4().hex
    cost = ctx.cost(state, profile)
    runtime = get_runtime()
    meter = runtime.registry.lease_meter()
    # (the trace's only: when the acquire left, so a reader can order it after a publication)
    sent = time.time() if ctx.trace.enabled else 0.0
    try:
        result = await runtime.store().lease_acquire(
            state.deployment_id,
            lease_id,
            slot_cap=verdict.slots,
            ttl_ms=int(ctx.settings.lease_ttl_seconds * 1000),
            cost_tokens=cost,
            token_cap=verdict.lease_token_cap,
            # below the top tier: refused while a higher tier waits in any replica's queue
            rank=None if ctx.tiers.is_top(profile.rank) else profile.rank,
            meter=meter.start_mark(state.deployment_id),  # cost: the start mark rides on the acquire
        )
    except StoreError as exc:
        if exc.late is not None:
            # Timed out, maybe still taken in Redis: the request goes on unaccounted (or is refused), so a
            # lease the late reply took is given back at once rather than left to lapse after its TTL.
            late = exc.late
            late.add_done_callback(lambda _: release_late_lease(late, state.deployment_id, lease_id))
        if runtime.faults.record(COMPONENT, exc, runtime.settings()):
            return None
        unavailable = runtime.faults.unavailable(COMPONENT)
        setattr(unavailable, MARK, "store_unavailable")
        raise unavailable from exc
    state.counts(result.inflight, result.reserved_tokens, ctx.clock())
    if result.acquired:
        lease = Lease(lease_id, state.deployment_id, call_id, profile, cost, time.time(), ctx.clock())
        ctx.hold(state, lease)
        state.note_cost(cost)
        gauges(ctx, state)
        meter.lease_started(state.deployment_id, lease_id, result.cost)
        if ctx.trace.enabled:
            ctx.trace.event("lease", ctx, state, profile, call_id, lease=lease_id, cost=cost, how=how, sent=sent)
        return lease
    if ctx.trace.enabled:
        ctx.trace.event(
            "store_refused", ctx, state, profile, call_id, cost=cost, refusal=result.refusal.name.lower(), sent=sent
        )
    if result.refusal is LeaseRefusal.WAITING:
        # A higher tier waits in another replica's queue: what frees up belongs to it (the policy's rule 4).
        fresh = ctx.decide(state, profile, queued=True, waiting_elsewhere=profile.rank + 1)
    else:
        fresh = ctx.decide(state, profile, queued=True)
    if not fresh.admitted:
        return fresh
    # The store refused on counts our cached view does not show yet (another replica): say what it said.
    return store_refusal(fresh, result.refusal is LeaseRefusal.TOKENS, ctx.tiers.is_top(profile.rank))


def release_late_lease(late: asyncio.Future[LeaseResult], deployment_id: str, lease_id: str) -> None:
    """A timed-out lease acquire answered after all: release the lease it took, in the background (the request
    went on without it, per the fail mode)."""
    answered = not late.cancelled() and late.exception() is None
    late_replies().labels(COMPONENT, "answered" if answered else "lost").inc()
    if answered and late.result().acquired:
        runtime = get_runtime()
        runtime.spawn(runtime.store().lease_release(deployment_id, lease_id))


async def wait_in_queue(ctx: Context, state: DeploymentState, profile: Profile, call_id: str) -> Lease | None:
    """Wait in ``state``'s queue until the dispatcher hands over a lease, a refusal, or the deadline passes."""
    loop = asyncio.get_running_loop()
    waiter = Waiter(profile, call_id, loop.create_future())
    max_wait = state.config.queue_max_wait_seconds
    entry = state.queue.push(
        waiter,
        client=profile.client,
        rank=profile.rank,
        cost=ctx.cost(state, profile),
        now=ctx.clock(),
        max_wait=max_wait,
        weight=profile.weight,
    )
    if entry is None:
        raise queue_full(ctx, state, ctx.decide(state, profile), profile)
    if ctx.trace.enabled:
        ctx.trace.event("enqueue", ctx, state, profile, call_id)
    gauges(ctx, state)
    if state.dispatcher is None or state.dispatcher.done():
        state.dispatcher = loop.create_task(_dispatch(ctx, state))
    state.wake.set()
    started = ctx.clock()
    try:
        # Tell the other replicas at once that this tier waits: the dispatcher publishes it too, on its first
        # turn, but that turn comes only when this event loop gets to it, over a second late in a burst of
        # requests, and meanwhile another replica's lower tier would take what frees up.
        await publish_waiting(ctx, state)
        # The dispatcher resolves the future (lease, or a refusal) or expires it at its deadline;
        # the extra second only guards against a dispatcher that died.
        return await asyncio.wait_for(asyncio.shield(waiter.future), max_wait + 1.0)
    except asyncio.TimeoutError:
        state.queue.remove(entry)
        waiter.future.cancel()
        raise queue_timeout(ctx, state, profile, ctx.clock() - started) from None
    except asyncio.CancelledError:
        state.queue.remove(entry)
        if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
            lease = waiter.future.result()
            if lease is not None:
                await release(ctx, lease)
        waiter.future.cancel()
        raise
    finally:
        observe_queue_wait(state.deployment_id, ctx.clock() - started)
        gauges(ctx, state)


async def _dispatch(ctx: Context, state: DeploymentState) -> None:
    """Serve the queue head while anything waits; every turn takes a slot, refuses, or sleeps."""
    poll = ctx.settings.queue.poll_interval_seconds
    while True:
        await _serve(ctx, state, poll)
        # Nothing waits here any more: the other replicas' lower tiers go on (a request queued during this
        # call is served by the next turn; a cancelled dispatcher's entries lapse after their time-to-live).
        await publish_waiting(ctx, state)
        if not len(state.queue):
            return


async def _serve(ctx: Context, state: DeploymentState, poll: float) -> None:
    """The dispatcher's loop (see :func:`_dispatch`)."""
    while len(state.queue):
        now = ctx.clock()
        for expired in state.queue.expire(now):
            if not expired.item.future.done():
                waited = now - expired.enqueued_at
                expired.item.future.set_exception(queue_timeout(ctx, state, expired.item.profile, waited))
        await publish_waiting(ctx, state)
        entry = state.queue.peek()
        if entry is None:
            break
        waiter = entry.item
        if waiter.future.done():
            state.queue.remove(entry)
            continue
        state.wake.clear()  # before the attempt: a release during it must wake the wait below
        verdict = ctx.decide(state, waiter.profile, queued=True)
        if ctx.trace.enabled:
            ctx.trace.event("head", ctx, state, waiter.profile, waiter.call_id, **verdict_fields(verdict))
        if not verdict.admitted and not verdict.queueable:
            state.queue.remove(entry)
            waiter.future.set_exception(refusal(ctx, state, verdict, waiter.profile))
            continue
        outcome: Lease | Verdict | None = verdict
        if verdict.admitted or verdict.count_based:
            # A count-based refusal is retried in the store: other replicas' releases show there first.
            try:
                outcome = await _try_lease(ctx, state, waiter.profile, waiter.call_id, verdict, how="queue")
            except Exception as exc:  # fail-closed store fault (marked) or a bug: hand it to the waiter
                state.queue.remove(entry)
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
        if isinstance(outcome, Verdict) and outcome.queueable:
            next_deadline = state.queue.next_deadline()
            timeout = poll if next_deadline is None else max(0.0, min(poll, next_deadline - ctx.clock()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.wake.wait(), timeout)
            continue
        if isinstance(outcome, Verdict):
            state.queue.remove(entry)
            waiter.future.set_exception(refusal(ctx, state, outcome, waiter.profile))
            continue
        state.queue.pop(entry)
        if waiter.future.done():
            if outcome is not None:
                await release(ctx, outcome)  # the waiter gave up while we took its slot
        else:
            waiter.future.set_result(outcome)


async def release(ctx: Context, lease: Lease) -> None:
    """Give ``lease`` back to the store and wake the deployment's queue."""
    state = ctx.forget(lease)
    if state is None:
        return
    runtime = get_runtime()
    meter = runtime.registry.lease_meter()
    end_mark = None
    try:
        # cost: the end mark rides on the release (the count from then on excludes this request)
        snapshot = await runtime.store().lease_release(
            lease.deployment_id, lease.lease_id, meter.end_mark(lease.lease_id)
        )
        state.counts(snapshot.inflight, snapshot.reserved_tokens, ctx.clock())
        end_mark = snapshot.cost
    except StoreError as exc:
        # Not renewed any more: the lease lapses after its TTL even if this release never lands.
        runtime.faults.record(COMPONENT, exc, runtime.settings())
        state.counts(state.inflight - 1, state.reserved_tokens - lease.cost, state.counted_at)
    state.wake.set()
    gauges(ctx, state)
    if ctx.trace.enabled:
        held = ctx.clock() - lease.started
        ctx.trace.event(
            "release", ctx, state, lease.profile, lease.call_id, lease=lease.lease_id, cost=lease.cost, held=held
        )
    meter.lease_ended(lease.lease_id, lease.attempt, lease.cost, end_mark)


def release_if_cancelled(ctx: Context, lease: Lease) -> None:
    """A cancelled request (client gone, router timeout) gets no success or failure event from LiteLLM:
    give its slot back when the task that holds it ends cancelled."""
    task = asyncio.current_task()
    if task is None:
        return

    def done(finished: asyncio.Task[Any]) -> None:
        state = ctx.deployments.get(lease.deployment_id)
        if finished.cancelled() and state is not None and lease.lease_id in state.leases and not ctx.loop.is_closed():
            ctx.loop.create_task(release(ctx, lease))

    task.add_done_callback(done)


async def refresh_counts(ctx: Context, states: list[DeploymentState]) -> None:
    """Read the shared counts of ``states`` fresh from the store (one round trip each, concurrently)."""
    runtime = get_runtime()
    snapshots = await asyncio.gather(
        *(runtime.store().concurrency_snapshot(s.deployment_id) for s in states), return_exceptions=True
    )
    for state, snapshot in zip(states, snapshots, strict=True):
        if isinstance(snapshot, StoreError):
            runtime.faults.record(COMPONENT, snapshot, runtime.settings())
        elif isinstance(snapshot, BaseException):
            raise snapshot
        else:
            state.counts(snapshot.inflight, snapshot.reserved_tokens, ctx.clock())


def sort_candidates(
    ctx: Context, candidates: list[tuple[Any, DeploymentState | None]], profile: Profile
) -> tuple[list[Any], list[Any], list[tuple[DeploymentState, Verdict, bool]]]:
    """Split deployments into admitting, queueable (full, room in the queue) and refusing ones (with their
    verdict, and whether the refusal is a full queue)."""
    admitted: list[Any] = []
    queueable: list[Any] = []
    refused: list[tuple[DeploymentState, Verdict, bool]] = []
    for deployment, state in candidates:
        if state is None:
            admitted.append(deployment)
            continue
        verdict = ctx.decide(state, profile)
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


def taken_elsewhere(ctx: Context, state: DeploymentState, profile: Profile) -> bool:
    """Whether another deployment of ``state``'s model group would take this request now (by this process's
    view of the deployments the last routing filter saw), so that the Router's retry of a refusal here can
    succeed. True when the group is unknown or has a deployment we do not manage."""
    members = ctx.groups.get(state.model_group)
    if members is None:
        return True
    for member in members:
        if member is None:
            return True
        if member is state:
            continue
        verdict = ctx.decide(member, profile)
        if verdict.admitted or (verdict.queueable and member.config.queue_enabled):
            return True
    return False
