"""``make demo`` end to end, in its short mode: the real proxy, the mocks, the load, the summary and the plot.

Each test runs ``python -m litellm_ratebalance.demo --duration 8`` as a child process (about 30 s with one
replica, 40 s with two on 2 busy cores) and checks that the figures it reports are consistent with each
other (client records, the deployments' own logs, the proxies' ``/metrics``), that the plot was written,
and that nothing it started is still listening afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DURATION_S = 8
RUN_TIMEOUT_S = 240


def run_demo(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str, Path]:
    plot = tmp_path / "demo.png"
    summary_path = tmp_path / "summary.json"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "litellm_ratebalance.demo",
            "--duration",
            str(DURATION_S),
            "--plot",
            str(plot),
            "--summary-json",
            str(summary_path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    return json.loads(summary_path.read_text()), output, plot


def assert_consistent(summary: dict[str, Any], output: str, plot: Path) -> None:
    # Every request has exactly one outcome, and admitted = not refused by the limiter or backpressure.
    total = 0
    for group, rows in summary["priorities"].items():
        assert set(rows) == {"prod", "batch", "default"}, group
        for priority, row in rows.items():
            assert row["ok"] + row["limited"] + row["shed"] + row["failed"] == row["sent"], (group, priority, row)
            assert row["admitted"] == row["sent"] - row["limited"] - row["shed"]
            total += row["sent"]
    assert total == summary["sent"] > 0

    # The limiter's own counts (/metrics, all replicas) agree with what the clients saw, request for request.
    chat = summary["priorities"]["chat"]
    limiter = summary["limiter_metrics"]
    for priority, row in chat.items():
        assert limiter.get(f"{priority}:rejected", 0) == row["limited"], (priority, limiter)
        assert limiter.get(f"{priority}:admitted", 0) == row["sent"] - row["limited"], (priority, limiter)
    # prod holds 60% of capacity (half of it not lendable) and asks for less: never refused; batch floods.
    assert chat["prod"]["limited"] == 0
    assert chat["batch"]["limited"] > 0

    deployments = summary["deployments"]
    chat_shares = [deployments[name]["share"] for name in ("chat-fast", "chat-slow", "chat-flaky")]
    assert sum(chat_shares) == pytest.approx(1.0)
    assert deployments["chat-flaky"]["share"] < deployments["chat-fast"]["share"]
    assert deployments["chat-slow"]["share"] < deployments["chat-fast"]["share"]
    # Each request a mock received was the rate balancer's pick (its counter on /metrics, all replicas).
    for name in ("chat-fast", "chat-slow", "chat-flaky"):
        assert deployments[name]["balancer_choices"] == deployments[name]["requests"], (name, deployments[name])

    # Backpressure: what clients were refused is what the proxies counted, lowest tier first.
    shed_client = sum(summary["shed_client"].values())
    assert shed_client == sum(summary["shed_metrics"].values()) > 0
    local = summary["priorities"]["local"]
    assert local["batch"]["shed"] >= local["prod"]["shed"]
    assert summary["inference_server"]["oom_failures"] == 0

    assert summary["contract_modes"], "no traffic-contract modes on /metrics"
    check = summary["limit_check"]
    assert check["admitted"] == check["limit"] == check["metrics"]["admitted"]
    assert check["admitted"] + check["refused"] == check["sent"] == 3 * check["limit"]

    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    assert f"plot: {plot.resolve()}" in output

    # Everything it started is gone: none of the proxies it announced still accepts connections.
    ports = [int(port) for port in re.findall(r"http://127\.0\.0\.1:(\d+)", output.split("sending", 1)[0])]
    assert ports
    for port in ports:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open after the demo"


def test_demo_one_proxy_embedded_store(tmp_path: Path) -> None:
    summary, output, plot = run_demo(tmp_path)
    assert summary["replicas"] == 1
    assert "embedded store, no Redis" in output
    assert_consistent(summary, output, plot)


@pytest.mark.redis
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_demo_two_replicas_share_limits_through_redis(tmp_path: Path) -> None:
    summary, output, plot = run_demo(tmp_path, "--replicas", "2")
    assert summary["replicas"] == 2
    assert "redis-server on 127.0.0.1:" in output
    assert_consistent(summary, output, plot)
    # Both replicas served the limit-check burst, and together they admitted exactly the limit.
    per_replica = summary["limit_check"]["admitted_per_replica"]
    assert len(per_replica) == 2 and all(count > 0 for count in per_replica)
    assert not summary["store_errors"]
