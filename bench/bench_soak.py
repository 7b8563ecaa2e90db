"""Soak benchmark: the real proxy (priority limiter + traffic contracts on a local redis-server) under a
sustained mixed load for a few minutes, sampling memory and Redis key count; is growth bounded?

What runs (everything on 127.0.0.1, stopped at the end):

* a redis-server (no persistence, ``maxmemory-policy noeviction``);
* one ``litellm`` proxy (:class:`~litellm_ratebalance.demo.proxy_process.ProxyProcess`) with
  ``litellm_ratebalance.rate_limiter`` and ``litellm_ratebalance.traffic_contracts`` on that Redis, two model
  groups of ``mock_response`` deployments with ``mock_delay`` (``chat``: two deployments, rpm/tpm limits
  that the load exceeds, so there are 429s; ``slow``: one deployment, half a second per call), and a
  ``custom_auth`` module that reads a key's priority and feature from the bearer token;
* an open-loop load (~``--rate`` requests/s, at most ``--concurrency`` in flight) mixing priorities
  (prod / batch / none) and features (two configured, one alias, unassigned), plus hostile traffic: a
  fresh bogus priority and feature on every such request, and requests for unknown model groups. If
  they created state, keys or cache entries would grow with the request count.

Sampled every ``--sample-seconds``: the proxy's RSS (its process group), Redis DBSIZE and used_memory,
and the number of ``litellm_ratebalance_*`` metric series on ``/metrics`` (label cardinality; LiteLLM's
``prometheus`` callback is enabled only to serve ``/metrics``, and its own series are counted apart). Windows
are short (limiter 20 s, contracts 20 s with a 40 s counter TTL) so counters roll over and expire many
times during the run.

Verdicts printed at the end:

* keys bounded: DBSIZE never exceeds the bound the key layouts give (one limiter window hash per limited
  model group, two contract hashes per live contract window; see docs/redis.md);
* memory bounded: the proxy's RSS over the last third of the run grew less than 5% (and less than 30 MB)
  over the middle third (the first third is warm-up: imports, connection pools, caches filling);
* metric labels bounded: no series of ours carries a name the hostile requests invented (our series still
  appear as new mode/reason combinations first happen, a set fixed by the configuration).

Usage::

    python bench/bench_soak.py                 # 3 minutes
    python bench/bench_soak.py --minutes 10
    python bench/bench_soak.py --minutes 1     # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: this checkout's package

import httpx
import redis

from litellm_ratebalance.demo.proxy_process import ProxyProcess, free_port
from litellm_ratebalance.store.keys import KeySpace

PREFIX = "soak"
LIMITER_WINDOW_S = 20
CONTRACT_WINDOW_S, CONTRACT_TTL_S = 20, 40
LIMITED_GROUPS = ("chat", "slow")

AUTH_MODULE = '''
"""custom_auth for the soak benchmark: ``sk-soak.<priority>.<feature>``; "-" means none.

``sk-soak.hostile`` stands for a flood of keys whose admin-set metadata names priorities and features
nobody configured: the names come from the ``x-soak-serial`` header, the key itself stays one key (LiteLLM
labels its own Prometheus metrics by hashed key, which would otherwise grow without bound).
"""
from litellm.proxy._types import UserAPIKeyAuth


async def user_api_key_auth(request, api_key):
    token = api_key.removeprefix("Bearer ").strip()
    if token == "sk-soak.hostile":
        serial = request.headers.get("x-soak-serial", "0")
        token = f"sk-soak.bogus-{serial}.feature-{serial}"
        api_key = "sk-soak.hostile"
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != "sk-soak":
        raise Exception("unknown soak key")
    _, priority, feature = parts
    metadata = {}
    if priority != "-":
        metadata["priority"] = priority
    if feature != "-":
        metadata["feature"] = feature
    # A fixed alias: LiteLLM's own Prometheus metrics label by key alias.
    return UserAPIKeyAuth(api_key=api_key, key_alias="soak", metadata=metadata)
'''


def soak_config() -> dict[str, Any]:
    def deployment(group: str, index: int, delay: float, rpm: int, tpm: int) -> dict[str, Any]:
        return {
            "model_name": group,
            "litellm_params": {
                "model": "openai/soak",
                "api_key": "sk-mock",
                "api_base": "http://127.0.0.1:9/v1",  # never reached: every call is mocked
                "mock_response": "A short answer from a mock deployment.",
                "mock_delay": delay,
                "rpm": rpm,
                "tpm": tpm,
                "max_parallel_requests": 1000,
            },
            "model_info": {"id": f"{group}-{index}"},
        }

    return {
        "model_list": [
            deployment("chat", 0, 0.1, 90, 20_000),
            deployment("chat", 1, 0.1, 90, 20_000),
            deployment("slow", 0, 0.5, 40, 8_000),
        ],
        "litellm_settings": {
            # "prometheus" mounts LiteLLM's /metrics, which serves our metrics too (same default registry).
            "callbacks": ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.traffic_contracts", "prometheus"],
            "require_auth_for_metrics_endpoint": False,  # loopback only; custom_auth knows no admin key
            "priority_reservation": {"prod": 0.6, "batch": 0.3},
            "priority_reservation_settings": {"default_priority": 0.1, "saturation_threshold": 0.5},
            "ratebalance": {
                "key_prefix": PREFIX,
                "limiter": {"window_seconds": LIMITER_WINDOW_S},
                "traffic_contracts": {
                    "window_seconds": CONTRACT_WINDOW_S,
                    "counter_ttl_seconds": CONTRACT_TTL_S,
                    "basket": {"rpm": 300, "tpm": 30_000},
                    "features": {
                        "smart-window": {"rpm": 60, "tpm": 6000, "aliases": ["ai"]},
                        "s2s": {"rpm": 120, "tpm": 12_000},
                    },
                    "enforcement": {"degraded": {"cap_max_tokens": 16}},
                },
            },
        },
        "general_settings": {"custom_auth": "soak_auth.user_api_key_auth"},
        "router_settings": {"num_retries": 0},
    }


def key_bound() -> int:
    """Most keys the layouts allow: one admission window hash per limited model group (it lingers
    ``max(window, 10 s)`` after its window, then the next window reuses the same key), plus an RPM and a
    TPM hash per contract window still alive (each expires ``counter_ttl`` after its start, so at most
    ``ceil(ttl / window) + 1`` windows overlap)."""
    live_windows = -(-CONTRACT_TTL_S // CONTRACT_WINDOW_S) + 1
    return len(LIMITED_GROUPS) + 2 * live_windows


# -- processes -------------------------------------------------------------------------------------------
class RedisProcess:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (make redis-server)")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-soak-redis-"))
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--maxmemory-policy", "noeviction", "--dir", str(self.dir), "--logfile", str(self.dir / "log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.client.close()
        self.process.kill()
        self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def group_rss_bytes(leader_pid: int) -> int:
    """RSS of every process in the proxy's process group (the proxy may run worker processes)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != leader_pid:  # field 5 of stat: the process group id
                continue
            total += int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


# -- load ------------------------------------------------------------------------------------------------
@dataclass
class Tally:
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    skipped: int = 0
    """Arrivals not sent because ``concurrency`` requests were already in flight (keeps the load bounded)."""


def pick_request(rng: random.Random, serial: int) -> tuple[str, str, dict[str, Any]]:
    """(label, bearer token, body) of one request of the mix."""
    roll = rng.random()
    if roll < 0.08:  # hostile: a never-seen priority and feature (see AUTH_MODULE)
        token, label = "sk-soak.hostile", "bogus names"
    elif roll < 0.12:
        token, label = "sk-soak.prod.-", "unknown model"
        return label, token, {"model": f"no-such-model-{serial}", "messages": [{"role": "user", "content": "hi"}]}
    else:
        priority = rng.choices(["prod", "batch", "-"], weights=[3, 5, 2])[0]
        feature = rng.choices(["smart-window", "ai", "s2s", "-"], weights=[3, 1, 4, 2])[0]
        token, label = f"sk-soak.{priority}.{feature}", f"{priority}/{feature}"
    model = "slow" if rng.random() < 0.2 else "chat"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "word " * rng.randint(1, 40)}],
        "max_tokens": rng.randint(8, 64),
    }
    return label, token, body


async def drive(base_url: str, duration_s: float, rate: float, concurrency: int, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    in_flight: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0, limits=limits) as http:

        async def one(token: str, body: dict[str, Any], serial: int) -> None:
            headers = {"Authorization": f"Bearer {token}", "x-soak-serial": str(serial)}
            try:
                response = await http.post("/v1/chat/completions", headers=headers, json=body)
                tally.statuses[(str(body["model"])[:13], response.status_code)] += 1
            except httpx.HTTPError:
                tally.statuses[(str(body["model"])[:13], -1)] += 1

        started = time.monotonic()
        serial = 0
        while time.monotonic() - started < duration_s:
            serial += 1
            _, token, body = pick_request(rng, serial)
            if len(in_flight) >= concurrency:
                tally.skipped += 1
            else:
                task = asyncio.create_task(one(token, body, serial))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            # Poisson arrivals at `rate`, bounded: the loop ends at duration_s whatever happens.
            await asyncio.sleep(min(1.0, rng.expovariate(rate)))
        if in_flight:
            await asyncio.wait(in_flight, timeout=30)


# -- sampling --------------------------------------------------------------------------------------------
@dataclass
class Sample:
    t: float
    rss_mb: float
    keys: int
    redis_mb: float
    series: int
    """Our metric series (``litellm_ratebalance_*``)."""
    hostile_series: int
    litellm_series: int
    """Every other series on /metrics (LiteLLM's own, process and GC metrics)."""
    litellm_hostile_series: int


HOSTILE_MARKERS = ("bogus-", "feature-", "no-such-model-")
"""Parts of the names the hostile requests invent: none may show up as a label value of our metrics."""


def metric_series(base_url: str) -> tuple[int, int, int, int]:
    """(our series, of which carry an invented name, every other series, of which carry an invented name)
    on ``/metrics``; -1s if it cannot be read."""
    try:
        response = httpx.get(f"{base_url}/metrics/", timeout=5, follow_redirects=True)
    except httpx.HTTPError:
        return -1, -1, -1, -1
    if response.status_code != 200:
        return -1, -1, -1, -1
    ours = hostile = other = other_hostile = 0
    for line in response.text.splitlines():
        if not line or line.startswith("#"):
            continue
        invented = any(marker in line for marker in HOSTILE_MARKERS)
        if line.startswith("litellm_ratebalance_"):
            ours += 1
            hostile += invented
        else:
            other += 1
            other_hostile += invented
    return ours, hostile, other, other_hostile


async def sample_loop(
    proxy: ProxyProcess, store: RedisProcess, every_s: float, stop: asyncio.Event, out: list[Sample]
) -> None:
    started = time.monotonic()
    assert proxy.process is not None
    leader = proxy.process.pid
    while not stop.is_set():
        info = await asyncio.to_thread(store.client.info, "memory")
        ours, hostile, other, other_hostile = await asyncio.to_thread(metric_series, proxy.base_url)
        sample = Sample(
            t=time.monotonic() - started,
            rss_mb=group_rss_bytes(leader) / 2**20,
            keys=int(await asyncio.to_thread(store.client.dbsize)),
            redis_mb=int(info["used_memory"]) / 2**20,
            series=ours,
            hostile_series=hostile,
            litellm_series=other,
            litellm_hostile_series=other_hostile,
        )
        out.append(sample)
        print(
            f"  t={sample.t:6.1f}s  proxy RSS {sample.rss_mb:7.1f} MB  redis keys {sample.keys:3d}  "
            f"redis used {sample.redis_mb:6.2f} MB  our series {ours} ({hostile} invented)  LiteLLM series {other}",
            flush=True,
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(samples: list[Sample], tally: Tally, duration_s: float, store: RedisProcess) -> bool:
    print("\nRequests (model group, status): count")
    for (model, status), count in sorted(tally.statuses.items()):
        print(f"  {model:<14} {status:>4}: {count}")
    sent = sum(tally.statuses.values())
    print(f"  sent {sent} in {duration_s:.0f}s ({sent / duration_s:.1f}/s); skipped (concurrency cap) {tally.skipped}")

    print("\nSeries        start      max      end")
    for name, unit, values in (
        ("proxy RSS", "MB", [s.rss_mb for s in samples]),
        ("redis keys", "", [float(s.keys) for s in samples]),
        ("redis used", "MB", [s.redis_mb for s in samples]),
        ("our series", "", [float(s.series) for s in samples]),
        ("LiteLLM ser.", "", [float(s.litellm_series) for s in samples]),
    ):
        print(f"  {name:<11}{values[0]:>8.1f}{max(values):>9.1f}{values[-1]:>9.1f} {unit}")

    bound = key_bound()
    keys_ok = max(s.keys for s in samples) <= bound
    without_ttl = [key for key in store.client.scan_iter(match=f"{PREFIX}:*") if store.client.ttl(key) < 0]
    third = max(1, len(samples) // 3)
    middle = mean([s.rss_mb for s in samples[third : 2 * third]])
    last = mean([s.rss_mb for s in samples[2 * third :]])
    growth = last - middle
    rss_ok = growth < 0.05 * middle and growth < 30.0
    # Our label values come from config and fixed sets: a series count that settles, none invented.
    series_ok = max(s.hostile_series for s in samples) == 0 and samples[-1].series >= 0
    unexpected = [k for k in store.client.scan_iter(match="*") if not k.decode().startswith(f"{PREFIX}:")]

    print(f"\nkeys bounded:   {'yes' if keys_ok else 'NO'} (max {max(s.keys for s in samples)}, layout bound {bound})")
    print(f"keys with TTL:  {'yes' if not without_ttl else 'NO: ' + ', '.join(map(repr, without_ttl[:5]))}")
    print(f"other keys:     {len(unexpected)} outside the {PREFIX}: prefix")
    print(
        f"memory bounded: {'yes' if rss_ok else 'NO'} (proxy RSS mean {middle:.1f} MB over the middle third, "
        f"{last:.1f} MB over the last third: {growth:+.1f} MB)"
    )
    print(
        f"metric labels:  {'bounded' if series_ok else 'NOT BOUNDED'} (our series: {samples[third].series} after "
        f"warm-up, {samples[-1].series} at the end; with an invented name: {max(s.hostile_series for s in samples)})"
    )
    print(f"key layouts:    {', '.join(_layout_names())}")
    print(
        f"LiteLLM's own:  {samples[-1].litellm_series} series at the end, {samples[-1].litellm_hostile_series} of "
        "them naming an invented model (LiteLLM's Prometheus labels by requested model; not ours)"
    )
    return keys_ok and not without_ttl and rss_ok and series_ok


def _layout_names() -> list[str]:
    keys = KeySpace(PREFIX)
    return [keys.admission_window(group) for group in LIMITED_GROUPS] + [
        keys.contract_window("rpm", 0).replace(":{0}", ":{<window start>}"),
        keys.contract_window("tpm", 0).replace(":{0}", ":{<window start>}"),
    ]


async def main_async(args: argparse.Namespace) -> int:
    duration_s = args.minutes * 60.0
    store = RedisProcess()
    workdir = Path(tempfile.mkdtemp(prefix="ratebalance-soak-"))
    config = soak_config()
    config["litellm_settings"]["ratebalance"]["redis_url"] = store.url
    proxy = ProxyProcess(config, workdir, files={"soak_auth.py": AUTH_MODULE}, env={"PYTHONPATH": _pythonpath()})
    try:
        print(f"starting redis-server on {store.port} and the proxy on {proxy.port} ...", flush=True)
        await asyncio.to_thread(proxy.start)
        print(
            f"soak: {args.minutes:g} min, ~{args.rate:g} req/s, at most {args.concurrency} in flight, "
            f"sample every {args.sample_seconds:g}s",
            flush=True,
        )
        samples: list[Sample] = []
        tally = Tally()
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_loop(proxy, store, args.sample_seconds, stop, samples))
        await drive(proxy.base_url, duration_s, args.rate, args.concurrency, tally, args.seed)
        stop.set()
        await sampler
        if len(samples) < 3:
            print("too few samples for a verdict (run longer)")
            return 1
        ok = report(samples, tally, duration_s, store)
        print(f"\nverdict: {'growth bounded' if ok else 'GROWTH NOT BOUNDED (see above)'}")
        return 0 if ok else 1
    finally:
        proxy.stop()
        store.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="load duration (default 3)")
    parser.add_argument("--rate", type=float, default=15.0, help="mean arrivals per second (default 15)")
    parser.add_argument("--concurrency", type=int, default=40, help="most requests in flight (default 40)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="sampling interval (default 5)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if not 0.2 <= args.minutes <= 120 or not 0.1 <= args.rate <= 200 or not 1 <= args.concurrency <= 500:
        parser.error("--minutes 0.2..120, --rate 0.1..200, --concurrency 1..500")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
