"""``litellm-ratebalance status`` against the real redis-server, after the real hooks and store calls wrote.

The tests are synchronous: the CLI runs its own event loop (``asyncio.run``), as it does for an operator.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from litellm.router import Router

from litellm_ratebalance.cli import main
from litellm_ratebalance.proxy.contracts import TrafficContractsCallback
from litellm_ratebalance.proxy.replica_report import report_once
from litellm_ratebalance.proxy.runtime import Runtime
from litellm_ratebalance.routing.balancer import RateBalancer
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import KeySpace, RedisStore
from litellm_ratebalance.store.metering import MeterEnd, MeterStart
from tests.integration import contracts_support, limiter_support
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

PREFIX = "rbstatus"
# Feature names of tests/integration/contracts_support.EXAMPLE_CONTRACTS: the Prometheus registry is shared by
# the session, and test_contracts_hooks checks that no other feature label appears in it.
LITELLM_SETTINGS: dict[str, Any] = {
    "priority_reservation": {"prod": 0.7, "dev": 0.2},
    "priority_reservation_settings": {"default_priority": 0.1, "saturation_threshold": 0.5},
    "ratebalance": {
        "key_prefix": PREFIX,
        "traffic_contracts": {
            "window_seconds": 3600,  # one test never straddles a contract window
            "counter_ttl_seconds": 7200,
            "basket": {"rpm": 5, "tpm": 10000},
            "features": {"smart-window": {"rpm": 2, "tpm": 5000}, "s2s": {"rpm": 10}},
        },
        "backpressure": {"deployments": {"chat-a": {"min_limit": 2, "initial_limit": 4, "max_limit": 16}}},
    },
}
MODEL_LIST: list[dict[str, Any]] = [
    {
        "model_name": "chat",
        "litellm_params": {"model": "openai/a", "api_key": "sk-fake", "mock_response": "hi", "rpm": 6, "tpm": 600},
        "model_info": {"id": "chat-a"},
    },
    {
        # No model_info.id: LiteLLM's Router derives one; status must derive the same.
        "model_name": "chat",
        "litellm_params": {"model": "openai/b", "api_key": "sk-fake", "mock_response": "hi", "rpm": 4, "tpm": 400},
    },
]


def _router() -> Any:
    return Router(model_list=[dict(m) for m in json.loads(json.dumps(MODEL_LIST))])


def _write_config(tmp_path: Path, url: str | None) -> Path:
    settings = json.loads(json.dumps(LITELLM_SETTINGS))
    if url is not None:
        settings["ratebalance"]["redis_url"] = url
    path = tmp_path / "config.yaml"
    # Key order kept: LiteLLM hashes the params in file order (as the proxy reads the file).
    path.write_text(yaml.safe_dump({"model_list": MODEL_LIST, "litellm_settings": settings}, sort_keys=False))
    return path


async def _drive(url: str, derived_id: str) -> dict[str, Any]:
    """Write through the real limiter and contracts hooks and the routing / concurrency store calls."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    await client.flushdb()
    store = RedisStore(client, KeySpace(PREFIX), timeout_seconds=5.0)
    settings = parse_settings(LITELLM_SETTINGS)
    router = _router()
    limiter = limiter_support.make_limiter(store, router, LITELLM_SETTINGS)
    refused = 0
    for priority, tokens in (("prod", 30), ("prod", 30), ("prod", 30), ("dev", 20), (None, 10)):
        data = limiter_support.request("chat", max_tokens=10)
        outcome = await limiter_support.call(limiter, data, limiter_support.auth(priority))
        if outcome is None:
            await limiter_support.finish(limiter, data, tokens)
        else:
            refused += 1
    runtime = Runtime()
    runtime.configure(settings=settings, store=store, router=router)
    contracts = TrafficContractsCallback(runtime)
    modes = []
    for feature in ("smart-window", "smart-window", "smart-window", "s2s"):
        data = contracts_support.request("chat", max_tokens=10)
        assert await contracts_support.call(contracts, data, contracts_support.auth(feature)) is None
        modes.append(data["metadata"]["traffic_contract_rpm_mode"])
        await contracts_support.finish(contracts, data, 40)
    balancer = RateBalancer(store, settings.ratebalance.routing)
    for _ in range(4):
        balancer.record("chat", "chat-a", latency=1.0, output_tokens=100)
    for _ in range(2):
        balancer.record("chat", derived_id, latency=2.0, output_tokens=100)
    balancer.record("chat", "from-the-database", latency=1.0, output_tokens=30)  # a deployment not in config
    await balancer.aclose()
    await store.lease_acquire("chat-a", "lease-1", slot_cap=4, ttl_ms=60_000, cost_tokens=70)
    # One metered request on chat-a (cost attribution's marks around a lease), 250 output tokens.
    half_life_ms = int(settings.ratebalance.cost.efficiency_half_life_seconds * 1000)
    meter = MeterStart(half_life_ms=half_life_ms, ttl_ms=60_000)
    taken = await store.lease_acquire("chat-a", "lease-2", slot_cap=4, ttl_ms=60_000, cost_tokens=30, meter=meter)
    assert taken.cost is not None
    await asyncio.sleep(0.02)
    await store.lease_release(
        "chat-a", "lease-2", MeterEnd(taken.cost.mark, 1, 250, half_life_ms=half_life_ms, ttl_ms=60_000)
    )
    efficiency = await store.cost_efficiency("chat-a", half_life_ms=half_life_ms)
    admission = await store.admission_snapshot("chat", 60_000)
    window = await store.contract_window(3600)
    # This process as a proxy replica would report itself every 10 s (its store calls above, its loop lag).
    assert await report_once(store, "replica-a:101", 10.0) == 1
    await client.aclose()
    return {"refused": refused, "modes": modes, "admission": admission, "window": window, "efficiency": efficiency}


def _derived_id() -> str:
    ids = [d["model_info"]["id"] for d in _router().get_model_list()]
    assert ids[0] == "chat-a"
    return str(ids[1])


def test_status_json_and_table_show_what_was_written(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    derived_id = _derived_id()
    written = asyncio.run(_drive(redis_server.url, derived_id))
    config = _write_config(tmp_path, redis_server.url)
    capsys.readouterr()

    assert main(["status", "--config", str(config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and doc["store"]["key_prefix"] == PREFIX
    (group,) = doc["model_groups"]
    admission = written["admission"]
    assert (group["rpm"], group["tpm"]) == (10, 1000)
    assert group["window"]["live"] and 1 <= group["window"]["reset_seconds"] <= 60
    assert (group["requests"], group["tokens"]) == (admission.requests, admission.tokens)
    assert group["requests"] == 5 - written["refused"]
    pools = {p["priority"]: p for p in group["priorities"]}
    for name, field in (("prod", "p.prod"), ("dev", "p.dev"), ("default", "d")):
        assert (pools[name]["requests"], pools[name]["tokens"]) == admission.pools.get(field, (0, 0))
    assert pools["prod"]["reserved_requests"] == 7.0 and pools["prod"]["reserved_tokens"] == 700.0
    assert group["saturation"] == round(max(admission.requests / 10, admission.tokens / 1000), 4)

    deployments = {d["deployment_id"]: d for d in group["deployments"]}
    assert list(deployments) == ["chat-a", derived_id, "from-the-database"]
    unlisted = deployments["from-the-database"]
    assert (unlisted["estimated_rate"], unlisted["weight"], unlisted["routing_mode"]) == (30.0, None, "not in config")
    a, b = deployments["chat-a"], deployments[derived_id]
    # Samples as the balancer counts them: recency-weighted by default, so just under the raw counts.
    assert 3.5 <= a["samples"] <= 4 and 1.5 <= b["samples"] <= 2
    assert (a["estimated_rate"], b["estimated_rate"]) == (100.0, 50.0)
    assert a["weight"] + b["weight"] == pytest.approx(1.0, abs=1e-3)
    assert (a["in_flight"], a["reserved_tokens"], b["in_flight"]) == (1, 70, 0)
    assert a["concurrency_limit"] == {"min": 2, "initial": 4, "max": 16}
    assert b["concurrency_limit"] is None  # not configured for backpressure
    per_1k = written["efficiency"].per_1k_output_tokens()
    assert per_1k is not None and per_1k > 0
    # Read by status from the same shared state (decayed a few ms further: equal to 3 significant digits).
    assert a["gpu_seconds_per_1k_output_tokens"] == pytest.approx(per_1k, rel=1e-3)
    assert b["gpu_seconds_per_1k_output_tokens"] is None  # nothing metered there

    contracts = doc["contracts"]
    window = written["window"]
    assert contracts["window_start"] == window.window_start
    features = {c["feature"]: c for c in contracts["features"]}
    assert features["smart-window"]["requests"] == window.requests["smart-window"] == 3
    assert (
        features["smart-window"]["tokens"]
        == window.tokens["smart-window"] + window.in_flight.get("smart-window", 0)
        == 120
    )
    assert written["modes"] == ["normal", "normal", "borrowed", "normal"]
    assert features["smart-window"]["rpm_mode"] == "borrowed"  # 3 of 2: the next one borrows as well
    assert features["s2s"]["rpm_mode"] == "normal"
    assert contracts["basket"]["requests"] == 4 and contracts["basket"]["rpm_mode"] == "normal"  # 5th fits

    assert main(["status", "--config", str(config), "--model", "chat"]) == 0
    table = capsys.readouterr().out
    print(table)  # the sample output quoted in docs/status.md
    assert f"requests {admission.requests}/10, tokens {admission.tokens}/1000" in table
    prod_line = next(line for line in table.splitlines() if line.lstrip().startswith("prod "))
    assert prod_line.split()[:4] == ["prod", "0.70", str(pools["prod"]["requests"]), "7"]
    a_line = next(line for line in table.splitlines() if line.lstrip().startswith("chat-a"))
    cells = a_line.split()
    assert cells[:3] == ["chat-a", "100.0", f"{a['weight']:.3f}"] and cells[4:7] == ["0", "1", "2..16"]
    assert float(cells[3]) == pytest.approx(a["samples"], abs=0.06)
    assert float(cells[-1]) == pytest.approx(per_1k, abs=0.0015)  # the GPU-s/1k tok column
    b_line = next(line for line in table.splitlines() if line.lstrip().startswith(derived_id[:20]))
    assert b_line.split()[-1] == "-"
    assert "GPU-s/1k tok: attributed GPU-seconds per 1000 output tokens, recent requests of all replicas" in table
    feature_line = next(line for line in table.splitlines() if line.lstrip().startswith("smart-window"))
    assert feature_line.split() == ["smart-window", "3", "2", "borrowed", "120", "5000", "normal"]
    assert "replicas: 1 reporting" in table
    replica_line = next(line for line in table.splitlines() if line.lstrip().startswith("replica-a:101"))
    assert replica_line.split()[-1] == "none"  # no store errors

    (replica,) = doc["replicas"]
    assert replica["replica"] == "replica-a:101" and replica["interval_seconds"] == 10.0
    assert replica["store_calls"] >= 15  # every store call _drive made through this store
    assert 0 < replica["store_call_max_seconds"] < 5 and replica["loop_lag_max_seconds"] >= 0
    assert replica["store_errors"] == {}


def test_unknown_model_group_is_a_usage_error(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path, redis_server.url)
    assert main(["status", "--config", str(config), "--model", "nope"]) == 2
    assert "unknown model group(s) ['nope']; the config has ['chat']" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_redis_is_a_clear_error_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://ops:hunter2@127.0.0.1:{_free_port()}/0"
    config = _write_config(tmp_path, url)
    assert main(["status", "--config", str(config), "--timeout", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "cannot read the store at redis://ops:***@127.0.0.1:" in captured.err
    assert "hunter2" not in captured.err and "Traceback" not in captured.err


def test_embedded_store_has_nothing_to_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write_config(tmp_path, None)
    assert main(["status", "--config", str(config)]) == 3
    assert "nothing to show" in capsys.readouterr().err


async def _scrape_once(url: str, model_list: list[dict[str, Any]], litellm_settings: dict[str, Any]) -> None:
    """One background step of the real backpressure callback, writing its signal reports to the Redis."""
    import redis.asyncio as aioredis

    from litellm_ratebalance.proxy.backpressure import BackpressureCallback
    from litellm_ratebalance.proxy.runtime import configure, reset_runtime

    client = aioredis.Redis.from_url(url)
    await client.flushdb()
    reset_runtime()
    configure(
        settings=parse_settings(litellm_settings),
        store=RedisStore(client, KeySpace(PREFIX), timeout_seconds=5.0),
        router=Router(model_list=json.loads(json.dumps(model_list))),
    )
    callback = BackpressureCallback()
    try:
        await callback.maintain_once()
    finally:
        await callback.aclose()
        reset_runtime()
        await client.aclose()


def test_status_shows_what_each_deployments_signals_are_worth(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from litellm_ratebalance.simulate.inference_server import InferenceServer, ServerSpec

    async def serve_and_scrape() -> list[dict[str, Any]]:
        # A vLLM without its stats (--disable-log-stats), an SGLang with every signal, and no metrics_url.
        servers = [
            await InferenceServer(ServerSpec(metrics_flavor="none")).start(),
            await InferenceServer(ServerSpec(metrics_flavor="sglang")).start(),
        ]
        try:
            model_list = [
                {
                    "model_name": "local",
                    "litellm_params": {"model": "openai/sim", "api_base": server.api_base, "api_key": "sk-none"},
                    "model_info": {"id": name, "backpressure": {"metrics_url": server.metrics_url}},
                }
                for name, server in zip(("gpu-vllm", "gpu-sglang"), servers, strict=True)
            ]
            model_list.append(
                {
                    "model_name": "local",
                    "litellm_params": {"model": "openai/sim", "api_base": "http://127.0.0.1:9/v1", "api_key": "x"},
                    "model_info": {"id": "gpu-plain", "backpressure": {}},
                }
            )
            await _scrape_once(redis_server.url, model_list, settings)
            return model_list
        finally:
            for server in servers:
                await server.stop()

    settings: dict[str, Any] = {"ratebalance": {"key_prefix": PREFIX, "redis_url": redis_server.url}}
    model_list = asyncio.run(serve_and_scrape())
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model_list": model_list, "litellm_settings": settings}, sort_keys=False))
    capsys.readouterr()

    assert main(["status", "--config", str(config), "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)["model_groups"]
    signals = {d["deployment_id"]: d["signals"] for d in group["deployments"]}
    vllm, sglang, plain = signals["gpu-vllm"], signals["gpu-sglang"], signals["gpu-plain"]
    assert (vllm["metrics_url"], vllm["server"], vllm["problems"]) == (True, None, ["unrecognised"])
    assert vllm["detail"].startswith("unrecognised: ") and "--disable-log-stats" in vllm["detail"]
    assert 0 <= vllm["age_seconds"] < 60
    assert (sglang["server"], sglang["problems"], sglang["detail"]) == ("sglang", [], "")
    assert (plain["metrics_url"], plain["age_seconds"], plain["problems"]) == (False, None, [])

    assert main(["status", "--config", str(config)]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  signals of gpu-vllm:"))
    assert "no supported server; PROBLEMS unrecognised (reported" in lines[at]
    assert lines[at + 1].startswith("    unrecognised: the endpoint exports no metric of vLLM")
    assert any(line.startswith("  signals of gpu-sglang: sglang, every signal read (reported") for line in lines)
    assert "  signals of gpu-plain: no metrics_url (concurrency limit only)" in lines
