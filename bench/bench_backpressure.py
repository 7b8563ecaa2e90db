"""Backpressure under a 3x overload of a simulated local inference server, two server profiles, each with
the same request sequence sent without the layer and with it (seeded), everything on loopback.

Server profiles (:class:`Profile`; the simulator is ``litellm_ratebalance/simulate/inference_server.py``):

* ``knee``: knee 8 running requests, 20 ms per token, 48 slots, a 2,000-token KV cache; prompts 50-150
  tokens, answers 20-60. The knee binds: 8 requests hold ~1,000 tokens.
* ``kv``: the issue's vLLM-like server: knee 12, 20 ms per token, 64 slots, a 3,000-token KV cache whose
  overflow fails every running request with 500; prompts 100-600 tokens, answers 50-300. The KV cache binds:
  a request holds 150-900 tokens, so ~5 fit where the knee would allow 12.

Requests are sent as users send them: every prompt has a natural answer length (the simulator ends it there,
as a model stops at end-of-sequence); a third of the requests set ``max_tokens`` to exactly that length (a
benchmark client), a third set a ``max_tokens`` far above it (1,024 / 2,048), a third set none.

Per profile:

1. **best closed loop**: the server alone, clients back to back at a few fixed concurrencies; the best
   output tokens/s without a simulated OOM, counted over a window after a warm-up (the reference of goodput);
2. **unloaded**: high-priority requests through a plain LiteLLM Router at concurrency 3 (below the knee and
   the KV cache): their p95 latency per output token;
3. **overload**: Poisson arrivals at 3x the best closed loop (20% high priority) for ``--seconds``, through
   a Router without the layer, then with ``BackpressureCallback`` reserving ``max_tokens`` (``output_estimate:
   max_tokens``, the former behaviour), then with the defaults (``learned``). ``--modes`` may add
   ``no_reserve`` (the defaults with ``top_reserve_quantile: 0``, no reserve of slots for the top tier) and
   ``stale_kv`` (the scraped KV-cache usage used as read, not less the requests finished since the scrape)
   for a comparison on the same request sequence. Layer settings: tiers ``[low, high]``, ``kv_cache_tokens``
   of the server, metrics scraped, queue on (max wait 10 s).

``--seed`` fixes the requests: the closed loop, the unloaded sample and the overload sequence each draw from
an rng of their own derived from it (:func:`seeded`), so a seed sends the same overload requests in every
run; only their arrival times scale with the measured capacity (and a few requests more or fewer fit in the
run). The share of the capacity the high tier offers alone is printed per profile.

Targets (``learned``, each profile): high priority refused <= 5%, high p95 per output token <= 1.5x
unloaded, zero simulated OOM failures, goodput >= 85% of the best closed loop, the low tier refused more
than the high one. Goodput: output tokens of successful requests completed inside the measurement window
(after a warm-up), per second. The server runs in a child process so the load generator's CPU does not slow
its engine.

``python bench/bench_backpressure.py [--profile knee|kv|both] [--modes without,max_tokens,learned,no_reserve,stale_kv]
[--seconds 25] [--seed 7] [--high-share 0.2] [--limit JSON] [--settings JSON] [--debug]`` (also part of ``make bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import litellm
from litellm.proxy._types import UserAPIKeyAuth
from litellm.router import Router
from prometheus_client import REGISTRY

from bench.backpressure_replicas import Replicas, send_http
from bench.backpressure_trace import ClientRecord, finish_trace, start_trace
from litellm_ratebalance.proxy.backpressure import BackpressureCallback
from litellm_ratebalance.proxy.backpressure.book import DeploymentState
from litellm_ratebalance.proxy.runtime import configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.simulate.inference_server import InferenceServerProcess, ServerSpec, answer_length
from litellm_ratebalance.store import MemoryStore

OVERLOAD = 3.0
HIGH_SHARE = 0.2
WARMUP_SECONDS = 3.0
MAX_IN_FLIGHT = 400  # safety bound on concurrent client tasks
UNLOADED_CONCURRENCY = 3
CLOSED_LOOP_SECONDS = 12.0
TIERS = ("high", "low")
MODES = ("without", "max_tokens", "learned", "no_reserve", "stale_kv")
DEFAULT_MODES = ("without", "max_tokens", "learned")
MODE_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "max_tokens": ("max_tokens", {}),
    "learned": ("learned", {}),
    "no_reserve": ("learned", {"top_reserve_quantile": 0.0}),
    "stale_kv": ("learned", {}),
}
"""Per layer mode: its ``output_estimate`` and further settings (``no_reserve``: the defaults without the top
tier's reserve of slots, ``top_reserve_quantile: 0``; ``stale_kv``: the defaults, but the scraped KV-cache usage is
used as read, without subtracting the requests finished since the scrape; both for a comparison on the same
request sequence)."""


_WORD_TEXT = (
    "the and for are but not you all any can had her was one our out day get has him his how man new now "
    "old see two way who boy did its let put say she too use act add age ago aid aim air art ask bad bag "
    "bed big bit box bus buy car cat cup cut dog dry ear eat egg end eye far few fit fly fun gas hat hot "
    "ice job key kid lab law lay leg lie lot low map mix mud net nut oil pan pay pen pet pie pig pin pot "
    "raw red rid row run sad sea set"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Profile:
    name: str
    spec: ServerSpec
    prompt_tokens: tuple[int, int]
    far_max_tokens: int
    """The max_tokens of the requests that set one far above their answer."""
    closed_loop: tuple[int, ...]
    """Concurrencies tried for the best closed loop."""
    unloaded_requests: int
    """Requests of the unloaded reference (short answers need more: their per-token p95 is noisier)."""
    prompt_text: str = "words"
    """``words``: prompts of three-letter words, which the simulator and LiteLLM's token counter count alike;
    ``runs``: one character repeated, which LiteLLM counts at about half the simulator's tokens (a model
    whose tokenizer differs from LiteLLM's count: the layer must learn the server's count)."""


PROFILES = {
    "knee": Profile(
        "knee",
        ServerSpec(knee=8, step_seconds=0.02, max_num_seqs=48, memory_tokens=2000, answer_tokens=(20, 60)),
        prompt_tokens=(50, 150),
        far_max_tokens=1024,
        closed_loop=(8, 10, 12),
        unloaded_requests=96,
    ),
    "kv": Profile(
        "kv",
        ServerSpec(knee=12, step_seconds=0.02, max_num_seqs=64, memory_tokens=3000, answer_tokens=(50, 300)),
        prompt_tokens=(100, 600),
        far_max_tokens=2048,
        closed_loop=(3, 4, 5, 6),
        unloaded_requests=48,
    ),
}


@dataclass(frozen=True)
class Job:
    at: float
    priority: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    answer: int
    """The natural answer length the server will produce."""

    def payload(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass
class Result:
    job: Job
    status: int
    reason: str | None
    started: float
    ended: float
    output_tokens: int


_FINISHED = DeploymentState.finished


def _no_freed(self: DeploymentState, started: float, ended: float, prompt_tokens: int, output_tokens: int) -> None:
    """``DeploymentState.finished`` for the ``stale_kv`` mode: the reading stands until the next scrape."""


def make_job(rng: random.Random, profile: Profile, at: float, priority: str, index: int) -> Job:
    tokens = rng.randint(*profile.prompt_tokens)
    head = f"request {index}: "
    if profile.prompt_text == "runs":
        # The simulator counts 4 characters per token; LiteLLM's counter about 8 of one repeated character.
        content = head + "x" * max(0, 4 * tokens - len(head))
    else:
        # Three-letter words: the simulator counts 4 characters per token and LiteLLM's counter one token
        # per word (plus a few for the chat format), so both see the same prompt size.
        content = head + " ".join(rng.choice(WORDS) for _ in range(tokens))
    messages = (("user", content),)
    answer = answer_length(profile.spec, [{"role": "user", "content": content}])
    assert answer is not None
    kind = index % 3  # exact, far above, none: interleaved so every tier and phase gets all three
    max_tokens = answer if kind == 0 else (profile.far_max_tokens if kind == 1 else None)
    return Job(at, priority, messages, max_tokens, answer)


def seeded(seed: int, purpose: str) -> random.Random:
    """An rng of its own per ``purpose``, derived from ``--seed``: what one part of the bench draws (the
    closed loop draws as many requests as the server completes) cannot shift what another part draws."""
    return random.Random(f"bench_backpressure:{seed}:{purpose}")


def make_jobs(seed: int, profile: Profile, rate: float, seconds: float, high_share: float) -> list[Job]:
    """The overload sequence of ``seed``: Poisson arrivals at ``rate`` for ``seconds``. Request ``i`` (its
    priority, prompt and answer) and the ``i``-th inter-arrival gap in units of ``1 / rate`` come from two
    rngs of their own, so the same seed sends the same requests whatever capacity the closed loop measured;
    only the arrival times scale with the rate (and a few requests more or fewer fit in ``seconds``)."""
    contents, arrivals = seeded(seed, "overload"), seeded(seed, "arrivals")
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += arrivals.expovariate(1.0) / rate
        if t >= seconds:
            return jobs
        priority = "high" if contents.random() < high_share else "low"
        jobs.append(make_job(contents, profile, t, priority, len(jobs)))


def mean_answer(seed: int, profile: Profile) -> float:
    """Mean natural answer length of the profile's requests (2,000 drawn from ``seed``'s own rng)."""
    rng = seeded(seed, "mean_answer")
    return statistics.fmean(make_job(rng, profile, 0.0, "low", i).answer for i in range(2000))


def router_for(api_base: str) -> Router:
    deployment = {
        "model_name": "local",
        "litellm_params": {"model": "openai/sim", "api_base": api_base, "api_key": "sk-none", "timeout": 120},
        "model_info": {"id": "gpu1"},
    }
    return Router(model_list=[deployment], num_retries=0)


async def send(router: Router, job: Job, origin: float) -> Result:
    started = time.monotonic() - origin
    extra: dict[str, Any] = {} if job.max_tokens is None else {"max_tokens": job.max_tokens}
    try:
        response = await router.acompletion(
            model="local",
            messages=job.payload(),
            metadata={
                "user_api_key_auth": UserAPIKeyAuth(token=f"k-{job.priority}", metadata={"priority": job.priority})
            },
            **extra,
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


async def closed_loop(server: InferenceServerProcess, profile: Profile, concurrency: int, rng: random.Random) -> float:
    """Output tokens/s of the server alone with ``concurrency`` clients back to back, counted over the
    completions inside ``[warm-up, end]`` (0 if it OOMed)."""
    await server.reset()
    origin = time.monotonic()
    tokens = 0
    counter = iter(range(10**9))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal tokens
            while time.monotonic() - origin < CLOSED_LOOP_SECONDS:
                job = make_job(rng, profile, 0.0, "high", next(counter))
                body: dict[str, Any] = {"model": "sim", "messages": job.payload()}
                if job.max_tokens is not None:
                    body["max_tokens"] = job.max_tokens
                async with session.post(server.api_base + "/chat/completions", json=body) as response:
                    data = await response.json()
                if response.status == 200 and WARMUP_SECONDS <= time.monotonic() - origin <= CLOSED_LOOP_SECONDS:
                    tokens += int(data["usage"]["completion_tokens"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return 0.0 if (await server.stats()).oom_failures else tokens / (CLOSED_LOOP_SECONDS - WARMUP_SECONDS)


async def measure_capacity(server: InferenceServerProcess, profile: Profile, rng: random.Random) -> dict[int, float]:
    """Closed-loop throughput per concurrency (0: it ran out of memory)."""
    rates: dict[int, float] = {}
    for concurrency in profile.closed_loop:
        rates[concurrency] = await closed_loop(server, profile, concurrency, rng)
        await wait_idle(server)
    return rates


async def measure_unloaded(router: Router, profile: Profile, rng: random.Random) -> list[float]:
    """Latency per output token of high-priority requests at a concurrency below the knee and the cache."""
    jobs = [make_job(rng, profile, 0.0, "high", i) for i in range(profile.unloaded_requests)]
    limiter = asyncio.Semaphore(UNLOADED_CONCURRENCY)
    origin = time.monotonic()

    async def one(job: Job) -> Result:
        async with limiter:
            return await send(router, job, origin)

    results = await asyncio.gather(*(one(j) for j in jobs))
    return [(r.ended - r.started) / r.output_tokens for r in results if r.status == 200 and r.output_tokens]


async def server_view(server: InferenceServerProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(server.url + "/_sim/stats") as response:
        return dict(await response.json())


def queue_wait_totals() -> tuple[float, float]:
    """(count, sum) of the layer's queue-wait histogram so far (the default registry, deployment gpu1)."""
    labels = {"deployment": "gpu1"}
    name = "litellm_ratebalance_backpressure_queue_wait_seconds"
    count = REGISTRY.get_sample_value(name + "_count", labels) or 0.0
    return count, REGISTRY.get_sample_value(name + "_sum", labels) or 0.0


async def sample_fill(server: InferenceServerProcess, capacity: int, fills: list[float]) -> None:
    """Append the server's KV-cache fill (0..1) every 0.5 s until cancelled."""
    while True:
        await asyncio.sleep(0.5)
        fills.append((await server_view(server))["memory_used"] / capacity)


async def wait_idle(server: InferenceServerProcess) -> None:
    for _ in range(1200):
        data = await server_view(server)
        if data["running"] == 0 and data["waiting"] == 0:
            return
        await asyncio.sleep(0.1)


def p95(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def summarise(results: Sequence[Result], seconds: float, oom_failures: int, cache_fill: float) -> dict[str, Any]:
    window = [r for r in results if r.job.at >= WARMUP_SECONDS]
    span = seconds - WARMUP_SECONDS
    out: dict[str, Any] = {"oom": oom_failures, "cache_fill": cache_fill}
    for tier in TIERS:
        mine = [r for r in window if r.job.priority == tier]
        ok = [r for r in mine if r.status == 200]
        refused = [r for r in mine if r.reason is not None]
        done = [
            r for r in results if r.job.priority == tier and r.status == 200 and WARMUP_SECONDS <= r.ended <= seconds
        ]
        out[tier] = {
            "sent": len(mine),
            "ok": len(ok),
            "refused": len(refused),
            "failed": len(mine) - len(ok) - len(refused),
            "p95_token": p95([(r.ended - r.started) / r.output_tokens for r in ok if r.output_tokens]),
            "goodput": sum(r.output_tokens for r in done) / span,
        }
    out["reasons"] = dict(Counter(f"{r.job.priority}:{r.reason}" for r in window if r.reason))
    out["goodput"] = sum(out[tier]["goodput"] for tier in TIERS)
    return out


async def run_layer(
    server: InferenceServerProcess, profile: Profile, jobs: Sequence[Job], mode: str, args: Any
) -> tuple[list[Result], BackpressureCallback, list[dict[str, Any]], float]:
    output_estimate, mode_settings = MODE_SETTINGS[mode]
    # stale_kv: nothing finished is subtracted from the last reading (the bench only; not a setting).
    DeploymentState.finished = _no_freed if mode == "stale_kv" else _FINISHED  # type: ignore[method-assign]
    reset_runtime()
    configure(
        settings=parse_settings(
            {
                "ratebalance": {
                    "backpressure": {
                        "tiers": ["low", "high"],
                        "kv_cache_tokens": profile.spec.memory_tokens,
                        "output_estimate": output_estimate,
                        "limit": json.loads(args.limit),
                        "queue": {"enabled": True, "max_wait_seconds": 10},
                        "deployments": {"gpu1": {"metrics_url": server.metrics_url}},
                        **mode_settings,
                        **json.loads(args.settings),
                    }
                }
            }
        ),
        store=MemoryStore(),
    )
    callback = BackpressureCallback()
    litellm.callbacks = [callback]
    layered = router_for(server.api_base)
    # Warm up what the first request through the layer initialises (tokenizer, store, metrics) and let it
    # learn a little, so the timed run measures the steady state rather than a start-up stall.
    rng = random.Random(args.seed + 1)
    warm = [make_job(rng, profile, 0.0, "high", 10**6 + i) for i in range(12)]
    for start in range(0, len(warm), 3):
        await asyncio.gather(*(send(layered, job, time.monotonic()) for job in warm[start : start + 3]))
    await wait_idle(server)
    await server.reset()
    samples: list[dict[str, Any]] = []
    fills: list[float] = []

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.5)
            samples.append(dict(callback.snapshot().get("gpu1", {})))

    lags: list[float] = []

    async def loop_lag() -> None:
        # How late a 10 ms sleep wakes up: the load generator, the Router and the layer share this event loop
        # (and the machine), and every millisecond of lag is latency no admission policy can remove.
        while True:
            started = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - started - 0.01)

    fill = asyncio.create_task(sample_fill(server, profile.spec.memory_tokens, fills))
    watchers = [asyncio.create_task(watch()), fill, asyncio.create_task(loop_lag())]
    queue_before = queue_wait_totals()
    results = await run_open_loop(layered, jobs)
    for watcher in watchers:
        watcher.cancel()
    queued, waited = (after - before for after, before in zip(queue_wait_totals(), queue_before, strict=True))
    samples.append({"queued": queued, "waited": waited, "lag_p95": p95(lags), "load": os.getloadavg()[0]})
    return results, callback, samples, statistics.fmean(fills) if fills else 0.0


async def run_profile(profile: Profile, args: Any) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    spec = profile.spec
    async with InferenceServerProcess(spec) as server:
        rates = await measure_capacity(server, profile, seeded(args.seed, "closed_loop"))
        best_concurrency = max(rates, key=lambda c: rates[c])
        best = rates[best_concurrency]
        if best <= 0:
            raise SystemExit(f"profile {profile.name}: every closed loop ran out of memory; widen closed_loop")
        mean_output = mean_answer(args.seed, profile)
        rate = OVERLOAD * best / mean_output
        saved_callbacks = list(litellm.callbacks)
        litellm.callbacks = []
        plain = router_for(server.api_base)
        unloaded = await measure_unloaded(plain, profile, seeded(args.seed, "unloaded"))
        unloaded_p95 = p95(unloaded)
        jobs = make_jobs(args.seed, profile, rate, args.seconds, args.high_share)
        summaries: dict[str, dict[str, Any]] = {}
        views: dict[str, dict[str, Any]] = {}
        for mode in args.modes:
            await wait_idle(server)
            await server.reset()
            fills: list[float] = []
            if mode == "without":
                litellm.callbacks = []
                watcher = asyncio.create_task(sample_fill(server, spec.memory_tokens, fills))
                results = await run_open_loop(plain, jobs)
                watcher.cancel()
                fill = statistics.fmean(fills) if fills else 0.0
            else:
                results, callback, samples, fill = await run_layer(server, profile, jobs, mode, args)
                view = callback.snapshot().get("gpu1", {})
                limits = sorted(int(s["limit"]) for s in samples if "limit" in s)
                reserves = sorted(int(s["top_reserve"]) for s in samples if "top_reserve" in s)
                views[mode] = {"limits": limits, "reserves": reserves, "view": view, "queue": samples.pop()}
                if args.debug:
                    for sample in samples:
                        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in sample.items()})
                await callback.aclose()
            summaries[mode] = summarise(results, args.seconds, (await server.stats()).oom_failures, fill)
        litellm.callbacks = saved_callbacks

    high_offered = sum(job.answer for job in jobs if job.priority == "high") / args.seconds
    print(f"\n=== profile {profile.name} ===")
    print(
        f"simulated server: knee {spec.knee}, {spec.step_seconds * 1000:.0f} ms/token, max_num_seqs "
        f"{spec.max_num_seqs}, KV cache {spec.memory_tokens} tokens; prompts {profile.prompt_tokens[0]}-"
        f"{profile.prompt_tokens[1]} tokens, answers {spec.answer_tokens[0] if spec.answer_tokens else '?'}-"
        f"{spec.answer_tokens[1] if spec.answer_tokens else '?'}; max_tokens: 1/3 exact, 1/3 "
        f"{profile.far_max_tokens}, 1/3 unset"
    )
    closed = ", ".join(f"{c}: {r:.0f}" for c, r in rates.items())
    print(
        f"best closed loop: {best:.0f} output tokens/s at concurrency {best_concurrency} (tokens/s per "
        f"concurrency, 0 = OOM: {closed}); nominal knee / step {spec.capacity_tokens_per_second():.0f}"
    )
    print(
        f"unloaded high-priority p95 per output token (concurrency {UNLOADED_CONCURRENCY}): "
        f"{unloaded_p95 * 1000:.1f} ms over {len(unloaded)} requests"
    )
    print(
        f"overload: {len(jobs)} requests in {args.seconds:.0f}s ({rate:.1f}/s = {OVERLOAD:.0f}x the best closed "
        f"loop), {args.high_share:.0%} high priority, offering {high_offered:.0f} tokens/s alone "
        f"({high_offered / best:.0%} of the best closed loop); figures after a {WARMUP_SECONDS:.0f}s warm-up\n"
    )
    modes = list(summaries)
    header = f"{'':30}" + "".join(f"{m:>16}" for m in modes)
    print(header)
    print("-" * len(header))

    def row(label: str, values: Sequence[str]) -> None:
        print(f"{label:30}" + "".join(f"{v:>16}" for v in values))

    row("simulated OOM failures", [str(summaries[m]["oom"]) for m in modes])
    for tier in TIERS:
        row(f"{tier}: ok", [f"{summaries[m][tier]['ok']}/{summaries[m][tier]['sent']}" for m in modes])
        row(
            f"{tier}: refused (429/503)",
            [
                f"{summaries[m][tier]['refused'] / max(1, summaries[m][tier]['sent']):.0%} "
                f"({summaries[m][tier]['refused']})"
                for m in modes
            ],
        )
        row(f"{tier}: failed (5xx)", [str(summaries[m][tier]["failed"]) for m in modes])
        row(
            f"{tier}: p95 per token",
            [
                f"{summaries[m][tier]['p95_token'] * 1000:.1f}ms "
                f"({summaries[m][tier]['p95_token'] / unloaded_p95:.2f}x)"
                if math.isfinite(summaries[m][tier]["p95_token"])
                else "- (none served)"
                for m in modes
            ],
        )
        row(f"{tier}: goodput (tokens/s)", [f"{summaries[m][tier]['goodput']:.0f}" for m in modes])
    row("goodput / best closed loop", [f"{summaries[m]['goodput'] / best:.0%}" for m in modes])
    row("mean KV-cache fill", [f"{summaries[m]['cache_fill']:.0%}" for m in modes])
    for mode in modes:
        print(f"refusal reasons, {mode}: {summaries[mode]['reasons']}")
    for mode, info in views.items():
        limits, view = info["limits"], info["view"]
        if limits:
            print(
                f"{mode}: concurrency limit sampled every 0.5s min {limits[0]} / median {limits[len(limits) // 2]} "
                f"/ max {limits[-1]}; learned output estimate {view.get('output_estimate_tokens') or 0:.0f} tokens; "
                f"{info['queue']['queued']:.0f} requests waited in the queue, "
                f"{info['queue']['waited'] / max(1.0, info['queue']['queued']):.2f}s on average; event-loop lag p95 "
                f"{info['queue']['lag_p95'] * 1000:.0f} ms; machine load average {info['queue']['load']:.1f}"
            )
        reserves = info["reserves"]
        if reserves:
            print(
                f"{mode}: top-tier reserve sampled every 0.5s min {reserves[0]} / median "
                f"{reserves[len(reserves) // 2]} / max {reserves[-1]} slots"
            )

    checks: list[tuple[str, bool]] = []
    if "learned" in summaries:
        s = summaries["learned"]
        high_refused = s["high"]["refused"] / max(1, s["high"]["sent"])
        low_refused = s["low"]["refused"] / max(1, s["low"]["sent"])
        ratio = s["high"]["p95_token"] / unloaded_p95
        checks = [
            (f"{profile.name}: high refused {high_refused:.1%} (target <= 5%)", high_refused <= 0.05),
            (f"{profile.name}: high p95 per token {ratio:.2f}x unloaded (target <= 1.5x)", ratio <= 1.5),
            (f"{profile.name}: {s['oom']} simulated OOM failures (target 0)", s["oom"] == 0),
            (
                f"{profile.name}: goodput {s['goodput'] / best:.0%} of the best closed loop (target >= 85%)",
                s["goodput"] >= 0.85 * best,
            ),
            (
                f"{profile.name}: low refused first ({low_refused:.0%} vs high {high_refused:.0%})",
                low_refused > high_refused,
            ),
        ]
    return {"best": best, "unloaded_p95": unloaded_p95, "summaries": summaries}, checks


async def run_open_loop_http(
    replicas: Replicas, group: str, jobs: Sequence[Job], call_ids: Sequence[str] | None = None
) -> tuple[list[Result], float]:
    """The open loop through the proxy replicas: request ``i`` of ``jobs`` to replica ``i mod N`` (with call id
    ``call_ids[i]`` where given). Also returns the wall-clock time of the results' origin."""
    origin = time.monotonic()
    origin_wall = time.time()
    limiter = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(index: int, job: Job) -> Result:
        async with limiter:
            started = time.monotonic() - origin
            client = replicas.clients[index % len(replicas.clients)]
            call_id = None if call_ids is None else call_ids[index]
            status, reason, tokens = await send_http(
                client, group, job.priority, job.payload(), job.max_tokens, call_id
            )
            return Result(job, status, reason, started, time.monotonic() - origin, tokens)

    tasks = []
    for index, job in enumerate(jobs):
        delay = job.at - (time.monotonic() - origin)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, job)))
    return list(await asyncio.gather(*tasks)), origin_wall


def beyond_decode(results: Sequence[Result], step_seconds: float) -> tuple[float, float, float]:
    """The top tier's served requests: time beyond their decode at the unloaded step (``tokens x step``),
    which is waiting (in the layer's queue, or in the server's) plus prefill and the proxy's own time: (mean,
    p95, share above 0.5 s). Where the top tier's latency goes."""
    extra = [
        (r.ended - r.started) - r.output_tokens * step_seconds
        for r in results
        if r.job.priority == "high" and r.status == 200 and r.output_tokens
    ]
    if not extra:
        return float("nan"), float("nan"), float("nan")
    return statistics.fmean(extra), p95(extra), sum(1 for e in extra if e > 0.5) / len(extra)


async def run_replicas(profile: Profile, args: Any) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    """``--replicas N``: the overload through ``N`` real proxies sharing one redis-server (see
    ``bench/backpressure_replicas.py``), with all tiers (``mixed``) and with the top tier's requests alone."""
    spec = profile.spec
    async with InferenceServerProcess(spec) as server:
        rates = await measure_capacity(server, profile, seeded(args.seed, "closed_loop"))
        best = max(rates.values())
        if best <= 0:
            raise SystemExit(f"profile {profile.name}: every closed loop ran out of memory; widen closed_loop")
        rate = OVERLOAD * best / mean_answer(args.seed, profile)
        jobs = make_jobs(args.seed, profile, rate, args.seconds, args.high_share)
        alone_jobs = [job for job in jobs if job.priority == "high"]
        indices = {
            "learned": list(range(len(jobs))),
            "top_alone": [i for i, j in enumerate(jobs) if j.priority == "high"],
        }
        summaries: dict[str, dict[str, Any]] = {}
        clients: list[ClientRecord] = []
        trace_path = None if args.trace is None else start_trace(args.trace)
        async with Replicas(
            args.replicas, server.api_base, server.metrics_url, spec.memory_tokens, trace_path
        ) as replicas:
            # Warm-up: every replica learns a little on both groups (the same requests as the in-process bench).
            rng = random.Random(args.seed + 1)
            warm = [make_job(rng, profile, 0.0, "high", 10**6 + i) for i in range(12 * args.replicas)]
            for group in ("mixed", "alone"):
                for start in range(0, len(warm), 3):
                    await run_open_loop_http(replicas, group, warm[start : start + 3])  # (untraced call ids)
            for mode, group, sequence in (("top_alone", "alone", alone_jobs), ("learned", "mixed", jobs)):
                await wait_idle(server)
                await server.reset()
                fills: list[float] = []
                watcher = asyncio.create_task(sample_fill(server, spec.memory_tokens, fills))
                call_ids = [f"{mode}-{i}" for i in indices[mode]]
                results, origin_wall = await run_open_loop_http(replicas, group, sequence, call_ids)
                watcher.cancel()
                clients += [
                    ClientRecord(
                        mode,
                        index,
                        r.job.priority,
                        call_id,
                        origin_wall + r.started,
                        origin_wall + r.ended,
                        r.status,
                        r.output_tokens,
                        r.job.at >= WARMUP_SECONDS,
                    )
                    for index, call_id, r in zip(indices[mode], call_ids, results, strict=True)
                ]
                fill = statistics.fmean(fills) if fills else 0.0
                summaries[mode] = summarise(results, args.seconds, (await server.stats()).oom_failures, fill)
                summaries[mode]["high_wait"] = beyond_decode(results, spec.step_seconds)
            logs = replicas.logs()
    if trace_path is not None:
        await asyncio.sleep(0.5)  # the proxies' last release lines
        deployments = {"learned": "gpu-mixed", "top_alone": "gpu-alone"}
        lines = finish_trace(trace_path, clients, deployments, "prod", spec.step_seconds)
        print(f"\n--- trace ({trace_path}) ---")
        for line in lines:
            print(line)
    overflow_lines = sum(text.count("for want of GPU / KV-cache memory") for text in logs)
    mixed, alone = summaries["learned"], summaries["top_alone"]
    high_refused = mixed["high"]["refused"] / max(1, mixed["high"]["sent"])
    ratio = mixed["high"]["p95_token"] / alone["high"]["p95_token"]
    print(f"\n=== profile {profile.name}, {args.replicas} proxy replica(s) sharing one redis-server ===")
    print(
        f"best closed loop {best:.0f} output tokens/s; overload {len(jobs)} requests in {args.seconds:.0f}s "
        f"({rate:.1f}/s = {OVERLOAD:.0f}x), {len(alone_jobs)} of them top tier; machine load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    header = f"{'':30}{'all tiers':>18}{'top tier alone':>18}"
    print(header)
    print("-" * len(header))
    for label, key in (("simulated OOM failures", "oom"),):
        print(f"{label:30}{mixed[key]:>18}{alone[key]:>18}")
    for tier in TIERS:
        cells = []
        for s in (mixed, alone):
            t = s[tier]
            cells.append(
                f"{t['ok']}/{t['sent']} ok, {t['refused']} ref" if t["sent"] else "-",
            )
        print(f"{tier + ': ok / refused':30}{cells[0]:>18}{cells[1]:>18}")
    p95s = [
        f"{s['high']['p95_token'] * 1000:.1f}ms" if math.isfinite(s["high"]["p95_token"]) else "-"
        for s in (mixed, alone)
    ]
    print(f"{'high: p95 per token':30}{p95s[0]:>18}{p95s[1]:>18}")
    print(f"{'goodput / best closed loop':30}{mixed['goodput'] / best:>18.0%}{alone['goodput'] / best:>18.0%}")
    print(f"{'mean KV-cache fill':30}{mixed['cache_fill']:>18.0%}{alone['cache_fill']:>18.0%}")
    waits = [s["high_wait"] for s in (mixed, alone)]
    print(f"{'high: time beyond decode, mean':30}{waits[0][0]:>17.2f}s{waits[1][0]:>17.2f}s")
    print(f"{'high: time beyond decode, p95':30}{waits[0][1]:>17.2f}s{waits[1][1]:>17.2f}s")
    print(f"{'high: share beyond decode > 0.5s':30}{waits[0][2]:>18.0%}{waits[1][2]:>18.0%}")
    print(f"refusal reasons (all tiers): {mixed['reasons']}; overflow log lines in the proxies: {overflow_lines}")
    name = f"{profile.name} x{args.replicas}"
    checks = [
        (f"{name}: {mixed['oom']} simulated OOM failures (target 0)", mixed["oom"] == 0),
        (f"{name}: high refused {high_refused:.1%} (target 0%)", mixed["high"]["refused"] == 0),
        (f"{name}: high p95 per token {ratio:.2f}x top tier alone (target <= 1.15x)", ratio <= 1.15),
        (
            f"{name}: goodput {mixed['goodput'] / best:.0%} of the best closed loop (target >= 85%)",
            mixed["goodput"] >= 0.85 * best,
        ),
    ]
    return {"best": best, "summaries": summaries}, checks


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profile", choices=["knee", "kv", "both"], default="both")
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"comma-separated, of {', '.join(MODES)} (no_reserve: learned with top_reserve_quantile 0; stale_kv: "
        "learned without subtracting finished requests from the scraped KV-cache usage)",
    )
    parser.add_argument("--seconds", type=float, default=25.0, help="overload duration per mode")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--limit", default="{}", help="JSON of backpressure.limit settings, e.g. '{\"tolerance\": 1.1}'"
    )
    parser.add_argument(
        "--settings", default="{}", help="JSON of further backpressure settings, e.g. '{\"shed_threshold\": 0.8}'"
    )
    parser.add_argument(
        "--high-share", type=float, default=HIGH_SHARE, help="fraction of the overload sent as high priority"
    )
    parser.add_argument(
        "--prompt-text",
        choices=["words", "runs"],
        default="words",
        help="words: prompts LiteLLM counts as the server does; runs: one character repeated, which LiteLLM "
        "counts at about half the server's tokens",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="run the overload through this many real litellm proxies sharing one redis-server (1-8), with all "
        "tiers and with the top tier's requests alone, instead of the in-process modes",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="with --replicas: the proxies' backpressure trace and one line per request to FILE (JSON lines), and "
        "where each top-tier request's time went, all tiers against top tier alone (bench/backpressure_trace.py)",
    )
    parser.add_argument("--debug", action="store_true", help="print the layer's view of the deployment every 0.5s")
    args = parser.parse_args(argv)
    if not 0.0 < args.high_share < 1.0:
        parser.error(f"--high-share must be between 0 and 1, exclusive (got {args.high_share})")
    if args.replicas and not 1 <= args.replicas <= 8:
        parser.error(f"--replicas must be between 1 and 8 (got {args.replicas})")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    litellm.suppress_debug_info = True
    started = time.monotonic()
    checks: list[tuple[str, bool]] = []
    for name in ("knee", "kv") if args.profile == "both" else (args.profile,):
        profile = replace(PROFILES[name], prompt_text=args.prompt_text)
        run = run_replicas if args.replicas else run_profile
        _, profile_checks = await run(profile, args)
        checks += profile_checks
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    print(f"\n(bench took {time.monotonic() - started:.0f}s)")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
