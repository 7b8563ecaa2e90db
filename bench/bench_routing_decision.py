"""Cost of one routing decision at 8 deployments: ours (aggregates) vs the reference (walks samples).

Same samples in both, a window with few samples and one with very many. Printed per decision, in one run:

* ``ours choose``: RateBalancer.choose on a warm view (the request path: no store call), plus the release
  of the pick (what a finished request does), so the view stays in a steady state;
* ``ours choose, 4 in flight``: the same with four of its picks in flight at every decision (live load and
  in-flight evidence are worked into the shares);
* ``ours filter hook``: RateBalancerCallback.async_filter_deployments with LiteLLM deployment dicts
  (extracting the candidates, narrowing like the Router, working out the request's size from its
  ``max_tokens`` and messages, choosing), awaited on an event loop; also with four of its picks in flight;
* ``... + 1 overdue``: the same busy rows with one more request in flight that is overdue (older than the
  deployment's typical latency), so its deployment's in-flight evidence is timed and grows with the clock;
  the clock moves 1 ms per decision (1,000 decisions a second: shares with timed evidence are reused for
  50 ms for the same in-flight pattern) or, in the ``recomputed`` rows, 50 ms (every decision works the
  evidence out afresh: the cost of one decision when requests are rare);
* ``ours cache miss``: the first decision for a candidate set after a sync (shares computed once);
* ``ours sync``: one refresh of the local view (embedded store; with Redis add one round trip), which
  happens at most once per refresh interval and model group, not per request;
* ``reference``: the proposal's algorithm (tests/unit/routing_reference.py) deciding from the samples;
* ``litellm <strategy>``: LiteLLM's own decision with each built-in strategy,
  ``Router.async_get_available_deployment`` over the same 8 deployments (no call made), side by side.

Targets: the worst request-path decision (every row but the cache miss and the sync), whatever the number of
samples, <= 20 us compiled and <= 30 us in pure Python (LiteLLM's own decision time with each built-in strategy
is printed beside it, with the ratio). Run: ``python
bench/bench_routing_decision.py`` (or ``make bench BENCH_ARGS=routing_decision``); ``make bench-compiled`` runs
it on the mypyc-compiled routing core (the first line of the output says which build ran).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from litellm_ratebalance.proxy.routing import RateBalancerCallback
from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings, core_build
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_reference import ReferenceBalancer, Sample

DEPLOYMENTS = 8
T0 = 1_000_000.0
TARGET_US = {"compiled": 20.0, "python": 30.0}
"""Worst request-path decision allowed, by build of the routing core."""
OVERDUE_AGE = 8.0
"""Seconds the overdue request has been in flight when an overdue row starts (typical latencies are 0.5-5 s)."""


def per_call_us(fn: Callable[[], object], min_calls: int = 200, min_seconds: float = 0.5) -> float:
    calls = 0
    start = time.perf_counter()
    while True:
        for _ in range(min_calls):
            fn()
        calls += min_calls
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls * 1e6


async def per_await_us(fn: Callable[[], Awaitable[object]], min_calls: int = 200, min_seconds: float = 0.5) -> float:
    calls = 0
    start = time.perf_counter()
    while True:
        for _ in range(min_calls):
            await fn()
        calls += min_calls
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls * 1e6


MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "lorem ipsum " * 160}]
REQUEST_KWARGS = {"max_tokens": 256}
"""What the hook rows pass: a request with a ~500-token prompt and a max_tokens (so its size is worked out)."""


async def overdue_costs(
    ours: RateBalancer,
    callback: RateBalancerCallback,
    clock: list[float],
    candidates: tuple[Candidate, ...],
    deployments: list[dict[str, Any]],
    step: float,
) -> tuple[float, float]:
    """Per-decision cost of ``choose`` and of the filter hook with four requests cycling through flight (each
    finishes four decisions later) and one more overdue: started :data:`OVERDUE_AGE` before, never finished.
    The clock moves ``step`` seconds per decision; it is put back where it was at the end."""
    now = clock[0]
    serial = itertools.count()
    costs: list[float] = []
    for hook in (False, True):
        clock[0] = now - OVERDUE_AGE
        overdue_at = candidates[ours.choose("g", candidates, "overdue")].id
        clock[0] = now
        cycling: list[tuple[str, str]] = []

        def finish_fifth(picked: str, request_id: str, cycling: list[tuple[str, str]] = cycling) -> None:
            cycling.append((picked, request_id))
            if len(cycling) > 4:
                ours.release("g", *cycling.pop(0))

        def choose_overdue() -> None:
            clock[0] += step
            request_id = f"r{next(serial)}"
            finish_fifth(candidates[ours.choose("g", candidates, request_id)].id, request_id)

        async def hook_overdue() -> None:
            clock[0] += step
            request_id = f"r{next(serial)}"
            kwargs = {**REQUEST_KWARGS, "litellm_trace_id": request_id}
            picked = await callback.async_filter_deployments("g", deployments, MESSAGES, kwargs)
            finish_fifth(picked[0]["model_info"]["id"], request_id)

        costs.append(await per_await_us(hook_overdue) if hook else per_call_us(choose_overdue))
        for deployment_id, request_id in cycling:
            ours.release("g", deployment_id, request_id)
        ours.release("g", overdue_at, "overdue")
        clock[0] = now
    return costs[0], costs[1]


def routing_build() -> str:
    """Which build of the routing core this process runs (:func:`core_build`): the mypyc-compiled modules
    (``make compiled``, setup.py) or the Python sources."""
    return "compiled (mypyc)" if core_build() == "compiled" else "pure Python"


BUILTIN_STRATEGIES = ("simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing-v2")


async def builtin_us(strategy: str, deployments: list[dict[str, Any]]) -> float:
    """LiteLLM's own routing decision with ``strategy``: ``Router.async_get_available_deployment`` for a request
    like the hook rows' (the Router's health, cooldown and strategy work; nothing is sent)."""
    from litellm.router import Router

    model_list = [{**d, "litellm_params": {**d["litellm_params"], "api_key": "sk-bench"}} for d in deployments]
    router = Router(model_list=model_list, routing_strategy=strategy)  # type: ignore[arg-type]

    async def decide() -> object:
        return await router.async_get_available_deployment(model="g", messages=MESSAGES, request_kwargs=REQUEST_KWARGS)

    await decide()  # warm-up: the first decision fills LiteLLM's caches
    return await per_await_us(decide, min_calls=50)


async def build(samples_per_deployment: int) -> tuple[RateBalancer, ReferenceBalancer, list[float]]:
    """The balancer and the reference with the same samples, and the clock both read (a one-item list)."""
    names = [f"deployment-{i}" for i in range(DEPLOYMENTS)]
    rng = random.Random(samples_per_deployment)
    clock = [T0]
    settings = RoutingSettings(refresh_interval=300.0)
    ours = RateBalancer(MemoryStore(clock=lambda: clock[0]), settings, clock=lambda: clock[0], rng=random.Random(1))
    reference = ReferenceBalancer(names, window_seconds=120, rng=random.Random(1))
    means = {name: rng.uniform(20, 150) for name in names}
    seconds = 100  # samples spread over 100 s of the 120 s window
    for second in range(seconds):
        clock[0] = T0 + second
        for name in names:
            for _ in range(samples_per_deployment // seconds + (1 if second < samples_per_deployment % seconds else 0)):
                latency = rng.uniform(0.5, 5.0)
                output = max(1, round(max(1.0, rng.gauss(means[name], means[name] * 0.2)) * latency))
                ok = rng.random() > 0.02
                reference.record(name, Sample(latency, clock[0], output, 0, ok))
                ours.record("g", name, latency=latency, output_tokens=output, ok=ok)
        await ours.refresh("g")
    clock[0] = T0 + seconds
    await ours.refresh("g")
    return ours, reference, clock


async def main() -> int:
    names = [f"deployment-{i}" for i in range(DEPLOYMENTS)]
    candidates = tuple(Candidate(n) for n in names)
    deployments = [
        {"model_name": "g", "litellm_params": {"model": f"openai/{n}", "tpm": 1_000_000}, "model_info": {"id": n}}
        for n in names
    ]
    rows: list[tuple[str, int, float, float | None]] = []
    worst_ours = 0.0
    for per_deployment in (10, 12_500):
        ours, reference, clock = await build(per_deployment)
        now = clock[0]
        total = sum(len(rates) for rates in reference.rates(now))  # samples in the window (unweighted)

        # The clock stands still; each pick is released again, as a finished request would be, so the view
        # stays in its steady state (a handful in flight) instead of piling up picks that never finish.
        def choose_and_finish(ours: RateBalancer = ours) -> None:
            ours.release("g", candidates[ours.choose("g", candidates)].id)

        choose_us = per_call_us(choose_and_finish)

        # Busy steady state: four requests stay in flight here (each pick finishes four decisions later), so
        # the deployments picked carry live load and in-flight evidence into every decision.
        in_flight: list[str] = []

        def choose_while_busy(ours: RateBalancer = ours, in_flight: list[str] = in_flight) -> None:
            in_flight.append(candidates[ours.choose("g", candidates)].id)
            if len(in_flight) > 4:
                ours.release("g", in_flight.pop(0))

        busy_us = per_call_us(choose_while_busy)
        for deployment_id in in_flight:
            ours.release("g", deployment_id)
        callback = RateBalancerCallback(balancer=ours)

        async def hook_and_finish(cb: RateBalancerCallback = callback, ours: RateBalancer = ours) -> None:
            picked = await cb.async_filter_deployments("g", deployments, MESSAGES, REQUEST_KWARGS)
            ours.release("g", picked[0]["model_info"]["id"])

        hook_us = await per_await_us(hook_and_finish)
        hook_in_flight: list[str] = []

        async def hook_while_busy(
            cb: RateBalancerCallback = callback, ours: RateBalancer = ours, hook_in_flight: list[str] = hook_in_flight
        ) -> None:
            picked = await cb.async_filter_deployments("g", deployments, MESSAGES, REQUEST_KWARGS)
            hook_in_flight.append(picked[0]["model_info"]["id"])
            if len(hook_in_flight) > 4:
                ours.release("g", hook_in_flight.pop(0))

        hook_busy_us = await per_await_us(hook_while_busy)
        for deployment_id in hook_in_flight:
            ours.release("g", deployment_id)

        overdue_rows: list[tuple[str, float]] = []
        for step, label in ((0.001, ""), (0.05, ", recomputed")):
            choose_cost, hook_cost = await overdue_costs(ours, callback, clock, candidates, deployments, step)
            overdue_rows.append((f"ours choose, 4 in flight + 1 overdue{label}", choose_cost))
            overdue_rows.append((f"ours filter hook, 4 in flight + 1 overdue{label}", hook_cost))

        def cache_miss(ours: RateBalancer = ours) -> None:
            for view in ours._views.values():
                view.cache.clear()
            ours.release("g", candidates[ours.choose("g", candidates)].id)

        miss_us = per_call_us(cache_miss)
        sync_us = await per_await_us(lambda ours=ours: ours.refresh("g"), min_calls=20)
        reference_us = per_call_us(lambda r=reference, t=now: r.choose(t), min_calls=2, min_seconds=1.0)
        worst_ours = max(worst_ours, choose_us, busy_us, hook_us, hook_busy_us, *(us for _, us in overdue_rows))
        rows += [
            ("ours choose", total, choose_us, reference_us),
            ("ours choose, 4 in flight", total, busy_us, reference_us),
            ("ours filter hook", total, hook_us, reference_us),
            ("ours filter hook, 4 in flight", total, hook_busy_us, reference_us),
            *((path, total, us, reference_us) for path, us in overdue_rows),
            ("ours cache miss", total, miss_us, reference_us),
            ("ours sync (per refresh)", total, sync_us, None),
            ("reference", total, reference_us, None),
        ]
    print(f"decision cost at {DEPLOYMENTS} deployments (microseconds; ratio = reference / ours)")
    print(f"routing core: {routing_build()}")
    print(f"{'path':56} {'samples in window':>18} {'us/decision':>12} {'ratio':>10}")
    for path, total, us, ref in rows:
        ratio = f"{ref / us:,.0f}x" if ref is not None else ""
        print(f"{path:56} {total:>18,} {us:>12,.1f} {ratio:>10}")
    builtins = [(strategy, await builtin_us(strategy, deployments)) for strategy in BUILTIN_STRATEGIES]
    print(f"\nLiteLLM's own decision at {DEPLOYMENTS} deployments (Router.async_get_available_deployment)")
    print(f"{'strategy':56} {'us/decision':>12} {'ours worst / it':>16}")
    for strategy, us in builtins:
        print(f"{'litellm ' + strategy:56} {us:>12,.1f} {worst_ours / us:>15.2f}x")
    target = TARGET_US[core_build()]
    verdict = "meets" if worst_ours <= target else "MISSES"
    print(
        f"\nworst request-path decision (any row above but cache miss and sync): {worst_ours:.1f} us -> {verdict} "
        f"<= {target:.0f} us ({routing_build()})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
