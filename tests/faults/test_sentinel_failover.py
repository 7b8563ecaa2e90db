"""The Redis master of a Sentinel set is killed under steady load over the limit; the replica is promoted.

A master, a replica and three sentinels (tests/faults/sentinel.py), and two real ``litellm`` proxies that reach
Redis the LiteLLM way: ``litellm_settings.cache_params`` with ``sentinel_nodes`` and ``service_name`` (response
caching left off with ``mode: default_off``), so the store runs on LiteLLM's Sentinel-managed client. Replica
``open`` has ``fail_mode: open``, replica ``closed`` ``fail_mode: closed``; both count the same model group.

Phases: a healthy window (exactly ``RPM`` admitted); SIGKILL of the master, steady load on until both replicas
count through Redis again; a fresh window on the new master (exactly ``RPM`` admitted again).

What must hold (asserted below):

* during the switch the fail mode applies: ``open`` serves (uncounted), ``closed`` answers 503 with
  ``retry-after``; no other status than 200, 429 and (``closed`` only) 503;
* limits hold again within seconds: both replicas count through Redis again within
  ``store_retry_after_seconds`` (+ slack) of the sentinels naming the new master;
* the fresh window admits exactly ``RPM``, on the promoted replica, whose keys of ours all have a TTL;
* ``litellm-ratebalance status`` on the proxy's config reads the master the sentinels name: the old one
  before, the promoted one after (with the live window's count).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment
from tests.faults.replicas import (
    OPEN_AND_CLOSED,
    ratebalance_config,
    running_fail_modes,
    running_litellm_limiter,
    sentinel_cache,
)
from tests.faults.sentinel import SERVICE, SentinelSet
from tests.faults.support import (
    Load,
    Recorder,
    admitted,
    by_status,
    connected,
    litellm_window_phase,
    load_for,
    of_replica,
    per_replica,
    rounded,
    send_one,
)

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "faults-sentinel"
MODEL = "sentinel"
RPM = 15
WINDOW_S = 3
LOAD = Load(PREFIX, MODEL, WINDOW_S)
TIMEOUT_S = 0.5
RETRY_AFTER_S = 0.5
SLACK_S = 1.5
"""The sentinels' view and a replica's first new connection are not simultaneous; on 2 shared cores."""


@pytest.fixture(scope="module")
def redis_set() -> Iterator[SentinelSet]:
    with SentinelSet() as sentinels:
        yield sentinels


def config(redis_set: SentinelSet, fail_mode: str) -> dict[str, Any]:
    return ratebalance_config(
        LOAD,
        mock_deployment(MODEL, rpm=RPM),
        fail_mode=fail_mode,
        timeout_s=TIMEOUT_S,
        retry_after_s=RETRY_AFTER_S,
        fault_log_interval_s=3600,
        cache_params=sentinel_cache(redis_set.sentinel_nodes, SERVICE),
    )


@pytest.fixture(scope="module")
def replicas(redis_set: SentinelSet) -> Iterator[list[LiteLLMProxy]]:
    with running_fail_modes(lambda mode: config(redis_set, mode)) as pair:
        yield pair


async def read_status(proxy: LiteLLMProxy) -> dict[str, Any]:
    """``litellm-ratebalance status --json`` on the proxy's own config.yaml (in a thread: it runs its own loop)."""
    from litellm_ratebalance.cli import main

    def run() -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["status", "--config", str(proxy.workdir / "config.yaml"), "--json"])
        return code, out.getvalue()

    code, text = await asyncio.to_thread(run)
    assert code == 0, text
    document: dict[str, Any] = json.loads(text)
    return document


async def test_master_killed_the_replica_takes_over(redis_set: SentinelSet, replicas: list[LiteLLMProxy]) -> None:
    open_, closed = replicas
    recorder = Recorder()
    old_port = redis_set.master_port()
    sync = redis.Redis(host="127.0.0.1", port=old_port, socket_timeout=2)
    async with connected(replicas) as targets:
        healthy, healthy_outcomes = await LOAD.window_phase(targets, recorder, sync)
        sync.close()
        status_before = await read_status(open_)

        killed_at = time.time()
        redis_set.kill_master()
        failover = asyncio.create_task(asyncio.to_thread(redis_set.wait_for_new_master, old_port))
        recovered = await LOAD.until_recovered(targets, recorder, killed_at, timeout_s=30.0)
        failover_s = await failover
        switch_outcomes = recorder.between(killed_at, killed_at + max(v or 0.0 for v in recovered.values()))

        new_port = redis_set.master_port()
        sync = redis.Redis(host="127.0.0.1", port=new_port, socket_timeout=2)
        await LOAD.until_window_ends(sync)
        after, after_outcomes = await LOAD.window_phase(targets, recorder, sync)
        client_open = targets[0][1]
        one_more = await send_one(client_open, open_, chat_body(MODEL), recorder)  # opens a new window
        status_after = await read_status(open_)

    switch_open = of_replica(switch_outcomes, open_)
    switch_closed = of_replica(switch_outcomes, closed)
    report = {
        "healthy": (by_status(healthy_outcomes), healthy["r"]),
        "master port old/new": (old_port, new_port),
        "sentinels named the new master after (s)": round(failover_s, 2),
        "counting again after the kill (s)": rounded(recovered),
        "switch open": by_status(switch_open),
        "switch open counted": sum(o.counted for o in switch_open),
        "switch closed": by_status(switch_closed),
        "after": (by_status(after_outcomes), after["r"]),
    }
    print(report)

    assert healthy["r"] == RPM and by_status(healthy_outcomes)[200] == RPM, report
    assert new_port == redis_set.replica.port != old_port
    # During the switch: the fail mode, and nothing else.
    assert set(by_status(switch_open)) <= {200, 429}, report
    assert any(not o.counted for o in switch_open if o.status == 200), report  # served without the store
    assert set(by_status(switch_closed)) <= {200, 429, 503} and by_status(switch_closed).get(503, 0) > 0, report
    assert all(o.retry_after == "1" for o in switch_closed if o.status == 503)
    # Within seconds of the sentinels' switch, every replica counts on the new master.
    for name, seconds in recovered.items():
        assert seconds is not None and seconds <= failover_s + RETRY_AFTER_S + SLACK_S, (name, report)
    assert after["r"] == RPM and by_status(after_outcomes) == {200: RPM, 429: len(after_outcomes) - RPM}, report
    assert all(o.counted for o in after_outcomes if o.status == 200)
    # `litellm-ratebalance status` with the proxy's own config asks the sentinels for the master, then and now.
    assert status_before["store"]["url"] == f"redis://127.0.0.1:{old_port}", status_before["store"]
    assert status_after["store"]["url"] == f"redis://127.0.0.1:{new_port}", status_after["store"]
    where = f"litellm_settings.cache_params.sentinel_nodes, service {SERVICE!r}"
    assert status_after["store"]["source"] == f"{where}: master 127.0.0.1:{new_port} per the sentinels"
    (group,) = status_after["model_groups"]
    assert one_more.counted and (group["model_group"], group["requests"], group["window"]["live"]) == (MODEL, 1, True)
    assert sync.pttl(LOAD.keys.admission_window(MODEL)) > 0
    assert LOAD.keys_without_ttl(sync) == []
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------
SWITCH_LOAD_S = 8.0
"""Load after the kill under LiteLLM's limiter: the sentinels' switch (about 2.5 s) and a few seconds more."""


@pytest.fixture(scope="module")
def litellm_redis_set() -> Iterator[SentinelSet]:
    with SentinelSet() as sentinels:
        yield sentinels


@pytest.fixture(scope="module")
def litellm_replicas(litellm_redis_set: SentinelSet) -> Iterator[list[LiteLLMProxy]]:
    cache = sentinel_cache(litellm_redis_set.sentinel_nodes, SERVICE)
    with running_litellm_limiter(mock_deployment(MODEL), cache, OPEN_AND_CLOSED, window_s=WINDOW_S, rpm=RPM) as pair:
        yield pair


async def test_litellm_limiter_when_the_master_is_killed(
    litellm_redis_set: SentinelSet, litellm_replicas: list[LiteLLMProxy]
) -> None:
    open_, closed = litellm_replicas
    recorder = Recorder()
    old_port = litellm_redis_set.master_port()
    async with connected(litellm_replicas) as targets:
        healthy = await litellm_window_phase(targets, recorder, MODEL, window_s=WINDOW_S)
        killed_at = time.time()
        litellm_redis_set.kill_master()
        failover = asyncio.create_task(asyncio.to_thread(litellm_redis_set.wait_for_new_master, old_port))
        switch = await load_for(targets, recorder, MODEL, since=killed_at, seconds=SWITCH_LOAD_S)
        failover_s = await failover
        await asyncio.sleep(1.0)
        after = await litellm_window_phase(targets, recorder, MODEL, window_s=WINDOW_S)

    switch_closed = sorted(of_replica(switch, closed), key=lambda o: o.sent)
    failing = [o for o in switch_closed if o.status not in (200, 429)]
    last_failure = max((o.sent for o in failing), default=killed_at) - killed_at
    report = {
        "healthy": by_status(healthy),
        "sentinels named the new master after (s)": round(failover_s, 2),
        "switch open": by_status(of_replica(switch, open_)),
        "switch closed": by_status(switch_closed),
        "closed: last failure sent after the kill (s)": round(last_failure, 2),
        "switch latency worst (s)": round(max(o.latency for o in switch), 2),
        "after": per_replica(after, litellm_replicas),
    }
    print(report)

    assert admitted(healthy) == RPM, report  # exact across both replicas when healthy
    # LiteLLM's Redis client has a circuit breaker of its own: five failures in a row open it for 60 s, so the
    # limiter does not go back to Redis for a minute, however soon the sentinels name the new master.
    logged = [line for line in closed.log_text().splitlines() if "Redis circuit breaker OPENED" in line]
    assert logged and "for 60s" in logged[0], logged
    # Fail closed (fail_closed_rate_limit_enforcement): 503 for every request from shortly after the kill to
    # the end of the test, long after the switch.
    late = [o for o in [*switch_closed, *after] if o.replica == closed.name and o.sent > killed_at + 1.0]
    assert late and all(o.status == 503 for o in late), report
    # Fail open: each replica counts in its own memory: at most the limit per window, from this replica alone.
    switch_open = of_replica(switch, open_)
    assert all(o.status in (200, 429) for o in switch_open), report
    assert sum(o.status == 200 for o in switch_open) <= RPM * (math.ceil(SWITCH_LOAD_S / WINDOW_S) + 1), report
    assert by_status(of_replica(after, open_)).get(200) == RPM, report
