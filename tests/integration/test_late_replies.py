"""A store call whose caller stopped waiting still runs in Redis; nothing it changed may be lost or doubled.

Redis is reached through a delaying TCP proxy (tests/faults/delay_proxy.py) so a call outlives its timeout
and answers later, and, separately, through a loop that is too busy to read a reply that came in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from litellm_ratebalance.errors import StoreError, StoreFault
from litellm_ratebalance.proxy.admission import PriorityRateLimiter
from litellm_ratebalance.proxy.backpressure.admit import release_late_lease
from litellm_ratebalance.proxy.runtime import Runtime, configure, reset_runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import KeySpace, RedisStore
from litellm_ratebalance.store._scripts import ScriptRunner
from tests.faults.delay_proxy import DelayProxy
from tests.integration.contracts_support import auth as contract_auth
from tests.integration.contracts_support import call as contract_call
from tests.integration.contracts_support import make_callback
from tests.integration.contracts_support import request as contract_request
from tests.integration.limiter_support import auth, call, finish, make_router, request
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis]

PREFIX = "rblate"
TIMEOUT_S = 0.1
DELAY_S = 0.15
"""One way: a round trip through the delaying proxy takes 0.3 s, three times the timeout."""


@pytest.fixture
def slow_path(redis_server: RedisServer) -> Iterator[DelayProxy]:
    with DelayProxy(redis_server.port) as proxy:
        yield proxy


@pytest.fixture
async def direct(redis_server: RedisServer) -> aioredis.Redis:
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushdb()
    return client


async def test_a_reply_read_late_by_a_busy_loop_is_not_a_store_fault(direct: aioredis.Redis) -> None:
    runner = ScriptRunner(direct, timeout_seconds=TIMEOUT_S, cooldown_seconds=60.0)
    await runner.call("warm-up", lambda client: client.ping())
    pending = asyncio.ensure_future(runner.call("set", lambda client: client.set(f"{PREFIX}:k", "v")))
    await asyncio.sleep(0)  # the command is written ...
    time.sleep(0.5)  # noqa: ASYNC251 ... and the loop is busy for five timeouts (a burst's per-request work)
    assert await pending is True
    assert await runner.call("get", lambda client: client.get(f"{PREFIX}:k")) == b"v"  # breaker still closed


async def test_a_slow_redis_times_out_and_its_late_reply_is_handed_on(
    slow_path: DelayProxy, direct: aioredis.Redis
) -> None:
    client = aioredis.Redis.from_url(slow_path.url)
    runner = ScriptRunner(client, timeout_seconds=TIMEOUT_S, cooldown_seconds=60.0)
    await runner.call("warm-up", lambda c: c.ping())
    slow_path.delay_s = DELAY_S
    started = time.monotonic()
    with pytest.raises(StoreError) as raised:
        await runner.call("incr", lambda c: c.incr(f"{PREFIX}:n"))
    assert time.monotonic() - started < TIMEOUT_S + 0.15  # the request waited the timeout, not the reply
    assert raised.value.cause is StoreFault.TIMEOUT
    assert raised.value.late is not None
    assert await raised.value.late == 1  # Redis ran it: the late reply says what it did
    assert await direct.get(f"{PREFIX}:n") == b"1"  # once
    with pytest.raises(StoreError) as skipped:  # a slow Redis opens the breaker
        await runner.call("incr", lambda c: c.incr(f"{PREFIX}:n"))
    assert skipped.value.cause is StoreFault.BREAKER
    await client.aclose()


def slow_limiter(url: str, router: object, fail_mode: str) -> PriorityRateLimiter:
    settings = parse_settings(
        {
            "ratebalance": {
                "redis_url": url,
                "key_prefix": PREFIX,
                "fail_mode": fail_mode,
                "store_timeout_seconds": TIMEOUT_S,
                "store_retry_after_seconds": 0.0,
                "fault_log_interval_seconds": 3600,
            }
        }
    )
    runtime = Runtime()
    runtime.configure(settings=settings, router=router)
    return PriorityRateLimiter(runtime)


async def window(direct: aioredis.Redis) -> dict[str, int]:
    raw: dict[bytes, bytes] = await direct.hgetall(KeySpace(PREFIX).admission_window("m"))  # type: ignore[assignment]
    return {key.decode(): int(value) for key, value in raw.items() if key in (b"r", b"t")}


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_a_timed_out_admission_reserved_in_redis_is_given_back_and_its_settles_count_once(
    slow_path: DelayProxy, direct: aioredis.Redis, fail_mode: str
) -> None:
    limiter = slow_limiter(slow_path.url, make_router(rpm=100, tpm=100_000), fail_mode)
    warm_up = request(max_tokens=50)
    assert await call(limiter, warm_up, auth()) is None
    await finish(limiter, warm_up, 30)  # the output estimate is learned: later corrections wait for a batch
    first = request(max_tokens=50)
    assert await call(limiter, first, auth()) is None  # counted: its reservation
    await finish(limiter, first, 36, flush=False)  # its correction waits for the next admission
    reserved = (await window(direct))["t"]

    slow_path.delay_s = DELAY_S
    second = request(max_tokens=50)
    refused = await call(limiter, second, auth())  # carries the correction; times out
    assert (refused is None) if fail_mode == "open" else (refused is not None and refused.status_code == 503)
    slow_path.delay_s = 0.0
    await asyncio.sleep(3 * DELAY_S)  # the late reply arrives: the script ran, the correction with it
    await limiter.flush_settles()  # the second request's reservation goes back

    # What is left counts the first two requests exactly: the correction the timed-out call carried applied
    # once, the reservation it made given back.
    assert await window(direct) == {"r": 2, "t": 30 + 36}
    assert reserved != 30 + 36  # (the correction did change something)


async def test_a_timed_out_contract_count_leaves_no_estimate_in_flight(
    slow_path: DelayProxy, direct: aioredis.Redis
) -> None:
    client = aioredis.Redis.from_url(slow_path.url)
    store = RedisStore(client, KeySpace(PREFIX), timeout_seconds=TIMEOUT_S, cooldown_seconds=0.0)
    callback = make_callback(store)
    slow_path.delay_s = DELAY_S
    data = contract_request(max_tokens=40)
    assert await contract_call(callback, data, contract_auth("s2s")) is None  # fail open: served, mode unknown
    slow_path.delay_s = 0.0
    await asyncio.sleep(3 * DELAY_S)
    await callback.drain()

    seconds, _ = await direct.time()
    window = await store.contract_window(3600, int(seconds) // 3600 * 3600)
    assert window is not None
    # Counted once (the request was served); its estimate left flight, recorded as its usage.
    assert window.requests["s2s"] == 1
    assert window.in_flight.get("s2s", 0) == 0
    assert window.tokens["s2s"] > 0
    await client.aclose()


async def test_a_lease_taken_by_a_timed_out_acquire_is_released_when_it_answers(
    slow_path: DelayProxy, direct: aioredis.Redis
) -> None:
    slow_client = aioredis.Redis.from_url(slow_path.url)
    slow = RedisStore(slow_client, KeySpace(PREFIX), timeout_seconds=TIMEOUT_S, cooldown_seconds=0.0)
    fast = RedisStore(direct, KeySpace(PREFIX))
    reset_runtime()
    configure(settings=parse_settings({"ratebalance": {"key_prefix": PREFIX}}), store=fast)
    try:
        await slow.ping()
        slow_path.delay_s = DELAY_S
        with pytest.raises(StoreError) as raised:
            await slow.lease_acquire("gpu-1", "lease-late", slot_cap=4, ttl_ms=60_000, cost_tokens=100)
        late = raised.value.late
        assert late is not None
        late.add_done_callback(lambda _: release_late_lease(late, "gpu-1", "lease-late"))
        slow_path.delay_s = 0.0
        result = await late
        assert result.acquired  # Redis did take the slot ...
        for _ in range(50):
            if (await fast.concurrency_snapshot("gpu-1")).inflight == 0:
                break
            await asyncio.sleep(0.02)
        snapshot = await fast.concurrency_snapshot("gpu-1")
        assert (snapshot.inflight, snapshot.reserved_tokens) == (0, 0)  # ... and gave it back at once
    finally:
        reset_runtime()
        await slow_client.aclose()


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_a_redis_two_seconds_away_costs_a_request_at_most_the_default_timeout(
    slow_path: DelayProxy, fail_mode: str
) -> None:
    """Default store settings (0.5 s timeout, 1 s breaker): with every round trip 2 s long, each request follows
    the fail mode and waits at most the timeout; while the breaker is open, requests do not wait at all."""
    settings = parse_settings(
        {"ratebalance": {"redis_url": slow_path.url, "key_prefix": PREFIX, "fail_mode": fail_mode}}
    )
    runtime = Runtime()
    runtime.configure(settings=settings, router=make_router(rpm=1000))
    limiter = PriorityRateLimiter(runtime)
    assert await call(limiter, request(), auth()) is None  # connected, counted
    slow_path.delay_s = 1.0
    spans: list[tuple[float, float]] = []
    outcomes: list[int] = []
    for _ in range(12):
        started = time.monotonic()
        refused = await call(limiter, request(), auth())
        spans.append((started, time.monotonic()))
        outcomes.append(200 if refused is None else refused.status_code)
        await asyncio.sleep(0.1)
    slow_path.delay_s = 0.0
    assert set(outcomes) == ({200} if fail_mode == "open" else {503})
    waits = [end - start for start, end in spans]
    assert max(waits) <= 0.5 + 0.3  # the timeout, plus scheduling slack on a busy machine
    assert sum(1 for wait in waits if wait >= 0.4) >= 1  # (Redis was slow: someone waited the timeout)
    # After a request timed out, the breaker's second: whoever comes then fails over without waiting.
    for start, end in spans:
        if end - start >= 0.4:
            during_breaker = [e - s for s, e in spans if end <= s < end + 0.9]
            assert all(wait < 0.1 for wait in during_breaker), during_breaker
