"""A proxy replica SIGKILLed with admitted requests in flight, under steady load over the limit.

Two real ``litellm`` proxies (A and B) share one redis-server; the model group allows ``RPM`` requests per
``WINDOW_S`` window, and each replica gets one request every ``INTERVAL_S`` (about 3x the limit together).
Admitted requests stay in flight for ``MOCK_DELAY_S``. ``KILL_AT_S`` into the first window, A's whole
process group gets SIGKILL (no shutdown hook, no settle flushed) and the load balancer stops sending to it.

What must hold (each line asserted below):

* window 0: A's admissions stay reserved (A never reports back), so B admits exactly ``RPM`` minus them,
  never more; the window's counter is exactly ``RPM``;
* windows 1 and 2: A's reservations no longer count (they lived in window 0 only): B alone admits exactly
  ``RPM`` per window, every admission counted in Redis;
* B never answers anything but 200 or 429; A's clients see broken connections for the requests in flight;
* every key under our prefix has a TTL.

The limit is never lost, so "time until limits held again" is 0; the figure that matters is how long A's
reservations kept counting after the kill: until the end of window 0, at most ``WINDOW_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from tests.e2e.conftest import StartProxies
from tests.e2e.harness import LiteLLMProxy, chat_body, mock_deployment
from tests.faults.replicas import ratebalance_config, redis_cache, running_litellm_limiter
from tests.faults.support import (
    ERROR,
    REFUSED,
    Load,
    Outcome,
    Recorder,
    Target,
    by_status,
    connected,
    litellm_window_start,
    sigkill,
    steady,
    until_litellm_window_ends,
)
from tests.servers import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

PREFIX = "faults-crash"
MODEL = "crash"
RPM = 12
WINDOW_S = 3
GUARD_S = 0.8
"""Load stops this long before a window ends, so every request of a phase is decided in its window."""
INTERVAL_S = 0.1
MOCK_DELAY_S = 1.5
KILL_AT_S = 0.6
LOAD = Load(PREFIX, MODEL, WINDOW_S, interval_s=INTERVAL_S, guard_s=GUARD_S)

CONFIG: dict[str, Any] = ratebalance_config(
    LOAD,
    mock_deployment(MODEL, rpm=RPM, mock_delay=MOCK_DELAY_S),
    # Redis stays up here: a slow call on 2 busy cores must not fail open and blur the counts.
    timeout_s=5.0,
)


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def pair(proxies: StartProxies, own_redis: RedisServer) -> list[LiteLLMProxy]:
    return proxies(CONFIG, redis_url=own_redis.url, count=2)


async def load_and_kill(
    loads: Sequence[Target],
    recorder: Recorder,
    began: float,
    tasks: set[asyncio.Task[Outcome]],
    kill: LiteLLMProxy | None,
) -> float | None:
    """Steady load on each of ``loads`` (one loader each, so that the load balancer can take one out) until
    ``GUARD_S`` before the window that began at ``began`` ends, requests added to ``tasks``; ``kill`` is
    SIGKILLed ``KILL_AT_S`` in. Returns the kill time."""
    stops = {proxy.name: asyncio.Event() for proxy, _ in loads}
    loaders = [
        asyncio.create_task(
            steady(
                [(proxy, client)],
                chat_body(MODEL),
                recorder,
                until=began + WINDOW_S - GUARD_S,
                interval_s=INTERVAL_S,
                tasks=tasks,
                stop=stops[proxy.name],
            )
        )
        for proxy, client in loads
    ]
    killed_at: float | None = None
    if kill is not None:
        await asyncio.sleep(KILL_AT_S)
        stops[kill.name].set()  # the load balancer takes it out
        killed_at = time.time()
        sigkill(kill)
    await asyncio.gather(*loaders)
    return killed_at


async def one_window(
    loads: Sequence[Target],
    recorder: Recorder,
    sync: redis.Redis,
    *,
    kill: LiteLLMProxy | None = None,
) -> tuple[dict[str, int], float, float | None]:
    """Steady load on ``loads`` for one window (see tests/faults/support.py); ``kill`` is SIGKILLed
    ``KILL_AT_S`` in. Returns the window's final counters, the time the phase began and the kill time."""
    began = time.time()
    tasks: set[asyncio.Task[Outcome]] = set()
    killed_at = await load_and_kill(loads, recorder, began, tasks, kill)
    # Wait for the window to end (its counters are final: nothing is decided before the next phase).
    counters = await LOAD.window_end(sync, began)
    await asyncio.gather(*tasks)
    return counters, began, killed_at


async def test_sigkill_of_a_replica_with_requests_in_flight(pair: list[LiteLLMProxy], own_redis: RedisServer) -> None:
    a, b = pair
    sync = redis.Redis.from_url(own_redis.url, socket_timeout=2)
    recorder = Recorder()
    async with connected(pair) as targets:
        w0, began0, killed_at = await one_window(targets, recorder, sync, kill=a)
        w1, began1, _ = await one_window(targets[1:], recorder, sync)
        w2, began2, _ = await one_window(targets[1:], recorder, sync)
    assert killed_at is not None
    ends = [began1, began2, time.time()]

    def seen(replica: str, index: int) -> list[Outcome]:
        return recorder.between([began0, began1, began2][index], ends[index], replica)

    b0, b1, b2 = (seen(b.name, i) for i in range(3))
    a0 = seen(a.name, 0)
    a_reserved = w0["r"] - sum(o.status == 200 for o in b0)
    report = {
        "A window 0": by_status(a0),
        "B by window": [by_status(b0), by_status(b1), by_status(b2)],
        "window r": [w0["r"], w1["r"], w2["r"]],
        "A reserved in window 0": a_reserved,
        "A reservations counted after the kill (s)": round(w0["start"] / 1000 + WINDOW_S - killed_at, 2),
    }
    print(report)

    # Window 0: A died holding reservations; B got exactly what they left.
    assert w0["r"] == RPM, report
    assert a_reserved >= 1, f"A had no admitted request in flight when killed: the test has no teeth: {report}"
    broken = [o for o in a0 if o.status == ERROR]
    assert len(broken) >= a_reserved, report  # each admitted one was in flight (MOCK_DELAY_S) and broke
    assert set(by_status(a0)) <= {200, 429, ERROR, REFUSED} and by_status(a0).get(200, 0) == 0, report
    assert by_status(b0) == {200: RPM - a_reserved, 429: len(b0) - (RPM - a_reserved)}, report
    # Windows 1 and 2: A's reservations are gone; B alone admits exactly the limit, each admission counted.
    for window, outcomes in ((w1, b1), (w2, b2)):
        assert window["r"] == RPM, report
        assert by_status(outcomes) == {200: RPM, 429: len(outcomes) - RPM}, report
        assert all(o.counted for o in outcomes if o.status == 200)
        assert all(o.retry_after is not None and int(o.retry_after) >= 1 for o in outcomes if o.status == 429)
    assert w0["start"] / 1000 + WINDOW_S - killed_at <= WINDOW_S
    assert LOAD.keys_without_ttl(sync) == []
    assert sync.pttl(LOAD.keys.admission_window(MODEL)) > 0
    sync.close()


# -- the same fault under LiteLLM's own limiter -------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm_pair(own_redis: RedisServer) -> Iterator[list[LiteLLMProxy]]:
    deployment = mock_deployment(MODEL, mock_delay=MOCK_DELAY_S)
    replicas = [(f"litellm{i}", False) for i in range(2)]
    with running_litellm_limiter(deployment, redis_cache(own_redis.port), replicas, window_s=WINDOW_S, rpm=RPM) as pair:
        yield pair


async def litellm_window(
    loads: Sequence[Target], recorder: Recorder, *, kill: LiteLLMProxy | None = None
) -> tuple[float, float | None]:
    """As :func:`one_window`, for LiteLLM's windows (whole seconds of Redis TIME: see
    ``tests.faults.support.litellm_window_phase``); returns the time the phase began and the kill time."""
    began = await litellm_window_start()
    tasks: set[asyncio.Task[Outcome]] = set()
    killed_at = await load_and_kill(loads, recorder, began, tasks, kill)
    await until_litellm_window_ends(began, WINDOW_S)
    await asyncio.gather(*tasks)
    return began, killed_at


async def test_litellm_limiter_when_a_replica_is_killed(litellm_pair: list[LiteLLMProxy]) -> None:
    a, b = litellm_pair
    recorder = Recorder()
    async with connected(litellm_pair) as targets:
        began0, _ = await litellm_window(targets, recorder, kill=a)
        began1, _ = await litellm_window(targets[1:], recorder)
        began2, _ = await litellm_window(targets[1:], recorder)
    ends = [began1, began2, time.time()]
    b_windows = [recorder.between([began0, began1, began2][i], ends[i], b.name) for i in range(3)]
    a0 = recorder.between(began0, began1, a.name)
    report = {"A window 0": by_status(a0), "B by window": [by_status(w) for w in b_windows]}
    print(report)

    # LiteLLM counts a request when it admits it and never gives it back, so a killed replica's admitted
    # requests hold their share until the window ends, as ours do: B gets exactly the rest, then the limit.
    broken = sum(o.status == ERROR for o in a0)
    assert broken >= 1 and set(by_status(a0)) <= {429, ERROR, REFUSED}, report
    assert by_status(b_windows[0]) == {200: RPM - broken, 429: len(b_windows[0]) - (RPM - broken)}, report
    for outcomes in b_windows[1:]:
        assert by_status(outcomes) == {200: RPM, 429: len(outcomes) - RPM}, report
