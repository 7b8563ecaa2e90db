"""Routing benchmark: LiteLLM's built-in strategies vs the rate balancer (vs an oracle), on mock deployments.

Every strategy drives a real ``litellm.Router`` (``openai/...`` deployments whose ``api_base`` points at mock
OpenAI-compatible servers on 127.0.0.1, run in a child process) through the same seeded scenario: the same
request plan (open-loop Poisson arrivals; the answer's length in each prompt, ``max_tokens`` equal to it, absent
or far above it) and the same true deployment behaviour over time. The strategies of a scenario and seed run
side by side, in groups of ``--side-by-side`` (default 3), each in its own worker process with its own mock
cluster, from one shared epoch: machine noise hits a group alike, and no two strategies share LiteLLM's
process-wide callback lists. ``ours`` is ``RateBalancedRouting(...).install()``; ``ours-litellm`` the same
strategy set the LiteLLM way only (``router.set_custom_routing_strategy``). The built-ins' time settings are
scaled like ours (``--builtin-time scaled``, see BUILT_IN_TIME_ARGS) unless ``--builtin-time default``. One
scenario can also run through the real ``litellm`` proxy process (``litellm_settings.callbacks:
["litellm_ratebalance.rate_balancer"]``) against the best built-in strategy of that scenario.

Usage::

    # the targets' table (8 seeds x 7 scenarios, 12 s runs, no proxy; ~35 minutes on 2 busy cores;
    # `make bench-routing` without --write)
    python bench/bench_routing.py --seeds 1 2 3 4 5 6 7 8 --duration 12 --no-proxy \
        --strategies ours least-busy latency-based-routing simple-shuffle usage-based-routing-v2 oracle --write
    python bench/bench_routing.py --quick    # smoke run: 2 s per run
    python bench/bench_routing.py --duration 9 --write --results-name routing_9s   # own file
    python bench/bench_routing.py --ours selection='"random"'   # one of ours' settings overridden (JSON)
    python bench/bench_routing.py --sequential   # strategies one after another on one mock cluster

Each run lasts DEFAULT_DURATION (30 s) of arrivals unless ``--duration`` says otherwise; with the simulation's
time compressed ~10x, 12 s is two minutes of traffic. The bootstrap (every deployment measured once, the slowest
answering after seconds) and the seconds it takes to see a change are fixed costs, heavier in shorter runs.

With several seeds it prints, and ``--write`` writes, the targets per scenario (ours >= 0.9x least-busy's mean
effective rate on every seed, ours' average >= the best built-in's), the per-seed table, averages across seeds,
and for any seed under 0.9x least-busy a trace: shares per deployment over time and the balancer's estimates.
Per run it prints the mean and p5 effective token rate ((output + input / ratio) / latency, failures count 0),
p50/p95 latency of successful requests and the p95 of every request (a failure at its time to fail), goodput
(output tokens of successful requests per second), errors and the share of requests each deployment received.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import math
import multiprocessing
import os
import random
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from aiohttp import ClientSession, ClientTimeout, TCPConnector

from litellm_ratebalance.simulate.load import (
    RequestResult,
    Summary,
    effective_rate,
    proxy_sender,
    router_sender,
    run_load,
    summarise,
)
from litellm_ratebalance.simulate.mock_openai import MockClusterProcess, ServedRequest
from litellm_ratebalance.simulate.oracle import MOCK_NAME_KEY, OracleRouting
from litellm_ratebalance.simulate.scenarios import SCENARIOS, Scenario, build_scenario

BUILT_INS = ("simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing-v2")
OURS = ("ours", "ours-litellm")
"""``ours``: ``RateBalancedRouting(router, balancer=...).install()``; ``ours-litellm``: the same strategy set the
way LiteLLM documents custom strategies, ``router.set_custom_routing_strategy(RateBalancedRouting(router,
balancer=...))`` and nothing else (no ``install()``)."""
STRATEGIES = (
    "ours",
    "least-busy",
    "latency-based-routing",
    "simple-shuffle",
    "usage-based-routing-v2",
    "ours-litellm",
    "oracle",
)
"""Default strategies, in the order they run: side by side in groups of ``--side-by-side`` (3: ours beside
least-busy and latency-based, the built-ins it is held to)."""
EXTRA_STRATEGIES = ("ours-slots", "oracle-lagged")
"""Run only when named: ``ours-slots`` is ours with each deployment's true capacity configured as
``model_info.slots`` (what a user who knows a server's concurrency, e.g. vLLM's ``--max-num-seqs``, can
set). It shows what learning the slots leaves on the table; it is not part of the targets.
``oracle-lagged`` is the oracle seeing every deployment's behaviour ``--oracle-lag`` seconds late (default
:data:`ORACLE_LAG_SECONDS`): what knowing everything but learning of each change only that late achieves."""
ORACLE_LAG_SECONDS = 2.0
MODEL_GROUP = "bench"
RATIO = 250.0
PROXY_SCENARIO = "drift"
DEFAULT_DURATION = 30.0
"""Seconds of arrivals per run (see the module docstring)."""
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The rate balancer's time settings, scaled to the simulation's compressed time (requests take ~0.2-3 s and a
# run lasts seconds, where real traffic takes ~10x longer and changes over minutes). Everything else is the
# package default. The same values go to the SDK strategy and to the proxy's config.
OURS_SETTINGS: dict[str, Any] = {
    "window_seconds": 5,
    "bucket_seconds": 1,
    "refresh_interval": 0.25,
    "failure_window_seconds": 2,
    "stall_min_seconds": 1.0,
    "rate_limit_header_max_age_seconds": 5.0,
}
BUILT_IN_TIME_ARGS: dict[str, dict[str, Any]] = {
    "latency-based-routing": {"ttl": 300.0},
    "usage-based-routing-v2": {"ttl": 5},
}
"""``routing_strategy_args`` of the built-ins whose state has a time setting, scaled like ours (``--builtin-time
scaled``, the default) by ~12x, as ours' ``window_seconds`` 120 -> 5 and ``rate_limit_header_max_age_seconds``
60 -> 5: latency-based's ``ttl`` (how long its per-deployment latency list lives) 3600 -> 300 s, still longer than
a run, so its last-10-samples list decides as before; usage-based-v2's ``ttl`` (life of its per-deployment
tpm/rpm counters, which start at the first request after expiry) 60 -> 5 s, so it counts 5 s windows rather than
whole minutes. usage-based-v2 also keys its counters by the wall-clock minute (not a setting): a minute boundary
inside a run still restarts its counts. ``--builtin-time default`` runs them on LiteLLM's defaults. least-busy
and simple-shuffle have no time setting."""
BUILT_IN_TIME = "scaled"
"""``scaled`` (BUILT_IN_TIME_ARGS) or ``default`` (LiteLLM's): set by ``--builtin-time``."""
ROUTER_SETTINGS: dict[str, Any] = {}
"""Extra ``litellm.Router`` settings for every strategy (``--router``; the proxy runs get them in
``router_settings``), e.g. ``disable_cooldowns``. Empty: LiteLLM's defaults."""
_BENCH_ROUTER_KEYS = frozenset({"model_list", "routing_strategy", "num_retries", "timeout"})
"""Router settings the bench sets itself (per strategy, or the same for all): not for ``--router``."""


@dataclass
class Run:
    """One strategy on one scenario."""

    scenario: str
    strategy: str
    summary: Summary
    results: list[RequestResult]
    served: list[ServedRequest]
    wall_seconds: float
    trace: list[str] = field(default_factory=list)
    """Our balancer's estimates sampled during the run (ours' runs only)."""

    def shares(self, names: Sequence[str]) -> dict[str, float]:
        """Share of the requests that reached each deployment (by the mock's own log)."""
        counts = dict.fromkeys(names, 0)
        for record in self.served:
            counts[record.deployment] = counts.get(record.deployment, 0) + 1
        total = sum(counts.values())
        return {name: counts[name] / total if total else 0.0 for name in names}


# -- strategies -------------------------------------------------------------------------------------------
def _model_list(
    scenario: Scenario, api_bases: dict[str, str], tag: str, group: str, *, slots: bool = False
) -> list[dict[str, Any]]:
    return [
        {
            "model_name": group,
            "litellm_params": {
                "model": f"openai/mock-{spec.name}",
                "api_base": api_bases[spec.name],
                "api_key": "sk-mock",
                "max_retries": 0,  # no hidden SDK retries: one request = one routing decision
                "timeout": scenario.workload.timeout,
            },
            "model_info": {
                "id": f"{tag}-{spec.name}",
                MOCK_NAME_KEY: spec.name,
                **({"slots": spec.behaviour.capacity} if slots else {}),
            },
        }
        for spec in scenario.deployments
    ]


def _group(tag: str) -> str:
    """Model group of one SDK run: unique per run, so runs side by side never share routing state (LiteLLM's
    strategies and ours key their state by model group and deployment id)."""
    return f"{MODEL_GROUP}-{tag}"


@contextlib.contextmanager
def _isolated_callbacks() -> Iterator[None]:
    """Restore LiteLLM's global callback lists after a run: each Router (and our strategy) registers
    callbacks there, and one run's must not filter or observe the next run's requests."""
    names = (
        "callbacks",
        "success_callback",
        "failure_callback",
        "_async_success_callback",
        "_async_failure_callback",
        "input_callback",
        "service_callback",
    )
    saved = {name: list(getattr(litellm, name)) for name in names}
    try:
        yield
    finally:
        for name, items in saved.items():
            getattr(litellm, name)[:] = items


def _make_router(
    strategy: str, scenario: Scenario, api_bases: dict[str, str], epoch: float, tag: str
) -> tuple[Any, Callable[[str], None] | None, Callable[[], None], Any]:
    """(router, on_done(request_id) or None, teardown, our balancer or None)."""
    model_list = _model_list(scenario, api_bases, tag, _group(tag), slots=strategy == "ours-slots")
    common: dict[str, Any] = {"num_retries": 0, "timeout": scenario.workload.timeout, **ROUTER_SETTINGS}
    if strategy in BUILT_INS:
        args = BUILT_IN_TIME_ARGS.get(strategy, {}) if BUILT_IN_TIME == "scaled" else {}
        router = litellm.Router(
            model_list=model_list, routing_strategy=strategy, routing_strategy_args=dict(args), **common
        )
        return router, None, router.discard, None
    router = litellm.Router(model_list=model_list, routing_strategy="simple-shuffle", **common)
    if strategy in ("oracle", "oracle-lagged"):
        specs = {spec.name: spec for spec in scenario.deployments}
        lag = ORACLE_LAG_SECONDS if strategy == "oracle-lagged" else 0.0
        oracle = OracleRouting(router, specs, epoch, ratio=RATIO, lag_seconds=lag)
        router.set_custom_routing_strategy(oracle)
        return router, oracle.finished, router.discard, None
    if strategy in ("ours", "ours-slots", "ours-litellm"):
        from litellm_ratebalance import RateBalancer, RoutingSettings
        from litellm_ratebalance.proxy.routing import RateBalancedRouting
        from litellm_ratebalance.store import MemoryStore

        balancer = RateBalancer(
            MemoryStore(), RoutingSettings(**OURS_SETTINGS), rng=random.Random(f"ours/{scenario.name}/{scenario.seed}")
        )
        if strategy == "ours-litellm":
            # As LiteLLM documents custom strategies: set it on the router, nothing else.
            router.set_custom_routing_strategy(RateBalancedRouting(router, balancer=balancer))
            return router, None, router.discard, balancer
        ours = RateBalancedRouting(router, balancer=balancer).install()

        def teardown() -> None:
            ours.uninstall()
            router.discard()

        return router, None, teardown, ours.balancer()
    raise ValueError(f"unknown strategy {strategy!r}")


async def _trace_balancer(balancer: Any, epoch: float, tag: str, every: float, end: float) -> list[str]:
    """Lines of what our balancer believes, sampled every ``every`` seconds until ``end`` (diagnostics)."""
    lines: list[str] = []
    while time.time() - epoch < end:
        await asyncio.sleep(every)
        try:
            estimates = balancer.estimates(_group(tag))
        except Exception as exc:  # diagnostics only: never break a run
            lines.append(f"    t={time.time() - epoch:4.1f}s estimates failed: {exc!r}")
            continue
        parts = []
        for deployment_id, e in sorted(estimates.items()):
            name = deployment_id.removeprefix(tag + "-")
            share = "-" if e.share is None else f"{e.share:.2f}"
            parts.append(
                f"{name}: share {share} n {e.samples:.1f} fail {e.failures:.1f} mean {e.mean_rate:.0f} "
                f"sd {e.std_rate:.0f} inflight {e.in_flight} load-shift {getattr(e, 'load_shift', 0.0):+.0f}"
            )
        mode = next(iter(estimates.values())).mode if estimates else "-"
        lines.append(f"    t={time.time() - epoch:4.1f}s [{mode}] " + " | ".join(parts))
    return lines


async def run_strategy(
    cluster: MockClusterProcess,
    scenario: Scenario,
    strategy: str,
    run_no: int,
    *,
    trace: bool = False,
    epoch: float | None = None,
) -> Run:
    """Run one strategy on a scenario against ``cluster`` (reset for the run), its first request due at
    ``epoch`` (wall clock; default 0.3 s from now). No other run shares this process: the global generator is
    seeded and LiteLLM's callback lists restored afterwards."""
    workload = scenario.workload
    with _isolated_callbacks():
        epoch = time.time() + 0.3 if epoch is None else epoch
        late = time.time() + 0.1 - epoch
        if late > 0:
            print(f"  {strategy}: ready {late:.2f} s after its epoch: its first requests go out late", flush=True)
        await cluster.reset(epoch=epoch)
        tag = f"r{run_no}"
        # LiteLLM's shuffles draw from the global generator: seed it so a run repeats as far as timing allows.
        random.seed(f"{scenario.name}/{scenario.seed}/{strategy}")
        router, on_done, teardown, balancer = _make_router(strategy, scenario, cluster.api_bases, epoch, tag)
        tracer = None
        trace_lines: list[str] = []
        if balancer is not None:  # always sampled (cheap); printed with --trace, reported for a missed seed
            every = workload.duration / 10
            tracer = asyncio.create_task(_trace_balancer(balancer, epoch, tag, every, workload.duration + 0.5))
        try:
            send = router_sender(router, _group(tag), timeout=workload.timeout)
            done = (lambda request: on_done(str(request.index))) if on_done is not None else None
            started = time.perf_counter()
            results = await run_load(scenario.plan(), send, epoch=epoch, deadline=workload.timeout + 2.0, on_done=done)
            wall = time.perf_counter() - started
            await asyncio.sleep(0.2)  # let LiteLLM's logging tasks of the last requests finish before teardown
            if tracer is not None:
                trace_lines = await tracer
            if trace and trace_lines:
                print(f"  {strategy}'s estimates on {scenario.name}:\n" + "\n".join(trace_lines), flush=True)
        finally:
            if tracer is not None and not tracer.done():
                tracer.cancel()
            teardown()
    served = await cluster.served()
    return Run(scenario.name, strategy, summarise(results, RATIO), results, served, wall, trace_lines)


@dataclass(frozen=True)
class _Job:
    """One strategy on one scenario and seed, for a worker process (with the settings the parent parsed)."""

    scenario: str
    seed: int
    duration: float
    strategy: str
    run_no: int
    epoch: float
    trace: bool
    ours_settings: dict[str, Any]
    router_settings: dict[str, Any]
    builtin_time: str


def _worker_ready() -> int:
    """Warm-up job: the worker has imported LiteLLM and this module; its pid."""
    time.sleep(0.5)  # held a moment, so every idle worker takes one warm-up job
    return os.getpid()


def _worker_run(job: _Job) -> Run:
    """Run ``job`` in this worker process: its own mock cluster process, Router and LiteLLM callback lists."""
    global BUILT_IN_TIME
    OURS_SETTINGS.clear()
    OURS_SETTINGS.update(job.ours_settings)
    ROUTER_SETTINGS.clear()
    ROUTER_SETTINGS.update(job.router_settings)
    BUILT_IN_TIME = job.builtin_time
    scenario = build_scenario(job.scenario, duration=job.duration, seed=job.seed)

    async def one() -> Run:
        async with MockClusterProcess(scenario.deployments) as cluster:
            return await run_strategy(cluster, scenario, job.strategy, job.run_no, trace=job.trace, epoch=job.epoch)

    return asyncio.run(one())


START_MARGIN_SECONDS = 4.0
"""Side by side: the shared epoch is this far ahead of the jobs' submission (a worker starts its mock cluster
process and builds its Router in that time)."""


async def run_scenario(
    scenario: Scenario,
    strategies: Sequence[str],
    first_run_no: int,
    *,
    pool: concurrent.futures.ProcessPoolExecutor | None,
    trace: bool,
) -> list[Run]:
    """Every strategy on ``scenario``: one after another on one mock cluster (no ``pool``), or side by side
    (the default) in groups of the pool's size, in ``strategies`` order: the strategies of a group at the same
    time from one epoch, each in its own worker process with its own mock cluster process, so machine noise hits
    them alike and no two share LiteLLM's process-wide callback lists."""
    if pool is None:
        async with MockClusterProcess(scenario.deployments) as cluster:
            runs = []
            for offset, strategy in enumerate(strategies):
                runs.append(await run_strategy(cluster, scenario, strategy, first_run_no + offset, trace=trace))
                _print_run(runs[-1])
        return runs
    loop = asyncio.get_running_loop()
    size = pool._max_workers  # the executor keeps its size only there
    runs = []
    for start in range(0, len(strategies), size):
        epoch = time.time() + START_MARGIN_SECONDS
        jobs = [
            _Job(
                scenario.name,
                scenario.seed,
                scenario.workload.duration,
                strategy,
                first_run_no + start + offset,
                epoch,
                trace,
                dict(OURS_SETTINGS),
                dict(ROUTER_SETTINGS),
                BUILT_IN_TIME,
            )
            for offset, strategy in enumerate(strategies[start : start + size])
        ]
        group = list(await asyncio.gather(*(loop.run_in_executor(pool, _worker_run, job) for job in jobs)))
        for run in group:
            _print_run(run)
        runs += group
    return runs


def _print_run(run: Run) -> None:
    s = run.summary
    print(
        f"  {run.strategy:24s} mean {s.mean_rate:6.1f}  p5 {s.p5_rate:6.1f}  p50 {s.p50_latency:5.2f}s  "
        f"p95 {s.p95_latency:5.2f}s  p95 all {s.p95_latency_all:5.2f}s  goodput {s.goodput:6.1f}  "
        f"errors {s.errors:3d}  ({run.wall_seconds:.1f}s)  "
        "share " + "/".join(f"{100 * v:.0f}" for v in run.shares(sorted({r.deployment for r in run.served})).values()),
        flush=True,
    )


# -- the real proxy ---------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proxy_config(scenario: Scenario, api_bases: dict[str, str], strategy: str, master_key: str) -> str:
    model_list = _model_list(scenario, api_bases, f"proxy-{strategy}", MODEL_GROUP)
    router_settings = {
        "routing_strategy": "simple-shuffle" if strategy == "ours" else strategy,
        "num_retries": 0,
        "timeout": scenario.workload.timeout,
        **ROUTER_SETTINGS,
    }
    litellm_settings: dict[str, Any] = {"request_timeout": scenario.workload.timeout}
    if strategy == "ours":
        litellm_settings["callbacks"] = ["litellm_ratebalance.rate_balancer"]
        litellm_settings["ratebalance"] = {"routing": OURS_SETTINGS}
    config = {
        "model_list": model_list,
        "router_settings": router_settings,
        "litellm_settings": litellm_settings,
        "general_settings": {"master_key": master_key},
    }
    return json.dumps(config, indent=2)  # JSON is YAML


async def run_proxy(cluster: MockClusterProcess, scenario: Scenario, strategy: str, workdir: Path) -> Run:
    """Start ``litellm --config ... --port ...`` for ``strategy`` ("ours" = simple-shuffle + our callback), run
    the scenario over HTTP, stop the proxy."""
    master_key = "sk-bench-" + secrets.token_hex(16)
    config_path = workdir / f"proxy-{strategy}.yaml"
    config_path.write_text(_proxy_config(scenario, cluster.api_bases, strategy, master_key))
    port = _free_port()
    litellm_bin = Path(sys.executable).with_name("litellm")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
    log_path = workdir / f"proxy-{strategy}.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *[str(litellm_bin), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with ClientSession(connector=TCPConnector(limit=256)) as session:
            deadline = time.monotonic() + 60
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"proxy exited ({process.returncode}); see {log_path}")
                with contextlib.suppress(Exception):
                    async with session.get(f"{base_url}/health/liveliness", timeout=ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"proxy not ready after 60 s; see {log_path}")
                await asyncio.sleep(0.25)
            workload = scenario.workload
            epoch = time.time() + 0.3
            await cluster.reset(epoch=epoch)
            send = proxy_sender(session, base_url, master_key, MODEL_GROUP, timeout=workload.timeout + 1.0)
            started = time.perf_counter()
            results = await run_load(scenario.plan(), send, epoch=epoch, deadline=workload.timeout + 2.0)
            wall = time.perf_counter() - started
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
    problems = [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if "Traceback" in line or "litellm_ratebalance routing:" in line
    ]
    if problems:
        print(f"  proxy {strategy}: {len(problems)} error lines in its log, first: {problems[0][:200]}", flush=True)
    served = await cluster.served()
    return Run(scenario.name, f"proxy: {strategy}", summarise(results, RATIO), results, served, wall)


# -- report -----------------------------------------------------------------------------------------------
def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _ratio(a: float, b: float) -> str:
    return "-" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def scenario_table(scenario: Scenario, runs: Sequence[Run]) -> list[str]:
    names = [spec.name for spec in scenario.deployments]
    sdk = [r for r in runs if not r.strategy.startswith("proxy")]
    built_in = [r for r in sdk if r.strategy in BUILT_INS]
    best_mean = max(built_in, key=lambda r: r.summary.mean_rate)
    best_p95 = min(built_in, key=lambda r: r.summary.p95_latency)
    oracle = next((r for r in sdk if r.strategy == "oracle"), None)
    lines = [
        f"#### {scenario.name}",
        "",
        scenario.description,
        "",
        "| strategy | mean eff rate | p5 eff rate | p50 lat s | p95 lat s | p95 all s | goodput tok/s | errors "
        + "| share "
        + "/".join(names)
        + " % | mean vs best built-in | p95 vs best built-in | mean vs oracle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for run in runs:
        s = run.summary
        shares = run.shares(names)
        errors = f"{s.errors}/{s.requests}"
        if s.error_kinds:
            errors += " (" + ", ".join(f"{k} {v}" for k, v in list(s.error_kinds.items())[:2]) + ")"
        lines.append(
            f"| {run.strategy} | {_fmt(s.mean_rate)} | {_fmt(s.p5_rate)} | {_fmt(s.p50_latency, 2)} "
            f"| {_fmt(s.p95_latency, 2)} | {_fmt(s.p95_latency_all, 2)} | {_fmt(s.goodput)} | {errors} "
            f"| {'/'.join(f'{100 * shares[n]:.0f}' for n in names)} "
            f"| {_ratio(s.mean_rate, best_mean.summary.mean_rate)} "
            f"| {_ratio(s.p95_latency, best_p95.summary.p95_latency)} "
            f"| {_ratio(s.mean_rate, oracle.summary.mean_rate) if oracle else '-'} |"
        )
    lines.append("")
    lines.append(
        f"Best built-in: mean eff rate {best_mean.strategy}, p95 latency {best_p95.strategy}. "
        "Ratios: mean rows / best built-in mean, p95 rows / best built-in p95 (below 1 is better), mean / oracle. "
        "p95 lat: successful requests (the targets'); p95 all: every request, a failure at its time to fail."
    )
    return lines


def target_lines(scenarios: Sequence[Scenario], runs_by: dict[str, list[Run]]) -> list[str]:
    lines = ["| scenario | ours / best built-in mean (> 1) | ours / best built-in p95 (< 1) | ours / oracle mean |"]
    lines.append("|---|---:|---:|---:|")
    for scenario in scenarios:
        runs = {r.strategy: r for r in runs_by[scenario.name]}
        if "ours" not in runs:
            continue
        ours = runs["ours"].summary
        built_in = [runs[b].summary for b in BUILT_INS if b in runs]
        if not built_in:
            continue
        best_mean = max(s.mean_rate for s in built_in)
        best_p95 = min(s.p95_latency for s in built_in)
        oracle = runs.get("oracle")
        need_oracle = TARGETS.get(scenario.name, Targets()).vs_oracle
        mark = lambda ok: "met" if ok else "MISSED"  # noqa: E731
        if oracle is None or not oracle.summary.mean_rate:
            oracle_cell = "- (oracle not run)"
        else:
            ratio_oracle = ours.mean_rate / oracle.summary.mean_rate
            oracle_cell = f"{ratio_oracle:.2f}" + (
                f" {mark(ratio_oracle >= need_oracle)} (target >= {need_oracle:g})" if need_oracle else ""
            )
        lines.append(
            f"| {scenario.name} | {_ratio(ours.mean_rate, best_mean)} {mark(ours.mean_rate > best_mean)} "
            f"| {_ratio(ours.p95_latency, best_p95)} {mark(ours.p95_latency < best_p95)} "
            f"| {oracle_cell} |"
        )
    return lines


def plot_drift(scenario: Scenario, runs: Sequence[Run], path: Path, bin_seconds: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [spec.name for spec in scenario.deployments]
    shown = [r for r in runs if not r.strategy.startswith("proxy")] + [
        r for r in runs if r.strategy.startswith("proxy")
    ]
    columns = 3
    rows = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 2.8 * rows), sharex=True, sharey=True, squeeze=False
    )
    bins = max(1, math.ceil(scenario.workload.duration / bin_seconds))
    edges = [i * bin_seconds for i in range(bins + 1)]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, run in zip(axes.flat, shown, strict=False):
        counts = {n: [0] * bins for n in names}
        for record in run.served:
            index = min(bins - 1, max(0, int(record.arrival / bin_seconds)))
            counts.setdefault(record.deployment, [0] * bins)[index] += 1
        totals = [sum(counts[n][i] for n in names) for i in range(bins)]
        bottom = [0.0] * bins
        for k, n in enumerate(names):
            # A bin no request arrived in stays empty rather than reading as a share of 0.
            heights = [counts[n][i] / totals[i] if totals[i] else 0.0 for i in range(bins)]
            ax.bar(edges[:-1], heights, width=bin_seconds, bottom=bottom, align="edge", color=colours[k], label=n)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for at, _label in scenario.events:
            ax.axvline(at, color="black", linestyle="--", linewidth=1.2)
        ax.set_title(run.strategy, fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_xlim(0, scenario.workload.duration)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds")
    for row in axes:
        row[0].set_ylabel("share of requests")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    rates = {
        spec.name: (spec.behaviour.token_rate, spec.behaviour_at(scenario.workload.duration).token_rate)
        for spec in scenario.deployments
    }
    fig.legend(
        handles,
        [f"{n} ({rates[n][0]:.0f}->{rates[n][1]:.0f} tok/s)" for n in labels],
        loc="lower center",
        ncol=len(names),
        fontsize=8,
    )
    events = "; ".join(f"{label} at t={at:.1f} s" for at, label in scenario.events)
    fig.suptitle(
        f"{scenario.name}: share of requests per deployment over time ({bin_seconds:.2f} s bins; dashed: {events})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------------------
async def run_seed(
    args: argparse.Namespace,
    seed: int,
    duration: float,
    run_no: int,
    workdir: Path,
    with_proxy: bool,
    pool: concurrent.futures.ProcessPoolExecutor | None,
) -> dict[str, list[Run]]:
    """Every scenario and strategy for one seed (plus the proxy runs when ``with_proxy``)."""
    strategies = list(args.strategies)
    runs_by: dict[str, list[Run]] = {}
    for name in args.scenarios:
        scenario = build_scenario(name, duration=duration, seed=seed)
        print(f"\n== seed {seed}, {scenario.name}: {scenario.description}; {len(scenario.plan())} requests", flush=True)
        runs = await run_scenario(scenario, strategies, run_no, pool=pool, trace=args.trace)
        run_no += len(strategies)
        runs_by[scenario.name] = runs
        if with_proxy and scenario.name == PROXY_SCENARIO:
            built_in = [r for r in runs if r.strategy in BUILT_INS]
            proxy_strategies = ["ours"]
            if built_in and not args.quick:
                proxy_strategies.insert(0, max(built_in, key=lambda r: r.summary.mean_rate).strategy)
            async with MockClusterProcess(scenario.deployments) as cluster:
                for strategy in proxy_strategies:
                    runs.append(await run_proxy(cluster, scenario, strategy, workdir))
                    _print_run(runs[-1])
    return runs_by


def across_seeds(names: Sequence[str], by_seed: dict[int, dict[str, list[Run]]]) -> list[str]:
    """Per scenario and strategy: mean effective rate and p95 latency averaged over the seeds (min-max)."""
    lines: list[str] = []
    for name in names:
        strategies: dict[str, list[Summary]] = {}
        for runs_by in by_seed.values():
            for run in runs_by.get(name, []):
                if not run.strategy.startswith("proxy"):
                    strategies.setdefault(run.strategy, []).append(run.summary)
        lines += [
            f"#### {name}",
            "",
            "| strategy | mean eff rate, avg (min-max) | p95 lat s, avg (min-max) | p95 all s, avg | errors, avg |",
            "|---|---:|---:|---:|---:|",
        ]
        for strategy, summaries in strategies.items():
            means = [s.mean_rate for s in summaries]
            p95s = [s.p95_latency for s in summaries]
            p95s_all = [s.p95_latency_all for s in summaries]
            errors = sum(s.errors for s in summaries) / len(summaries)
            lines.append(
                f"| {strategy} | {sum(means) / len(means):.1f} ({min(means):.1f}-{max(means):.1f}) "
                f"| {sum(p95s) / len(p95s):.2f} ({min(p95s):.2f}-{max(p95s):.2f}) "
                f"| {sum(p95s_all) / len(p95s_all):.2f} | {errors:.1f} |"
            )
        lines.append("")
    return lines


def targets_across_seeds(names: Sequence[str], by_seed: dict[int, dict[str, list[Run]]]) -> list[str]:
    """The targets on seed-averaged figures, and in how many seeds each held."""
    lines = [
        "| scenario | ours / best built-in mean (> 1) | seeds met | ours / best built-in p95 (< 1) | seeds met "
        "| ours / oracle mean | seeds met |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        per_seed: list[tuple[float, float, float]] = []
        averages: dict[str, list[Summary]] = {}
        for runs_by in by_seed.values():
            runs = {r.strategy: r.summary for r in runs_by.get(name, []) if not r.strategy.startswith("proxy")}
            built_in = [runs[b] for b in BUILT_INS if b in runs]
            if "ours" not in runs or not built_in:
                continue
            oracle = runs.get("oracle")
            per_seed.append(
                (
                    runs["ours"].mean_rate / max(s.mean_rate for s in built_in),
                    runs["ours"].p95_latency / min(s.p95_latency for s in built_in),
                    runs["ours"].mean_rate / oracle.mean_rate if oracle else math.nan,
                )
            )
            for strategy, summary in runs.items():
                averages.setdefault(strategy, []).append(summary)
        if not per_seed:
            continue

        def avg(strategy: str, field: str, averages: dict[str, list[Summary]] = averages) -> float:
            values = [getattr(s, field) for s in averages.get(strategy, [])]
            return sum(values) / len(values) if values else math.nan

        best_mean = max(avg(b, "mean_rate") for b in BUILT_INS if b in averages)
        best_p95 = min(avg(b, "p95_latency") for b in BUILT_INS if b in averages)
        n = len(per_seed)
        oracle_needed = TARGETS.get(name, Targets()).vs_oracle
        oracle_ratio = avg("ours", "mean_rate") / avg("oracle", "mean_rate") if "oracle" in averages else math.nan
        if "oracle" not in averages:
            oracle_cell = "- | oracle not run"
        else:
            oracle_cell = f"{oracle_ratio:.2f} | " + (
                f"{sum(r[2] >= oracle_needed for r in per_seed)}/{n} (>= {oracle_needed:g})"
                if oracle_needed
                else "no target"
            )
        lines.append(
            f"| {name} | {avg('ours', 'mean_rate') / best_mean:.2f} | {sum(r[0] > 1 for r in per_seed)}/{n} "
            f"| {avg('ours', 'p95_latency') / best_p95:.2f} | {sum(r[1] < 1 for r in per_seed)}/{n} "
            f"| {oracle_cell}" + " |"
        )
    return lines


MIN_VS_LEAST_BUSY = 0.9
"""Target: ours' mean effective rate at least this fraction of least-busy's on every seed."""


@dataclass(frozen=True)
class Targets:
    """What ours is held to in one scenario, over the seeds of a run (mean effective rates)."""

    vs_best_built_in: float = 1.0
    """ours' average over the seeds / the best built-in's average, at least."""
    min_vs_least_busy: float = MIN_VS_LEAST_BUSY
    """ours / least-busy on every seed, at least."""
    vs_least_busy: float | None = None
    """ours' average / least-busy's average, at least (None: no such target)."""
    vs_oracle: float | None = None
    """ours' average / the oracle's average, at least (None: no such target)."""


TARGETS: dict[str, Targets] = {
    "drift": Targets(vs_oracle=0.85),
    "fluctuating": Targets(vs_oracle=0.9),
    "flaky": Targets(vs_oracle=0.9),
    "mixed-slots": Targets(vs_least_busy=1.0, min_vs_least_busy=0.95),
}
"""Per scenario (the rest: :class:`Targets` defaults)."""


def _ours_of(strategies: Collection[str]) -> list[str]:
    """Which of ours ran, in OURS order."""
    return [o for o in OURS if o in strategies]


def per_seed_table(names: Sequence[str], by_seed: dict[int, dict[str, list[Run]]]) -> list[str]:
    """One row per scenario and seed: mean effective rate of each strategy, and ours' ratios to least-busy and to
    the best built-in of that seed (a ratio to least-busy under the target is marked MISS)."""
    strategies = [
        s
        for s in (*OURS, "ours-slots", *BUILT_INS, "oracle", "oracle-lagged")
        if any(r.strategy == s for rb in by_seed.values() for runs in rb.values() for r in runs)
    ]
    ours = [s for s in OURS if s in strategies]
    header = "| scenario | seed | " + " | ".join(strategies)
    for o in ours:
        header += f" | {o} / least-busy | {o} / best built-in"
    lines = [header + " |", "|---|---:|" + "---:|" * (len(strategies) + 2 * len(ours))]
    for name in names:
        for seed, runs_by in by_seed.items():
            runs = {r.strategy: r for r in runs_by.get(name, []) if not r.strategy.startswith("proxy")}
            if not runs:
                continue
            cells = [_fmt(runs[s].summary.mean_rate) if s in runs else "-" for s in strategies]
            built_in = [runs[b].summary.mean_rate for b in BUILT_INS if b in runs]
            best = max(built_in) if built_in else math.nan
            least_busy = runs["least-busy"].summary.mean_rate if "least-busy" in runs else math.nan
            for o in ours:
                if o not in runs:
                    cells += ["-", "-"]
                    continue
                mine = runs[o].summary.mean_rate
                vs_lb = _ratio(mine, least_busy)
                miss = " MISS" if vs_lb != "-" and mine < MIN_VS_LEAST_BUSY * least_busy else ""
                cells += [vs_lb + miss, _ratio(mine, best)]
            lines.append(f"| {name} | {seed} | " + " | ".join(cells) + " |")
    return lines


def seed_targets(names: Sequence[str], by_seed: dict[int, dict[str, list[Run]]]) -> list[str]:
    """Per scenario and each of ours: its average, the averages it is held to (best built-in, least-busy, the
    oracle) and the ratios against :data:`TARGETS` (a ratio with a target shows it and a mark), the worst seed
    against least-busy and against the oracle."""
    lines = [
        "| scenario | strategy | seeds | avg | best built-in avg | least-busy avg | oracle avg "
        "| / best built-in | / least-busy | / oracle | min seed / least-busy | min seed / oracle | met |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def cell(value: float, target: float | None) -> tuple[str, bool]:
        if math.isnan(value):
            return "-", target is None
        if target is None:
            return f"{value:.2f}", True
        ok = value >= target - 1e-9
        return f"{value:.2f} {'ok' if ok else 'MISS'} (>= {target:g})", ok

    for name in names:
        targets = TARGETS.get(name, Targets())
        rows: dict[str, list[float]] = {}
        vs_lb: dict[str, list[tuple[float, int]]] = {}
        vs_oracle: dict[str, list[tuple[float, int]]] = {}
        for seed, runs_by in by_seed.items():
            runs = {
                r.strategy: r.summary.mean_rate for r in runs_by.get(name, []) if not r.strategy.startswith("proxy")
            }
            for strategy, rate in runs.items():
                rows.setdefault(strategy, []).append(rate)
            for o in _ours_of(runs):
                if runs.get("least-busy"):
                    vs_lb.setdefault(o, []).append((runs[o] / runs["least-busy"], seed))
                if runs.get("oracle"):
                    vs_oracle.setdefault(o, []).append((runs[o] / runs["oracle"], seed))
        averages = {k: sum(v) / len(v) for k, v in rows.items()}
        built_in = {b: averages[b] for b in BUILT_INS if b in averages}
        if not built_in:
            continue
        best_name = max(built_in, key=lambda b: built_in[b])
        least_busy = averages.get("least-busy", math.nan)
        oracle = averages.get("oracle", math.nan)
        for o in OURS:
            if o not in averages:
                continue
            mine = averages[o]
            checks = [
                cell(mine / built_in[best_name], targets.vs_best_built_in),
                cell(mine / least_busy if least_busy else math.nan, targets.vs_least_busy),
                cell(mine / oracle if oracle else math.nan, targets.vs_oracle),
            ]
            worst = ["-", "-"]
            for k, (ratios, target) in enumerate(((vs_lb.get(o), targets.min_vs_least_busy), (vs_oracle.get(o), None))):
                if ratios:
                    ratio, seed = min(ratios)
                    text, ok = cell(ratio, target)
                    worst[k] = f"{text}, seed {seed}"
                    checks.append((text, ok))
                elif target is not None:
                    checks.append(("-", False))
            met = all(ok for _, ok in checks)
            lines.append(
                f"| {name} | {o} | {len(rows[o])} | {mine:.1f} | {best_name} {built_in[best_name]:.1f} "
                f"| {_fmt(least_busy)} | {_fmt(oracle)} | {checks[0][0]} | {checks[1][0]} | {checks[2][0]} "
                f"| {worst[0]} | {worst[1]} | {'met' if met else 'MISSED'} |"
            )
    return lines


def shares_over_time(run: Run, names: Sequence[str], bins: int, duration: float) -> list[str]:
    """Share of requests (by arrival) each deployment received, per time bin: one line per bin."""
    width = duration / bins
    counts = [dict.fromkeys(names, 0) for _ in range(bins)]
    for record in run.served:
        index = min(bins - 1, max(0, int(record.arrival / width)))
        counts[index][record.deployment] = counts[index].get(record.deployment, 0) + 1
    lines = []
    for i, bin_counts in enumerate(counts):
        total = sum(bin_counts.values())
        cells = "/".join(f"{100 * bin_counts[n] / total:3.0f}" if total else "  -" for n in names)
        lines.append(f"    t={i * width:4.1f}-{(i + 1) * width:4.1f}s {cells} % (n {total})")
    return lines


def miss_traces(names: Sequence[str], by_seed: dict[int, dict[str, list[Run]]], duration: float) -> list[str]:
    """For every scenario and seed where one of ours fell under 0.9x least-busy: per-deployment shares over time
    of it and least-busy, how each did per deployment, and its balancer's estimates over the run."""
    lines: list[str] = []
    for name in names:
        for seed, runs_by in by_seed.items():
            runs = {r.strategy: r for r in runs_by.get(name, []) if not r.strategy.startswith("proxy")}
            if "least-busy" not in runs:
                continue
            scenario = build_scenario(name, duration=duration, seed=seed)
            deployments = [spec.name for spec in scenario.deployments]
            for o in _ours_of(runs):
                ratio = runs[o].summary.mean_rate / runs["least-busy"].summary.mean_rate
                if ratio >= MIN_VS_LEAST_BUSY:
                    continue
                lines += [f"#### {name}, seed {seed}: {o} at {ratio:.2f}x least-busy", "", "```"]
                for strategy in (o, "least-busy"):
                    run = runs[strategy]
                    lines.append(f"  {strategy}: shares {'/'.join(deployments)} over time (by arrival)")
                    lines += shares_over_time(run, deployments, 10, scenario.workload.duration)
                    lines.append(f"  {strategy}: per deployment " + _per_deployment(run, deployments))
                lines.append(f"  {o}'s balancer over time (share, samples, mean rate, in flight per deployment):")
                lines += runs[o].trace
                lines += ["```", ""]
    return lines


def _per_deployment(run: Run, names: Sequence[str]) -> str:
    """Requests, mean effective rate and errors per deployment (results matched to the mock's log by id)."""
    where = {r.request_id: r.deployment for r in run.served if r.request_id is not None}
    parts = []
    for name in names:
        mine = [r for r in run.results if where.get(str(r.index)) == name]
        if not mine:
            parts.append(f"{name}: 0")
            continue
        rates = [effective_rate(r, RATIO) for r in mine]
        errors = sum(not r.ok for r in mine)
        parts.append(f"{name}: n {len(mine)} mean {sum(rates) / len(rates):.0f} err {errors}")
    return "; ".join(parts)


async def main_async(args: argparse.Namespace) -> int:
    duration = args.duration or (2.0 if args.quick else DEFAULT_DURATION)
    seeds: list[int] = args.seeds
    by_seed: dict[int, dict[str, list[Run]]] = {}
    bench_started = time.perf_counter()
    pool = None
    if not args.sequential:
        # One worker process per strategy of a group (spawned: a fresh interpreter, no state forked from this one).
        size = max(1, min(args.side_by_side, len(args.strategies)))
        pool = concurrent.futures.ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"))
        loop = asyncio.get_running_loop()
        pids = await asyncio.gather(*(loop.run_in_executor(pool, _worker_ready) for _ in range(size)))
        print(f"{len(set(pids))} worker processes ready", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
            for i, seed in enumerate(seeds):
                # The proxy runs go with the first seed only (they add two proxy start-ups).
                with_proxy = args.proxy and i == 0
                by_seed[seed] = await run_seed(args, seed, duration, 1 + 100 * i, Path(tmp), with_proxy, pool)
    finally:
        if pool is not None:
            pool.shutdown()
    elapsed = time.perf_counter() - bench_started
    if args.dump:
        _dump(Path(args.dump), duration, by_seed)
    command = "python bench/bench_routing.py " + " ".join(args.argv)
    lines = [
        "## Routing benchmark",
        "",
        f"Command: `{command.strip()}` (total {elapsed:.0f} s) on {_code_version()}. LiteLLM {_litellm_version()}, "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, {duration:g} s of Poisson arrivals "
        f"per run, input-to-output ratio {RATIO:g}.",
        "",
        "Every run: a fresh `litellm.Router` (num_retries 0, SDK max_retries 0, "
        + (
            ", ".join(f"{k}={v}" for k, v in ROUTER_SETTINGS.items()) + ", LiteLLM's defaults otherwise"
            if ROUTER_SETTINGS
            else "default cooldowns"
        )
        + "), the same "
        "request plan and deployment timeline for every strategy. Mean / p5 effective rate over all requests "
        "(a failure counts 0); latency over successful requests; goodput = successful output tokens / run time; "
        "share = requests each deployment received (mock log). `ours` = `RateBalancedRouting` with "
        + ", ".join(f"{k}={v}" for k, v in OURS_SETTINGS.items())
        + " (time settings scaled to the compressed simulation), the rest default; `ours-litellm` = the same, "
        "set with `router.set_custom_routing_strategy(RateBalancedRouting(router, balancer=...))` only (no "
        "`install()`). Built-ins' time settings: "
        + (
            "scaled the same way (`routing_strategy_args`: "
            + "; ".join(f"{k} {v}" for k, v in BUILT_IN_TIME_ARGS.items())
            + "; usage-based-v2's counters are also keyed by the wall-clock minute, which no setting changes)"
            if BUILT_IN_TIME == "scaled"
            else "LiteLLM's defaults (latency-based ttl 3600 s, usage-based-v2 ttl 60 s)"
        )
        + ". Requests: the answer's length is in the prompt (the mock decides it); "
        "about half set `max_tokens` to it, a quarter set none, a quarter set 1024-4096. "
        f"`proxy: ...` rows (seed {seeds[0]}): the real `litellm` proxy process over HTTP; `proxy: ours` = "
        "`routing_strategy: simple-shuffle` plus `callbacks: [litellm_ratebalance.rate_balancer]`."
        + (
            " The strategies of a scenario and seed ran one after another."
            if args.sequential
            else " The strategies of a scenario and seed ran side by side (at the same time, one mock cluster "
            "process each, same request plan and timeline), so machine noise hits them alike."
        ),
        "",
        "Scenarios: "
        + "; ".join(
            f"`{name}`: {build_scenario(name, duration=duration, seed=seeds[0]).description}" for name in args.scenarios
        )
        + ".",
        "",
    ]
    if len(seeds) > 1:
        lines += [
            "### Targets over seeds",
            "",
            "Mean effective rate averaged over the seeds, and ours' ratios to the others' averages; min seed: the "
            "lowest per-seed ratio. Targets (a ratio with one shows it): every scenario, ours' average >= the best "
            f"built-in's and every seed >= {MIN_VS_LEAST_BUSY}x least-busy; "
            + "; ".join(
                name
                + ": "
                + ", ".join(
                    part
                    for part in (
                        f"average >= {t.vs_oracle:g}x the oracle's" if t.vs_oracle is not None else "",
                        f"average >= {t.vs_least_busy:g}x least-busy's" if t.vs_least_busy is not None else "",
                        f"every seed >= {t.min_vs_least_busy:g}x least-busy"
                        if t.min_vs_least_busy != MIN_VS_LEAST_BUSY
                        else "",
                    )
                    if part
                )
                for name, t in TARGETS.items()
            )
            + ".",
            "",
            *seed_targets(args.scenarios, by_seed),
            "",
            "### Per seed: mean effective rate (tokens/s)",
            "",
            *per_seed_table(args.scenarios, by_seed),
            "",
            "### Across seeds",
            "",
            *targets_across_seeds(args.scenarios, by_seed),
            "",
        ]
        lines += across_seeds(args.scenarios, by_seed)
        traces = miss_traces(args.scenarios, by_seed, duration)
        lines += ["### Seeds under 0.9x least-busy: traces", ""] + (traces or ["None.", ""])
    for seed, runs_by in list(by_seed.items())[:1]:
        scenarios = [build_scenario(name, duration=duration, seed=seed) for name in args.scenarios]
        lines += [f"### Seed {seed}", ""]
        for scenario in scenarios:
            if any(r.strategy in BUILT_INS for r in runs_by[scenario.name]):
                lines += [*scenario_table(scenario, runs_by[scenario.name]), ""]
            else:
                lines += [f"#### {scenario.name}", "(no built-in strategy ran)", ""]
        lines += [f"#### Targets, seed {seed}", "", *target_lines(scenarios, runs_by), ""]
    if len(seeds) > 1:
        lines.append(f"(Full tables for seed {seeds[0]} only; the other seeds are in the tables above.)")
    report = "\n".join(lines)
    print("\n" + report)
    if args.write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        name = args.results_name
        (RESULTS_DIR / f"{name}.md").write_text(report + "\n")
        first = by_seed[seeds[0]]
        if "drift" in first:
            drift = build_scenario("drift", duration=duration, seed=seeds[0])
            plot_drift(drift, first["drift"], RESULTS_DIR / f"{name}_drift_share.png", bin_seconds=duration / 12)
        print(f"wrote {RESULTS_DIR / (name + '.md')} and, with drift, the drift share plot")
    return 0


def _dump(path: Path, duration: float, by_seed: dict[int, dict[str, list[Run]]]) -> None:
    """Pickle every run for tracing (``--dump``)."""
    import pickle

    path.write_bytes(pickle.dumps({"duration": duration, "by_seed": by_seed}))


def _code_version() -> str:
    """The commit the bench ran on, and whether the routing code differed from it (a dirty tree)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--",
                "litellm_ratebalance/routing",
                "litellm_ratebalance/proxy/routing",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {commit}" + (" (routing code modified since)" if dirty else "")


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    global BUILT_IN_TIME, ORACLE_LAG_SECONDS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (~1 minute): 2 s per run, the strategies of a scenario side by side, proxy: ours only",
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="one full pass per seed (default 1)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=[*STRATEGIES, *EXTRA_STRATEGIES])
    parser.add_argument("--no-proxy", dest="proxy", action="store_false", help="skip the run through the proxy")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="run the strategies of a scenario one after another on one mock cluster (default: side by side)",
    )
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=3,
        metavar="N",
        help="strategies run at once, each in its own process, in --strategies order (default 3)",
    )
    parser.add_argument(
        "--builtin-time",
        choices=("scaled", "default"),
        default="scaled",
        help="built-ins' time settings: scaled like ours (default) or LiteLLM's defaults",
    )
    parser.add_argument(
        "--ours",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one of ours' routing settings (JSON value), e.g. --ours adaptive_window=true",
    )
    parser.add_argument(
        "--router",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra litellm.Router setting for every strategy (JSON value), e.g. --router disable_cooldowns=true",
    )
    parser.add_argument(
        "--oracle-lag",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"how late oracle-lagged sees each deployment's behaviour (default {ORACLE_LAG_SECONDS:g})",
    )
    parser.add_argument("--trace", action="store_true", help="print our balancer's estimates during its runs")
    parser.add_argument(
        "--dump",
        default=None,
        metavar="PATH",
        help="pickle every run (results, the mocks' logs, our balancer's trace) by seed and scenario to PATH, "
        "for tracing (bench/trace_routing.py reads it)",
    )
    parser.add_argument(
        "--write", action="store_true", help="write bench/results/<results-name>.md and, with drift, its share PNG"
    )
    parser.add_argument(
        "--results-name",
        default="routing",
        help="with --write: file name (no suffix) under bench/results, e.g. routing_30s for a longer run",
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.results_name):
        parser.error(f"--results-name must be a plain file name (letters, digits, _ . -), got {args.results_name!r}")
    args.argv = list(argv)
    BUILT_IN_TIME = args.builtin_time
    if args.oracle_lag is not None:
        if args.oracle_lag < 0:
            parser.error(f"--oracle-lag must be >= 0 seconds (got {args.oracle_lag})")
        ORACLE_LAG_SECONDS = args.oracle_lag
    for option, items, target in (("--ours", args.ours, OURS_SETTINGS), ("--router", args.router, ROUTER_SETTINGS)):
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"{option} takes KEY=VALUE (got {item!r})")
            try:
                target[key] = json.loads(value)
            except json.JSONDecodeError:
                target[key] = value
    router_keys = set(inspect.signature(litellm.Router.__init__).parameters) - _BENCH_ROUTER_KEYS - {"self"}
    for key in ROUTER_SETTINGS:
        if key not in router_keys:
            why = "the bench sets it itself" if key in _BENCH_ROUTER_KEYS else "not a litellm.Router setting"
            parser.error(f"--router {key}: {why} (e.g. disable_cooldowns, cooldown_time, allowed_fails)")
    return args


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async(parse_args(sys.argv[1:]))))
