"""The demo: mock deployments, the real LiteLLM proxy with our limiter on the embedded store, a short
scripted load from two priorities, and a table of what each priority got.

Run with ``make demo`` (or ``python -m litellm_ratebalance.demo``). Everything it starts it stops; it
needs no Redis and no network beyond loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from litellm_ratebalance.demo.proxy_process import ProxyProcess

__all__ = ["main"]

MODEL = "demo-model"


def demo_config(tpm: int, rpm: int) -> dict[str, Any]:
    """Two mock deployments sharing ``tpm``/``rpm``; prod reserves 70% and lends none of it."""
    deployments = []
    for index in range(2):
        deployments.append(
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": "openai/demo",
                    "api_key": "sk-mock",
                    "mock_response": "A short answer from a mock deployment.",
                    "mock_delay": 0.2,
                    "tpm": tpm // 2,
                    "rpm": rpm // 2,
                    "max_parallel_requests": 1000,
                },
                "model_info": {"id": f"demo-{index}"},
            }
        )
    return {
        "model_list": deployments,
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter"],
            "priority_reservation": {"prod": 0.7, "batch": 0.3},
            "priority_reservation_settings": {"default_priority": 0.1, "saturation_threshold": 0.5},
            "ratebalance": {"limiter": {"window_seconds": 60, "lendable": {"prod": 0.5}}},
        },
        "general_settings": {"custom_auth": "demo_auth.user_api_key_auth"},
    }


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    tokens: int = 0
    last_headers: dict[str, str] = field(default_factory=dict)


async def client_loop(
    http: httpx.AsyncClient, key: str, tally: Tally, rate_per_s: float, duration_s: float, concurrency: int
) -> None:
    """Send requests at ``rate_per_s`` for ``duration_s`` with at most ``concurrency`` in flight."""
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []

    async def one() -> None:
        async with gate:
            response = await http.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 20},
            )
            tally.statuses[response.status_code] += 1
            if response.status_code == 200:
                tally.tokens += int(response.json().get("usage", {}).get("total_tokens", 0))
                tally.last_headers = {
                    k: v
                    for k, v in response.headers.items()
                    if k.startswith("x-ratelimit-") or k in ("x-litellm-priority", "x-litellm-saturation")
                }

    sent = 0
    while time.monotonic() - started < duration_s:
        tasks.append(asyncio.create_task(one()))
        sent += 1
        await asyncio.sleep(max(0.0, started + sent / rate_per_s - time.monotonic()))
    await asyncio.gather(*tasks)


def print_table(tallies: dict[str, Tally], tpm: int) -> None:
    print(f"\nModel {MODEL}: tpm {tpm}, reservations prod 70% (half of it not lendable), batch 30%, default 10%")
    print(f"{'caller':<22}{'sent':>6}{'200':>6}{'429':>6}{'other':>7}{'tokens':>8}{'share of tpm':>14}")
    for name, tally in tallies.items():
        sent = sum(tally.statuses.values())
        ok = tally.statuses.get(200, 0)
        limited = tally.statuses.get(429, 0)
        other = sent - ok - limited
        print(f"{name:<22}{sent:>6}{ok:>6}{limited:>6}{other:>7}{tally.tokens:>8}{tally.tokens / tpm:>13.0%}")


async def drive(base_url: str, master_key: str, duration_s: float) -> dict[str, Tally]:
    tallies = {"prod (team priority)": Tally(), "batch (key priority)": Tally(), "no priority": Tally()}
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http:
        await asyncio.gather(
            # batch floods from the start; prod arrives steadily; unlabelled traffic trickles in.
            client_loop(http, "sk-demo-batch", tallies["batch (key priority)"], 12.0, duration_s, 50),
            client_loop(http, "sk-demo-prod", tallies["prod (team priority)"], 3.0, duration_s, 20),
            client_loop(http, "sk-demo-anon", tallies["no priority"], 1.0, duration_s, 5),
        )
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m litellm_ratebalance.demo", description=__doc__)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load (default 20)")
    parser.add_argument("--tpm", type=int, default=3000)
    args = parser.parse_args(argv)
    auth_source = resources.files("litellm_ratebalance.demo").joinpath("demo_auth.py").read_text("utf-8")
    with tempfile.TemporaryDirectory(prefix="ratebalance-demo-") as tmp:
        proxy = ProxyProcess(demo_config(args.tpm, rpm=600), Path(tmp), files={"demo_auth.py": auth_source})
        print(f"starting the litellm proxy on {proxy.base_url} (embedded store, no Redis) ...", flush=True)
        with proxy:
            print(f"sending {args.duration:.0f}s of load from three callers ...", flush=True)
            tallies = asyncio.run(drive(proxy.base_url, proxy.master_key, args.duration))
        print_table(tallies, args.tpm)
        prod = tallies["prod (team priority)"]
        if prod.last_headers:
            print("\nheaders on prod's last 200:", ", ".join(f"{k}={v}" for k, v in sorted(prod.last_headers.items())))
    return 0
