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
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment
from tests.faults.delay_proxy import DelayProxy
from tests.faults.replicas import (
    OPEN_AND_CLOSED,
    ratebalance_config,
    redis_cache,
    running_fail_modes,
    running_litellm_limiter,
)
from tests.faults.support import (
    Load,
    Outcome,
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
    return ratebalance_config(
        LOAD,
        mock_deployment(MODEL, rpm=RPM),
        fail_mode=fail_mode,
        timeout_s=TIMEOUT_S,
        retry_after_s=RETRY_AFTER_S,
        fault_log_interval_s=3600,
    )


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
    with running_fail_modes(config, redis_url=slow_link.url) as pair:
        yield pair


async def test_slow_redis_applies_the_fail_mode_with_bounded_latency(
    replicas: list[LiteLLMProxy], slow_link: DelayProxy, own_redis: RedisServer
) -> None:
    open_, closed = replicas
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=2)  # direct, not through the delay
    recorder = Recorder()
    async with connected(replicas) as targets:
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
        slow_outcomes = await load_for(targets, recorder, MODEL, since=slow_from, seconds=SLOW_S)
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
    slow_open = of_replica(slow_outcomes, open_)
    slow_closed = of_replica(slow_outcomes, closed)
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
        "recovered after (s)": rounded(recovered),
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
    burst_open = of_replica(burst, open_)
    burst_closed = of_replica(burst, closed)
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
    assert LOAD.keys_without_ttl(sync) == []
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------
LITELLM_MODEL = "slow-litellm"


@pytest.fixture(scope="module")
def litellm_replicas(slow_link: DelayProxy) -> Iterator[list[LiteLLMProxy]]:
    deployment = mock_deployment(LITELLM_MODEL)
    with running_litellm_limiter(
        deployment, redis_cache(slow_link.port), OPEN_AND_CLOSED, window_s=WINDOW_S, rpm=RPM
    ) as pair:
        yield pair


async def test_litellm_limiter_when_redis_is_slow(litellm_replicas: list[LiteLLMProxy], slow_link: DelayProxy) -> None:
    slow_link.delay_s = 0.0
    recorder = Recorder()
    async with connected(litellm_replicas) as targets:
        open_, client_open = targets[0]
        await send_one(client_open, open_, chat_body(LITELLM_MODEL), Recorder())  # warm-up
        await asyncio.sleep(WINDOW_S + 1)
        healthy = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)
        slow_link.delay_s = DELAY_S
        slow = await load_for(targets, recorder, LITELLM_MODEL, since=time.time(), seconds=SLOW_S)
        slow_link.delay_s = 0.0
        await asyncio.sleep(WINDOW_S + 1)
        after = await litellm_window_phase(targets, recorder, LITELLM_MODEL, window_s=WINDOW_S)

    def latencies(outcomes: list[Outcome]) -> tuple[float, float, float]:
        values = sorted(o.latency for o in outcomes)
        return round(values[0], 3), round(statistics.median(values), 3), round(values[-1], 3)

    report = {
        "healthy": per_replica(healthy, litellm_replicas),
        "healthy latency min/median/max (s)": latencies(healthy),
        "slow": per_replica(slow, litellm_replicas),
        "slow latency min/median/max (s)": latencies(slow),
        "after": per_replica(after, litellm_replicas),
    }
    print(report)

    assert admitted(healthy) == RPM and admitted(after) == RPM, report  # exact across both replicas
    # Slow: no fail mode at all (not even with fail_closed_rate_limit_enforcement): every request waits for its
    # round trips to the slow Redis, several per request, with no timeout of its own and no breaker.
    assert all(o.status in (200, 429) for o in [*healthy, *slow, *after]), report
    assert statistics.median(o.latency for o in slow) >= 2 * (2 * DELAY_S), report
