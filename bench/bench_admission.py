"""Admission benchmark: our PriorityRateLimiter vs LiteLLM's ``_PROXY_DynamicRateLimitHandlerV3``.

Both limiters run in this process against the same throwaway local redis-server, one after the other
(database flushed in between), driven through the hooks the proxy calls, with the same workload:

* ``pre_call``: ``async_pre_call_hook`` (a 429 counts as refused);
* ``post_call``: the proxy's response hook (ours: ``async_post_call_response_headers_hook``; LiteLLM's:
  ``async_post_call_success_hook``), then ``async_log_success_event`` with the same token usage.

Figures:

* pre-call latency p50/p99: sequential requests on a model far from its limits (priorities configured);
* Redis round trips per admitted request, before and after the call (client side: every command or
  pipeline written to a connection), and Redis commands per admitted request (INFO commandstats deltas,
  which also count the commands a Lua script runs inside the server);
* admissions/s of one process: pre + post for many concurrent requests, no upstream time;
* TPM overshoot: open-loop arrivals with a 1 s upstream (about 100 requests in flight), ``max_tokens`` set,
  usage at most the estimate; ratio = tokens served in the window / tpm;
* RPM: 200 concurrent requests at rpm 50 over two limiter instances (separate Redis clients): admitted.

LiteLLM's limiter runs with its defaults (``saturation_check_cache_ttl`` 60) and ``LITELLM_LICENSE`` set
(needed for its priority weights).

Usage::

    python bench/bench_admission.py            # about 25 s on 2 cores
    python bench/bench_admission.py --write    # also write bench/results/admission.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LICENSE", "bench-only-placeholder")  # LiteLLM's priority weights need it

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import litellm  # noqa: E402
import redis  # noqa: E402
from litellm.proxy.auth.litellm_license import LicenseCheck  # noqa: E402

# LITELLM_LICENSE makes importing the proxy verify the license over the network; this bench must not leave
# the machine, and LiteLLM's limiter only checks that the variable is set.
LicenseCheck._verify = lambda self, license_str: False  # type: ignore[method-assign]

import redis.asyncio as aioredis  # noqa: E402
from fastapi import HTTPException  # noqa: E402
from litellm.caching.dual_cache import DualCache  # noqa: E402
from litellm.caching.redis_cache import RedisCache  # noqa: E402
from litellm.proxy._types import UserAPIKeyAuth  # noqa: E402
from litellm.proxy.hooks.dynamic_rate_limiter_v3 import _PROXY_DynamicRateLimitHandlerV3  # noqa: E402
from litellm.types.utils import ModelResponse, Usage  # noqa: E402
from redis.asyncio.connection import AbstractConnection  # noqa: E402

from litellm_ratebalance.proxy.limiter import PriorityRateLimiter  # noqa: E402
from litellm_ratebalance.proxy.runtime import Runtime  # noqa: E402
from litellm_ratebalance.settings import parse_settings  # noqa: E402
from litellm_ratebalance.store import KeySpace, RedisStore  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

PRIORITIES: dict[str, float] = {"prod": 0.75, "dev": 0.25}
THRESHOLD = 0.5
LAT_MODEL, TPM_MODEL, RPM_MODEL = "bench-lat", "bench-tpm", "bench-rpm"
TPM_LIMIT = 3000
RPM_LIMIT = 50
PROMPT = "Summarise the following paragraph in two sentences. " * 4
MAX_TOKENS = 40
KINDS = ("ours", "litellm")


# -- counting Redis round trips per phase ------------------------------------------------------------
_phase: contextvars.ContextVar[str | None] = contextvars.ContextVar("bench_phase", default=None)
ROUND_TRIPS: Counter[str] = Counter()
_original_send = AbstractConnection.send_packed_command


async def _counting_send(self: Any, *args: Any, **kwargs: Any) -> Any:
    ROUND_TRIPS[_phase.get() or "other"] += 1
    return await _original_send(self, *args, **kwargs)


AbstractConnection.send_packed_command = _counting_send  # type: ignore[method-assign]


# -- the two limiters behind one driver interface ------------------------------------------------------
def make_router() -> Any:
    def deployment(name: str, **limits: int) -> dict[str, Any]:
        params = {"model": "openai/fake", "api_key": "sk-fake", "mock_response": "hi", **limits}
        return {"model_name": name, "litellm_params": params}

    from litellm.router import Router

    return Router(
        model_list=[
            deployment(LAT_MODEL, rpm=10_000_000, tpm=10_000_000_000),
            deployment(TPM_MODEL, tpm=TPM_LIMIT),
            deployment(RPM_MODEL, rpm=RPM_LIMIT),
        ]
    )


def set_litellm_priorities(with_priorities: bool) -> None:
    """LiteLLM's limiter reads these module attributes (the proxy sets them from litellm_settings)."""
    from litellm.types.utils import PriorityReservationSettings

    litellm.priority_reservation = dict(PRIORITIES) if with_priorities else None
    litellm.priority_reservation_settings = PriorityReservationSettings(saturation_threshold=THRESHOLD)


@dataclass
class Driver:
    """One limiter instance: ``admit`` runs the pre-call hook, ``finish`` the post-call hooks."""

    kind: str
    limiter: Any
    close: Callable[[], Awaitable[None]]

    async def admit(self, auth: UserAPIKeyAuth, data: dict[str, Any]) -> bool:
        try:
            await self.limiter.async_pre_call_hook(auth, None, data, "acompletion")
        except HTTPException as exc:
            if exc.status_code != 429:
                raise
            return False
        return True

    async def finish(self, auth: UserAPIKeyAuth, data: dict[str, Any], usage: tuple[int, int]) -> None:
        prompt, completion = usage
        usage_obj = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        response = ModelResponse(usage=usage_obj)
        metadata = dict(data.get("metadata") or {})
        metadata["model_group"] = data["model"]
        kwargs = {
            "model": data["model"],
            "litellm_params": {"metadata": metadata},
            "standard_logging_object": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "metadata": {"user_api_key_auth_metadata": dict(auth.metadata)},
            },
        }
        if self.kind == "ours":
            await self.limiter.async_post_call_response_headers_hook(data, auth, response)
        else:
            await self.limiter.async_post_call_success_hook(data=data, user_api_key_dict=auth, response=response)
        await self.limiter.async_log_success_event(kwargs, response, None, None)


def make_driver(kind: str, redis_url: str, port: int, router: Any, with_priorities: bool) -> Driver:
    if kind == "ours":
        raw: dict[str, Any] = {"priority_reservation_settings": {"saturation_threshold": THRESHOLD}}
        if with_priorities:
            raw["priority_reservation"] = dict(PRIORITIES)
        client = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=64, timeout=20)
        )
        runtime = Runtime()
        # A store error would fail open (admit uncounted): a generous timeout keeps CPU hiccups of a busy
        # bench machine from looking like limiter results; errors are still counted and reported.
        store = RedisStore(client, KeySpace("bench"), timeout_seconds=5.0)
        runtime.configure(settings=parse_settings(raw), store=store, router=router)
        return Driver(kind, PriorityRateLimiter(runtime), client.aclose)
    set_litellm_priorities(with_priorities)
    cache = RedisCache(host="127.0.0.1", port=port)
    handler = _PROXY_DynamicRateLimitHandlerV3(internal_usage_cache=DualCache(redis_cache=cache))
    handler.update_variables(router)

    async def close() -> None:
        await cache.disconnect()  # type: ignore[no-untyped-call]

    return Driver(kind, handler, close)


# -- workload -------------------------------------------------------------------------------------------
AUTH = {
    name: UserAPIKeyAuth(api_key=f"sk-bench-{name}", metadata={"priority": name} if name != "none" else {})
    for name in ("prod", "dev", "none")
}
_PROMPT_TOKENS: dict[str, int] = {}


def request(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}


def prompt_tokens(model: str) -> int:
    if model not in _PROMPT_TOKENS:
        _PROMPT_TOKENS[model] = int(litellm.token_counter(model=model, messages=request(model)["messages"]))
    return _PROMPT_TOKENS[model]


def usage_for(model: str, rng: random.Random) -> tuple[int, int]:
    """Provider usage: the prompt as counted, and at most max_tokens of output."""
    return prompt_tokens(model), rng.randint(MAX_TOKENS // 2, MAX_TOKENS)


def commandstats(client: redis.Redis) -> Counter[str]:
    info: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return Counter({name: int(stats["calls"]) for name, stats in info.items() if name != "cmdstat_info"})


@dataclass
class Result:
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    trips_pre: float = math.nan
    trips_post: float = math.nan
    trips_other: float = math.nan
    commands: float = math.nan
    commands_detail: str = ""
    admissions_per_s: float = math.nan
    tpm_admitted: int = 0
    tpm_offered: int = 0
    tpm_served: int = 0
    rpm_admitted: int = 0
    notes: list[str] = field(default_factory=list)


async def latency_and_round_trips(
    driver: Driver, sync: redis.Redis, requests: int, warmup: int, result: Result
) -> None:
    rng = random.Random(1)
    keys = ("prod", "dev")
    for i in range(warmup):
        data = request(LAT_MODEL)
        if await driver.admit(AUTH[keys[i % 2]], data):
            await driver.finish(AUTH[keys[i % 2]], data, usage_for(LAT_MODEL, rng))
    await asyncio.sleep(0.05)
    ROUND_TRIPS.clear()
    before = commandstats(sync)
    samples: list[float] = []
    admitted = 0
    for i in range(requests):
        auth = AUTH[keys[i % 2]]
        data = request(LAT_MODEL)
        token = _phase.set("pre")
        started = time.perf_counter()
        ok = await driver.admit(auth, data)
        samples.append(time.perf_counter() - started)
        _phase.reset(token)
        if ok:
            admitted += 1
            token = _phase.set("post")
            await driver.finish(auth, data, usage_for(LAT_MODEL, rng))
            _phase.reset(token)
    await asyncio.sleep(0.2)  # let background writes (if any) land before reading the counters
    delta = commandstats(sync) - before
    samples.sort()
    result.p50_ms = statistics.median(samples) * 1000
    result.p99_ms = samples[min(len(samples) - 1, int(0.99 * len(samples)))] * 1000
    result.trips_pre = ROUND_TRIPS["pre"] / admitted
    result.trips_post = ROUND_TRIPS["post"] / admitted
    result.trips_other = ROUND_TRIPS["other"] / admitted
    result.commands = sum(delta.values()) / admitted
    result.commands_detail = ", ".join(
        f"{name.removeprefix('cmdstat_')} {calls / admitted:.1f}" for name, calls in delta.most_common(6)
    )
    if admitted != requests:
        result.notes.append(f"latency run: only {admitted}/{requests} admitted")


async def throughput(driver: Driver, requests: int, concurrency: int, result: Result) -> None:
    rng = random.Random(2)
    queue = list(range(requests))
    admitted = 0

    async def worker() -> None:
        nonlocal admitted
        while queue:
            i = queue.pop()
            auth = AUTH[("prod", "dev")[i % 2]]
            data = request(LAT_MODEL)
            if await driver.admit(auth, data):
                admitted += 1
                await driver.finish(auth, data, usage_for(LAT_MODEL, rng))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.admissions_per_s = admitted / (time.perf_counter() - started)


async def tpm_overshoot(driver: Driver, offered: int, rate_per_s: float, upstream_s: float, result: Result) -> None:
    rng = random.Random(3)
    served = 0
    admitted = 0

    async def one(i: int) -> None:
        nonlocal served, admitted
        await asyncio.sleep(i / rate_per_s)
        auth = AUTH["none"]
        data = request(TPM_MODEL)
        if not await driver.admit(auth, data):
            return
        admitted += 1
        await asyncio.sleep(upstream_s)
        usage = usage_for(TPM_MODEL, rng)
        served += sum(usage)
        await driver.finish(auth, data, usage)

    await asyncio.gather(*(one(i) for i in range(offered)))
    result.tpm_admitted, result.tpm_offered, result.tpm_served = admitted, offered, served


async def rpm_exact(drivers: list[Driver], requests: int, result: Result) -> None:
    async def one(i: int) -> bool:
        return await drivers[i % 2].admit(AUTH["none"], request(RPM_MODEL))

    admitted = await asyncio.gather(*(one(i) for i in range(requests)))
    result.rpm_admitted = sum(admitted)


async def run_kind(kind: str, server: RedisServer, router: Any, args: argparse.Namespace) -> Result:
    sync = redis.Redis.from_url(server.url)
    result = Result()

    async def fresh(with_priorities: bool, count: int = 1) -> list[Driver]:
        sync.flushdb()
        return [make_driver(kind, server.url, server.port, router, with_priorities) for _ in range(count)]

    async def closing(drivers: list[Driver]) -> None:
        for driver in drivers:
            await driver.close()

    drivers = await fresh(True)
    await latency_and_round_trips(drivers[0], sync, args.requests, args.warmup, result)
    await closing(drivers)
    drivers = await fresh(True)
    await throughput(drivers[0], args.throughput_requests, args.concurrency, result)
    await closing(drivers)
    drivers = await fresh(False)
    await tpm_overshoot(drivers[0], args.tpm_offered, args.tpm_rate, 1.0, result)
    await closing(drivers)
    drivers = await fresh(False, count=2)
    await rpm_exact(drivers, 200, result)
    await closing(drivers)
    sync.close()
    if kind == "ours":
        failed_open = store_errors()
        if failed_open:
            result.notes.append(f"{failed_open:.0f} store errors (failed open): figures are not clean")
    return result


def store_errors() -> float:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "litellm_ratebalance_store_errors_total", {"component": "rate_limiter", "mode": "open"}
    )
    return value or 0.0


# -- report ---------------------------------------------------------------------------------------------
def table(results: dict[str, Result]) -> list[str]:
    ours, theirs = results["ours"], results["litellm"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "n/a"

    def tpm_ratio(r: Result) -> float:
        return r.tpm_served / TPM_LIMIT

    rows = [
        ("pre-call latency p50 (ms)", f"{ours.p50_ms:.3f}", f"{theirs.p50_ms:.3f}", ratio(ours.p50_ms, theirs.p50_ms)),
        ("pre-call latency p99 (ms)", f"{ours.p99_ms:.3f}", f"{theirs.p99_ms:.3f}", ratio(ours.p99_ms, theirs.p99_ms)),
        (
            "Redis round trips / admitted, before the call",
            f"{ours.trips_pre:.2f}",
            f"{theirs.trips_pre:.2f}",
            ratio(ours.trips_pre, theirs.trips_pre),
        ),
        (
            "Redis round trips / admitted, after the call",
            f"{ours.trips_post:.2f}",
            f"{theirs.trips_post:.2f}",
            ratio(ours.trips_post, theirs.trips_post),
        ),
        (
            "Redis round trips / admitted, from background tasks",
            f"{ours.trips_other:.2f}",
            f"{theirs.trips_other:.2f}",
            "",
        ),
        (
            "Redis commands / admitted (commandstats, in-script included)",
            f"{ours.commands:.1f}",
            f"{theirs.commands:.1f}",
            ratio(ours.commands, theirs.commands),
        ),
        (
            "admissions/s, one process (pre + post)",
            f"{ours.admissions_per_s:.0f}",
            f"{theirs.admissions_per_s:.0f}",
            ratio(ours.admissions_per_s, theirs.admissions_per_s),
        ),
        (
            f"TPM {TPM_LIMIT}: admitted / offered",
            f"{ours.tpm_admitted} / {ours.tpm_offered}",
            f"{theirs.tpm_admitted} / {theirs.tpm_offered}",
            "",
        ),
        (
            "TPM overshoot (tokens served in window / tpm)",
            f"{tpm_ratio(ours):.3f}",
            f"{tpm_ratio(theirs):.3f}",
            ratio(tpm_ratio(ours), tpm_ratio(theirs)),
        ),
        (
            f"RPM {RPM_LIMIT}, 200 concurrent, 2 instances: admitted",
            str(ours.rpm_admitted),
            str(theirs.rpm_admitted),
            "",
        ),
    ]
    lines = ["| metric | ours | LiteLLM v3 | ours / LiteLLM |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {a} | {b} | {r} |" for name, a, b, r in rows]
    return lines


def targets(results: dict[str, Result]) -> list[str]:
    ours, theirs = results["ours"], results["litellm"]
    checks = [
        ("1 round trip before the call", round(ours.trips_pre, 2) == 1.0),
        # A reservation that matched the usage exactly needs no settle: at most one, not always one.
        ("at most 1 round trip after the call", 0 < ours.trips_post <= 1.0),
        ("p50 pre-call latency at most half of LiteLLM's", ours.p50_ms <= theirs.p50_ms / 2),
        (f"RPM exact ({RPM_LIMIT})", ours.rpm_admitted == RPM_LIMIT),
        ("TPM overshoot <= 2% with max_tokens set", ours.tpm_served <= TPM_LIMIT * 1.02),
    ]
    return [f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in checks]


async def main_async(args: argparse.Namespace) -> int:
    router = make_router()
    results: dict[str, Result] = {}
    with RedisServer() as server:
        for kind in KINDS:
            started = time.perf_counter()
            results[kind] = await run_kind(kind, server, router, args)
            print(f"{kind}: done in {time.perf_counter() - started:.1f}s", flush=True)
    lines = table(results)
    print()
    print("\n".join(lines))
    print()
    for kind in KINDS:
        print(f"{kind} commands per admitted request: {results[kind].commands_detail}")
        for note in results[kind].notes:
            print(f"{kind}: {note}")
    print()
    verdicts = targets(results)
    print("\n".join(verdicts))
    if args.write:
        write_markdown(lines, verdicts, results, args)
    return 0


def write_markdown(lines: list[str], verdicts: list[str], results: dict[str, Result], args: argparse.Namespace) -> None:
    out = REPO / "bench" / "results" / "admission.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/bench_admission.py --write" + (
        "" if args.requests == 2000 else f" --requests {args.requests}"
    )
    text = [
        "# Admission benchmark: ours vs LiteLLM's dynamic_rate_limiter_v3",
        "",
        f"Command: `{command}` (litellm {litellm_version()}, redis-server {redis_version()}, "
        f"{os.cpu_count()} CPUs). Both limiters in one process, one after the other, on the same local "
        "redis-server, driven through the proxy's hooks with the same workload (see the script's docstring).",
        "",
        *lines,
        "",
        f"Workload: one chat message of {prompt_tokens(LAT_MODEL)} prompt tokens, max_tokens {MAX_TOKENS}, reported "
        f"usage = the prompt as counted + {MAX_TOKENS // 2}..{MAX_TOKENS} output tokens. Latency and Redis counts: "
        f"{args.requests} sequential requests (keys alternating prod/dev, priorities "
        f"{PRIORITIES}, threshold {THRESHOLD}) after {args.warmup} warm-up ones. Admissions/s: "
        f"{args.throughput_requests} requests over {args.concurrency} concurrent workers. TPM: "
        f"{args.tpm_offered} arrivals at {args.tpm_rate:.0f}/s, 1 s upstream, tpm {TPM_LIMIT}, no priorities. "
        "Round trips are counted client side (each command or pipeline written to a connection).",
        "",
        "Commands per admitted request, by command:",
        "",
        *[f"- {kind}: {results[kind].commands_detail}" for kind in KINDS],
        "",
        "Targets:",
        "",
        *verdicts,
        "",
    ]
    out.write_text("\n".join(text))
    print(f"wrote {out.relative_to(REPO)}")


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def redis_version() -> str:
    import subprocess

    from tests.servers import redis_server_binary

    binary = redis_server_binary() or "redis-server"
    words = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.split()
    return next((w.split("=", 1)[1] for w in words if w.startswith("v=")), "?")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests for latency and Redis counts")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--throughput-requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--tpm-offered", type=int, default=300, help="open-loop arrivals in the TPM run")
    parser.add_argument("--tpm-rate", type=float, default=100.0, help="arrivals per second in the TPM run")
    parser.add_argument("--write", action="store_true", help="write bench/results/admission.md")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async(parse_args(sys.argv[1:]))))
