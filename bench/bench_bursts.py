"""Concurrent bursts at an rpm and a tpm limit through two real proxy replicas on one redis-server: our
limiter and LiteLLM's ``dynamic_rate_limiter_v3`` side by side, with default settings, on a quiet machine and
with two CPU-burning processes beside the proxies.

Per run and limiter, every burst goes to a model group of its own (a fresh limiter window):

* rpm: ``rpm: 30``; N requests at once (N = --sizes, default 100 300 1000), half to each replica; admitted =
  the 200s (the rest are 429s). Exact is 30.
* tpm: ``tpm: 600``; 60 requests at once with ``max_tokens: 20`` and a prompt LiteLLM counts as 10 tokens (the
  mock deployment reports 10 + 20 tokens per answer, so the count and the usage agree); served = the tokens
  of the 200s' usage, over the tpm.

Our replicas also serve ``/metrics``; the bench reads ``litellm_ratebalance_store_errors_total`` before and
after each burst: store errors during the burst by cause (should be none: Redis is local and healthy).

Usage::

    python bench/bench_bursts.py                      # 3 runs of each, quiet and with 2 hogs (~10 min)
    python bench/bench_bursts.py --runs 10            # the figures in the README
    python bench/bench_bursts.py --hogs 0 --sizes 100 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from litellm_ratebalance.demo.proxy_process import ProxyProcess
from litellm_ratebalance.demo.services import LocalRedis

RPM, TPM = 30, 600
TPM_BURST = 60
MAX_TOKENS = 20
PROMPT = "Say hello."
"""LiteLLM's token counter gives 10 prompt tokens, as many as its ``mock_response`` reports."""
UPSTREAM_DELAY_S = 0.5
REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_PER_KIND = 130
"""Model groups per kind configured up front: each burst takes the next one (a fresh window)."""


def deployment(name: str, **limit: int) -> dict[str, Any]:
    return {
        "model_name": name,
        "litellm_params": {
            "model": "openai/fake",
            "api_key": "sk-fake",
            "api_base": "http://127.0.0.1:9/v1",  # never reached: mocked
            "mock_response": "Hello world!",
            "mock_delay": UPSTREAM_DELAY_S,
            "max_parallel_requests": 100_000,  # LiteLLM's own default cap would refuse a burst first
            **limit,
        },
    }


def model_list() -> list[dict[str, Any]]:
    rpm = [deployment(f"rpm-{i}", rpm=RPM) for i in range(MODELS_PER_KIND)]
    tpm = [deployment(f"tpm-{i}", tpm=TPM) for i in range(MODELS_PER_KIND)]
    return rpm + tpm


def ours_config(redis_url: str) -> dict[str, Any]:
    return {
        "model_list": model_list(),
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter", "prometheus"],
            "require_auth_for_metrics_endpoint": False,
            "ratebalance": {"key_prefix": "bench-bursts", "redis_url": redis_url},
        },
        "router_settings": {"num_retries": 0},
    }


def litellm_config(redis_port: int) -> dict[str, Any]:
    return {
        "model_list": model_list(),
        "litellm_settings": {
            "callbacks": ["dynamic_rate_limiter_v3"],
            "cache": True,
            "cache_params": {"type": "redis", "host": "127.0.0.1", "port": redis_port, "mode": "default_off"},
        },
        "router_settings": {"num_retries": 0},
    }


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    burn = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@dataclass(frozen=True, slots=True)
class Outcome:
    admitted: int
    served_tokens: int
    other_statuses: int
    store_errors: int
    causes: dict[str, int]
    """Store errors by cause."""


async def store_errors(client: httpx.AsyncClient, proxy: ProxyProcess) -> Counter[str]:
    """``litellm_ratebalance_store_errors_total`` of one replica, summed by cause."""
    response = await client.get(f"{proxy.base_url}/metrics/", follow_redirects=True)
    by_cause: Counter[str] = Counter()
    for line in response.text.splitlines():
        if line.startswith("litellm_ratebalance_store_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            cause = labels.split('cause="', 1)[1].split('"', 1)[0] if 'cause="' in labels else "?"
            by_cause[cause] += int(float(value))
    return by_cause


async def errors_of(client: httpx.AsyncClient, replicas: list[ProxyProcess]) -> Counter[str]:
    total: Counter[str] = Counter()
    for proxy in replicas:
        total += await store_errors(client, proxy)
    return total


async def burst(replicas: list[ProxyProcess], model: str, count: int, max_tokens: int | None, metrics: bool) -> Outcome:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        before = await errors_of(client, replicas) if metrics else Counter()
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{replicas[i % 2].base_url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {replicas[i % 2].master_key}"},
                    json=body,
                )
                for i in range(count)
            ),
            return_exceptions=True,
        )
        after = await errors_of(client, replicas) if metrics else Counter()
    served = [r for r in responses if isinstance(r, httpx.Response) and r.status_code == 200]
    other = sum(1 for r in responses if not isinstance(r, httpx.Response) or r.status_code not in (200, 429))
    tokens = sum(int(r.json()["usage"]["total_tokens"]) for r in served)
    errors = after - before
    return Outcome(len(served), tokens, other, sum(errors.values()), dict(errors))


def _row_order(item: tuple[tuple[str, int, str], list[Outcome]]) -> tuple[int, int, str]:
    (name, hogs, workload), _ = item
    size = int(workload.split()[1]) if workload.startswith("rpm") else 10**9  # rpm bursts by size, then tpm
    return hogs, size, name


def describe(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return fmt.format(low) if low == high else f"{fmt.format(low)}-{fmt.format(high)}"


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ratebalance-bench-bursts-"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    results: dict[tuple[str, int, str], list[Outcome]] = {}
    next_model = {"rpm": 0, "tpm": 0}
    with LocalRedis() as redis_server:
        groups = {
            "ours": [ProxyProcess(ours_config(redis_server.url), workdir / f"ours{i}", env=env) for i in range(2)],
            "litellm-v3": [
                ProxyProcess(litellm_config(redis_server.port), workdir / f"v3-{i}", env=env) for i in range(2)
            ],
        }
        chosen = {name: procs for name, procs in groups.items() if name in args.limiters}
        everything = [p for procs in chosen.values() for p in procs]
        try:
            for proxy in everything:
                proxy.launch()
            await asyncio.gather(*(p.wait_ready_async() for p in everything))
            print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
            for run in range(args.runs):
                for hogs in args.hogs:
                    with cpu_hogs(hogs):
                        for name, replicas in chosen.items():
                            metrics = name == "ours"
                            for size in args.sizes:
                                model = f"rpm-{next_model['rpm']}"
                                next_model["rpm"] += 1
                                outcome = await burst(replicas, model, size, None, metrics)
                                results.setdefault((name, hogs, f"rpm {size}"), []).append(outcome)
                            model = f"tpm-{next_model['tpm']}"
                            next_model["tpm"] += 1
                            outcome = await burst(replicas, model, TPM_BURST, MAX_TOKENS, metrics)
                            results.setdefault((name, hogs, "tpm"), []).append(outcome)
                print(f"run {run + 1}/{args.runs} done, load {os.getloadavg()[0]:.2f}", flush=True)
        finally:
            for proxy in everything:
                proxy.terminate()
            for proxy in everything:
                proxy.stop()

    print()
    print(f"## Bursts over 2 replicas, one redis-server ({args.runs} runs per cell; range over runs)")
    print()
    print(
        "| limiter | CPU hogs | burst | admitted (limit 30) / served tokens per tpm | store errors | other statuses |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, hogs, workload), outcomes in sorted(results.items(), key=_row_order):
        if workload == "tpm":
            figure = describe([o.served_tokens / TPM for o in outcomes], "{:.2f}x")
            label = f"tpm {TPM}, {TPM_BURST} at once, max_tokens {MAX_TOKENS}"
        else:
            figure = describe([o.admitted for o in outcomes])
            label = f"rpm {RPM}, {workload.split()[1]} at once"
        errors = describe([o.store_errors for o in outcomes]) if name == "ours" else "n/a"
        causes = sum((Counter(o.causes) for o in outcomes), Counter())
        if causes:
            errors += " (" + ", ".join(f"{cause} {count}" for cause, count in sorted(causes.items())) + ")"
        print(f"| {name} | {hogs} | {label} | {figure} | {errors} | {describe([o.other_statuses for o in outcomes])} |")
    exact = all(
        o.admitted == RPM and o.store_errors == 0 and o.other_statuses == 0
        for (name, _h, w), outs in results.items()
        if name == "ours" and w != "tpm"
        for o in outs
    )
    print(f"\nours exact on every rpm burst with no store error: {exact}")
    fills = [o.served_tokens / TPM for (n, _h, w), outs in results.items() if n == "ours" and w == "tpm" for o in outs]
    print(f"ours, tpm bursts: at most {max(fills, default=0):.2f}x the tpm")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--hogs", type=int, nargs="+", default=[0, 2], help="CPU-burning processes per phase")
    parser.add_argument("--limiters", nargs="+", default=["ours", "litellm-v3"], choices=["ours", "litellm-v3"])
    args = parser.parse_args(argv)
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"took {time.monotonic() - started:.0f}s")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
