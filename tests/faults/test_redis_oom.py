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

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.e2e.harness import LiteLLMProxy, mock_deployment
from tests.faults.replicas import (
    OPEN_AND_CLOSED,
    ratebalance_config,
    redis_cache,
    running_fail_modes,
    running_litellm_limiter,
)
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
)
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
    return ratebalance_config(
        LOAD,
        mock_deployment(MODEL, rpm=RPM),
        fail_mode=fail_mode,
        # Redis answers at once here (an OOM error is an answer): a slow call on 2 busy cores must not fail
        # open while Redis is healthy and blur the exact counts.
        timeout_s=5.0,
        retry_after_s=RETRY_AFTER_S,
        fault_log_interval_s=3600,
    )


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=("--maxmemory-policy", "noeviction")) as server:
        yield server


@pytest.fixture(scope="module")
def replicas(own_redis: RedisServer) -> Iterator[list[LiteLLMProxy]]:
    with running_fail_modes(config, redis_url=own_redis.url) as pair:
        yield pair


def used_memory(sync: redis.Redis) -> int:
    info: dict[str, Any] = sync.info("memory")  # type: ignore[assignment]
    return int(info["used_memory"])


async def test_redis_out_of_memory_applies_the_fail_mode_and_recovers_without_restart(
    replicas: list[LiteLLMProxy], own_redis: RedisServer
) -> None:
    open_, closed = replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    recorder = Recorder()
    async with connected(replicas) as targets:
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
        full_outcomes = await load_for(targets, recorder, MODEL, since=full_from, seconds=FULL_S)
        during = LOAD.window(sync)

        # Freed: delete the big key; nothing restarts.
        sync.delete(FILLER_KEY)
        freed_at = time.time()
        recovered = await LOAD.until_recovered(targets, recorder, freed_at)

        await LOAD.until_window_ends(sync)
        after, after_outcomes = await LOAD.window_phase(targets, recorder, sync)

    full_open = of_replica(full_outcomes, open_)
    full_closed = of_replica(full_outcomes, closed)
    report = {
        "healthy": by_status(healthy_outcomes),
        "healthy r": healthy["r"],
        "full open": by_status(full_open),
        "full closed": by_status(full_closed),
        "window before/after the full phase": (before, during),
        "recovered after (s)": rounded(recovered),
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
    assert LOAD.keys_without_ttl(sync) == []
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------
LITELLM_MODEL = "oom-litellm"


@pytest.fixture(scope="module")
def litellm_replicas(own_redis: RedisServer) -> Iterator[list[LiteLLMProxy]]:
    deployment = mock_deployment(LITELLM_MODEL)
    with running_litellm_limiter(
        deployment, redis_cache(own_redis.port), OPEN_AND_CLOSED, window_s=WINDOW_S, rpm=RPM
    ) as pair:
        yield pair


async def test_litellm_limiter_when_redis_is_out_of_memory(
    litellm_replicas: list[LiteLLMProxy], own_redis: RedisServer
) -> None:
    open_, closed = litellm_replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    sync.config_set("maxmemory", 0)
    recorder = Recorder()
    async with connected(litellm_replicas) as targets:
        healthy = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        base = used_memory(sync)
        sync.set(FILLER_KEY, b"x" * FILLER_BYTES)
        sync.config_set("maxmemory", base + FILLER_BYTES // 2)
        full = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        sync.delete(FILLER_KEY)
        after = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)

    full_closed = sorted(of_replica(full, closed), key=lambda o: o.sent)
    report = {
        "healthy": per_replica(healthy, litellm_replicas),
        "full": per_replica(full, litellm_replicas),
        "full closed, served at rank": [i for i, o in enumerate(full_closed) if o.status == 200],
        "full closed retry-after": sorted({str(o.retry_after) for o in full_closed if o.status == 503}),
        "after": per_replica(after, litellm_replicas),
    }
    print(report)

    assert admitted(healthy) == RPM and admitted(after) == RPM, report  # exact across both replicas when healthy
    assert all(o.status in (200, 429) for o in [*healthy, *after]), report
    # Full: the fail-open replica falls back to counting in its own memory, so it enforces the whole limit by
    # itself (every fail-open replica would: n replicas admit n x the limit); the fail-closed one
    # (fail_closed_rate_limit_enforcement) refuses with 503 (no retry-after), except, in some runs, the first
    # request of the window (both replicas send one at once: whichever restarts the window in Redis).
    full_open = of_replica(full, open_)
    assert by_status(full_open) == {200: RPM, 429: len(full_open) - RPM}, report
    assert all(o.status == 503 for o in full_closed[1:]) and full_closed[0].status in (200, 503), report
    sync.close()
