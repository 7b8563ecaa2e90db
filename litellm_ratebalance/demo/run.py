"""``make demo``: every component of litellm-ratebalance working in the real LiteLLM proxy, on this machine.

What it starts (all on 127.0.0.1, all stopped at the end, also on Ctrl-C, SIGTERM or an error):

* three mock OpenAI-compatible deployments of model group ``chat`` (``litellm_ratebalance.simulate``):
  ``chat-fast`` (160 tokens/s), ``chat-slow`` (25 tokens/s) and ``chat-flaky`` (fast, but 30% of its
  answers are 500s, and it answers only 429s from 35% to 60% of the run);
* a simulated vLLM-like inference server for model group ``local`` (continuous batching, KV cache that runs
  out, Prometheus ``/metrics``), behind backpressure;
* ``--replicas 2``: a throwaway ``redis-server`` on a free port, shared by the replicas;
* the real ``litellm`` proxy (one per replica) with ``example_config.yaml``'s structure: all four callbacks
  plus ``prometheus``, pointed at the mocks (see ``demo/config.py`` for what the demo changes). No network
  beyond loopback, no database, no Redis for one replica (the embedded store).

Then it runs a scripted mixed load (``demo/load.py``) from three demo keys (``demo/demo_auth.py``): ``prod``
(team metadata priority), ``batch`` (key metadata priority, floods) and a caller with no priority; each key
carries a traffic-contract feature (team metadata, key metadata, a key tag). After the load, a burst to
model group ``quota`` checks that an rpm limit holds exactly across the replicas. It prints:

* per priority and model group: sent, admitted, 429 from the limiter, shed by backpressure, 200, failed;
* per deployment: share of its group's requests, requests/s, output tokens/s, tokens/s per request;
* traffic-contract modes per feature (normal / borrowed / degraded), from the proxies' ``/metrics``;
* backpressure refusals by tier and reason (``/metrics`` and what clients saw);
* the global limit check;

and writes a PNG plot of the run and the summary as JSON (paths printed).

Flags::

    --duration S          seconds of mixed load (default 40; the e2e test uses 8)
    --replicas N          proxy replicas (default 1: embedded store; 2+: a local redis-server shared by all)
    --plot PATH           PNG to write (default out/demo/ratebalance-demo.png)
    --summary-json PATH   summary as JSON (default out/demo/summary.json)
    --example-config PATH the config whose structure the demo runs (default: example_config.yaml of this checkout)
    --quota-rpm N         rpm of the limit-check group (default 30; the burst sends 3 x N)
    --seed N              seed of the arrivals (default 7)
    --workdir DIR         keep the proxies' configs and logs in DIR (default: a temporary directory, removed)

Exit status: 0 after a complete run (the summary says whether the limit held), 1 if something could not
start, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from litellm_ratebalance.demo.config import (
    CHAT_DEPLOYMENTS,
    LOCAL_DEPLOYMENT,
    default_example_path,
    demo_config,
    load_example,
)
from litellm_ratebalance.demo.load import client_limits, limit_check, run_script
from litellm_ratebalance.demo.proxy_process import ProxyProcess
from litellm_ratebalance.demo.report import Samples, build_summary, parse_metrics, plot_run, print_summary
from litellm_ratebalance.demo.services import LocalRedis
from litellm_ratebalance.simulate.inference_server import InferenceServerProcess, ServerSpec
from litellm_ratebalance.simulate.mock_openai import Behaviour, Change, DeploymentSpec, MockClusterProcess

__all__ = ["main", "mock_specs"]

WINDOW_SECONDS = 10
"""Limiter and contract windows of the demo (the example's 60 s would outlast a short run)."""
DEPLOYMENT_RPM = 20
"""Requests per limiter window of each chat deployment: 60 for the group."""
SERVER_SPEC = ServerSpec(knee=4, step_seconds=0.025, max_num_seqs=32, memory_tokens=1500, model="sim-llm")
"""~160 output tokens/s at the knee (4 running requests), OOM past 1500 KV-cache tokens."""
REPO_ROOT = Path(__file__).resolve().parents[2]


def mock_specs(duration: float) -> list[DeploymentSpec]:
    """The chat deployments: fast, slow, and flaky (errors throughout, a 429 burst mid-run)."""
    return [
        DeploymentSpec("chat-fast", Behaviour(token_rate=160.0, base_latency=0.05, capacity=32), seed=1),
        DeploymentSpec("chat-slow", Behaviour(token_rate=25.0, base_latency=0.25, capacity=32), seed=2),
        DeploymentSpec(
            "chat-flaky",
            Behaviour(token_rate=120.0, base_latency=0.05, capacity=32, error_rate=0.3, retry_after=2.0),
            timeline=(Change(0.35 * duration, {"rate_limited": True}), Change(0.6 * duration, {"rate_limited": False})),
            seed=3,
        ),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m litellm_ratebalance.demo",
        description="litellm-ratebalance demo: mock deployments, the real LiteLLM proxy, a scripted load, a summary.",
    )
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of mixed load (default 40)")
    parser.add_argument("--replicas", type=int, default=1, choices=range(1, 5), help="proxy replicas (default 1)")
    parser.add_argument("--plot", type=Path, default=Path("out/demo/ratebalance-demo.png"))
    parser.add_argument("--summary-json", type=Path, default=Path("out/demo/summary.json"))
    parser.add_argument("--example-config", type=Path, default=None)
    parser.add_argument("--quota-rpm", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.duration <= 600:
        print("--duration must be between 1 and 600 seconds", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_demo(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: everything the demo started has been stopped", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1


async def _demo(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is not None:
        # SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C: the exit stack below stops everything.
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    example = load_example(args.example_config or default_example_path())
    async with contextlib.AsyncExitStack() as stack:
        workdir = args.workdir
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="ratebalance-demo-"))
            stack.callback(shutil.rmtree, workdir, True)
        redis_url: str | None = None
        if args.replicas > 1:
            redis = LocalRedis()
            stack.callback(redis.stop)
            redis.start()
            redis_url = redis.url
            print(f"redis-server on 127.0.0.1:{redis.port} (throwaway, shared by {args.replicas} replicas)", flush=True)

        cluster = MockClusterProcess(mock_specs(args.duration))
        stack.push_async_callback(cluster.stop)
        server = InferenceServerProcess(SERVER_SPEC)
        stack.push_async_callback(server.stop)
        with _children_ignore_ctrl_c():
            chat_bases = await cluster.start()
            await server.start()
        print(
            "mock deployments: "
            + ", ".join(f"{name} {chat_bases[name]}" for name in CHAT_DEPLOYMENTS)
            + f"; simulated inference server {server.url}",
            flush=True,
        )

        config = demo_config(
            example,
            chat_api_bases=chat_bases,
            local_url=server.url,
            kv_cache_tokens=SERVER_SPEC.memory_tokens,
            window_seconds=WINDOW_SECONDS,
            deployment_rpm=DEPLOYMENT_RPM,
            quota_rpm=args.quota_rpm,
            redis_url=redis_url,
        )
        auth_source = resources.files("litellm_ratebalance.demo").joinpath("demo_auth.py").read_text("utf-8")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        proxies = [
            ProxyProcess(config, workdir / f"proxy{index + 1}", files={"demo_auth.py": auth_source}, env=env)
            for index in range(args.replicas)
        ]
        stack.callback(_stop_all, proxies)
        for proxy in proxies:
            proxy.launch()
        print(
            f"starting {len(proxies)} litellm proxy process(es) on "
            + ", ".join(proxy.base_url for proxy in proxies)
            + (" (embedded store, no Redis)" if redis_url is None else f" (store: {redis_url})")
            + " ...",
            flush=True,
        )
        started = time.monotonic()
        await asyncio.gather(*(proxy.wait_ready_async() for proxy in proxies))
        kept = "" if args.workdir else " (removed at the end; keep it with --workdir DIR)"
        print(f"proxies ready in {time.monotonic() - started:.1f}s; config: {proxies[0].workdir / 'config.yaml'}{kept}")

        clients = [httpx.AsyncClient(base_url=proxy.base_url, **client_limits()) for proxy in proxies]
        for client in clients:
            stack.push_async_callback(client.aclose)
        summary, records, served, samples = await _run(args, clients, cluster, server)

    # Everything is stopped by now; write the results.
    args.summary_json.parent.mkdir(parents=True, exist_ok=True)
    summary["plot"] = str(args.plot)
    args.summary_json.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    plot_run(records, served, samples, args.plot, args.duration)
    print_summary(summary)
    print(f"\nplot: {args.plot.resolve()}\nsummary: {args.summary_json.resolve()}")
    return 0


@contextlib.contextmanager
def _children_ignore_ctrl_c() -> Iterator[None]:
    """Processes spawned inside keep SIGINT ignored (Python leaves an inherited SIG_IGN in place): a Ctrl-C
    in the terminal then reaches only the demo, which stops them in order (the mock servers exit when their
    stdin closes) instead of each printing a KeyboardInterrupt traceback."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_all(proxies: list[ProxyProcess]) -> None:
    for proxy in proxies:
        proxy.terminate()  # all at once: each may take seconds to finish its open requests
    for proxy in proxies:
        proxy.stop()


async def _run(
    args: argparse.Namespace,
    clients: list[httpx.AsyncClient],
    cluster: MockClusterProcess,
    server: InferenceServerProcess,
) -> tuple[dict[str, Any], Any, Any, Samples]:
    samples = Samples([], [], [])
    await cluster.reset(epoch=time.time())
    await server.reset()
    print(f"sending {args.duration:.0f}s of mixed load (prod, batch, no priority; chat and local) ...", flush=True)
    stop = asyncio.Event()
    epoch = time.monotonic()
    sampler = asyncio.create_task(_sample(clients[0], epoch, samples, stop))
    try:
        records, _ = await run_script(clients, args.duration, seed=args.seed)
    finally:
        stop.set()
        await sampler
    served = await cluster.served()
    stats = (await server.stats()).to_dict()
    print(f"load done ({len(records)} requests); global limit check: {3 * args.quota_rpm} requests to 'quota' ...")
    check = await limit_check(clients, args.quota_rpm)
    metrics = []
    for client in clients:
        response = await client.get("/metrics", follow_redirects=True)
        response.raise_for_status()
        metrics.append(parse_metrics(response.text))
    summary = build_summary(
        records=records,
        served=served,
        server_stats=stats,
        metrics=metrics,
        check=check,
        quota_rpm=args.quota_rpm,
        duration=args.duration,
        replicas=len(clients),
        window_seconds=WINDOW_SECONDS,
    )
    return summary, records, served, samples


async def _sample(client: httpx.AsyncClient, epoch: float, samples: Samples, stop: asyncio.Event) -> None:
    """Backpressure's concurrency limit and in-flight count for the local deployment, once a second."""
    while not stop.is_set():
        try:
            response = await client.get("/metrics", follow_redirects=True, timeout=5.0)
            values = {
                s.name: s.value for s in parse_metrics(response.text) if s.labels.get("deployment") == LOCAL_DEPLOYMENT
            }
            limit = values.get("litellm_ratebalance_backpressure_concurrency_limit")
            if limit is not None:
                samples.times.append(time.monotonic() - epoch)
                samples.concurrency_limit.append(limit)
                samples.inflight.append(values.get("litellm_ratebalance_backpressure_inflight", 0.0))
        except httpx.HTTPError:
            pass  # a busy proxy may miss a sample; the plot just has a gap
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
