"""Backpressure under a 3x overload of a simulated local inference server, with and without the layer.

One run, same request sequence for both modes (seeded), everything on loopback:

1. **capacity**: the larger of the server's nominal decode rate (knee / step time: the batch size where
   per-token latency starts to grow, at full speed) and the best output tokens per second it sustains
   alone, closed loop at and a little past its knee, without running out of memory;
2. **unloaded**: high-priority requests through a LiteLLM Router at concurrency 2: their p95 latency;
3. **overload**: Poisson arrivals at 3x the capacity (20% high priority, 80% low) for ``--seconds``,
   through a Router **without** the layer, then **with** ``BackpressureCallback`` (tiers low < high,
   KV-cache capacity configured, metrics scraped, queue on for the top tier).

Targets (with the layer): zero simulated out-of-memory failures, high-priority p95 within 1.5x of the
unloaded p95, the low tier shed before the high one, goodput >= 90% of the measured capacity. Goodput counts
output tokens of successful requests that completed inside the measurement window (after a warm-up), per
second. The server runs in a child process so the load generator's CPU does not slow its engine.

Why 20% high priority: the high tier alone then offers 60% of the nominal capacity (about 70% of what the
server sustains closed loop). A tier that alone offers (nearly) all of the capacity queues behind itself:
at 86-95% load a FIFO wait grows like ``1 / (1 - load)`` whatever is done with the lower tiers, so its p95
measures the high tier's own provisioning, not the layer. ``--high-share 0.25`` is that stress case (kept in
bench/results/backpressure.md); the bench prints the high tier's offered load next to the capacity.

``python bench/bench_backpressure.py [--seconds 25] [--seed 7] [--high-share 0.2] [--limit JSON] [--debug]``
(also part of ``make bench``); the layer runs with default settings except those listed in the config below.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import litellm
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.inference_server import InferenceServerProcess, ServerSpec
from litellm_ratebalance.store import MemoryStore

SPEC = ServerSpec(knee=8, step_seconds=0.02, max_num_seqs=48, memory_tokens=2000)
OVERLOAD = 3.0
HIGH_SHARE = 0.2
WARMUP_SECONDS = 3.0
MAX_IN_FLIGHT = 400  # safety bound on concurrent client tasks


@dataclass(frozen=True)
class Job:
    at: float
    priority: str
    prompt_chars: int
    max_tokens: int


@dataclass
class Result:
    job: Job
    status: int
    reason: str | None
    started: float
    ended: float
    output_tokens: int


def make_jobs(rng: random.Random, rate: float, seconds: float, high_share: float) -> list[Job]:
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return jobs
        priority = "high" if rng.random() < high_share else "low"
        jobs.append(Job(t, priority, rng.randint(200, 600), rng.randint(20, 60)))


def router_for(api_base: str) -> Router:
    deployment = {
        "model_name": "local",
        "litellm_params": {"model": "openai/sim", "api_base": api_base, "api_key": "sk-none", "timeout": 120},
        "model_info": {"id": "gpu1"},
    }
    return Router(model_list=[deployment], num_retries=0)


async def send(router: Router, job: Job, origin: float) -> Result:
    started = time.monotonic() - origin
    try:
        response = await router.acompletion(
            model="local",
            messages=[{"role": "user", "content": "x" * job.prompt_chars}],
            max_tokens=job.max_tokens,
            metadata={
                "user_api_key_auth": UserAPIKeyAuth(token=f"k-{job.priority}", metadata={"priority": job.priority})
            },
        )
        tokens = int(getattr(getattr(response, "usage", None), "completion_tokens", 0) or 0)
        return Result(job, 200, None, started, time.monotonic() - origin, tokens)
    except Exception as exc:
        headers = getattr(exc, "headers", None) or {}
        status = int(getattr(exc, "status_code", 0) or 0)
        return Result(job, status, headers.get("x-litellm-backpressure-reason"), started, time.monotonic() - origin, 0)


async def run_open_loop(router: Router, jobs: Sequence[Job]) -> list[Result]:
    origin = time.monotonic()
    limiter = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(job: Job) -> Result:
        async with limiter:
            return await send(router, job, origin)

    tasks = []
    for job in jobs:
        delay = job.at - (time.monotonic() - origin)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(job)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(server: InferenceServerProcess, concurrency: int, seconds: float, rng: random.Random) -> float:
    """Output tokens/s of the server alone with ``concurrency`` clients back to back (0 if it OOMed)."""
    await server.reset()
    deadline = time.monotonic() + seconds
    tokens = 0
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal tokens
            while time.monotonic() < deadline:
                body = {
                    "model": "sim",
                    "messages": [{"role": "user", "content": "x" * rng.randint(200, 600)}],
                    "max_tokens": rng.randint(20, 60),
                }
                async with session.post(server.api_base + "/chat/completions", json=body) as response:
                    data = await response.json()
                if response.status == 200 and time.monotonic() <= deadline:
                    tokens += int(data["usage"]["completion_tokens"])

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = min(time.monotonic(), deadline) - start
    return 0.0 if (await server.stats()).oom_failures else tokens / elapsed


async def measure_capacity(server: InferenceServerProcess, rng: random.Random) -> tuple[float, int]:
    """The best sustainable throughput (no OOM) over a few concurrencies around the knee."""
    best, best_concurrency = 0.0, 0
    for concurrency in (SPEC.knee, SPEC.knee + 2, SPEC.knee + 4):
        rate = await closed_loop(server, concurrency, 4.0, rng)
        await wait_idle(server)
        if rate > best:
            best, best_concurrency = rate, concurrency
    return best, best_concurrency


async def measure_unloaded(router: Router, rng: random.Random, count: int) -> list[float]:
    jobs = [Job(0.0, "high", rng.randint(200, 600), rng.randint(20, 60)) for _ in range(count)]
    limiter = asyncio.Semaphore(2)
    origin = time.monotonic()

    async def one(job: Job) -> Result:
        async with limiter:
            return await send(router, job, origin)

    results = await asyncio.gather(*(one(j) for j in jobs))
    return [r.ended - r.started for r in results if r.status == 200]


async def wait_idle(server: InferenceServerProcess) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            async with session.get(server.url + "/_sim/stats") as response:
                data = await response.json()
            if data["running"] == 0 and data["waiting"] == 0:
                return
            await asyncio.sleep(0.1)


def queue_wait_totals() -> tuple[float, float]:
    """(count, sum) of the layer's queue-wait histogram so far (the default registry, deployment gpu1)."""
    labels = {"deployment": "gpu1"}
    name = "litellm_ratebalance_backpressure_queue_wait_seconds"
    count = REGISTRY.get_sample_value(name + "_count", labels) or 0.0
    return count, REGISTRY.get_sample_value(name + "_sum", labels) or 0.0


def p95(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def summarise(results: Sequence[Result], seconds: float, oom_failures: int) -> dict[str, Any]:
    window = [r for r in results if r.job.at >= WARMUP_SECONDS]
    out: dict[str, Any] = {"oom": oom_failures}
    for tier in ("high", "low"):
        mine = [r for r in window if r.job.priority == tier]
        ok = [r for r in mine if r.status == 200]
        shed = [r for r in mine if r.reason is not None]
        out[tier] = {
            "sent": len(mine),
            "ok": len(ok),
            "shed": len(shed),
            "failed": len(mine) - len(ok) - len(shed),
            "p50": statistics.median([r.ended - r.started for r in ok]) if ok else float("nan"),
            "p95": p95([r.ended - r.started for r in ok]),
        }
    out["reasons"] = dict(Counter(f"{r.job.priority}:{r.reason}" for r in window if r.reason))
    done = sum(r.output_tokens for r in results if r.status == 200 and WARMUP_SECONDS <= r.ended <= seconds)
    out["goodput"] = done / (seconds - WARMUP_SECONDS)
    return out


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="overload duration per mode")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--limit", default="{}", help="JSON of backpressure.limit settings, e.g. '{\"tolerance\": 1.1}'"
    )
    parser.add_argument(
        "--high-share", type=float, default=HIGH_SHARE, help="fraction of the overload sent as high priority"
    )
    parser.add_argument("--debug", action="store_true", help="print the layer's view of the deployment every 0.5s")
    args = parser.parse_args(argv)
    if not 0.0 < args.high_share < 1.0:
        parser.error(f"--high-share must be between 0 and 1, exclusive (got {args.high_share})")
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    litellm.suppress_debug_info = True
    rng = random.Random(args.seed)
    bench_started = time.monotonic()

    async with InferenceServerProcess(SPEC) as server:
        measured, capacity_concurrency = await measure_capacity(server, rng)
        # The stricter of the two: the engine's nominal decode rate at the knee, or what a closed loop got.
        nominal = SPEC.capacity_tokens_per_second()
        capacity = max(measured, nominal)
        mean_output = 40.0  # the uniform 20..60 of the request mix
        rate = OVERLOAD * capacity / mean_output
        saved_callbacks = list(litellm.callbacks)
        litellm.callbacks = []
        plain = router_for(server.api_base)
        unloaded = await measure_unloaded(plain, rng, 96)
        unloaded_p95 = p95(unloaded)
        jobs = make_jobs(rng, rate, args.seconds, args.high_share)

        await wait_idle(server)
        await server.reset()
        without = summarise(await run_open_loop(plain, jobs), args.seconds, (await server.stats()).oom_failures)

        await wait_idle(server)
        await server.reset()
        reset_runtime()
        configure(
            settings=parse_settings(
                {
                    "ratebalance": {
                        "backpressure": {
                            "tiers": ["low", "high"],
                            "kv_cache_tokens": SPEC.memory_tokens,
                            "limit": json.loads(args.limit),
                            "queue": {"enabled": True, "max_wait_seconds": 10},
                            "deployments": {"gpu1": {"metrics_url": server.metrics_url}},
                        }
                    }
                }
            ),
            store=MemoryStore(),
        )
        callback = BackpressureCallback()
        litellm.callbacks = [callback]
        layered = router_for(server.api_base)
        # Warm up what the first request through the layer initialises (tokenizer, store, metrics), so the
        # timed run measures the steady state rather than a start-up stall.
        await asyncio.gather(*(send(layered, Job(0.0, "high", 300, 5), time.monotonic()) for _ in range(4)))
        await wait_idle(server)
        await server.reset()
        samples: list[dict[str, Any]] = []
        lags: list[float] = []

        async def watch() -> None:
            while True:
                await asyncio.sleep(0.5)
                samples.append(dict(callback.snapshot().get("gpu1", {})))

        async def loop_lag() -> None:
            # How late a 10 ms sleep wakes up: the load generator, the Router and the layer share this event
            # loop (and the machine), and every millisecond of lag is latency no admission policy can remove.
            while True:
                started = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - started - 0.01)

        queue_before = queue_wait_totals()
        watchers = [asyncio.create_task(watch()), asyncio.create_task(loop_lag())]
        results = await run_open_loop(layered, jobs)
        for watcher in watchers:
            watcher.cancel()
        queued, waited = (after - before for after, before in zip(queue_wait_totals(), queue_before, strict=True))
        with_layer = summarise(results, args.seconds, (await server.stats()).oom_failures)
        if args.debug:
            for sample in samples:
                print(
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in sample.items() if k != "signals"},
                    sample.get("signals"),
                )
        view = callback.snapshot().get("gpu1", {})
        await callback.aclose()
        litellm.callbacks = saved_callbacks

    print(
        f"simulated server: knee {SPEC.knee}, {SPEC.step_seconds * 1000:.0f} ms/token, max_num_seqs "
        f"{SPEC.max_num_seqs}, KV cache {SPEC.memory_tokens} tokens"
    )
    print(
        f"capacity: {capacity:.0f} output tokens/s (nominal knee / step time {nominal:.0f}; server alone, best "
        f"closed loop without OOM: {measured:.0f} at concurrency {capacity_concurrency})"
    )
    print(f"unloaded high-priority p95 (concurrency 2): {unloaded_p95:.2f}s over {len(unloaded)} requests")
    print(
        f"overload: {len(jobs)} requests in {args.seconds:.0f}s ({rate:.1f}/s = {OVERLOAD:.0f}x capacity), "
        f"{args.high_share:.0%} high priority; figures after a {WARMUP_SECONDS:.0f}s warm-up"
    )
    high_jobs = [job for job in jobs if job.priority == "high"]
    high_offered = sum(job.max_tokens for job in high_jobs) / args.seconds
    print(
        f"high tier alone offers {high_offered:.0f} output tokens/s: {high_offered / nominal:.0%} of the nominal "
        f"capacity, {high_offered / measured:.0%} of the closed-loop best\n"
    )
    header = f"{'':24}{'without layer':>16}{'with layer':>16}"
    print(header)
    print("-" * len(header))

    def row(label: str, a: str, b: str) -> None:
        print(f"{label:24}{a:>16}{b:>16}")

    row("simulated OOM failures", str(without["oom"]), str(with_layer["oom"]))
    for tier in ("high", "low"):
        for key, label in (("ok", "ok"), ("shed", "shed (429/503)"), ("failed", "failed (5xx)")):
            row(
                f"{tier}: {label}",
                f"{without[tier][key]}/{without[tier]['sent']}",
                f"{with_layer[tier][key]}/{with_layer[tier]['sent']}",
            )
        row(f"{tier}: p50 latency", f"{without[tier]['p50']:.2f}s", f"{with_layer[tier]['p50']:.2f}s")
        row(f"{tier}: p95 latency", f"{without[tier]['p95']:.2f}s", f"{with_layer[tier]['p95']:.2f}s")
    row("goodput (tokens/s)", f"{without['goodput']:.0f}", f"{with_layer['goodput']:.0f}")
    row("goodput / capacity", f"{without['goodput'] / capacity:.0%}", f"{with_layer['goodput'] / capacity:.0%}")
    print(f"shed reasons with the layer: {with_layer['reasons']}")
    print(
        f"queued with the layer: {queued:.0f} requests waited for a slot, {waited / max(1.0, queued):.2f}s on "
        f"average; event-loop lag p95 {p95(lags) * 1000:.0f} ms, max {max(lags, default=0.0) * 1000:.0f} ms"
    )
    limits = sorted(int(sample["limit"]) for sample in samples if "limit" in sample)
    if limits:
        print(
            f"\nlayer's concurrency limit, sampled every 0.5s: min {limits[0]}, median "
            f"{limits[len(limits) // 2]}, max {limits[-1]} (knee {SPEC.knee}); final view: limit "
            f"{view.get('limit')}, mean latency {view.get('mean_latency_seconds') or 0:.2f}s"
        )

    high_ratio = with_layer["high"]["p95"] / unloaded_p95
    shed_rate = {t: with_layer[t]["shed"] / max(1, with_layer[t]["sent"]) for t in ("high", "low")}
    checks = [
        ("zero simulated OOM failures with the layer", with_layer["oom"] == 0),
        (f"high-priority p95 {high_ratio:.2f}x unloaded (target <= 1.5x)", high_ratio <= 1.5),
        (
            f"low tier shed first (low {shed_rate['low']:.0%} vs high {shed_rate['high']:.0%} of requests)",
            shed_rate["low"] > shed_rate["high"],
        ),
        (
            f"goodput {with_layer['goodput'] / capacity:.0%} of capacity (target >= 90%)",
            with_layer["goodput"] >= 0.9 * capacity,
        ),
    ]
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    print(f"\n(bench took {time.monotonic() - bench_started:.0f}s)")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
