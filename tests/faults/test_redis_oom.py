"""Redis runs out of memory (``maxmemory`` reached under ``noeviction``) under steady load over the limit.

Two real ``litellm`` proxies share one redis-server started with ``maxmemory-policy noeviction``: replica
``open`` with ``fail_mode: open``, replica ``closed`` with ``fail_mode: closed`` (same key prefix: they count
the same model group). Phases:

1. healthy: one window of steady load, exactly ``RPM`` admitted;
2. full: a big key (not ours) of ``FILLER_BYTES``, then ``maxmemory`` set to what Redis used before it plus
   half of it (Redis is then 2 MB over its limit);
   steady load for ``FULL_S`` seconds;
3. freed: the big key is deleted (no restart of anything); the load goes on until both replicas count again;
4. a fresh window of steady load: exactly ``RPM`` admitted again.

What must hold (asserted below):

* full: our writes are refused by Redis with ``OOM`` (the proxies log ``OutOfMemoryError``) and the fail mode applies:
  ``open`` serves uncounted, ``closed`` answers 503 with ``retry-after``; no other status. One exception, by
  Redis's rules: the request that restarts an ended window is admitted and counted (the restart begins
  with a ``DEL``, which Redis runs when full, and a script that has written is let finish), so each window
  that starts while Redis is full holds exactly one request;
* freed: both replicas count again within ``store_retry_after_seconds`` (+ slack) of the delete;
* afterwards a window admits exactly ``RPM``; no key of ours is left without a TTL.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.harness import LiteLLMProxy, litellm_binary, mock_deployment, start_all, stop_all
from tests.faults.support import Load, Outcome, Recorder, by_status, keys_without_ttl, litellm_window_phase, steady
from tests.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "faults-oom"
MODEL = "oom"
RPM = 15
WINDOW_S = 3
LOAD = Load(PREFIX, MODEL, WINDOW_S)
RETRY_AFTER_S = 0.5
FULL_S = 2.5
FILLER_BYTES = 4 * 1024 * 1024
FILLER_KEY = "not-ours:filler"
SLACK_S = 0.8


def config(fail_mode: str) -> dict[str, Any]:
    return {
        "model_list": [mock_deployment(MODEL, rpm=RPM)],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter"],
            "ratebalance": {
                "key_prefix": PREFIX,
                "fail_mode": fail_mode,
                # Redis answers at once here (an OOM error is an answer): a slow call on 2 busy cores must not
                # fail open while Redis is healthy and blur the exact counts.
                "store_timeout_seconds": 5.0,
                "store_retry_after_seconds": RETRY_AFTER_S,
                "fault_log_interval_seconds": 3600,
                "limiter": {"window_seconds": WINDOW_S},
            },
        },
        "router_settings": {"num_retries": 0},
    }


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=("--maxmemory-policy", "noeviction")) as server:
        yield server


@pytest.fixture(scope="module")
def replicas(own_redis: RedisServer) -> Iterator[list[LiteLLMProxy]]:
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    pair = [LiteLLMProxy(config(mode), redis_url=own_redis.url, name=mode) for mode in ("open", "closed")]
    try:
        yield start_all(pair)
    finally:
        stop_all(pair)


def used_memory(sync: redis.Redis) -> int:
    info: dict[str, Any] = sync.info("memory")  # type: ignore[assignment]
    return int(info["used_memory"])


async def test_redis_out_of_memory_applies_the_fail_mode_and_recovers_without_restart(
    replicas: list[LiteLLMProxy], own_redis: RedisServer
) -> None:
    open_, closed = replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    recorder = Recorder()
    async with open_.async_client() as client_open, closed.async_client() as client_closed:
        targets = [(open_, client_open), (closed, client_closed)]
        healthy, healthy_outcomes = await LOAD.window_phase(targets, recorder, sync)

        # Full: one big key (not ours), then maxmemory set below what Redis now uses, by a margin no client
        # buffer comes and goes by.
        base = used_memory(sync)
        sync.set(FILLER_KEY, b"x" * FILLER_BYTES)
        sync.config_set("maxmemory", base + FILLER_BYTES // 2)
        assert used_memory(sync) > base + FILLER_BYTES // 2 + 1024 * 1024
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            sync.set("not-ours:probe", b"1")  # Redis refuses writes now
        before = LOAD.window(sync)
        full_from = time.time()
        tasks: set[Any] = set()
        await steady(
            targets, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20},
            recorder, until=full_from + FULL_S, interval_s=LOAD.interval_s, tasks=tasks,
        )  # fmt: skip
        for task in tasks:
            await task
        full_outcomes: list[Outcome] = recorder.between(full_from, time.time())
        during = LOAD.window(sync)

        # Freed: delete the big key; nothing restarts.
        sync.delete(FILLER_KEY)
        freed_at = time.time()
        recovered = await LOAD.until_recovered(targets, recorder, freed_at)

        await LOAD.until_window_ends(sync)
        after, after_outcomes = await LOAD.window_phase(targets, recorder, sync)

    full_open = [o for o in full_outcomes if o.replica == open_.name]
    full_closed = [o for o in full_outcomes if o.replica == closed.name]
    report = {
        "healthy": by_status(healthy_outcomes),
        "healthy r": healthy["r"],
        "full open": by_status(full_open),
        "full closed": by_status(full_closed),
        "window before/after the full phase": (before, during),
        "recovered after (s)": {k: None if v is None else round(v, 2) for k, v in recovered.items()},
        "after": by_status(after_outcomes),
        "after r": after["r"],
    }
    print(report)

    assert healthy["r"] == RPM and by_status(healthy_outcomes) == {200: RPM, 429: len(healthy_outcomes) - RPM}, report
    # Full: the first request of the phase found the healthy window ended and restarted it: that script begins
    # with a DEL, which Redis allows when full (it frees memory), and a script that has written is let finish,
    # so that one admission is counted in a fresh window. Every other write of ours was refused (OOM), so the
    # window holds that one request and nothing else, and the fail mode applied to every other request.
    assert before["start"] < full_from * 1000 <= during["start"] and during["r"] == 1, report
    counted = [o for o in full_outcomes if o.counted]
    assert len(counted) == 1 and counted[0].sent < full_from + LOAD.interval_s / 2, report  # (one of the first two)
    for proxy in (open_, closed):
        logged = [line for line in proxy.log_text().splitlines() if "store error, failing" in line]
        assert logged and "OutOfMemoryError" in logged[0], (proxy.name, logged)
    assert len(full_open) >= FULL_S / LOAD.interval_s - 2, report
    assert by_status(full_open) == {200: len(full_open)}, report
    uncounted_closed = [o for o in full_closed if not o.counted]
    assert by_status(uncounted_closed) == {503: len(full_closed) - sum(o.counted for o in full_closed)}, report
    assert all(o.retry_after == "1" for o in uncounted_closed)
    # Freed: counting again within a breaker cool-down, no restart.
    for name, seconds in recovered.items():
        assert seconds is not None and seconds <= RETRY_AFTER_S + SLACK_S, (name, report)
    assert all(proxy.running for proxy in (open_, closed))
    assert after["r"] == RPM and by_status(after_outcomes) == {200: RPM, 429: len(after_outcomes) - RPM}, report
    assert keys_without_ttl(sync, PREFIX) == []
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------
LITELLM_MODEL = "oom-litellm"
LIMIT_AUTH = Path(__file__).with_name("limit_auth.py")


def litellm_config(own_redis: RedisServer, *, fail_closed: bool) -> dict[str, Any]:
    general: dict[str, Any] = {"custom_auth": "limit_auth.user_api_key_auth"}
    if fail_closed:
        general["fail_closed_rate_limit_enforcement"] = True
    return {
        "model_list": [mock_deployment(LITELLM_MODEL)],
        "litellm_settings": {
            "cache": True,
            "cache_params": {"type": "redis", "host": "127.0.0.1", "port": own_redis.port, "mode": "default_off"},
        },
        "general_settings": general,
        "router_settings": {"num_retries": 0},
    }


@pytest.fixture(scope="module")
def litellm_replicas(own_redis: RedisServer) -> Iterator[list[LiteLLMProxy]]:
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    env = {"LITELLM_RATE_LIMIT_WINDOW_SIZE": str(WINDOW_S), "RATEBALANCE_FAULTS_RPM_LIMIT": str(RPM)}
    pair = [
        LiteLLMProxy(litellm_config(own_redis, fail_closed=closed), env=env, name=name)
        for name, closed in (("litellm-open", False), ("litellm-closed", True))
    ]
    for proxy in pair:
        shutil.copyfile(LIMIT_AUTH, proxy.workdir / LIMIT_AUTH.name)
    try:
        yield start_all(pair)
    finally:
        stop_all(pair)


async def test_litellm_limiter_when_redis_is_out_of_memory(
    litellm_replicas: list[LiteLLMProxy], own_redis: RedisServer
) -> None:
    open_, closed = litellm_replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    sync.config_set("maxmemory", 0)
    recorder = Recorder()
    async with open_.async_client() as client_open, closed.async_client() as client_closed:
        targets = [(open_, client_open), (closed, client_closed)]
        healthy = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        base = used_memory(sync)
        sync.set(FILLER_KEY, b"x" * FILLER_BYTES)
        sync.config_set("maxmemory", base + FILLER_BYTES // 2)
        full = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        sync.delete(FILLER_KEY)
        after = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)

    def per_replica(outcomes: list[Outcome]) -> dict[str, dict[int | str, int]]:
        return {p.name: by_status(o for o in outcomes if o.replica == p.name) for p in (open_, closed)}

    full_closed = sorted((o for o in full if o.replica == closed.name), key=lambda o: o.sent)
    report = {
        "healthy": per_replica(healthy),
        "full": per_replica(full),
        "full closed, served at rank": [i for i, o in enumerate(full_closed) if o.status == 200],
        "full closed retry-after": sorted({str(o.retry_after) for o in full_closed if o.status == 503}),
        "after": per_replica(after),
    }
    print(report)

    def admitted(outcomes: list[Outcome]) -> int:
        return sum(o.status == 200 for o in outcomes)

    assert admitted(healthy) == RPM and admitted(after) == RPM, report  # exact across both replicas when healthy
    assert all(o.status in (200, 429) for o in [*healthy, *after]), report
    # Full: the fail-open replica falls back to counting in its own memory, so it enforces the whole limit by
    # itself (every fail-open replica would: n replicas admit n x the limit); the fail-closed one
    # (fail_closed_rate_limit_enforcement) refuses with 503 (no retry-after), except, in some runs, the first
    # request of the window (both replicas send one at once: whichever restarts the window in Redis).
    full_open = [o for o in full if o.replica == open_.name]
    assert by_status(full_open) == {200: RPM, 429: len(full_open) - RPM}, report
    assert all(o.status == 503 for o in full_closed[1:]) and full_closed[0].status in (200, 503), report
    sync.close()
