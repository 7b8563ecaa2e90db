"""Seeded, deterministic replay of the decision code: one digest per part and one over all of them.

The real-time benches (``bench_routing``, ``bench_backpressure``, ...) run on the wall clock and the event
loop's timing, so two runs of the same code do not give the same decisions. This replay drives the pure
policy and the embedded store (:class:`~litellm_ratebalance.store.MemoryStore`) on a fake clock, with every
input drawn from seeded ``random.Random`` generators, so a tree gives the same decisions at every run and two
trees give the same digests exactly when they decide the same. It answers "did a refactoring change a
decision?", not "is a decision good".

Parts (each prints ``<part> <decisions> <sha256>``):

* ``routing-default``, ``routing-plain``, ``routing-smooth``: a :class:`RateBalancer` (default settings, the
  preset that turns every addition off, smooth selection) over two model groups of 5 and 3 deployments: a
  fast one with 4 slots, a medium one, a slow one failing 6% of its requests, one answering 429 in bursts
  with ``x-ratelimit-*`` headers, one that slows down half-way; latency grows with the requests in flight;
  half the requests give their size (``work``), 1% are released unanswered; the store synced every simulated
  second. Logged: every pick, and every 100 decisions the weights and estimates.
* ``backpressure``: a closed loop over three simulated inference servers (two with a KV cache, one without)
  with the ``overload`` policy: the gradient limit updated after every answer, the learned output
  reservation, the top tier's slot reserve, priority shedding (``shedding.decide``), the fair queue for the
  top tier, the store's leases (another replica takes a quarter of the leases behind this one's back, so the
  store refuses some that the local view admits: ``store_refusal``), retry-after and advice. Logged: every
  verdict, lease, limit update, queue event. Plus ``decide`` on 4,000 random inputs, half of them on a
  slot or token-cap boundary.
* ``cost``: the GPU-second shares the lease marks charge (``MeterStart``/``MeterEnd`` on the same loop) and
  the priority/team labels of 500 random callers (the priority trust rule).
* ``admission``: ``MemoryStore.acquire`` / ``flush`` / ``admission_snapshot`` over two model groups and about
  14 one-minute windows, three configured priorities (reservations, one with a floor), the default pool and a
  priority not configured; corrections and learned output sent with a later acquire or in a flush; the 429
  text and rate-limit headers of each result. Plus the pure ``decide`` on 3,000 random counters.
* ``contracts``: feature resolution, ``MemoryStore.contract_admit`` / ``contract_settle`` /
  ``contract_window`` over about 20 one-minute windows (3% of the answers settle after their window
  expired), the action per mode (cap, reject, delay) and the 429 text.

Only names present before and after the package's restructuring are used; where a signature changed
(``shedding.decide`` took 14 keywords, it now takes value objects) :func:`shedding_decide` detects which one
the imported tree has. Run it against a tree with ``PYTHONPATH=<tree> python bench/replay_decisions.py``
(the first line says which package was imported); ``--trace FILE`` writes every logged decision, one per line,
to find the first that differs between two trees (``diff`` the two files).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import hashlib
import heapq
import importlib
import math
import os
import random
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TextIO

T0 = 1_800_000_000.0
"""Simulated start: a whole minute (every window of the replay starts on a boundary)."""


class Clock:
    """The fake clock every part's code and store read."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Hashes the decisions of one part; optionally writes each to a trace file."""

    def __init__(self, part: str, trace: TextIO | None) -> None:
        self.part = part
        self.count = 0
        self._hash = hashlib.sha256()
        self._trace = trace

    def log(self, *values: object) -> None:
        line = repr(values)
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        if self._trace is not None:
            self._trace.write(f"{self.part} {self.count} {line}\n")
        self.count += 1

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


def _module(name: str) -> Any:
    """A module of the tree under test, typed loosely: the replay runs against trees whose APIs differ."""
    return importlib.import_module(name)


def _fields(value: Any, names: Iterable[str]) -> tuple[object, ...]:
    """The named attributes of a result, enums as their values (the same whatever module defines them)."""
    out: list[object] = []
    for name in names:
        item = getattr(value, name)
        out.append(item.value if isinstance(item, enum.Enum) else item)
    return tuple(out)


# -- routing ----------------------------------------------------------------------------------------------


@dataclass
class _Deployment:
    id: str
    rate: float
    """Output tokens/s of one request alone."""
    ttft: float
    fail: float = 0.0
    rate_limited: bool = False
    slows_at: float | None = None
    """Simulated seconds after the start from which it runs at a third of its rate."""
    slots: float | None = None
    tpm: float | None = None
    in_flight: int = 0


_ROUTING_GROUPS: dict[str, list[_Deployment]] = {
    "chat": [
        _Deployment("chat-fast", 140.0, 0.25, slots=4.0),
        _Deployment("chat-medium", 90.0, 0.35, tpm=400_000.0),
        _Deployment("chat-slow-flaky", 45.0, 0.6, fail=0.06),
        _Deployment("chat-429", 110.0, 0.3, rate_limited=True),
        _Deployment("chat-degrades", 130.0, 0.2, slows_at=60.0),
    ],
    "code": [
        _Deployment("code-a", 60.0, 0.4),
        _Deployment("code-b", 75.0, 0.5, fail=0.02),
        _Deployment("code-c", 50.0, 0.3, slots=2.0),
    ],
}


def replay_routing(rec: Recorder, seed: int, steps: int, settings_args: dict[str, Any]) -> None:
    routing = _module("litellm_ratebalance.routing")
    store_module = _module("litellm_ratebalance.store")
    clock = Clock()
    store = store_module.MemoryStore(clock=clock)
    settings = routing.RoutingSettings(**settings_args)
    balancer = routing.RateBalancer(store, settings, clock=clock, rng=random.Random(seed))
    rng = random.Random(seed * 1_000 + 1)
    groups = {name: [_Deployment(**{**d.__dict__}) for d in deps] for name, deps in _ROUTING_GROUPS.items()}
    candidates = {
        name: tuple(routing.Candidate(d.id, tpm=d.tpm, slots=d.slots) for d in deps) for name, deps in groups.items()
    }
    # (finish time, sequence, group, deployment, request id, latency, input, output, ok, ttft, 429, released)
    finishing: list[tuple[float, int, str, _Deployment, str, float, int, int, bool, float | None, bool, bool]] = []
    remaining_429 = 40.0
    loop = asyncio.new_event_loop()
    next_sync = T0 + 1.0

    def finish_until(limit: float) -> None:
        nonlocal remaining_429
        while finishing and finishing[0][0] <= limit:
            end, _, group, dep, rid, latency, tin, tout, ok, ttft, limited, released = heapq.heappop(finishing)
            clock.now = end
            dep.in_flight -= 1
            if released:
                balancer.release(group, dep.id, rid)
                rec.log("release", rid, dep.id)
                continue
            limits = None
            if dep.rate_limited:
                remaining_429 = 0.0 if limited else min(100.0, remaining_429 + 3.0)
                limits = routing.RateLimitObservation(
                    remaining_requests=remaining_429, limit_requests=100.0, reset_seconds=5.0 if limited else 20.0
                )
            balancer.record(
                group,
                dep.id,
                latency=latency,
                input_tokens=tin,
                output_tokens=tout,
                ok=ok,
                ttft=ttft,
                rate_limits=limits,
                request_id=rid,
            )

    def sync_until(limit: float) -> None:
        nonlocal next_sync
        while next_sync <= limit:
            finish_until(next_sync)
            clock.now = next_sync
            for group in groups:
                loop.run_until_complete(balancer.refresh(group))
            next_sync += 1.0

    try:
        now = T0
        for i in range(steps):
            now += rng.expovariate(9.0)
            sync_until(now)
            finish_until(now)
            clock.now = now
            group = "chat" if rng.random() < 0.7 else "code"
            deps = groups[group]
            tin = rng.randint(50, 2_000)
            tout = rng.randint(20, 600)
            sized = rng.random() < 0.5
            work = float(tout + 100 + tin / 10.0) if sized else None
            rid = f"r{i}"
            index = balancer.choose(group, candidates[group], rid, work=work)
            dep = deps[index]
            rec.log("pick", i, group, dep.id)
            dep.in_flight += 1
            limited = dep.rate_limited and (i // 150) % 3 == 2 and rng.random() < 0.7
            ok = not limited and rng.random() >= dep.fail
            rate = dep.rate / 3.0 if dep.slows_at is not None and now - T0 >= dep.slows_at else dep.rate
            slowdown = 1.0 + 0.2 * max(0, dep.in_flight - 1)
            if limited:
                latency, tout_done, ttft = 0.05, 0, None
            elif not ok:
                latency, tout_done, ttft = dep.ttft + rng.uniform(0.5, 3.0), 0, None
            else:
                ttft = dep.ttft * slowdown * rng.uniform(0.8, 1.25)
                latency = ttft + tout / rate * slowdown * rng.uniform(0.9, 1.1)
                tout_done = tout
            released = rng.random() < 0.01
            heapq.heappush(
                finishing, (now + latency, i, group, dep, rid, latency, tin, tout_done, ok, ttft, limited, released)
            )
            if i % 100 == 99:
                for name in groups:
                    weights = balancer.weights(name, candidates[name])
                    rec.log("weights", i, name, sorted(weights.items()))
                    estimates = balancer.estimates(name, candidates[name])
                    rec.log(
                        "estimates",
                        i,
                        name,
                        sorted(
                            (k, _fields(e, ("share", "probability", "samples", "failures", "mean_rate", "mode")))
                            for k, e in estimates.items()
                        ),
                    )
        finish_until(math.inf)
        loop.run_until_complete(balancer.aclose())
    finally:
        loop.close()


def plain_preset() -> str:
    """The name of the preset that turns every routing addition off (``proposal`` before it was renamed)."""
    presets: dict[str, Any] = _module("litellm_ratebalance.routing.config").PRESETS
    return "plain" if "plain" in presets else "proposal"


# -- backpressure and cost ----------------------------------------------------------------------------------


def shedding_decide(shedding: Any, **kwargs: Any) -> Any:
    """``shedding.decide`` with the keywords of the former signature, on whichever signature the tree has:
    value objects (``TierThresholds``, ``DeploymentLoad``) after the restructuring, 14 keywords before."""
    if not hasattr(shedding, "TierThresholds"):
        return shedding.decide(**kwargs)
    thresholds = shedding.TierThresholds(
        kwargs.pop("n_tiers"), kwargs.pop("shed_threshold"), kwargs.pop("hard_threshold")
    )
    rank, cost = kwargs.pop("rank"), kwargs.pop("cost_tokens")
    return shedding.decide(thresholds, rank, cost, shedding.DeploymentLoad(**kwargs))


VERDICT_FIELDS = (
    "admitted",
    "reason",
    "status",
    "utilisation",
    "threshold",
    "signal",
    "completions_needed",
    "never_fits",
    "slots",
    "token_cap",
    "lease_token_cap",
    "higher_waiting",
    "queueable",
)

TIERS = ("low", "default", "high")
_Request = tuple[int, str, int, int, int, int]
"""(index, lease id, rank, prompt tokens, answer tokens, tokens reserved)."""
SHED, HARD = 0.85, 0.95


@dataclass
class _Server:
    id: str
    knee: int
    seconds_per_token: float
    kv_tokens: int | None
    limit: Any
    output: Any
    demand: Any
    queue: Any
    inflight_store: int = 0
    """In flight on the server (both replicas), as the store counts it."""
    local_view: int = 0
    """What this replica believes is in flight: its own, plus the other replica's as of the last snapshot."""
    reserved_view: int = 0
    running_tokens: int = 0
    top_inflight: int = 0
    latencies: list[float] = field(default_factory=list)


def replay_backpressure(rec: Recorder, cost_rec: Recorder, seed: int, steps: int) -> None:
    limits_module = _module("litellm_ratebalance.overload.limits")
    output_module = _module("litellm_ratebalance.overload.output")
    queue_module = _module("litellm_ratebalance.overload.queue")
    reserve_module = _module("litellm_ratebalance.overload.reserve")
    shedding = _module("litellm_ratebalance.overload.shedding")
    store_module = _module("litellm_ratebalance.store")
    metering = _module("litellm_ratebalance.store.metering")
    lease_refusal = _module("litellm_ratebalance.store.concurrency").LeaseRefusal
    clock = Clock()
    store = store_module.MemoryStore(clock=clock)
    rng = random.Random(seed * 1_000 + 2)
    tiers = shedding.Tiers(TIERS)
    config = limits_module.LimitConfig(initial_limit=6, min_limit=1, max_limit=48)
    servers = [
        _Server(
            sid,
            knee,
            spt,
            kv,
            limits_module.GradientLimit(config),
            output_module.OutputEstimate(),
            reserve_module.TopDemand(),
            queue_module.FairQueue(12),
        )
        for sid, knee, spt, kv in (("gpu-a", 6, 0.02, 5_000), ("gpu-b", 10, 0.015, 9_000), ("gpu-c", 4, 0.03, None))
    ]
    half_life, ttl = 60_000, 600_000
    loop = asyncio.new_event_loop()
    run: Callable[[Any], Any] = loop.run_until_complete
    # (end, seq, server index, lease id, latency, prompt tokens, output tokens, local, rank, start mark, reserved)
    ends: list[tuple[float, int, int, str, float, int, int, bool, int, Any, int]] = []
    seq = 0

    def start(request: _Request, server: _Server, slot_cap: int, token_cap: int | None, local: bool) -> Any:
        """Take the lease and start the request on the server; the store's answer."""
        nonlocal seq
        i, lease_id, rank, prompt, answer, cost = request
        result = run(
            store.lease_acquire(
                server.id,
                lease_id,
                slot_cap=slot_cap,
                ttl_ms=ttl,
                cost_tokens=cost,
                token_cap=token_cap,
                meter=metering.MeterStart(half_life_ms=half_life, ttl_ms=ttl),
            )
        )
        rec.log(
            "lease", i, server.id, local, result.acquired, result.refusal.value, result.inflight, result.reserved_tokens
        )
        if not result.acquired:
            return result
        server.inflight_store = result.inflight
        if local:
            server.local_view += 1
            server.reserved_view += cost
            if rank == len(TIERS) - 1:
                server.top_inflight += 1
        server.running_tokens += prompt + answer
        load = max(1.0, server.inflight_store / server.knee)
        latency = 0.05 + answer * server.seconds_per_token * load * rng.uniform(0.9, 1.1)
        seq += 1
        mark = result.cost.mark if result.cost is not None else None
        heapq.heappush(
            ends,
            (
                clock.now + latency,
                seq,
                servers.index(server),
                lease_id,
                latency,
                prompt,
                answer,
                local,
                rank,
                mark,
                cost,
            ),
        )
        return result

    def finish_until(limit: float) -> None:
        while ends and ends[0][0] <= limit:
            end, _, index, lease_id, latency, prompt, answer, local, rank, mark, cost = heapq.heappop(ends)
            clock.now = end
            server = servers[index]
            meter = None
            if mark is not None:
                meter = metering.MeterEnd(
                    half_life_ms=half_life, ttl_ms=ttl, start=mark, gpus=1.0, output_tokens=answer
                )
            snap = run(store.lease_release(server.id, lease_id, meter=meter))
            server.inflight_store = snap.inflight
            server.running_tokens -= prompt + answer
            share = snap.cost.share if snap.cost is not None else None
            cost_rec.log("share", lease_id, server.id, share)
            if local:
                server.local_view = max(0, server.local_view - 1)
                server.reserved_view = max(0, server.reserved_view - cost)
                if rank == len(TIERS) - 1:
                    server.top_inflight = max(0, server.top_inflight - 1)
                    server.demand.served(latency)
                dropped = answer == 0
                new_limit = server.limit.update(
                    end, limits_module.per_token_rtt(latency, answer), server.local_view + 1, dropped
                )
                server.output.learn(answer)
                server.latencies = [*server.latencies[-49:], latency]
                rec.log("limit", lease_id, server.id, new_limit, server.limit.estimate)
            drain(server)

    def verdict_for(server: _Server, rank: int, cost: int) -> Any:
        top = tiers.is_top(rank)
        kv_signal = {"kv_cache": min(1.0, server.running_tokens / server.kv_tokens)} if server.kv_tokens else {}
        reserve = server.demand.reserve(clock.now, 0.5, 2.0) if not top else 0
        return shedding_decide(
            shedding,
            rank=rank,
            n_tiers=len(tiers),
            shed_threshold=SHED,
            hard_threshold=HARD,
            server_signals=kv_signal,
            inflight=server.local_view,
            limit=server.limit.limit,
            cost_tokens=cost,
            reserved_tokens=server.reserved_view,
            kv_cache_tokens=server.kv_tokens,
            waiting_rank=server.queue.top_rank(),
            headroom_tokens=400 if server.kv_tokens else 0,
            top_reserve=reserve,
            top_inflight=server.top_inflight,
        )

    def admit(request: _Request, server: _Server) -> Any:
        rank, cost = request[2], request[5]
        verdict = verdict_for(server, rank, cost)
        if verdict.admitted:
            result = start(request, server, verdict.slots, verdict.lease_token_cap, True)
            if not result.acquired:
                # The other replica's leases fill what this view thought free: the store's counts now show.
                server.local_view, server.reserved_view = result.inflight, result.reserved_tokens
                tokens = result.refusal == lease_refusal.TOKENS
                verdict = shedding.store_refusal(verdict, tokens, tiers.is_top(rank))
        return verdict

    def drain(server: _Server) -> None:
        for entry in server.queue.expire(clock.now):
            rec.log("expired", entry.item[0], server.id)
        while (entry := server.queue.peek()) is not None:
            request: _Request = entry.item
            verdict = admit(request, server)
            rec.log("dequeue", request[0], server.id, _fields(verdict, VERDICT_FIELDS))
            if not verdict.admitted:
                break
            server.queue.pop(entry)
            server.queue.charge(entry.client, request[3] + request[4] - request[5])

    try:
        now = T0
        for i in range(steps):
            now += rng.expovariate(9.0)
            finish_until(now)
            clock.now = now
            if i % 25 == 0:
                for server in servers:
                    # The adapter's book refreshes the shared counts now and then: the other replica's show.
                    snap = run(store.concurrency_snapshot(server.id))
                    server.inflight_store = snap.inflight
                    server.local_view = snap.inflight
                    server.reserved_view = snap.reserved_tokens
            server = servers[rng.randrange(len(servers))]
            rank = rng.choices(range(len(TIERS)), weights=(5, 3, 2))[0]
            prompt = rng.randint(50, 700)
            answer = rng.randint(10, 400)
            max_tokens = rng.choice((None, answer, 2_048))
            lease_id = f"l{i}"
            if rank == len(TIERS) - 1:
                server.demand.arrive(now)
            reserved_out = server.output.reserve(max_tokens, mode="learned", default_output_tokens=256, quantile=0.9)
            cost = prompt + reserved_out
            request = (i, lease_id, rank, prompt, answer, cost)
            if rng.random() < 0.25:
                # The other replica: leases on its own (stale) view, not seen here until the next snapshot.
                token_cap = None if server.kv_tokens is None else int(server.kv_tokens * SHED)
                start(request, server, max(1, server.limit.limit), token_cap, False)
                continue
            verdict = admit(request, server)
            rec.log("verdict", i, server.id, rank, cost, _fields(verdict, VERDICT_FIELDS))
            if verdict.admitted:
                continue
            client = f"team{rng.randrange(4)}"
            if verdict.queueable:
                entry = server.queue.push(request, client=client, rank=rank, cost=cost, now=now, max_wait=4.0)
                rec.log("queued", i, server.id, entry is not None)
                if entry is not None:
                    continue
            mean = sum(server.latencies) / len(server.latencies) if server.latencies else None
            retry = shedding.retry_after_seconds(verdict.completions_needed, server.local_view, mean)
            rec.log("refused", i, retry, shedding.advice(verdict, retry, 30))
        finish_until(math.inf)
        for server in servers:
            drain(server)
            finish_until(math.inf)
    finally:
        loop.close()

    # The policy alone, on random inputs; every other one on a boundary (the request's tokens exactly filling
    # the tier's token cap, or its slot the last one, give or take one), where an off-by-one shows.
    prng = random.Random(seed * 1_000 + 3)
    for i in range(4_000):
        n_tiers = prng.randint(1, 4)
        rank = prng.randrange(n_tiers)
        shed = prng.uniform(0.5, 0.95)
        hard = prng.uniform(shed, 1.0)
        kv = prng.choice((None, prng.randint(500, 20_000)))
        signals = {
            name: prng.uniform(0.0, 1.1) for name in ("kv_cache", "gpu_memory", "server_queue") if prng.random() < 0.4
        }
        limit = prng.randint(0, 40)
        inflight = prng.randint(0, 40)
        reserved = prng.randint(0, 20_000)
        cost = prng.randint(0, 4_000)
        headroom = prng.choice((0, prng.randint(0, 2_000)))
        edge = i % 2 == 1
        if edge:
            signals.pop("kv_cache", None)
            headroom = 0
            slots = shedding.tier_slots(rank, n_tiers, limit, shed, hard)
            inflight = max(0, slots - 1 + prng.choice((-1, 0, 1)))
            if kv is not None:
                cap = math.floor(shedding.tier_threshold(rank, n_tiers, shed, hard) * kv)
                reserved = prng.randint(0, cap)
                cost = max(0, cap - reserved + prng.choice((-1, 0, 1)))
        verdict = shedding_decide(
            shedding,
            rank=rank,
            n_tiers=n_tiers,
            shed_threshold=shed,
            hard_threshold=hard,
            server_signals=signals,
            inflight=inflight,
            limit=limit,
            cost_tokens=cost,
            reserved_tokens=reserved,
            kv_cache_tokens=kv,
            waiting_rank=prng.choice((None, prng.randrange(n_tiers))),
            headroom_tokens=headroom,
            top_reserve=0 if edge else prng.choice((0, prng.randint(0, 10))),
            top_inflight=prng.randint(0, 10),
        )
        rec.log("decide", i, _fields(verdict, VERDICT_FIELDS))


def replay_cost_labels(rec: Recorder, seed: int) -> None:
    labels = _module("litellm_ratebalance.attribution.labels")
    rng = random.Random(seed * 1_000 + 4)
    priorities = ("high", "low", "batch")
    teams = labels.TeamLabels(None, 5)
    allowed = labels.TeamLabels(("t1", "t3"), 10)
    values: tuple[object, ...] = ("high", "low", "batch", "bogus", "", 3, None, ["high"], "HIGH")
    no_metadata: tuple[object, ...] = ({}, None, "x")
    for i in range(500):
        team_meta = {"priority": rng.choice(values)} if rng.random() < 0.6 else rng.choice(no_metadata)
        key_meta = {"priority": rng.choice(values)} if rng.random() < 0.6 else rng.choice(no_metadata[:2])
        auth = SimpleNamespace(
            team_metadata=team_meta,
            metadata=key_meta,
            team_alias=rng.choice((None, "", "alias-a", "alias-b")),
            team_id=rng.choice((None, f"t{rng.randrange(8)}")),
        )
        caller = auth if rng.random() < 0.95 else None
        for name, book in (("open", teams), ("allowed", allowed)):
            got = labels.cost_labels(caller, priorities, book, f"f{i % 3}")
            rec.log("labels", i, name, got.priority, got.team, got.feature)


# -- admission ----------------------------------------------------------------------------------------------

ACQUIRE_FIELDS = (
    "admitted",
    "reason",
    "now_ms",
    "window_start_ms",
    "window_end_ms",
    "saturation",
    "strict",
    "held_requests",
    "held_tokens",
    "cost_tokens",
    "estimate",
    "headroom",
)
COUNTER_FIELDS = ("requests", "tokens", "pool_requests", "pool_tokens")


def _counters(counters: Any) -> tuple[object, ...]:
    other = counters.other_pools
    return (*_fields(counters, COUNTER_FIELDS), None if other is None else sorted(other.items()))


def replay_admission(rec: Recorder, seed: int, steps: int) -> None:
    policy = _module("litellm_ratebalance.admission.policy")
    ledger = _module("litellm_ratebalance.admission.ledger")
    estimate = _module("litellm_ratebalance.admission.estimate")
    store_module = _module("litellm_ratebalance.store")
    clock = Clock()
    store = store_module.MemoryStore(clock=clock)
    rng = random.Random(seed * 1_000 + 5)
    window_ms = 60_000
    reservations: dict[str, Any] = {"high": 0.5, "low": {"type": "tpm", "value": 30_000}, "batch": 0.1}
    lendable = {"high": 0.6}
    field_of = {name: policy.pool_field(name) for name in reservations}
    groups = {"gpt": (120, 150_000), "small": (None, 60_000)}
    loop = asyncio.new_event_loop()
    pending: dict[str, Any] = {name: estimate.SettleBatch() for name in groups}
    # (end, seq, group, window start, pool, reserved, actual, output)
    ends: list[tuple[float, int, str, int, str, int, int, int]] = []
    try:
        now = T0
        for i in range(steps):
            now += rng.expovariate(3.5)
            while ends and ends[0][0] <= now:
                _, _, group, start_ms, pool, reserved, actual, output = heapq.heappop(ends)
                pending[group].add(start_ms, pool, actual - reserved)
                pending[group].learn(output)
            clock.now = now
            group = "gpt" if rng.random() < 0.65 else "small"
            rpm, tpm = groups[group]
            priority = rng.choice(("high", "low", "batch", None, "unknown"))
            configured = priority if priority in reservations else None
            limits = policy.build_limits(
                rpm=rpm,
                tpm=tpm,
                priority=configured,
                reservations=reservations,
                default_priority=0.2,
                saturation_threshold=0.8,
                lendable=lendable,
                field_of=field_of,
            )
            prompt = rng.randint(20, 3_000)
            cap = rng.choice((None, 256, 4_096))
            cost = ledger.RequestCost(prompt, cap, 300)
            settles = None
            if rng.random() < 0.5 and pending[group]:
                settles, pending[group] = pending[group], estimate.SettleBatch()
            quantile = 0.9 if group == "small" else None
            result = loop.run_until_complete(
                store.acquire(group, limits, cost, window_ms, settles=settles, quantile=quantile)
            )
            rec.log("acquire", i, group, priority, _fields(result, ACQUIRE_FIELDS), _counters(result.counters))
            headers = policy.rate_limit_headers(
                limits=limits,
                counters=result.counters,
                strict=result.strict,
                saturation_value=result.saturation,
                priority_label=priority or "default",
                now_ms=result.now_ms,
                window_end_ms=result.window_end_ms,
            )
            rec.log("headers", i, sorted(headers.items()))
            if result.admitted:
                output = rng.randint(0, 900) if cap is None else rng.randint(0, cap)
                actual = prompt + output
                if rng.random() < 0.03:
                    pending[group].add(result.window_start_ms, limits.pool, -result.cost_tokens, -1)
                    continue
                heapq.heappush(
                    ends,
                    (
                        now + rng.uniform(0.2, 20.0),
                        i,
                        group,
                        result.window_start_ms,
                        limits.pool,
                        result.cost_tokens,
                        actual,
                        output,
                    ),
                )
            else:
                remaining = policy.effective_remaining(result.counters, limits, result.strict)
                message = policy.rejection_message(
                    model=group,
                    priority=priority,
                    reason=result.reason,
                    rpm=rpm,
                    tpm=tpm,
                    remaining=remaining[1] if result.reason.limit_type == "tokens" else remaining[0],
                    saturation_value=result.saturation,
                )
                rec.log("rejected", i, message)
            if i % 40 == 0:
                for name in groups:
                    if pending[name] and rng.random() < 0.5:
                        loop.run_until_complete(store.flush(name, pending[name]))
                        pending[name] = estimate.SettleBatch()
                    snap = loop.run_until_complete(store.admission_snapshot(name, window_ms))
                    rec.log(
                        "snapshot",
                        i,
                        name,
                        None
                        if snap is None
                        else (
                            snap.window_start_ms,
                            snap.requests,
                            snap.tokens,
                            sorted(snap.pools.items()),
                            snap.carried_tokens,
                            snap.estimate,
                        ),
                    )
    finally:
        loop.close()

    # The pure decision on random counters (scaled limits too: a replica's share in the local fallback).
    prng = random.Random(seed * 1_000 + 6)
    for i in range(3_000):
        random_rpm = prng.choice((None, prng.randint(1, 500)))
        random_tpm = prng.choice((None, prng.randint(100, 200_000)))
        priority = prng.choice(("high", "low", "batch", None))
        limits = policy.build_limits(
            rpm=random_rpm,
            tpm=random_tpm,
            priority=priority,
            reservations=reservations,
            default_priority=prng.uniform(0.0, 0.5),
            saturation_threshold=prng.uniform(0.3, 1.0),
            lendable={"high": prng.uniform(0.0, 1.0), "batch": prng.uniform(0.0, 1.0)},
            field_of=field_of,
        )
        if prng.random() < 0.3:
            limits = policy.scale_limits(limits, prng.uniform(0.1, 1.0))
        requests = prng.randint(0, 600)
        tokens = prng.randint(0, 250_000)
        counters = policy.WindowCounters(
            requests,
            tokens,
            prng.randint(0, requests),
            prng.randint(0, tokens),
            {floor.pool: (prng.randint(0, 50), prng.randint(0, 20_000)) for floor in limits.floors},
        )
        decision = policy.decide(counters, limits, prng.randint(0, 10_000), prng.choice((0.0, prng.uniform(0, 5_000))))
        rec.log("decide", i, _fields(decision, ("admitted", "reason", "saturation", "strict")))


# -- contracts ----------------------------------------------------------------------------------------------

CONTRACT_FIELDS = (
    "now_ms",
    "window_start",
    "window_seconds",
    "rpm_mode",
    "tpm_mode",
    "counted",
    "feature_requests",
    "basket_requests",
    "feature_tokens",
    "basket_tokens",
)


def replay_contracts(rec: Recorder, seed: int, steps: int) -> None:
    policy = _module("litellm_ratebalance.contracts.policy")
    store_module = _module("litellm_ratebalance.store")
    clock = Clock()
    store = store_module.MemoryStore(clock=clock)
    rng = random.Random(seed * 1_000 + 7)
    book = policy.ContractBook(
        {"search": (30, 40_000), "chat": (None, 90_000), "batch": (10, None), "unassigned": (20, 20_000)},
        {"find": "search", "assistant": "chat"},
        80,
        150_000,
    )
    actions = {
        policy.Mode.BORROWED: policy.Action("cap_max_tokens", 200),
        policy.Mode.DEGRADED: policy.Action("reject"),
    }
    delay = policy.Action("delay", None, 0.1, 2.0)
    reject_modes = [mode for mode, action in actions.items() if action.kind == "reject"]
    names: tuple[object, ...] = ("search", "find", "chat", "assistant", "batch", "nothing", 7, None)
    window = 60
    loop = asyncio.new_event_loop()
    # (end, seq, feature, window start, estimate, actual)
    ends: list[tuple[float, int, str, int, int, int]] = []
    try:
        now = T0
        for i in range(steps):
            now += rng.expovariate(2.5)
            while ends and ends[0][0] <= now:
                end, _, feature, start, est, actual = heapq.heappop(ends)
                clock.now = end
                settled = loop.run_until_complete(store.contract_settle(feature, start, est, actual))
                rec.log("settle", feature, start, settled.applied, settled.feature_tokens, settled.basket_tokens)
            clock.now = now
            trust = rng.random() < 0.5
            resolution = policy.resolve_feature(
                book,
                request_feature=rng.choice(names),
                key_feature=rng.choice(names) if rng.random() < 0.3 else None,
                team_feature=rng.choice(names) if rng.random() < 0.3 else None,
                request_tags=[rng.choice(names) for _ in range(rng.randint(0, 2))],
                admin_tags=[rng.choice(names) for _ in range(rng.randint(0, 1))],
                trust_request_feature=trust,
            )
            limits = book.limits(resolution.feature)
            max_tokens = rng.choice((None, 100, 1_000, 5_000))
            prompt = rng.randint(10, 2_500)
            estimate = prompt + (256 if max_tokens is None else min(max_tokens, 4_096))
            admission = loop.run_until_complete(
                store.contract_admit(
                    resolution.feature,
                    limits,
                    estimate,
                    window_seconds=window,
                    ttl_seconds=2 * window,
                    reject_modes=reject_modes,
                )
            )
            action = policy.action_for(admission.mode, actions if i % 7 else {**actions, policy.Mode.BORROWED: delay})
            wait = policy.delay_seconds(action, rng.random())
            capped = policy.capped_max_tokens(max_tokens, action.cap) if action.kind == "cap_max_tokens" else None
            rec.log(
                "admit",
                i,
                resolution.feature,
                resolution.source,
                _fields(admission, CONTRACT_FIELDS),
                admission.retry_after_seconds,
                action.kind,
                wait,
                capped,
            )
            if not admission.counted:
                rec.log("rejected", i, policy.rejection_message(resolution.feature, admission, limits))
                continue
            answer = rng.randint(0, capped if capped is not None else (max_tokens or 800))
            # A few answers come back after their window's counters expired: the settle must find nothing.
            ends_at = now + (rng.uniform(130.0, 200.0) if rng.random() < 0.03 else rng.uniform(0.1, 30.0))
            heapq.heappush(ends, (ends_at, i, resolution.feature, admission.window_start, estimate, prompt + answer))
            if i % 50 == 0:
                seen = loop.run_until_complete(store.contract_window(window))
                rec.log(
                    "window",
                    i,
                    None
                    if seen is None
                    else (
                        seen.window_start,
                        sorted(seen.requests.items()),
                        sorted(seen.tokens.items()),
                        sorted(seen.in_flight.items()),
                    ),
                )
    finally:
        loop.close()


# -- main ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3_000, help="requests per simulated part (default 3000)")
    parser.add_argument("--trace", help="write every logged decision to this file, one per line")
    args = parser.parse_args(argv)
    # Routing settings read these when the config leaves them out: the replay must not depend on the shell.
    for variable in (
        "RB_LLM_CLIENT_SLIDING_WINDOW_SIZE",
        "RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO",
        "RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR",
    ):
        os.environ.pop(variable, None)
    package = importlib.import_module("litellm_ratebalance")
    print(f"package {os.path.dirname(os.path.abspath(package.__file__ or ''))}")
    trace = open(args.trace, "w", encoding="utf-8") if args.trace else None  # noqa: SIM115
    try:
        recorders: list[Recorder] = []

        def part(name: str) -> Recorder:
            recorders.append(Recorder(name, trace))
            return recorders[-1]

        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # a deprecated name here would be a wrong comparison
            replay_routing(part("routing-default"), args.seed, args.steps, {})
            replay_routing(part("routing-plain"), args.seed, args.steps, {"preset": plain_preset()})
            replay_routing(part("routing-smooth"), args.seed, args.steps, {"selection": "smooth"})
        backpressure, cost = part("backpressure"), part("cost")
        replay_backpressure(backpressure, cost, args.seed, args.steps)
        replay_cost_labels(cost, args.seed)
        replay_admission(part("admission"), args.seed, args.steps)
        replay_contracts(part("contracts"), args.seed, args.steps)
    finally:
        if trace is not None:
            trace.close()
    combined = hashlib.sha256()
    for rec in recorders:
        print(f"{rec.part:<16} {rec.count:>7} {rec.digest}")
        combined.update(f"{rec.part} {rec.count} {rec.digest}\n".encode())
    print(f"{'combined':<16} {sum(r.count for r in recorders):>7} {combined.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
