"""Admission benchmark: our PriorityRateLimiter vs LiteLLM's ``_PROXY_DynamicRateLimitHandlerV3``, side by side.

Both limiters run in this process against the same throwaway local redis-server, one after the other
(database flushed in between), driven through the hooks the proxy calls, with the same workload:

* ``pre_call``: ``async_pre_call_hook`` (a 429 counts as refused);
* ``post_call``: the proxy's response hook (ours: ``async_post_call_response_headers_hook``; LiteLLM's:
  ``async_post_call_success_hook``), then ``async_log_success_event`` with the provider's token usage.

Workloads are sent the way clients send them: **no max_tokens** unless a row says otherwise, answers of
varied length, closed-loop clients that retry after a 429 (a short back-off), windows compressed to a few
seconds for both limiters (ours: ``limiter.window_seconds``; LiteLLM's: its ``window_size``), upstream time
scaled with them. Served tokens are attributed to the window a request was admitted in (windows counted
from the first admission). Rows:

* quick start (the docs' first example): tpm 60, ~30-token answers, one request at a time;
* two teams (the docs' worked example): tpm 1000, team_a / team_b reserve 0.5 each, threshold 0.5,
  4 clients per busy team, 50-token answers; window 1 team_a alone, window 2 team_b wants 500,
  window 3 team_b wants 400. LiteLLM runs with ``saturation_check_cache_ttl: 0`` here (its docs' example
  does not hold with the default 60);
* steady: 20 clients, answers lognormal in 20..400 tokens, 5 windows from a fresh store (the first learns);
  then the same with ``max_tokens: 4096`` on every request;
* cold burst: fresh store, tpm 1000, 20 clients at once, 30-token answers, each client stops at its first
  429 (a client honouring ``retry-after`` would not come back within the window);
* the same cold burst through two limiter instances (two replicas, separate Redis clients, one Redis):
  each client's requests alternating between them, starting with the first (a burst reaches one replica,
  what follows is spread); and each request to an instance drawn at random, over 10 runs;
* RPM: 200 concurrent requests at rpm 50 over two limiter instances (separate Redis clients);
* admissions/s of one process (pre + post, 50 concurrent workers, no upstream time; the two limiters
  alternate over 3 rounds, the median of each is shown), pre-call latency and post-call hook time
  (sequential requests), Redis round trips and commands per admitted request.

LiteLLM's limiter runs with its defaults but where said, and ``LITELLM_LICENSE`` set (needed for its priority
weights).

Usage::

    python bench/bench_admission.py            # about 3 minutes on 2 cores
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

from litellm_ratebalance.proxy.admission import PriorityRateLimiter  # noqa: E402
from litellm_ratebalance.proxy.runtime import Runtime  # noqa: E402
from litellm_ratebalance.settings import parse_settings  # noqa: E402
from litellm_ratebalance.store import KeySpace, RedisStore  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

PRIORITIES: dict[str, float] = {"prod": 0.75, "dev": 0.25}
TEAMS: dict[str, float] = {"team_a": 0.5, "team_b": 0.5}
THRESHOLD = 0.5
LAT_MODEL, RPM_MODEL = "bench-lat", "bench-rpm"
QUICK_MODEL, TEAMS_MODEL, COLD_MODEL = "bench-quick", "bench-teams", "bench-cold"
STEADY_MODEL, HEAVY_MODEL = "bench-steady", "bench-heavy"
RPM_LIMIT = 50
QUICK_TPM, TEAMS_TPM, COLD_TPM = 60, 1000, 1000
STEADY_TPM = 30_000
"""Per 5 s window: the 20 clients offer about 1.6x this (a saturated deployment's usual overload)."""
HEAVY_TPM = 12_000
"""The same clients at about 4x overload: a quarter of the limit is in flight at any time."""
LAT_PROMPT = "Summarise the following paragraph in two sentences. " * 4
SHORT_PROMPT = "Hello world!"
LAT_MAX_TOKENS = 40
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
            deployment(RPM_MODEL, rpm=RPM_LIMIT),
            deployment(QUICK_MODEL, tpm=QUICK_TPM),
            deployment(TEAMS_MODEL, tpm=TEAMS_TPM),
            deployment(STEADY_MODEL, tpm=STEADY_TPM),
            deployment(HEAVY_MODEL, tpm=HEAVY_TPM),
            deployment(COLD_MODEL, tpm=COLD_TPM),
        ]
    )


@dataclass(frozen=True)
class Setup:
    """How both limiters are configured for one workload."""

    priorities: dict[str, float] | None = None
    window_seconds: int = 60
    litellm_cache_ttl: int = 60
    """LiteLLM's ``saturation_check_cache_ttl`` (its default 60)."""


def set_litellm_priorities(setup: Setup) -> None:
    """LiteLLM's limiter reads these module attributes (the proxy sets them from litellm_settings)."""
    from litellm.types.utils import PriorityReservationSettings

    litellm.priority_reservation = dict(setup.priorities) if setup.priorities else None
    litellm.priority_reservation_settings = PriorityReservationSettings(
        saturation_threshold=THRESHOLD, saturation_check_cache_ttl=setup.litellm_cache_ttl
    )


_RESPONSES: dict[tuple[int, int], ModelResponse] = {}


def response_for(prompt: int, completion: int) -> ModelResponse:
    """One response object per usage, built once: the proxy builds it anyway, and the bench measures the
    limiters, not pydantic (both limiters get the same objects)."""
    found = _RESPONSES.get((prompt, completion))
    if found is None:
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        found = _RESPONSES[(prompt, completion)] = ModelResponse(usage=usage)
    return found


@dataclass
class Driver:
    """One limiter instance: ``admit`` runs the pre-call hook, ``finish`` the post-call hooks."""

    kind: str
    limiter: Any
    close: Callable[[], Awaitable[None]]
    post_call_seconds: list[float] = field(default_factory=list)

    async def admit(self, auth: UserAPIKeyAuth, data: dict[str, Any]) -> bool:
        try:
            await self.limiter.async_pre_call_hook(auth, None, data, "acompletion")
        except HTTPException as exc:
            if exc.status_code != 429:
                raise
            return False
        return True

    async def finish(
        self, auth: UserAPIKeyAuth, data: dict[str, Any], usage: tuple[int, int], *, timed: bool = False
    ) -> None:
        prompt, completion = usage
        response = response_for(prompt, completion)
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
        started = time.perf_counter()
        if self.kind == "ours":
            await self.limiter.async_post_call_response_headers_hook(data, auth, response)
        else:
            await self.limiter.async_post_call_success_hook(data=data, user_api_key_dict=auth, response=response)
        await self.limiter.async_log_success_event(kwargs, response, None, None)
        if timed:
            self.post_call_seconds.append(time.perf_counter() - started)


def make_driver(kind: str, server: RedisServer, router: Any, setup: Setup) -> Driver:
    if kind == "ours":
        raw: dict[str, Any] = {
            "priority_reservation_settings": {"saturation_threshold": THRESHOLD},
            "ratebalance": {"limiter": {"window_seconds": setup.window_seconds}},
        }
        if setup.priorities:
            raw["priority_reservation"] = dict(setup.priorities)
        client = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(server.url, max_connections=64, timeout=20)
        )
        runtime = Runtime()
        # A store error would fail open (admit uncounted): a generous timeout keeps CPU hiccups of a busy
        # bench machine from looking like limiter results; errors are still counted and reported.
        store = RedisStore(client, KeySpace("bench"), timeout_seconds=5.0)
        runtime.configure(settings=parse_settings(raw), store=store, router=router)
        return Driver(kind, PriorityRateLimiter(runtime), client.aclose)
    set_litellm_priorities(setup)
    cache = RedisCache(host="127.0.0.1", port=server.port)
    handler = _PROXY_DynamicRateLimitHandlerV3(internal_usage_cache=DualCache(redis_cache=cache))
    handler.update_variables(router)
    handler.v3_limiter.window_size = setup.window_seconds

    async def close() -> None:
        await cache.disconnect()  # type: ignore[no-untyped-call]

    return Driver(kind, handler, close)


# -- requests and answers --------------------------------------------------------------------------------
def auth_for(name: str) -> UserAPIKeyAuth:
    """A key with ``metadata.priority`` (prod / dev), a team's key (team_*), or a key without priority."""
    if name.startswith("team_"):
        return UserAPIKeyAuth(api_key=f"sk-bench-{name}", team_id=name, team_metadata={"priority": name})
    return UserAPIKeyAuth(api_key=f"sk-bench-{name}", metadata={"priority": name} if name != "none" else {})


AUTH = {name: auth_for(name) for name in ("prod", "dev", "none", "team_a", "team_b")}
_PROMPT_TOKENS: dict[tuple[str, str], int] = {}


def request(model: str, prompt: str, max_tokens: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if max_tokens is not None:
        data["max_tokens"] = max_tokens
    return data


def prompt_tokens(model: str, prompt: str) -> int:
    """The prompt as the provider counts it (here: LiteLLM's counter, as for the mock deployments)."""
    if (model, prompt) not in _PROMPT_TOKENS:
        messages = [{"role": "user", "content": prompt}]
        _PROMPT_TOKENS[(model, prompt)] = int(litellm.token_counter(model=model, messages=messages))
    return _PROMPT_TOKENS[(model, prompt)]


def lognormal_answer(rng: random.Random) -> int:
    """Answer lengths of chat traffic: lognormal, median 90 tokens, clipped to 20..400."""
    return max(20, min(400, round(rng.lognormvariate(math.log(90), 0.75))))


# -- closed-loop clients ------------------------------------------------------------------------------------
@dataclass
class Traffic:
    """What one workload saw: (admission time, who, tokens served) and (refusal time, who)."""

    t0: float = 0.0
    served: list[tuple[float, str, int]] = field(default_factory=list)
    refused: list[tuple[float, str]] = field(default_factory=list)

    def window_of(self, at: float, window_s: float) -> int:
        return int((at - self.t0) // window_s)

    def tokens(self, window: int, window_s: float, who: str | None = None) -> int:
        return sum(
            n for at, w, n in self.served if self.window_of(at, window_s) == window and (who is None or w == who)
        )

    def refusals(self, window: int, window_s: float, who: str | None = None) -> int:
        return sum(1 for at, w in self.refused if self.window_of(at, window_s) == window and (who is None or w == who))


@dataclass
class Client:
    who: str
    model: str
    prompt: str
    answer: Callable[[random.Random], int]
    upstream_s: Callable[[int], float]
    max_tokens: int | None = None
    backoff_s: float = 0.05
    stop_on_refusal: bool = False
    start_at: float = 0.0
    """Seconds after t0 the client starts."""
    demand: Callable[[int], int] | None = None
    """Tokens the client's team wants in window k (shared by the team's clients); None: unlimited."""


async def run_clients(
    driver: Driver, clients: list[Client], seconds: float, window_s: float, seed: int, *, quiet_s: float = 0.0
) -> Traffic:
    """Run the clients for ``seconds``. ``quiet_s``: nobody sends from ``quiet_s / 3`` before each window
    boundary of the bench to ``2 x quiet_s / 3`` after it, so every client starts each window together, and
    the limiter's own window (which starts at its first request) ends inside the pause."""
    traffic = Traffic(t0=time.perf_counter())
    end = traffic.t0 + seconds
    wanted: dict[tuple[str, int], int] = {}  # (team, window) -> tokens asked for so far

    async def loop(index: int, client: Client) -> None:
        rng = random.Random(seed * 1000 + index)
        await asyncio.sleep(client.start_at)
        while (now := time.perf_counter()) < end:
            into_window = (now - traffic.t0) % window_s
            before, after = quiet_s / 3, 2 * quiet_s / 3
            if quiet_s and ((now - traffic.t0 >= window_s and into_window < after) or into_window >= window_s - before):
                wait = after - into_window if into_window < after else window_s - into_window + after
                await asyncio.sleep(wait)
                continue
            output = client.answer(rng)
            prompt = prompt_tokens(client.model, client.prompt)
            if client.demand is not None:
                window = traffic.window_of(now, window_s)
                asked = wanted.get((client.who, window), 0)
                if asked >= client.demand(window):
                    next_window = traffic.t0 + (window + 1) * window_s + 2 * quiet_s / 3
                    await asyncio.sleep(max(0.0, min(next_window, end) - now))
                    continue
                wanted[(client.who, window)] = asked + prompt + output
            data = request(client.model, client.prompt, client.max_tokens)
            auth = AUTH[client.who]
            if not await driver.admit(auth, data):
                traffic.refused.append((time.perf_counter(), client.who))
                if client.demand is not None:
                    wanted[(client.who, window)] -= prompt + output
                if client.stop_on_refusal:
                    return
                await asyncio.sleep(client.backoff_s * (0.5 + rng.random()))
                continue
            admitted_at = time.perf_counter()
            await asyncio.sleep(client.upstream_s(output))
            traffic.served.append((admitted_at, client.who, prompt + output))
            await driver.finish(auth, data, (prompt, output))

    await asyncio.gather(*(loop(i, c) for i, c in enumerate(clients)))
    return traffic


# -- workloads --------------------------------------------------------------------------------------------
@dataclass
class Result:
    quick_start: str = ""
    teams: dict[str, float] = field(default_factory=dict)
    steady: list[int] = field(default_factory=list)
    steady_4096: list[int] = field(default_factory=list)
    heavy: list[int] = field(default_factory=list)
    cold: int = 0
    cold_alternating: int = 0
    cold_random: list[int] = field(default_factory=list)
    rpm_admitted: int = 0
    admissions_per_s: float = math.nan
    pre_p50_ms: float = math.nan
    pre_p99_ms: float = math.nan
    post_p50_us: float = math.nan
    trips_pre: float = math.nan
    trips_post: float = math.nan
    trips_other: float = math.nan
    commands: float = math.nan
    commands_detail: str = ""
    notes: list[str] = field(default_factory=list)


async def quick_start(driver: Driver) -> str:
    """The docs' quick start: one request at a time until the first 429 (at most 6)."""
    outcomes = []
    for _ in range(6):
        data = request(QUICK_MODEL, SHORT_PROMPT, None)
        if not await driver.admit(AUTH["none"], data):
            outcomes.append("429")
            break
        outcomes.append("200")
        await driver.finish(AUTH["none"], data, (prompt_tokens(QUICK_MODEL, SHORT_PROMPT), 20))
    return " ".join(outcomes)


TEAMS_WINDOW_S = 3
PHASE_QUIET_S = 0.3
"""Both teams pause this long around each window boundary (0.1 s before, 0.2 s after), then start together:
a limiter's window starts at its first request, so without the pause it would drift from the bench's
count, and whichever team came first would borrow in lenient mode before the other arrived."""


async def two_teams(driver: Driver, seed: int) -> dict[str, float]:
    # The bench's phases are 50 ms longer than the limiters' windows, so each limiter window ends inside the
    # pause around a phase boundary (a limiter's window starts at its first request, a few ms after the
    # teams start; without the margin that lag adds up and the first requests of a phase would meet the
    # full window before).
    w = TEAMS_WINDOW_S + 0.05
    team_b_wants = {1: 500, 2: 400}
    common = dict(model=TEAMS_MODEL, prompt=SHORT_PROMPT, answer=lambda rng: 50, upstream_s=lambda n: 0.05)
    clients = [Client("team_a", **common) for _ in range(4)]  # type: ignore[arg-type]
    clients += [
        Client("team_b", start_at=w, demand=lambda k: team_b_wants.get(k, 0), **common)  # type: ignore[arg-type]
        for _ in range(4)
    ]
    traffic = await run_clients(driver, clients, 3 * w - 0.05, w, seed, quiet_s=PHASE_QUIET_S)
    out: dict[str, float] = {}
    for k in range(3):
        out[f"w{k + 1}_a"] = traffic.tokens(k, w, "team_a")
        out[f"w{k + 1}_b"] = traffic.tokens(k, w, "team_b")
        out[f"w{k + 1}_total"] = traffic.tokens(k, w)
        out[f"w{k + 1}_b_429"] = traffic.refusals(k, w, "team_b")
    return out


STEADY_WINDOW_S = 5
STEADY_WINDOWS = 5


async def steady(driver: Driver, max_tokens: int | None, seed: int, model: str = STEADY_MODEL) -> list[int]:
    """20 clients, lognormal answers, upstream 50 ms + 2.5 ms per output token; tokens served per window."""
    clients = [
        Client(
            "none",
            model,
            LAT_PROMPT,
            lognormal_answer,
            upstream_s=lambda n: 0.05 + n / 400,
            max_tokens=max_tokens,
            backoff_s=0.1,
        )
        for _ in range(20)
    ]
    w = STEADY_WINDOW_S
    traffic = await run_clients(driver, clients, STEADY_WINDOWS * w - 0.05, w, seed)
    return [traffic.tokens(k, w) for k in range(STEADY_WINDOWS)]


async def cold_burst(driver: Driver, seed: int) -> int:
    clients = [
        Client("none", COLD_MODEL, SHORT_PROMPT, lambda rng: 30, lambda n: 0.05, stop_on_refusal=True)
        for _ in range(20)
    ]
    traffic = await run_clients(driver, clients, 9.5, 10, seed)
    return traffic.tokens(0, 10)


COLD_RANDOM_RUNS = 10


async def cold_burst_replicas(drivers: list[Driver], seed: int | None) -> int:
    """The cold burst through several limiter instances; tokens served. ``seed`` ``None``: each client's
    requests go to the instances in turn, all starting with the first; else to one drawn at random."""
    rng = random.Random(seed)
    prompt = prompt_tokens(COLD_MODEL, SHORT_PROMPT)
    served = 0
    end = time.perf_counter() + 9.5

    async def client() -> None:
        nonlocal served
        sent = 0
        while time.perf_counter() < end:
            driver = drivers[sent % len(drivers)] if seed is None else rng.choice(drivers)
            sent += 1
            data = request(COLD_MODEL, SHORT_PROMPT, None)
            if not await driver.admit(AUTH["none"], data):
                return
            await asyncio.sleep(0.05)
            served += prompt + 30
            await driver.finish(AUTH["none"], data, (prompt, 30))

    await asyncio.gather(*(client() for _ in range(20)))
    return served


async def rpm_exact(drivers: list[Driver], requests: int) -> int:
    async def one(i: int) -> bool:
        return await drivers[i % 2].admit(AUTH["none"], request(RPM_MODEL, SHORT_PROMPT, None))

    return sum(await asyncio.gather(*(one(i) for i in range(requests))))


def lat_usage(rng: random.Random) -> tuple[int, int]:
    return prompt_tokens(LAT_MODEL, LAT_PROMPT), rng.randint(LAT_MAX_TOKENS // 2, LAT_MAX_TOKENS)


async def latency_and_round_trips(
    driver: Driver, sync: redis.Redis, requests: int, warmup: int, result: Result
) -> None:
    rng = random.Random(1)
    keys = ("prod", "dev")
    for i in range(warmup):
        data = request(LAT_MODEL, LAT_PROMPT, LAT_MAX_TOKENS)
        if await driver.admit(AUTH[keys[i % 2]], data):
            await driver.finish(AUTH[keys[i % 2]], data, lat_usage(rng))
    await asyncio.sleep(0.3)
    ROUND_TRIPS.clear()
    before = commandstats(sync)
    samples: list[float] = []
    admitted = 0
    for i in range(requests):
        auth = AUTH[keys[i % 2]]
        data = request(LAT_MODEL, LAT_PROMPT, None)
        token = _phase.set("pre")
        started = time.perf_counter()
        ok = await driver.admit(auth, data)
        samples.append(time.perf_counter() - started)
        _phase.reset(token)
        if ok:
            admitted += 1
            token = _phase.set("post")
            await driver.finish(auth, data, lat_usage(rng), timed=True)
            _phase.reset(token)
    await asyncio.sleep(0.3)  # let background writes (if any) land before reading the counters
    delta = commandstats(sync) - before
    samples.sort()
    result.pre_p50_ms = statistics.median(samples) * 1000
    result.pre_p99_ms = samples[min(len(samples) - 1, int(0.99 * len(samples)))] * 1000
    result.post_p50_us = statistics.median(driver.post_call_seconds) * 1e6
    result.trips_pre = ROUND_TRIPS["pre"] / admitted
    result.trips_post = ROUND_TRIPS["post"] / admitted
    result.trips_other = ROUND_TRIPS["other"] / admitted
    result.commands = sum(delta.values()) / admitted
    result.commands_detail = ", ".join(
        f"{name.removeprefix('cmdstat_')} {calls / admitted:.1f}" for name, calls in delta.most_common(6)
    )
    if admitted != requests:
        result.notes.append(f"latency run: only {admitted}/{requests} admitted")


async def throughput(driver: Driver, requests: int, concurrency: int) -> float:
    rng = random.Random(2)
    queue = list(range(requests))
    admitted = 0

    async def worker() -> None:
        nonlocal admitted
        while queue:
            i = queue.pop()
            auth = AUTH[("prod", "dev")[i % 2]]
            data = request(LAT_MODEL, LAT_PROMPT, None)
            if await driver.admit(auth, data):
                admitted += 1
                await driver.finish(auth, data, lat_usage(rng))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return admitted / (time.perf_counter() - started)


def commandstats(client: redis.Redis) -> Counter[str]:
    info: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return Counter({name: int(stats["calls"]) for name, stats in info.items() if name != "cmdstat_info"})


async def run_kind(kind: str, server: RedisServer, router: Any, args: argparse.Namespace) -> Result:
    sync = redis.Redis.from_url(server.url)
    result = Result()

    async def run(setup: Setup, work: Callable[[Driver], Awaitable[Any]]) -> Any:
        sync.flushdb()
        driver = make_driver(kind, server, router, setup)
        try:
            return await work(driver)
        finally:
            await driver.close()

    result.quick_start = await run(Setup(), quick_start)
    teams_setup = Setup(priorities=TEAMS, window_seconds=TEAMS_WINDOW_S, litellm_cache_ttl=0)
    result.teams = await run(teams_setup, lambda d: two_teams(d, args.seed))
    if kind == "ours":  # the headroom learned by window 3 (what borrowing leaves free there)
        learned = sync.hget(KeySpace("bench").admission_estimate(TEAMS_MODEL), "h")
        result.teams["w3_headroom"] = float(learned or 0)
    steady_setup = Setup(window_seconds=STEADY_WINDOW_S)
    result.steady = await run(steady_setup, lambda d: steady(d, None, args.seed))
    result.steady_4096 = await run(steady_setup, lambda d: steady(d, 4096, args.seed))
    result.heavy = await run(steady_setup, lambda d: steady(d, None, args.seed, HEAVY_MODEL))
    result.cold = await run(Setup(window_seconds=10), lambda d: cold_burst(d, args.seed))

    def replicas(seed: int | None) -> Callable[[Driver], Awaitable[int]]:
        async def work(driver: Driver) -> int:
            other = make_driver(kind, server, router, Setup(window_seconds=10))
            try:
                return await cold_burst_replicas([driver, other], seed)
            finally:
                await other.close()

        return work

    result.cold_alternating = await run(Setup(window_seconds=10), replicas(None))
    for offset in range(COLD_RANDOM_RUNS):
        result.cold_random.append(await run(Setup(window_seconds=10), replicas(args.seed * 1000 + offset)))

    async def rpm(driver: Driver) -> int:
        other = make_driver(kind, server, router, Setup())
        try:
            return await rpm_exact([driver, other], 200)
        finally:
            await other.close()

    result.rpm_admitted = await run(Setup(), rpm)
    await run(
        Setup(priorities=PRIORITIES), lambda d: latency_and_round_trips(d, sync, args.requests, args.warmup, result)
    )
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
def _ratios(values: list[int], tpm: int) -> str:
    return " / ".join(f"{v / tpm:.2f}" for v in values)


def _spread(values: list[int], tpm: int) -> str:
    ordered = sorted(values)
    return " / ".join(f"{v / tpm:.2f}" for v in (ordered[0], statistics.median(ordered), ordered[-1]))


def rows(results: dict[str, Result]) -> list[tuple[str, str, str, str, bool]]:
    """(workload, ours, LiteLLM's, target, met) for every target."""
    ours, theirs = results["ours"], results["litellm"]

    def teams(r: Result) -> str:
        t = r.teams
        headroom = f", headroom {t['w3_headroom']:.0f}" if "w3_headroom" in t else ""
        return (
            f"W1 a {t['w1_a']:.0f}; W2 a {t['w2_a']:.0f} / b {t['w2_b']:.0f}; "
            f"W3 a {t['w3_a']:.0f} / b {t['w3_b']:.0f} ({t['w3_b_429']:.0f} 429s{headroom}); "
            f"max window {max(t[f'w{k}_total'] for k in (1, 2, 3)) / TEAMS_TPM:.2f} x tpm"
        )

    t = ours.teams
    teams_met = (
        450 <= t["w1_a"] <= 550
        and min(t["w2_a"], t["w2_b"]) >= 450
        and t["w3_b"] >= 380
        and t["w3_b_429"] == 0
        and t["w3_a"] <= 0.5 * TEAMS_TPM
        and max(t[f"w{k}_total"] for k in (1, 2, 3)) <= 1.05 * TEAMS_TPM
    )

    def steady_met(values: list[int]) -> bool:
        return all(0.95 * STEADY_TPM <= v <= 1.02 * STEADY_TPM for v in values[1:])

    def five(values: list[int]) -> str:
        return f"{sum(values) / (len(values) * STEADY_TPM):.3f}"

    return [
        ("quick start, tpm 60 (hooks; the e2e test runs it through the proxy)", ours.quick_start,
         theirs.quick_start, "200 200 429", ours.quick_start == "200 200 429"),
        ("two-team docs example, 3 windows (tokens)", teams(ours), teams(theirs),
         "W1 a ~500; W2 each >= 450; W3 b >= 380, 0 429s, a <= 500; every window <= 1.05", teams_met),
        (f"steady, 20 clients, lognormal 20-400: tokens per window / tpm ({STEADY_TPM}), windows 1-5",
         _ratios(ours.steady, STEADY_TPM), _ratios(theirs.steady, STEADY_TPM), "windows 2-5 in [0.95, 1.02]",
         steady_met(ours.steady)),
        ("same, max_tokens 4096 on every request", _ratios(ours.steady_4096, STEADY_TPM),
         _ratios(theirs.steady_4096, STEADY_TPM), "windows 2-5 in [0.95, 1.02]", steady_met(ours.steady_4096)),
        ("5 saturated windows in a row: total / (5 x tpm)", f"{five(ours.steady)} ; {five(ours.steady_4096)}",
         f"{five(theirs.steady)} ; {five(theirs.steady_4096)}", "<= 1.01 (both steady runs)",
         max(sum(ours.steady), sum(ours.steady_4096)) <= 1.01 * STEADY_WINDOWS * STEADY_TPM),
        (f"steady at about 4x overload (tpm {HEAVY_TPM}): tokens per window / tpm, windows 1-5",
         _ratios(ours.heavy, HEAVY_TPM), _ratios(theirs.heavy, HEAVY_TPM),
         f"(no target; 5-window total {sum(ours.heavy) / (STEADY_WINDOWS * HEAVY_TPM):.3f})", True),
        (f"cold burst, fresh store, 20 clients, 30-token answers: tokens / tpm ({COLD_TPM})",
         f"{ours.cold / COLD_TPM:.2f}", f"{theirs.cold / COLD_TPM:.2f}", "[0.6, 1.25]",
         0.6 * COLD_TPM <= ours.cold <= 1.25 * COLD_TPM),
        ("same through 2 instances, each client's requests alternating between them from the first",
         f"{ours.cold_alternating / COLD_TPM:.2f}", f"{theirs.cold_alternating / COLD_TPM:.2f}", "[0.8, 1.02]",
         0.8 * COLD_TPM <= ours.cold_alternating <= 1.02 * COLD_TPM),
        (f"same through 2 instances, each request to one at random: min / median / max of {COLD_RANDOM_RUNS} runs",
         _spread(ours.cold_random, COLD_TPM), _spread(theirs.cold_random, COLD_TPM), "all in [0.8, 1.02]",
         all(0.8 * COLD_TPM <= v <= 1.02 * COLD_TPM for v in ours.cold_random)),
        (f"RPM {RPM_LIMIT}, 200 concurrent over 2 instances: admitted", str(ours.rpm_admitted),
         str(theirs.rpm_admitted), f"{RPM_LIMIT}", ours.rpm_admitted == RPM_LIMIT),
        ("admissions/s, one process (pre + post)", f"{ours.admissions_per_s:.0f}",
         f"{theirs.admissions_per_s:.0f}", f">= 5x LiteLLM's ({ours.admissions_per_s / theirs.admissions_per_s:.2f}x)",
         ours.admissions_per_s >= 5 * theirs.admissions_per_s),
        ("post-call hooks p50 (us)", f"{ours.post_p50_us:.1f}", f"{theirs.post_p50_us:.1f}", "<= 50",
         ours.post_p50_us <= 50),
        ("pre-call latency p50 / p99 (ms)", f"{ours.pre_p50_ms:.3f} / {ours.pre_p99_ms:.3f}",
         f"{theirs.pre_p50_ms:.3f} / {theirs.pre_p99_ms:.3f}", "", True),
        ("Redis round trips / admitted: before / after the call / background",
         f"{ours.trips_pre:.2f} / {ours.trips_post:.2f} / {ours.trips_other:.2f}",
         f"{theirs.trips_pre:.2f} / {theirs.trips_post:.2f} / {theirs.trips_other:.2f}", "1 in all",
         round(ours.trips_pre + ours.trips_post + ours.trips_other, 2) <= 1.0),
        ("Redis commands / admitted (commandstats, in-script included)", f"{ours.commands:.1f}",
         f"{theirs.commands:.1f}", "", True),
    ]  # fmt: skip


def table(results: dict[str, Result]) -> list[str]:
    lines = [
        "| workload (no max_tokens unless said) | ours | LiteLLM v3 | target (ours) | met |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {a} | {b} | {target} | {'yes' if ok else '**no**'} |" for name, a, b, target, ok in rows(results)
    ]
    return lines


async def main_async(args: argparse.Namespace) -> int:
    router = make_router()
    results: dict[str, Result] = {}
    with RedisServer() as server:
        for kind in KINDS:
            started = time.perf_counter()
            results[kind] = await run_kind(kind, server, router, args)
            print(f"{kind}: done in {time.perf_counter() - started:.1f}s", flush=True)
        # Throughput last, the two limiters alternating round by round (the median of each): this machine is
        # shared, and minutes apart the same code runs at different speeds.
        rounds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        sync = redis.Redis.from_url(server.url)
        for _ in range(args.throughput_rounds):
            for kind in KINDS:
                sync.flushdb()
                driver = make_driver(kind, server, router, Setup(priorities=PRIORITIES))
                try:
                    rounds[kind].append(await throughput(driver, args.throughput_requests, args.concurrency))
                finally:
                    await driver.close()
        sync.close()
        for kind in KINDS:
            results[kind].admissions_per_s = statistics.median(rounds[kind])
            results[kind].notes.append("admissions/s per round: " + ", ".join(f"{r:.0f}" for r in rounds[kind]))
    lines = table(results)
    print()
    print("\n".join(lines))
    print()
    for kind in KINDS:
        print(f"{kind} commands per admitted request: {results[kind].commands_detail}")
        for note in results[kind].notes:
            print(f"{kind}: {note}")
    if args.write:
        write_markdown(lines, results, args)
    return 0


def write_markdown(lines: list[str], results: dict[str, Result], args: argparse.Namespace) -> None:
    out = REPO / "bench" / "results" / "admission.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = [
        "# Admission benchmark: ours vs LiteLLM's dynamic_rate_limiter_v3",
        "",
        f"Command: `python bench/bench_admission.py --write --seed {args.seed}` (litellm {litellm_version()}, "
        f"redis-server {redis_version()}, {os.cpu_count()} CPUs). Both limiters in one process, one after the "
        "other, on the same local redis-server, driven through the proxy's hooks with the same workloads (see "
        "the script's docstring); ours in its default configuration but for the compressed window.",
        "",
        *lines,
        "",
        "Commands per admitted request, by command:",
        "",
        *[f"- {kind}: {results[kind].commands_detail}" for kind in KINDS],
        "",
        *[f"- {kind}: {note}" for kind in KINDS for note in results[kind].notes],
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
    parser.add_argument("--throughput-rounds", type=int, default=3, help="alternating rounds per limiter")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", action="store_true", help="write bench/results/admission.md")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async(parse_args(sys.argv[1:]))))
