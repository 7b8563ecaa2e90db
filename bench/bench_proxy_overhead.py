"""What our callbacks cost the proxy: requests/s of the real ``litellm`` proxy with each configuration, against the
bare proxy, LiteLLM's own ``dynamic_rate_limiter_v3`` beside ours.

Set-up (everything on loopback, started by this script):

* one ``redis-server``; every proxy reaches it as LiteLLM's Redis (``litellm_settings.cache_params``, response
  caching off), which is where our store and LiteLLM's limiter find it;
* three mock OpenAI-compatible deployments of one model group ``chat`` (``openai/gpt-4o-mini``) in their own
  process (:mod:`litellm_ratebalance.simulate.mock_openai`): 10 ms before the answer, then 20,000 tokens/s, no
  capacity limit, so the upstream is never what bounds the throughput;
* one proxy process per configuration (``litellm --config``, one worker, ``LITELLM_LOG=ERROR``), all started at
  the beginning; deployment ``rpm``/``tpm`` and every contract far above the offered load (nothing is refused:
  this is the cost of the admitted path);
* callers: the demo's three keys (:mod:`litellm_ratebalance.demo.demo_auth`: priorities ``prod`` / ``batch`` /
  none, traffic-contract features from key or team metadata), in turn;
* requests: a fixed, seeded list of chat bodies of 1-5 messages (20-4,000 characters each), answers of 20-200
  tokens (the mock's ``[answer:N]`` tag), ``max_tokens`` in one request of five (above the answer), none in the
  others;
* 16 closed-loop clients (one request at a time each, the next as soon as the answer is read) on one proxy at a
  time; the others idle.

Configurations: ``bare`` (no callback), ``litellm-v3`` (``dynamic_rate_limiter_v3`` with the same
``priority_reservation`` as ours), ``limiter``, ``balancer``, ``contracts``, ``limiter+balancer+contracts`` and
``all`` (those three with ``backpressure`` and ``cost``, in ``example_config.yaml``'s order; backpressure manages
no deployment of this API model group, cost charges LiteLLM's response cost), and ``noop`` (three callbacks with
the hooks of our limiter, contracts and balancer that do nothing, ``bench/overhead_noop.py``: what LiteLLM's own
calling of such callbacks costs, before any of our work).

Each configuration runs in ``--instances`` proxy processes (default 2) that take the rounds in turn: one process
can run 10-20 % slower than another with the same code and config for its whole life (memory layout), which one
process per configuration would pin on the configuration.

Rounds: after one warm-up pass over every proxy, each round measures every configuration once (the order rotates
from round to round), ``--warmup`` seconds of load, then ``--seconds`` counted. A configuration's ratio in a
round is its requests/s over the bare proxy's in the same round; the table gives the median over rounds and the
range. Also printed: the proxy's CPU time per request (its process group, from ``/proc``; less sensitive to other
work on the machine than requests/s) and the load average before and after.

``--compare-tree DIR`` adds, for every configuration with our callbacks, the same configuration importing
``litellm_ratebalance`` from DIR (another checkout, e.g. ``git archive <commit> | tar -x -C DIR``), measured in the
same rounds: a before/after comparison under the same machine state.

``--profile SECONDS`` then samples each proxy but the bare one for that long with py-spy (100 Hz, not pausing it)
under the same load and prints the share of its busy samples inside the callbacks: ours per component, LiteLLM's
``dynamic_rate_limiter_v3`` hooks (background tasks they start are not counted). That says where the cost is, and
is a figure that other work on the machine disturbs much less than requests/s (a proportion of the proxy's own
samples; the throughput left to it is about 1 - share). Needs ``pip install py-spy`` and permission to trace the
proxy (same user).

Usage::

    python bench/bench_proxy_overhead.py                 # about 6 minutes on 2 cores
    python bench/bench_proxy_overhead.py --rounds 7 --seconds 20
    python bench/bench_proxy_overhead.py --configs bare,contracts --compare-tree /tmp/rb-before --profile 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # importing litellm must not go to the network

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from aiohttp import ClientSession, ClientTimeout, TCPConnector  # noqa: E402

from litellm_ratebalance.demo.demo_auth import DEMO_KEYS  # noqa: E402
from litellm_ratebalance.demo.proxy_process import ProxyProcess  # noqa: E402
from litellm_ratebalance.demo.services import LocalRedis  # noqa: E402
from litellm_ratebalance.simulate.mock_openai import (  # noqa: E402
    Behaviour,
    DeploymentSpec,
    MockClusterProcess,
    answer_tag,
)

AUTH_FILE = Path(__file__).with_name("overhead_auth.py")
NOOP_FILE = Path(__file__).with_name("overhead_noop.py")
MODEL_GROUP = "chat"
DEPLOYMENTS = ("m1", "m2", "m3")
KEYS = tuple(DEMO_KEYS)
RESERVATION = {"prod": 0.6, "batch": 0.3}
"""``priority_reservation`` of both limiters (LiteLLM's key, read by ours with LiteLLM's meaning)."""
HIGH = 1_000_000_000
"""rpm / tpm of every deployment and contract: far above what the clients offer."""

LIMITER = "litellm_ratebalance.rate_limiter"
BALANCER = "litellm_ratebalance.rate_balancer"
CONTRACTS = "litellm_ratebalance.traffic_contracts"
BACKPRESSURE = "litellm_ratebalance.backpressure"
COST = "litellm_ratebalance.cost"
CONFIGS: dict[str, tuple[str, ...]] = {
    "bare": (),
    "litellm-v3": ("dynamic_rate_limiter_v3",),
    "limiter": (LIMITER,),
    "balancer": (BALANCER,),
    "contracts": (CONTRACTS,),
    "limiter+balancer+contracts": (LIMITER, CONTRACTS, BALANCER),
    "noop": ("overhead_noop.noop_limiter", "overhead_noop.noop_contracts", "overhead_noop.noop_balancer"),
    "all": (LIMITER, CONTRACTS, BACKPRESSURE, BALANCER, COST),
}
OURS = frozenset(
    name for name, callbacks in CONFIGS.items() if any(c.startswith("litellm_ratebalance.") for c in callbacks)
)

PROBLEM_WORDS = ("store error", "Traceback", "ERROR", "Exception")
VOCABULARY = (
    "the quick brown fox jumps over a lazy dog while our service answers questions about orders refunds "
    "shipping invoices and accounts in several languages with short and long explanations"
)


# -- the proxies ----------------------------------------------------------------------------------------------------
def proxy_config(callbacks: Sequence[str], api_bases: dict[str, str], redis_port: int) -> dict[str, Any]:
    model_list = [
        {
            "model_name": MODEL_GROUP,
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": api_bases[name],
                "api_key": "sk-fake-upstream",
                "rpm": HIGH,
                "tpm": HIGH,
                "max_parallel_requests": 100_000,
            },
            "model_info": {"id": name},
        }
        for name in DEPLOYMENTS
    ]
    contract = {"rpm": HIGH, "tpm": HIGH}
    ratebalance = {
        "traffic_contracts": {
            "basket": contract,
            "features": {
                "checkout-assistant": {**contract, "aliases": ["assistant"]},
                "summaries": contract,
                "search": {"rpm": HIGH, "aliases": ["lookup"]},
            },
        },
    }
    litellm_settings: dict[str, Any] = {
        "cache": True,
        "cache_params": {"type": "redis", "host": "127.0.0.1", "port": redis_port, "mode": "default_off"},
        "priority_reservation": dict(RESERVATION),
        "ratebalance": ratebalance,
    }
    if callbacks:
        litellm_settings["callbacks"] = list(callbacks)
    return {
        "model_list": model_list,
        "litellm_settings": litellm_settings,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 0},
        "general_settings": {"custom_auth": "overhead_auth.user_api_key_auth"},
    }


@dataclass
class Proxy:
    name: str
    process: ProxyProcess
    paused: bool = False

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, ..., utime (14th field overall), stime (15th).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


# -- the load ---------------------------------------------------------------------------------------------------------
def request_bodies(seed: int, count: int = 512) -> list[dict[str, Any]]:
    """Chat bodies as an application sends them: 1-5 messages of varied length, max_tokens in one of five."""
    rng = random.Random(seed)
    vocabulary = VOCABULARY.split()

    def text(chars: int) -> str:
        words: list[str] = []
        size = 0
        while size < chars:
            word = rng.choice(vocabulary)
            words.append(word)
            size += len(word) + 1
        return " ".join(words)

    bodies = []
    for _ in range(count):
        turns = rng.randint(1, 5)
        messages: list[dict[str, str]] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": text(int(rng.uniform(50, 600)))})
        for turn in range(turns):
            role = "user" if turn % 2 == 0 else "assistant"
            messages.append({"role": role, "content": text(int(min(4000, rng.lognormvariate(5.0, 1.0) + 20)))})
        if messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": text(int(rng.uniform(20, 300)))})
        answer = rng.randint(20, 200)
        messages[-1]["content"] += " " + answer_tag(answer)
        body: dict[str, Any] = {"model": MODEL_GROUP, "messages": messages}
        if rng.random() < 0.2:
            body["max_tokens"] = answer + rng.choice((50, 200, 1000))
        bodies.append(body)
    return bodies


@dataclass
class Measurement:
    config: str
    round: int
    seconds: float
    ok: int
    failed: Counter[str] = field(default_factory=Counter)
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.cpu_seconds / max(1, self.ok)


async def closed_loop(
    base_url: str, bodies: Sequence[dict[str, Any]], clients: int, warmup: float, seconds: float, pgid: int
) -> tuple[int, Counter[str], float, list[float]]:
    """``clients`` closed-loop clients for ``warmup + seconds``; what finished within the counted part."""
    connector = TCPConnector(limit=0, force_close=False)
    failed: Counter[str] = Counter()
    latencies: list[float] = []
    ok = 0
    async with ClientSession(base_url, connector=connector, timeout=ClientTimeout(total=60)) as session:
        start = time.monotonic()
        counted_from = start + warmup
        stop_at = counted_from + seconds
        cpu_at_start: list[float] = []

        async def client(index: int) -> None:
            nonlocal ok
            position = index * 37
            while True:
                sent = time.monotonic()
                if sent >= stop_at:
                    return
                body = bodies[position % len(bodies)]
                key = KEYS[position % len(KEYS)]
                position += 1
                try:
                    async with session.post(
                        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                    ) as response:
                        await response.read()
                        status = response.status
                except Exception as exc:  # a refused connection, a timeout: counted, never raised
                    status, reason = 0, type(exc).__name__
                else:
                    reason = str(status)
                done = time.monotonic()
                if counted_from <= done < stop_at:
                    if status == 200:
                        ok += 1
                        latencies.append(done - sent)
                    else:
                        failed[reason] += 1

        async def mark_cpu() -> None:
            await asyncio.sleep(max(0.0, counted_from - time.monotonic()))
            cpu_at_start.append(group_cpu_seconds(pgid))

        marker = asyncio.create_task(mark_cpu())
        workers = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        cpu_used = group_cpu_seconds(pgid) - cpu_at_start[0]
        await marker
        await asyncio.gather(*workers)
    return ok, failed, cpu_used, latencies


# -- the run ----------------------------------------------------------------------------------------------------------
def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def instance_key(name: str, index: int) -> str:
    """The key of a configuration's ``index``-th proxy process in the dict :func:`start_proxies` returns."""
    return f"{name} #{index}"


def start_proxies(
    names: Sequence[str],
    trees: dict[str, Path],
    api_bases: dict[str, str],
    redis_port: int,
    workdir: Path,
    instances: int = 1,
) -> dict[str, Proxy]:
    """``instances`` proxy processes per configuration, keyed by :func:`instance_key`."""
    proxies: dict[str, Proxy] = {}
    for name, index in ((name, index) for name in names for index in range(instances)):
        base = name.split(" @", 1)[0]
        # The checkout the proxy imports our package from (ahead of the venv's install), and quiet logs.
        env = {"PYTHONPATH": str(trees[name]), "LITELLM_LOG": "ERROR"}
        if "dynamic_rate_limiter_v3" in CONFIGS[base]:
            env["RATEBALANCE_BENCH_LITELLM_LICENSE"] = "1"
        folder = workdir / f"{name.replace(' @', '-at-').replace('+', '-')}-{index}"
        process = ProxyProcess(
            proxy_config(CONFIGS[base], api_bases, redis_port),
            folder,
            files={AUTH_FILE.name: AUTH_FILE.read_text(), NOOP_FILE.name: NOOP_FILE.read_text()},
            env=env,
        )
        proxies[instance_key(name, index)] = Proxy(name, process)
    for proxy in proxies.values():
        proxy.process.launch()
    try:
        for proxy in proxies.values():
            proxy.process.wait_ready(timeout=240)
    except BaseException:
        stop_proxies(proxies)
        raise
    return proxies


def log_problems(proxies: dict[str, Proxy]) -> list[str]:
    """One line per proxy whose log reports an error or a store fault (every number above is then suspect)."""
    lines = []
    for proxy in proxies.values():
        try:
            text = proxy.process.log_path.read_text(errors="replace")
        except OSError:
            continue
        hits = [line for line in text.splitlines() if any(word in line for word in PROBLEM_WORDS)]
        if hits:
            lines.append(f"{proxy.name}: {len(hits)} log lines like: {hits[0][:200]}")
    return lines


def stop_proxies(proxies: dict[str, Proxy]) -> None:
    for proxy in proxies.values():
        if proxy.paused:
            proxy.resume()
        proxy.process.terminate()
    for proxy in proxies.values():
        proxy.process.stop()


async def measure(
    proxy: Proxy, bodies: Sequence[dict[str, Any]], args: argparse.Namespace, round_: int, pause_idle: bool
) -> Measurement:
    if pause_idle:
        proxy.resume()
    try:
        ok, failed, cpu, latencies = await closed_loop(
            proxy.process.base_url, bodies, args.clients, args.warmup, args.seconds, proxy.pid
        )
        # Background work after the last answers (logging, batched settles) finishes before the pause: a store
        # call caught by the pause would time out when the proxy resumes.
        await asyncio.sleep(1.0)
    finally:
        if pause_idle:
            proxy.pause()
    return Measurement(proxy.name, round_, args.seconds, ok, failed, cpu, latencies)


def summarise(names: Sequence[str], results: list[Measurement]) -> list[str]:
    """The table: per configuration the median over rounds, and each round's figure over the bare proxy's of the
    same round (requests/s; and bare CPU per request over this configuration's, the throughput the CPU alone
    would allow when the proxy's core is not shared)."""
    by_round: dict[int, dict[str, Measurement]] = {}
    for m in results:
        by_round.setdefault(m.round, {})[m.config] = m
    lines = [
        "| configuration | requests/s | vs bare | range | proxy CPU ms/request | vs bare by CPU | range | "
        "p50 latency ms | failed |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for name in names:
        rows = [r[name] for r in by_round.values() if name in r]
        paired = [(r[name], r["bare"]) for r in by_round.values() if name in r and r["bare"].ok and r[name].ok]
        ratios = [m.rps / bare.rps for m, bare in paired]
        cpu_ratios = [bare.cpu_ms_per_request / m.cpu_ms_per_request for m, bare in paired]
        failed = sum(sum(m.failed.values()) for m in rows)
        latencies = [x for m in rows for x in m.latencies]
        lines.append(
            f"| {name} | {statistics.median(m.rps for m in rows):.1f} | "
            f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}-{max(ratios):.3f} | "
            f"{statistics.median(m.cpu_ms_per_request for m in rows):.2f} | "
            f"{statistics.median(cpu_ratios):.3f}x | {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f} | "
            f"{1000 * statistics.median(latencies) if latencies else float('nan'):.1f} | {failed} |"
        )
    return lines


def configurations(args: argparse.Namespace) -> tuple[list[str], dict[str, Path]]:
    """The configurations to measure, in order (bare first), and the checkout each imports our package from."""
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    if "bare" not in names:
        names.insert(0, "bare")
    trees = {name: REPO for name in names}
    if args.compare_tree is not None:
        other = Path(args.compare_tree).resolve()
        if not (other / "litellm_ratebalance" / "__init__.py").is_file():
            raise SystemExit(f"--compare-tree: {other} holds no litellm_ratebalance package")
        for name in [n for n in names if n in OURS]:
            label = f"{name} @{args.compare_label}"
            names.insert(names.index(name), label)
            trees[label] = other
    return names, trees


async def measure_rounds(
    proxies: dict[str, Proxy], names: list[str], bodies: list[dict[str, Any]], args: argparse.Namespace
) -> list[Measurement] | None:
    """The warm-up pass, then ``args.rounds`` rounds over every configuration; None if a proxy serves nothing."""
    if args.pause_idle:
        for proxy in proxies.values():
            proxy.pause()
    for proxy in proxies.values():  # warm-up pass (first requests import and build lazily)
        warm = argparse.Namespace(**{**vars(args), "warmup": 0.0, "seconds": args.first_warmup})
        first = await measure(proxy, bodies, warm, -1, args.pause_idle)
        if first.ok == 0:
            print(f"{proxy.name}: no request succeeded ({dict(first.failed)}); log tail:")
            print(proxy.process.log_tail())
            return None
    print(f"load average before: {loadavg()}")
    results = []
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            proxy = proxies[instance_key(name, round_ % args.instances)]
            m = await measure(proxy, bodies, args, round_, args.pause_idle)
            results.append(m)
            extra = f", failed {dict(m.failed)}" if m.failed else ""
            print(
                f"round {round_ + 1} {name:<34} {m.rps:7.1f} req/s  {m.cpu_ms_per_request:5.2f} CPU ms/request{extra}",
                flush=True,
            )
    print(f"load average after: {loadavg()}")
    return results


# -- where the time goes: py-spy on a proxy under the same load --------------------------------------------------------
def py_spy() -> str | None:
    candidate = Path(sys.executable).with_name("py-spy")
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


COMPONENT_FILES = (
    ("limiter", ("proxy/admission/", "admission/")),
    ("contracts", ("proxy/contracts/", "contracts/")),
    ("balancer", ("proxy/routing/", "routing/")),
    ("backpressure", ("proxy/backpressure/", "overload/")),
    ("cost", ("proxy/cost/", "attribution/")),
    ("store", ("store/",)),  # a store call whose caller py-spy did not see (a resumed coroutine)
)


def component_of(frame: str) -> str:
    """Our component a py-spy frame (``function (path:line)``) belongs to; its file otherwise."""
    path = frame.rsplit("litellm_ratebalance/", 1)[-1].split(":", 1)[0]
    for component, prefixes in COMPONENT_FILES:
        if path.startswith(prefixes):
            return component
    return path


LITELLM_V3_FILE = "litellm/proxy/hooks/dynamic_rate_limiter_v3.py"
WHAT_INSIDE = (("token counting", "litellm_ratebalance/proxy/tokens.py"), ("store calls", "litellm_ratebalance/store/"))
"""Work inside our callbacks counted apart as well, by a frame anywhere on the stack."""


def callback_share(raw: str) -> tuple[int, Counter[str], Counter[str]]:
    """From py-spy's raw (collapsed) stacks: the busy samples of the proxy's event loop and worker threads (idle
    thread-pool workers left out); per component, the samples inside our package, by the outermost frame of ours
    (the bench's auth module, the demo's, is not one of our callbacks and is left out), or inside LiteLLM's
    ``dynamic_rate_limiter_v3`` hook (``litellm-v3``); and of ours, those in :data:`WHAT_INSIDE`."""
    busy = 0
    shares: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or not count.isdigit() or frames[-1].startswith("_worker (concurrent/futures/thread.py"):
            continue  # (a frame name py-spy printed over two lines has no count of its own)
        busy += int(count)
        for frame in frames:
            if "litellm_ratebalance/" in frame and "litellm_ratebalance/demo/" not in frame:
                shares[component_of(frame)] += int(count)
                for what, path in WHAT_INSIDE:
                    if path in stack:
                        inside[what] += int(count)
                break
            if LITELLM_V3_FILE in frame:
                shares["litellm-v3"] += int(count)
                break
    return busy, shares, inside


async def profile(proxy: Proxy, bodies: list[dict[str, Any]], args: argparse.Namespace, workdir: Path) -> str:
    """``args.profile`` seconds of py-spy (100 Hz, without pausing the proxy) under the bench's load; one line."""
    binary = py_spy()
    if binary is None:
        return f"{proxy.name}: py-spy not found (pip install py-spy)"
    out = workdir / f"py-spy-{proxy.pid}.txt"
    if args.pause_idle:
        proxy.resume()
    try:
        load = asyncio.create_task(
            closed_loop(proxy.process.base_url, bodies, args.clients, 0.0, args.profile + 2.0, proxy.pid)
        )
        await asyncio.sleep(1.0)
        command = [binary, "record", "--nonblocking", "-r", "100", "-d", str(int(args.profile)), "-f", "raw"]
        spy = await asyncio.create_subprocess_exec(
            *command, "-o", str(out), "-p", str(proxy.pid), stdout=asyncio.subprocess.DEVNULL
        )
        await spy.wait()
        await load
        await asyncio.sleep(1.0)
    finally:
        if args.pause_idle:
            proxy.pause()
    try:
        busy, shares, inside = callback_share(out.read_text())
    except OSError:
        return f"{proxy.name}: py-spy wrote nothing (ptrace not permitted?)"
    except ValueError as exc:  # an output format this parser does not know: say so, keep the run's table
        return f"{proxy.name}: py-spy output not understood ({exc})"
    if not busy:
        return f"{proxy.name}: no samples"
    parts = ", ".join(f"{name} {100 * n / busy:.2f}%" for name, n in shares.most_common())
    of_which = "".join(f"; of ours, {what} {100 * n / busy:.2f}%" for what, n in inside.items())
    return (
        f"{proxy.name}: callbacks {100 * sum(shares.values()) / busy:.2f}% of {busy} busy samples ({parts}{of_which})"
    )


async def run(args: argparse.Namespace, names: list[str], trees: dict[str, Path]) -> int:
    bodies = request_bodies(args.seed)
    specs = [
        DeploymentSpec(name, Behaviour(token_rate=20_000, base_latency=0.01, capacity=100_000, jitter=0.0))
        for name in DEPLOYMENTS
    ]
    print(f"configurations: {', '.join(names)}")
    print(f"{args.clients} closed-loop clients, {args.rounds} rounds of {args.warmup:g} s warm-up + {args.seconds:g} s")
    workdir = Path(tempfile.mkdtemp(prefix="ratebalance-bench-overhead-"))
    try:
        with LocalRedis() as redis_server:
            async with MockClusterProcess(specs) as cluster:
                started = time.monotonic()
                proxies = await asyncio.to_thread(
                    start_proxies, names, trees, cluster.api_bases, redis_server.port, workdir, args.instances
                )
                print(f"{len(proxies)} proxies live after {time.monotonic() - started:.0f} s")
                try:
                    results = await measure_rounds(proxies, names, bodies, args)
                    if results is None:
                        return 1
                    print()
                    print("\n".join(summarise(names, results)), flush=True)
                    if args.profile > 0:
                        print(
                            f"\nShare of each proxy's busy samples in the callbacks (py-spy, {args.profile:g} s each):"
                        )
                        for name in names:
                            if name.split(" @", 1)[0] != "bare":
                                print(await profile(proxies[instance_key(name, 0)], bodies, args, workdir), flush=True)
                    for line in log_problems(proxies):
                        print(f"warning: {line}")
                finally:
                    await asyncio.to_thread(stop_proxies, proxies)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="counted seconds per configuration and round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before counting, each time")
    parser.add_argument("--first-warmup", type=float, default=4.0, help="seconds of load per proxy before round 1")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--compare-tree", default=None, help="also run our configurations from this checkout")
    parser.add_argument("--compare-label", default="before", help="label of the --compare-tree configurations")
    parser.add_argument(
        "--no-pause-idle",
        dest="pause_idle",
        action="store_false",
        help="leave the proxies not being measured running (default: stopped with SIGSTOP until their turn)",
    )
    parser.add_argument(
        "--profile",
        type=float,
        default=0.0,
        help="after the rounds, this many seconds of py-spy on each proxy with our callbacks, under the same load: "
        "the share of its busy samples inside our hooks (needs py-spy: pip install py-spy)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=2,
        help="proxy processes per configuration, taking the rounds in turn: one process can run a steady 10-20 %% "
        "slower or faster than another with identical code and config for its whole life, so one per "
        "configuration would pin that on the configuration",
    )
    args = parser.parse_args(argv)
    if args.instances < 1:
        parser.error("--instances: at least 1")
    names, trees = configurations(args)
    return asyncio.run(run(args, names, trees))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
