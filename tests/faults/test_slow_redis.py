"""Redis gets slow (latency past ``store_timeout_seconds``) under steady load over the limit.

Two real ``litellm`` proxies share one redis-server through a delaying TCP proxy (tests/faults/delay_proxy.py):
replica ``open`` with ``fail_mode: open``, replica ``closed`` with ``fail_mode: closed``, same key prefix (they
count the same model group). ``store_timeout_seconds`` is ``TIMEOUT_S``, ``store_retry_after_seconds``
``RETRY_AFTER_S``. Phases:

1. healthy: a burst of ``BURST`` concurrent requests per replica, then one window of steady load with exactly
   ``RPM`` admitted (the baseline latencies of a burst and of single requests);
2. slow: every round trip to Redis takes ``2 * DELAY_S`` longer (past the timeout) for ``SLOW_S`` seconds of
   steady load, then (still slow) a burst of ``BURST`` concurrent requests per replica;
3. healed: the delay is removed; the load goes on until both replicas count through Redis again;
4. a fresh window of steady load: exactly ``RPM`` admitted again.

What must hold (asserted below):

* slow: ``open`` serves every request (uncounted: no ``x-litellm-saturation``), ``closed`` answers every one
  503 with ``retry-after``; no other status;
* the latency a request gains is bounded by the timeout, whatever the number of requests: no request takes
  longer than the baseline's worst + ``TIMEOUT_S`` + slack, the slow burst takes at most ``TIMEOUT_S`` (+ slack)
  longer than the healthy one (not ``BURST x TIMEOUT_S``), and only requests that found the circuit breaker
  closed wait at all (at most those arriving during one ``TIMEOUT_S`` per ``RETRY_AFTER_S`` cycle), the
  others fail over at once;
* healed: both replicas count again within ``RETRY_AFTER_S + TIMEOUT_S`` (+ slack) of the delay ending;
* afterwards a window admits exactly ``RPM``; no key is left without a TTL.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.harness import LiteLLMProxy, chat_body, litellm_binary, mock_deployment, start_all, stop_all
from tests.faults.delay_proxy import DelayProxy
from tests.faults.support import (
    Load,
    Outcome,
    Recorder,
    by_status,
    keys_without_ttl,
    litellm_window_phase,
    send_one,
    steady,
)
from tests.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "faults-slow"
MODEL = "slow"
RPM = 15
WINDOW_S = 3
LOAD = Load(PREFIX, MODEL, WINDOW_S)
TIMEOUT_S = 0.25
RETRY_AFTER_S = 1.0
DELAY_S = 0.5
"""One way: a round trip gains 1 s, four times the timeout."""
SLOW_S = 3.0
BURST = 30
SLACK_S = 0.6
"""Scheduling noise on 2 shared cores (the proxies, the load, Redis and the delay proxy all run here)."""


def config(fail_mode: str) -> dict[str, Any]:
    return {
        "model_list": [mock_deployment(MODEL, rpm=RPM)],
        "litellm_settings": {
            "callbacks": ["litellm_ratebalance.rate_limiter"],
            "ratebalance": {
                "key_prefix": PREFIX,
                "fail_mode": fail_mode,
                "store_timeout_seconds": TIMEOUT_S,
                "store_retry_after_seconds": RETRY_AFTER_S,
                "fault_log_interval_seconds": 3600,
                "limiter": {"window_seconds": WINDOW_S},
            },
        },
        "router_settings": {"num_retries": 0},
    }


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def slow_link(own_redis: RedisServer) -> Iterator[DelayProxy]:
    with DelayProxy(own_redis.port) as link:
        yield link


@pytest.fixture(scope="module")
def replicas(slow_link: DelayProxy) -> Iterator[list[LiteLLMProxy]]:
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    pair = [LiteLLMProxy(config(mode), redis_url=slow_link.url, name=mode) for mode in ("open", "closed")]
    try:
        yield start_all(pair)
    finally:
        stop_all(pair)


async def test_slow_redis_applies_the_fail_mode_with_bounded_latency(
    replicas: list[LiteLLMProxy], slow_link: DelayProxy, own_redis: RedisServer
) -> None:
    open_, closed = replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=2)  # direct, not through the delay
    recorder = Recorder()
    async with open_.async_client() as client_open, closed.async_client() as client_closed:
        targets = [(open_, client_open), (closed, client_closed)]
        # Warm-up (store clients made, scripts loaded) with the burst done healthy: its latency is the baseline
        # of the burst done slow below. Then a window of steady load: the baseline of single requests.
        healthy_burst = await asyncio.gather(
            *(send_one(c, p, chat_body(MODEL), Recorder()) for p, c in targets for _ in range(BURST))
        )
        await asyncio.sleep(WINDOW_S + 0.1)
        healthy, healthy_outcomes = await LOAD.window_phase(targets, recorder, sync)

        # Slow: steady load.
        slow_link.delay_s = DELAY_S
        slow_from = time.time()
        tasks: set[asyncio.Task[Outcome]] = set()
        until = slow_from + SLOW_S
        await steady(targets, chat_body(MODEL), recorder, until=until, interval_s=LOAD.interval_s, tasks=tasks)
        await asyncio.gather(*tasks)
        slow_outcomes = recorder.between(slow_from, time.time())
        # Still slow: a burst, once the breaker has closed again (the first request of it pays the timeout).
        await asyncio.sleep(RETRY_AFTER_S)
        burst = await asyncio.gather(
            *(send_one(client, proxy, chat_body(MODEL), Recorder()) for proxy, client in targets for _ in range(BURST))
        )
        healed_at = time.time()
        slow_link.delay_s = 0.0

        # Healed: the load goes on until every answer of a whole second is decided in Redis on both replicas.
        recovered = await LOAD.until_recovered(targets, recorder, healed_at)

        # A fresh window: the limit holds exactly again.
        await LOAD.until_window_ends(sync)
        after, after_outcomes = await LOAD.window_phase(targets, recorder, sync)

    base_worst = max(o.latency for o in healthy_outcomes)
    base_median = statistics.median(o.latency for o in healthy_outcomes)
    slow_open = [o for o in slow_outcomes if o.replica == open_.name]
    slow_closed = [o for o in slow_outcomes if o.replica == closed.name]
    waited = [o for o in slow_outcomes if o.latency > base_median + TIMEOUT_S / 2]
    report = {
        "healthy": by_status(healthy_outcomes),
        "healthy r": healthy["r"],
        "baseline latency median/worst (s)": (round(base_median, 3), round(base_worst, 3)),
        "slow open": by_status(slow_open),
        "slow closed": by_status(slow_closed),
        "slow latency worst (s)": round(max(o.latency for o in slow_outcomes), 3),
        "slow latencies (s)": [
            (o.replica[0], round(o.sent - slow_from, 2), round(o.latency, 2)) for o in slow_outcomes if o.latency > 0.1
        ],
        "requests that waited for the timeout": f"{len(waited)} of {len(slow_outcomes)}",
        "burst worst healthy/slow (s)": (
            round(max(o.latency for o in healthy_burst), 3),
            round(max(o.latency for o in burst), 3),
        ),
        "burst": by_status(burst),
        "recovered after (s)": {k: None if v is None else round(v, 2) for k, v in recovered.items()},
        "after": by_status(after_outcomes),
        "after r": after["r"],
    }
    print(report)

    assert healthy["r"] == RPM and by_status(healthy_outcomes) == {200: RPM, 429: len(healthy_outcomes) - RPM}, report
    # Slow: the fail mode applies, and nothing else.
    assert by_status(slow_open) == {200: len(slow_open)}, report
    assert not any(o.counted for o in slow_open), report
    assert by_status(slow_closed) == {503: len(slow_closed)}, report
    assert all(o.retry_after == "1" for o in slow_closed)
    burst_open = [o for o in burst if o.replica == open_.name]
    burst_closed = [o for o in burst if o.replica == closed.name]
    assert by_status(burst_open) == {200: BURST} and by_status(burst_closed) == {503: BURST}, report
    # Bounded by the timeout, not by the number of requests.
    assert max(o.latency for o in slow_outcomes) <= base_worst + TIMEOUT_S + SLACK_S, report
    assert max(o.latency for o in burst) <= max(o.latency for o in healthy_burst) + TIMEOUT_S + SLACK_S, report
    cycles = math.ceil(SLOW_S / RETRY_AFTER_S) + 1
    per_cycle = math.ceil(TIMEOUT_S / LOAD.interval_s) + 1  # requests arriving while one timeout runs
    assert len(waited) <= 2 * cycles * per_cycle, report  # 2 replicas
    assert len(waited) < len(slow_outcomes) / 2, report
    # Healed: counting again within a breaker cool-down plus a timeout.
    for name, seconds in recovered.items():
        assert seconds is not None and seconds <= RETRY_AFTER_S + TIMEOUT_S + SLACK_S, (name, report)
    assert after["r"] == RPM and by_status(after_outcomes) == {200: RPM, 429: len(after_outcomes) - RPM}, report
    assert keys_without_ttl(sync, PREFIX) == []
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------
LITELLM_MODEL = "slow-litellm"
LIMIT_AUTH = Path(__file__).with_name("limit_auth.py")


def litellm_config(link: DelayProxy, *, fail_closed: bool) -> dict[str, Any]:
    general: dict[str, Any] = {"custom_auth": "limit_auth.user_api_key_auth"}
    if fail_closed:
        general["fail_closed_rate_limit_enforcement"] = True
    return {
        "model_list": [mock_deployment(LITELLM_MODEL)],
        "litellm_settings": {
            "cache": True,
            "cache_params": {"type": "redis", "host": "127.0.0.1", "port": link.port, "mode": "default_off"},
        },
        "general_settings": general,
        "router_settings": {"num_retries": 0},
    }


@pytest.fixture(scope="module")
def litellm_replicas(slow_link: DelayProxy) -> Iterator[list[LiteLLMProxy]]:
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    env = {"LITELLM_RATE_LIMIT_WINDOW_SIZE": str(WINDOW_S), "RATEBALANCE_FAULTS_RPM_LIMIT": str(RPM)}
    pair = [
        LiteLLMProxy(litellm_config(slow_link, fail_closed=closed), env=env, name=name)
        for name, closed in (("litellm-open", False), ("litellm-closed", True))
    ]
    for proxy in pair:
        shutil.copyfile(LIMIT_AUTH, proxy.workdir / LIMIT_AUTH.name)
    try:
        yield start_all(pair)
    finally:
        stop_all(pair)


async def test_litellm_limiter_when_redis_is_slow(litellm_replicas: list[LiteLLMProxy], slow_link: DelayProxy) -> None:
    open_, closed = litellm_replicas
    slow_link.delay_s = 0.0
    recorder = Recorder()
    async with open_.async_client() as client_open, closed.async_client() as client_closed:
        targets = [(open_, client_open), (closed, client_closed)]
        await send_one(client_open, open_, chat_body(LITELLM_MODEL), Recorder())  # warm-up
        await asyncio.sleep(WINDOW_S + 1)
        healthy = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        slow_link.delay_s = DELAY_S
        slow_from = time.time()
        tasks: set[asyncio.Task[Outcome]] = set()
        until = slow_from + SLOW_S
        await steady(targets, chat_body(LITELLM_MODEL), recorder, until=until, interval_s=LOAD.interval_s, tasks=tasks)
        await asyncio.gather(*tasks)
        slow = recorder.between(slow_from, time.time())
        slow_link.delay_s = 0.0
        await asyncio.sleep(WINDOW_S + 1)
        after = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)

    def per_replica(outcomes: list[Outcome]) -> dict[str, dict[int | str, int]]:
        return {p.name: by_status(o for o in outcomes if o.replica == p.name) for p in (open_, closed)}

    def latencies(outcomes: list[Outcome]) -> tuple[float, float, float]:
        values = sorted(o.latency for o in outcomes)
        return round(values[0], 3), round(statistics.median(values), 3), round(values[-1], 3)

    report = {
        "healthy": per_replica(healthy),
        "healthy latency min/median/max (s)": latencies(healthy),
        "slow": per_replica(slow),
        "slow latency min/median/max (s)": latencies(slow),
        "after": per_replica(after),
    }
    print(report)

    def admitted(outcomes: list[Outcome]) -> int:
        return sum(o.status == 200 for o in outcomes)

    assert admitted(healthy) == RPM and admitted(after) == RPM, report  # exact across both replicas
    # Slow: no fail mode at all (not even with fail_closed_rate_limit_enforcement): every request waits for its
    # round trips to the slow Redis, several per request, with no timeout of its own and no breaker.
    assert all(o.status in (200, 429) for o in [*healthy, *slow, *after]), report
    assert statistics.median(o.latency for o in slow) >= 2 * (2 * DELAY_S), report
