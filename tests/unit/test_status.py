"""Status figures and formatting from hand-built snapshots (no store, no clock)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from litellm_ratebalance.contracts.policy import ContractBook
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.status import (
    ConcurrencyRange,
    DeploymentStatus,
    RedisTarget,
    SentinelSet,
    StatusReport,
    config_deployments,
    contracts_status,
    format_table,
    group_capacity,
    group_status,
    load_proxy_config,
    mask_url,
    report_json,
    resolve_redis,
)
from litellm_ratebalance.store.admission import AdmissionSnapshot
from litellm_ratebalance.store.contracts import ContractWindow
from litellm_ratebalance.store.replicas import ReplicaHealth

SETTINGS = parse_settings(
    {
        "priority_reservation": {"prod": 0.7, "dev": 0.2},
        "priority_reservation_settings": {"default_priority": 0.1, "saturation_threshold": 0.5},
        "ratebalance": {
            "traffic_contracts": {
                "window_seconds": 60,
                "basket": {"rpm": 10, "tpm": 1000},
                "features": {"search": {"rpm": 4, "tpm": 400}, "chat": {"rpm": 6}},
            }
        },
    }
)
NOW = 1_000_000_000


def _snapshot(start: int = NOW - 20_000) -> AdmissionSnapshot:
    # 6 of 10 requests, 300 of 1000 tokens: prod 4/200, dev 1/60, default 1/40.
    return AdmissionSnapshot(start, start + 60_000, 6, 300, {"p.prod": (4, 200), "p.dev": (1, 60), "d": (1, 40)})


def _deployment(name: str, rate: float, weight: float, limit: ConcurrencyRange | None = None) -> DeploymentStatus:
    return DeploymentStatus(name, rate, weight, 12, 1, "weighted", 2, 80, limit)


def test_group_figures_from_a_live_window() -> None:
    group = group_status("gpt", rpm=10, tpm=1000, snapshot=_snapshot(), settings=SETTINGS, now_ms=NOW)
    assert group.window_live and group.reset_seconds == 40
    assert (group.requests, group.tokens) == (6, 300)
    assert group.saturation == pytest.approx(0.6)
    assert group.mode == "strict"
    pools = {p.priority: p for p in group.priorities}
    assert list(pools) == ["prod", "dev", "default"]
    assert (pools["prod"].requests, pools["prod"].tokens) == (4, 200)
    assert pools["prod"].reserved_requests == pytest.approx(7.0)
    assert pools["prod"].reserved_tokens == pytest.approx(700.0)
    assert pools["dev"].reserved_tokens == pytest.approx(200.0)
    assert pools["default"].weight == pytest.approx(0.1)
    assert pools["default"].reserved_requests == pytest.approx(1.0)


def test_ended_window_counts_as_empty_and_lenient_below_threshold() -> None:
    ended = group_status("gpt", rpm=10, tpm=1000, snapshot=_snapshot(NOW - 61_000), settings=SETTINGS, now_ms=NOW)
    assert not ended.window_live and ended.reset_seconds is None
    assert (ended.requests, ended.tokens, ended.saturation, ended.mode) == (0, 0, 0.0, "lenient")
    assert all(p.requests == 0 for p in ended.priorities)
    unlimited = group_status("free", rpm=None, tpm=None, snapshot=None, settings=SETTINGS, now_ms=NOW)
    assert unlimited.mode == "unlimited"
    assert all(p.reserved_requests is None for p in unlimited.priorities)


def test_no_priority_reservation_divides_nothing_and_unconfigured_pools_still_show() -> None:
    settings = parse_settings({})
    snapshot = AdmissionSnapshot(NOW - 1000, NOW + 59_000, 9, 0, {"d": (8, 0), "p.old": (1, 0)})
    group = group_status("gpt", rpm=10, tpm=None, snapshot=snapshot, settings=settings, now_ms=NOW)
    assert group.saturation == pytest.approx(0.9) and group.mode == "lenient"  # nothing to divide
    pools = {p.priority: p for p in group.priorities}
    assert pools["default"].requests == 8 and pools["default"].reserved_requests is None
    assert pools["p.old (unconfigured)"].requests == 1


def test_contract_modes_are_those_of_the_next_request() -> None:
    book = ContractBook.from_settings(SETTINGS.ratebalance.traffic_contracts)
    window = ContractWindow(
        window_start=NOW // 1000 // 60 * 60,
        requests={"search": 4, "chat": 2, "unassigned": 1, "__basket__": 7},
        tokens={"search": 300, "__basket__": 300},
        in_flight={"search": 100, "__basket__": 100},
    )
    status = contracts_status(book, window, window_seconds=60, now_ms=NOW)
    lines = {line.feature: line for line in status.features}
    assert list(lines) == ["search", "chat", "unassigned"]
    assert (lines["search"].requests, lines["search"].tokens) == (4, 400)
    assert (lines["search"].rpm_mode, lines["search"].tpm_mode) == ("borrowed", "borrowed")
    assert (lines["chat"].rpm_mode, lines["chat"].tpm_mode) == ("normal", "normal")
    assert status.basket.requests == 7 and status.basket.rpm_mode == "normal"
    assert 1 <= status.reset_seconds <= 60
    full = ContractWindow(window.window_start, {"chat": 1, "__basket__": 10}, {}, {})
    degraded = contracts_status(book, full, window_seconds=60, now_ms=NOW)
    assert degraded.basket.rpm_mode == "degraded"
    assert {line.feature: line.rpm_mode for line in degraded.features}["chat"] == "degraded"
    empty = contracts_status(book, None, window_seconds=60, now_ms=NOW)
    assert all(line.rpm_mode == "normal" and line.requests == 0 for line in empty.features)


def _report() -> StatusReport:
    deployments = (
        _deployment("gpt-eu", 123.456, 0.6667, ConcurrencyRange(1, 8, 64)),
        _deployment("f3448299829431b199b433742f9751fce5125150f5b6903b515df7145ecc6b50", 61.5, 0.3333),
    )
    group = group_status(
        "gpt", rpm=10, tpm=1000, snapshot=_snapshot(), settings=SETTINGS, now_ms=NOW, deployments=deployments
    )
    book = ContractBook.from_settings(SETTINGS.ratebalance.traffic_contracts)
    window = ContractWindow(NOW // 1000 // 60 * 60, {"search": 4, "__basket__": 4}, {}, {})
    return StatusReport(
        generated_at_ms=NOW,
        backend="redis",
        url=mask_url("redis://ops:s3cret@127.0.0.1:6380/0"),
        source="ratebalance.redis_url",
        key_prefix="ratebalance",
        model_groups=(group,),
        contracts=contracts_status(book, window, window_seconds=60, now_ms=NOW),
    )


def test_json_has_stable_keys_and_the_figures() -> None:
    doc = json.loads(json.dumps(report_json(_report())))
    assert list(doc) == ["schema", "generated_at_ms", "store", "model_groups", "contracts", "replicas"]
    assert doc["replicas"] == []
    assert doc["store"]["url"] == "redis://ops:***@127.0.0.1:6380/0"
    group = doc["model_groups"][0]
    assert group["window"] == {"start_ms": NOW - 20_000, "end_ms": NOW + 40_000, "live": True, "reset_seconds": 40}
    assert (group["saturation"], group["mode"]) == (0.6, "strict")
    assert group["priorities"][0] == {
        "priority": "prod",
        "requests": 4,
        "tokens": 200,
        "weight": 0.7,
        "reserved_requests": 7.0,
        "reserved_tokens": 700.0,
    }
    eu = group["deployments"][0]
    assert eu["estimated_rate"] == 123.456 and eu["weight"] == 0.6667
    assert eu["concurrency_limit"] == {"min": 1, "initial": 8, "max": 64}
    assert group["deployments"][1]["concurrency_limit"] is None
    assert doc["contracts"]["basket"]["feature"] == "__basket__"
    assert doc["contracts"]["features"][0]["rpm_mode"] == "borrowed"


def test_table_is_aligned_and_shows_every_figure() -> None:
    text = format_table(_report())
    assert "s3cret" not in text
    assert "model group gpt: rpm 10, tpm 1000; window resets in 40s" in text
    assert "saturation 60.0% (threshold 50%, mode strict); requests 6/10, tokens 300/1000" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("priority"))
    prod = next(line for line in lines if line.lstrip().startswith("prod "))
    assert prod.split() == ["prod", "0.70", "4", "7", "200", "700"]
    assert len(prod) == len(header)  # right-aligned columns end where their headers end
    eu = next(line for line in lines if line.lstrip().startswith("gpt-eu"))
    assert eu.split()[:6] == ["gpt-eu", "123.5", "0.667", "12", "1", "2"]
    assert "1..64 (start 8)" in eu
    assert "routing mode weighted; in flight = leases of all replicas" in text
    derived = next(line for line in lines if line.lstrip().startswith("f344829982"))
    assert derived.split()[0] == "f3448299829431b199b4337~"  # shortened in the table, full in --json
    assert "traffic contracts: window 60s from 1970-01-12 13:46:00 UTC, resets in 20s" in text
    search = next(line for line in lines if line.lstrip().startswith("search"))
    assert search.split() == ["search", "4", "4", "borrowed", "0", "400", "normal"]
    assert any(line.lstrip().startswith("__basket__") for line in lines)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"),
        ("rediss://user:p%40ss@cache.local:6380/2", "rediss://user:***@cache.local:6380/2"),
        ("redis://user:pw@[::1]:6379", "redis://user:***@[::1]:6379"),
    ],
)
def test_mask_url_hides_passwords_only(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_resolve_redis_follows_the_proxy_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATUS_TEST_PW", "envpw")
    for name in ("REDIS_URL", "REDIS_HOST", "REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES"):
        monkeypatch.delenv(name, raising=False)
    base = (
        "router_settings: {redis_host: 127.0.0.1, redis_port: 7001, redis_password: os.environ/STATUS_TEST_PW}\n"
        "litellm_settings:\n  cache: true\n  cache_params: {type: redis, host: 127.0.0.1, port: 7000}\n"
    )
    config = load_proxy_config(_config(tmp_path, base))
    assert resolve_redis(config, "redis://127.0.0.1:1/0") == RedisTarget("redis://127.0.0.1:1/0", "--redis-url")
    assert resolve_redis(config) == RedisTarget("redis://127.0.0.1:7000", "litellm_settings.cache_params")
    config = load_proxy_config(_config(tmp_path, base + "  ratebalance: {redis_url: 'redis://127.0.0.1:7002'}\n"))
    assert resolve_redis(config) == RedisTarget("redis://127.0.0.1:7002", "ratebalance.redis_url")
    router_only = load_proxy_config(_config(tmp_path, base.replace("cache: true", "cache: false")))
    assert resolve_redis(router_only) == RedisTarget("redis://:envpw@127.0.0.1:7001", "router_settings.redis_host")
    local_cache = base.replace("type: redis, ", "")  # LiteLLM's default cache type is local (in memory)
    assert resolve_redis(load_proxy_config(_config(tmp_path, local_cache))).source == "router_settings.redis_host"
    target = resolve_redis(load_proxy_config(_config(tmp_path, "model_list: []\n")))
    assert target.url is None and not target.sentinel and "names no Redis" in target.source


CLUSTER_CACHE = (
    "litellm_settings:\n  cache: true\n  cache_params:\n    type: redis\n    host: 127.0.0.1\n    port: 7000\n"
    "    password: pw\n"
)


def test_resolve_redis_finds_a_cluster_as_litellm_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES", "REDIS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    # Startup nodes win over the host (LiteLLM builds its cluster client from them); ports as text or numbers.
    nodes = '    redis_startup_nodes: [{host: 10.0.0.1, port: "7001"}, {host: 10.0.0.2, port: 7002}]\n'
    target = resolve_redis(load_proxy_config(_config(tmp_path, CLUSTER_CACHE + nodes)))
    assert target == RedisTarget(
        "redis://:pw@10.0.0.1:7001",
        "litellm_settings.cache_params.redis_startup_nodes",
        cluster=True,
        other_nodes=(("10.0.0.2", 7002),),
    )
    assert target.masked() == "redis://:***@10.0.0.1:7001,10.0.0.2:7002"
    # Without startup nodes in the config, LiteLLM's REDIS_CLUSTER_NODES (JSON) makes the cache a cluster...
    monkeypatch.setenv("REDIS_CLUSTER_NODES", '[{"host": "10.0.0.3", "port": 7003}]')
    target = resolve_redis(load_proxy_config(_config(tmp_path, CLUSTER_CACHE)))
    assert target == RedisTarget("redis://:pw@10.0.0.3:7003", "REDIS_CLUSTER_NODES", cluster=True)
    # ... and the router's Redis too.
    router_only = "router_settings: {redis_host: 127.0.0.1, redis_port: 7001, redis_password: rpw}\n"
    target = resolve_redis(load_proxy_config(_config(tmp_path, router_only)))
    assert target == RedisTarget("redis://:rpw@10.0.0.3:7003", "REDIS_CLUSTER_NODES", cluster=True)
    # --redis-url as one node of a cluster.
    target = resolve_redis(
        load_proxy_config(_config(tmp_path, "model_list: []\n")), "redis://h:7005", override_cluster=True
    )
    assert target == RedisTarget("redis://h:7005", "--redis-url", cluster=True)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("[{host: 10.0.0.1, port: 70000}]", "redis_startup_nodes[0]: must be"),
        ("[{port: 7001}]", "redis_startup_nodes[0]: must be"),
        ("[{host: 10.0.0.1, port: seven}]", "redis_startup_nodes[0]: must be"),
        ("{host: 10.0.0.1}", "redis_startup_nodes: must be a list"),
        ("'not json'", "redis_startup_nodes: not valid JSON"),
    ],
)
def test_bad_startup_nodes_name_the_key(tmp_path: Path, nodes: str, message: str) -> None:
    config = load_proxy_config(_config(tmp_path, CLUSTER_CACHE + f"    redis_startup_nodes: {nodes}\n"))
    with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
        resolve_redis(config)
    assert "1..65535" in str(raised.value) or "JSON" in str(raised.value)


def test_resolve_redis_reads_a_sentinel_set_as_litellm_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES", "REDIS_SERVICE_NAME", "REDIS_SENTINEL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    sentinel = CLUSTER_CACHE + (
        '    sentinel_nodes: [[10.0.0.1, 26379], [10.0.0.2, "26380"]]\n    service_name: mymaster\n'
        "    sentinel_password: spw\n"
    )
    target = resolve_redis(load_proxy_config(_config(tmp_path, sentinel)))
    # No URL until the sentinels are asked (resolve_redis does no I/O); the master's credentials come along.
    assert target == RedisTarget(
        None,
        "litellm_settings.cache_params.sentinel_nodes, service 'mymaster'",
        sentinel=True,
        sentinel_set=SentinelSet(
            (("10.0.0.1", 26379), ("10.0.0.2", 26380)), "mymaster", password="pw", sentinel_password="spw"
        ),
    )
    # LiteLLM's variables: nodes as JSON, the service name, the sentinels' password.
    monkeypatch.setenv("REDIS_SENTINEL_NODES", '[["10.0.0.3", 26381]]')
    monkeypatch.setenv("REDIS_SERVICE_NAME", "svc")
    monkeypatch.setenv("REDIS_SENTINEL_PASSWORD", "envspw")
    target = resolve_redis(load_proxy_config(_config(tmp_path, CLUSTER_CACHE)))
    assert target.sentinel and target.source == "REDIS_SENTINEL_NODES, service 'svc'"
    assert target.sentinel_set == SentinelSet((("10.0.0.3", 26381),), "svc", password="pw", sentinel_password="envspw")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    sentinel_nodes: [[10.0.0.1, 26379]]\n", "cache_params.service_name: required with"),
        ("    sentinel_nodes: [[10.0.0.1]]\n    service_name: m\n", "sentinel_nodes[0]: must be a [host, port"),
        ("    sentinel_nodes: [[10.0.0.1, 0]]\n    service_name: m\n", "sentinel_nodes[0]: must be a [host, port"),
        ("    sentinel_nodes: '[[oops'\n    service_name: m\n", "sentinel_nodes: not valid JSON"),
    ],
)
def test_bad_sentinel_settings_name_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, message: str
) -> None:
    for name in ("REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES", "REDIS_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        resolve_redis(load_proxy_config(_config(tmp_path, CLUSTER_CACHE + extra)))


def test_deployment_ids_follow_litellm_router_rule(tmp_path: Path) -> None:
    from litellm.router import Router

    model_list = [
        {"model_name": "g", "litellm_params": {"model": "openai/a", "api_key": "sk-x", "rpm": 5, "tpm": 100}},
        {
            "model_name": "g",
            "litellm_params": {"model": "openai/b", "api_key": "sk-x", "rpm": 7},
            "model_info": {"id": "b"},
        },
    ]
    path = _config(tmp_path, json.dumps({"model_list": model_list}))
    deployments = config_deployments(load_proxy_config(path))
    listed = Router(model_list=model_list).get_model_list()
    assert listed is not None
    expected = [d["model_info"]["id"] for d in listed]
    assert [d.deployment_id for d in deployments] == expected
    assert expected[1] == "b" and len(expected[0]) == 64  # LiteLLM's sha256 of the params
    assert group_capacity(deployments) == (12, 100)


def test_status_command_on_a_sentinel_set_with_no_sentinel_answering_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from litellm_ratebalance.cli import EXIT_STORE, main
    from tests.servers import free_port

    for name in ("REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES", "REDIS_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()  # nothing listens there: refused at once
    config = _config(
        tmp_path, CLUSTER_CACHE + f"    sentinel_nodes: [[127.0.0.1, {port}]]\n    service_name: mymaster\n"
    )
    assert main(["status", "--config", str(config), "--timeout", "1"]) == EXIT_STORE
    err = capsys.readouterr().err
    assert f"no sentinel (127.0.0.1:{port}) named a master for service 'mymaster'" in err
    assert "embedded store" not in err and "pw" not in err.replace("password", "")


def test_cluster_flag_without_a_url_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from litellm_ratebalance.cli import EXIT_USAGE, main

    config = _config(tmp_path, CLUSTER_CACHE)
    assert main(["status", "--config", str(config), "--cluster"]) == EXIT_USAGE
    assert "--cluster reads the --redis-url given as a Redis Cluster node" in capsys.readouterr().err


def test_cluster_flag_with_a_url_no_cluster_can_use_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from litellm_ratebalance.cli import EXIT_USAGE, main

    config = _config(tmp_path, CLUSTER_CACHE)
    assert main(["status", "--config", str(config), "--redis-url", "unix:///tmp/r.sock", "--cluster"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid Redis URL unix:///tmp/r.sock (--redis-url)" in err and "Traceback" not in err


def test_replicas_show_their_loop_lag_and_store_errors_by_cause() -> None:
    report = replace(
        _report(),
        replicas=(
            ReplicaHealth("proxy-a:7", 10.0, 950, 0.41, 0.39, {}, reported_ms=NOW - 4_000),
            ReplicaHealth("proxy-b:9", 10.0, 40, 0.5, 0.001, {"timeout": 12, "breaker": 30}, reported_ms=NOW - 2_000),
        ),
    )
    doc = report_json(report)
    assert doc["replicas"][1] == {
        "replica": "proxy-b:9",
        "reported_ms": NOW - 2_000,
        "interval_seconds": 10.0,
        "store_calls": 40,
        "store_call_max_seconds": 0.5,
        "loop_lag_max_seconds": 0.001,
        "store_errors": {"timeout": 12, "breaker": 30},
    }
    lines = format_table(report).splitlines()
    assert "replicas: 2 reporting (store health over each one's last interval)" in lines
    a = next(line for line in lines if line.lstrip().startswith("proxy-a:7")).split()
    b = next(line for line in lines if line.lstrip().startswith("proxy-b:9")).split()
    assert a == ["proxy-a:7", "4", "950", "0.410", "0.390", "none"]  # busy: the loop stalled as long as the call
    assert b[:5] == ["proxy-b:9", "2", "40", "0.500", "0.001"]  # Redis slow: the loop kept up
    assert " ".join(b[5:]) == "breaker 30, timeout 12"
