"""Cost attribution against the truth: attributed vs true GPU-seconds per priority tier under overload.

The overload of ``bench_backpressure.py`` (its profiles, requests, closed loop and router, imported from it),
with the layer (default settings except tiers ``low`` < ``high``, ``kv_cache_tokens``, queue on, metrics
scraped), on each of its two simulated server profiles:

* ``knee``: knee 8, 20 ms/token, KV cache 2000 tokens; prompts 50-150 tokens, answers 20-60;
* ``kv``: knee 12, KV cache 3000 tokens; prompts 100-600 tokens, answers 50-300 (memory, not compute, bounds
  the batch: few long requests in flight, prefill a larger part of each step).

Requests carry a natural answer length (the server stops there or at max_tokens); a third set max_tokens to it,
a third far above it, a third not at all. Poisson arrivals at 3x the best closed-loop throughput of the
server alone, 20% high priority, for ``--seconds``. Every request carries its tier in the ``x-sim-cost-tag``
header, so the simulated server sums the ground truth per tier: each engine step's measured time shared among
the requests in it (decode equally, prefill by prompt tokens). The layer attributes GPU-seconds from its own
view only (the requests in flight on the deployment, the shared sharing clock), as in production; the bench
reads ``litellm_ratebalance_gpu_seconds_total`` per tier and compares.

Target: attributed within 10% of the truth for every tier of every profile. Also printed: the totals against
the engine's busy time, GPU-seconds per 1k output tokens as ``litellm-ratebalance status`` shows it (the
store's decayed sums) against the truth's, and, for comparison, the true total split by each tier's output
tokens (what charging per output token would give).

``python bench/bench_cost.py [--seconds 25] [--seed 7] [--high-share 0.2] [--profiles knee,kv]
[--redis-url redis://...] [--prompt-text words|runs]`` (``--redis-url``: the shared state in that Redis,
through the Lua scripts, instead of the embedded store).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import litellm
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from bench.bench_backpressure import (
    HIGH_SHARE,
    MAX_IN_FLIGHT,
    OVERLOAD,
    PROFILES,
    TIERS,
    Job,
    Profile,
    make_job,
    make_jobs,
    mean_answer,
    measure_capacity,
    router_for,
    seeded,
    wait_idle,
)
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.cost import cost_meter
from litellm_ratebalance.proxy.runtime import configure, get_runtime, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.inference_server import COST_TAG_HEADER, InferenceServerProcess, ServerStats
from litellm_ratebalance.store import KeySpace, MemoryStore, RedisStore, Store

TOLERANCE = 0.10
DEPLOYMENT = "gpu1"
"""The deployment id of ``bench_backpressure.router_for``."""


async def send(router: Router, job: Job) -> tuple[str, int, int]:
    """(tier, status, output tokens) of one request, tagged with its tier for the server's ground truth."""
    extra: dict[str, Any] = {} if job.max_tokens is None else {"max_tokens": job.max_tokens}
    try:
        response = await router.acompletion(
            model="local",
            messages=job.payload(),
            extra_headers={COST_TAG_HEADER: job.priority},
            metadata={
                "user_api_key_auth": UserAPIKeyAuth(
                    token=f"k-{job.priority}", team_id=f"team-{job.priority}", metadata={"priority": job.priority}
                )
            },
            **extra,
        )
        tokens = int(getattr(getattr(response, "usage", None), "completion_tokens", 0) or 0)
        return job.priority, 200, tokens
    except Exception as exc:
        return job.priority, int(getattr(exc, "status_code", 0) or 0), 0


async def run_open_loop(router: Router, jobs: Sequence[Job]) -> list[tuple[str, int, int]]:
    origin = time.monotonic()
    limiter = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(job: Job) -> tuple[str, int, int]:
        async with limiter:
            return await send(router, job)

    tasks = []
    for job in jobs:
        delay = job.at - (time.monotonic() - origin)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(job)))
    return list(await asyncio.gather(*tasks))


def store_faults() -> float:
    """Store errors counted so far by backpressure and cost (a faulty store leaves requests unmetered)."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "litellm_ratebalance_store_errors"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["component"] in ("backpressure", "cost")
    )


def attributed(tier: str) -> float:
    """GPU-seconds attributed so far to ``tier`` on the bench's deployment (every team and feature)."""
    total = 0.0
    for family in REGISTRY.collect():
        if family.name != "litellm_ratebalance_gpu_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels["deployment"] == DEPLOYMENT and labels["priority"] == tier:
                total += sample.value
    return total


async def make_store(redis_url: str | None, name: str) -> Store:
    if not redis_url:
        return MemoryStore()
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    return RedisStore(client, KeySpace(f"benchcost{os.getpid()}{name}"), owns_client=True)


@dataclass
class Outcome:
    profile: Profile
    jobs: int
    rate: float
    best: float
    elapsed: float
    stats: ServerStats
    got: dict[str, float]
    counts: dict[str, dict[str, int]]
    shown_per_1k: float | None
    store_faults: float


async def run_profile(profile: Profile, args: Any) -> Outcome:
    async with InferenceServerProcess(profile.spec) as server:
        best = max((await measure_capacity(server, profile, seeded(args.seed, "closed_loop"))).values())
        if best <= 0:
            raise SystemExit(f"profile {profile.name}: every closed loop ran out of memory")
        rate = OVERLOAD * best / mean_answer(args.seed, profile)
        jobs = make_jobs(args.seed, profile, rate, args.seconds, args.high_share)
        await wait_idle(server)

        saved_callbacks = list(litellm.callbacks)
        reset_runtime()
        warmup_store = await make_store(args.redis_url, f"{profile.name}warmup")
        configure(
            settings=parse_settings(
                {
                    "ratebalance": {
                        "backpressure": {
                            "tiers": ["low", "high"],
                            "kv_cache_tokens": profile.spec.memory_tokens,
                            "queue": {"enabled": True, "max_wait_seconds": 10},
                            "deployments": {DEPLOYMENT: {"metrics_url": server.metrics_url}},
                        }
                    }
                }
            ),
            store=warmup_store,
        )
        callback = BackpressureCallback()
        litellm.callbacks = [callback]
        router = router_for(server.api_base)
        warm = [make_job(random.Random(args.seed + 1), profile, 0.0, "warmup", 10**6 + i) for i in range(6)]
        for start in range(0, len(warm), 3):
            await asyncio.gather(*(send(router, job) for job in warm[start : start + 3]))
        await wait_idle(server)
        await server.reset()
        # A fresh store for the measured run: the warm-up's requests (alone, holding their slot through the
        # proxy's one-off start-up work) stay out of the efficiency sums that status reads.
        store = await make_store(args.redis_url, profile.name)
        configure(store=store)
        before = {tier: attributed(tier) for tier in TIERS}
        faults_before = store_faults()
        started = time.monotonic()
        results = await run_open_loop(router, jobs)
        elapsed = time.monotonic() - started
        await wait_idle(server)
        for _ in range(100):  # failure events reach the layer through LiteLLM's logging: let them land
            if (meter := cost_meter()) is None or meter.open_requests == 0:
                break
            await asyncio.sleep(0.05)
        stats = await server.stats()
        faults = store_faults() - faults_before
        half_life_ms = int(get_runtime().settings().ratebalance.cost.efficiency_half_life_seconds * 1000)
        efficiency = await get_runtime().store().cost_efficiency(DEPLOYMENT, half_life_ms=half_life_ms)
        await callback.aclose()
        litellm.callbacks = saved_callbacks
        await store.aclose()
        await warmup_store.aclose()  # (not earlier: the maintenance task may still be renewing through it)

    counts: dict[str, dict[str, int]] = {tier: {"ok": 0, "refused": 0, "failed": 0, "tokens": 0} for tier in TIERS}
    for tier, status, tokens in results:
        row = counts[tier]
        row["ok" if status == 200 else "refused" if status in (429, 503) else "failed"] += 1
        row["tokens"] += tokens
    return Outcome(
        profile=profile,
        jobs=len(jobs),
        rate=rate,
        best=best,
        elapsed=elapsed,
        stats=stats,
        got={tier: attributed(tier) - before[tier] for tier in TIERS},
        counts=counts,
        shown_per_1k=None if efficiency is None else efficiency.per_1k_output_tokens(),
        store_faults=faults,
    )


def report(outcome: Outcome, args: Any) -> list[tuple[str, bool]]:
    profile, stats = outcome.profile, outcome.stats
    spec = profile.spec
    truth = {tier: stats.gpu_seconds_by_tag.get(tier, 0.0) for tier in TIERS}
    print(f"\n=== profile {profile.name} ===")
    print(
        f"simulated server: knee {spec.knee}, {spec.step_seconds * 1000:.0f} ms/token, KV cache "
        f"{spec.memory_tokens} tokens; prompts {profile.prompt_tokens[0]}-{profile.prompt_tokens[1]} tokens, answers "
        f"{spec.answer_tokens}; store: {'redis' if args.redis_url else 'embedded'}"
    )
    print(
        f"overload: {outcome.jobs} requests in {args.seconds:.0f}s ({outcome.rate:.1f}/s = {OVERLOAD:.0f}x the best "
        f"closed loop, {outcome.best:.0f} tok/s), {args.high_share:.0%} high priority; run took "
        f"{outcome.elapsed:.1f}s, engine busy {stats.busy_seconds:.2f}s, simulated OOM failures {stats.oom_failures}, "
        f"store faults {outcome.store_faults:.0f} (a request that meets one goes unmetered)\n"
    )
    header = f"{'tier':6}{'ok':>6}{'refused':>9}{'failed':>8}{'attributed GPU-s':>18}{'true GPU-s':>12}{'error':>9}"
    print(header)
    print("-" * len(header))
    checks: list[tuple[str, bool]] = []
    for tier in TIERS:
        got, true = outcome.got[tier], truth[tier]
        error = (got - true) / true if true > 0 else float("nan")
        row = outcome.counts[tier]
        print(f"{tier:6}{row['ok']:>6}{row['refused']:>9}{row['failed']:>8}{got:>18.2f}{true:>12.2f}{error:>+9.1%}")
        label = f"{profile.name}/{tier}: attributed within {TOLERANCE:.0%} of the truth ({error:+.1%})"
        checks.append((label, abs(error) <= TOLERANCE))
    total_got, total_truth = sum(outcome.got.values()), sum(truth.values())
    print(f"{'all':6}{'':>23}{total_got:>18.2f}{total_truth:>12.2f}{(total_got - total_truth) / total_truth:>+9.1%}")
    output_tokens = sum(row["tokens"] for row in outcome.counts.values())
    true_per_1k = 1000 * total_truth / output_tokens if output_tokens else float("nan")
    shown = outcome.shown_per_1k
    print(
        f"\nGPU-seconds per 1k output tokens: status shows {'-' if shown is None else f'{shown:.3f}'} (the "
        f"store's decayed sums), truth {true_per_1k:.3f} ({total_truth:.2f} GPU-s / {output_tokens} output tokens)"
    )
    # The alternative a per-token price amounts to: the true total split by the tiers' output tokens (generous:
    # it is handed the true total). Requests that failed or produced little still used the GPU.
    if output_tokens:
        split = ", ".join(
            f"{tier} {total_truth * outcome.counts[tier]['tokens'] / output_tokens:.2f} "
            f"({(total_truth * outcome.counts[tier]['tokens'] / output_tokens - truth[tier]) / truth[tier]:+.1%})"
            for tier in TIERS
            if truth[tier] > 0
        )
        print(f"for comparison, the true total split by output tokens: {split}")
    return checks


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="overload duration per profile")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--high-share", type=float, default=HIGH_SHARE)
    parser.add_argument("--profiles", default="knee,kv", help=f"comma-separated, of {', '.join(PROFILES)}")
    parser.add_argument("--redis-url", default=None, help="keep the shared state in this Redis (default: embedded)")
    parser.add_argument(
        "--prompt-text",
        choices=["words", "runs"],
        default="words",
        help="as bench_backpressure.py's: runs = one character repeated, which LiteLLM counts at about half the "
        "server's tokens",
    )
    args = parser.parse_args(argv)
    if not 0.0 < args.high_share < 1.0:
        parser.error(f"--high-share must be between 0 and 1, exclusive (got {args.high_share})")
    names = [name.strip() for name in args.profiles.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROFILES]
    if unknown or not names:
        parser.error(f"--profiles: unknown {unknown} (known: {', '.join(PROFILES)})")
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    litellm.suppress_debug_info = True
    bench_started = time.monotonic()
    checks: list[tuple[str, bool]] = []
    for name in names:
        checks += report(await run_profile(replace(PROFILES[name], prompt_text=args.prompt_text), args), args)
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    print(f"\n(bench took {time.monotonic() - bench_started:.0f}s)")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
