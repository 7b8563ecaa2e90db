"""The priority limiter while its Redis is killed mid-load and restarted (same port, empty: no persistence).

The limiter is built as the proxy builds it: settings with ``ratebalance.redis_url`` (so the store, its
timeout and its circuit breaker come from ``store_timeout_seconds`` / ``store_retry_after_seconds``), a
Router, and the hooks called as LiteLLM calls them. What the fail modes document, checked here:

* ``fail_mode: open``: while Redis is down every request is admitted without being counted, and each
  failed store operation is counted in ``litellm_ratebalance_store_errors_total`` (admissions also in
  ``admission_decisions_total{reason="store_error"}``); reconciles that fail are dropped (counted too).
* ``fail_mode: closed``: while Redis is down requests get a 503 with ``retry-after``, nothing else.
* ``fail_mode: local``: while Redis is down the process decides against its own memory, at
  ``local_fallback_share`` of each limit, and its corrections stay there; back on Redis once it answers.
* Recovery: once Redis answers again (after at most ``store_retry_after_seconds``) counting resumes. The
  restarted Redis is empty, so the window restarts from zero: what was reserved before the crash is
  forgotten (the documented cost of a non-persistent Redis: up to one extra window's worth admitted).
  Requests admitted before the crash that report back afterwards are not added to the new window (their
  settle names the old window start and is dropped), and requests admitted fail-open have no reservation
  to settle, so after recovery the window holds exactly the requests and tokens admitted after it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from fastapi import HTTPException

from litellm_ratebalance.admission.estimate import SettleBatch
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.proxy.admission.callback import TICKET_KEY, PriorityRateLimiter
from litellm_ratebalance.proxy.runtime import Runtime
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import RedisStore
from tests.integration.contracts_support import sample
from tests.integration.limiter_support import auth, finish, make_router, request
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

RETRY_AFTER_S = 0.2
"""``store_retry_after_seconds`` in these tests (default 1 s): the breaker's cool-down after a fault."""
PREFIX = "rboutage"
WINDOW_MS = 60_000


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is killed and restarted (the session server is shared)."""
    with RedisServer() as server:
        yield server


def outage_limiter(server: RedisServer, router: Any, fail_mode: str, **extra: Any) -> PriorityRateLimiter:
    settings = parse_settings(
        {
            "ratebalance": {
                **extra,
                "redis_url": server.url,
                "key_prefix": PREFIX,
                "fail_mode": fail_mode,
                "store_retry_after_seconds": RETRY_AFTER_S,
                "fault_log_interval_seconds": 3600,
            }
        }
    )
    runtime = Runtime()
    runtime.configure(settings=settings, router=router)  # the store is built from redis_url, lazily
    return PriorityRateLimiter(runtime)


def store_of(limiter: PriorityRateLimiter) -> RedisStore:
    store = limiter._runtime().store()
    assert isinstance(store, RedisStore)
    return store


def store_errors(mode: str) -> float:
    return sample("litellm_ratebalance_store_errors_total", {"component": "rate_limiter", "mode": mode})


def failed_open_admissions() -> float:
    labels = {"model_group": "m", "priority": "default", "result": "admitted", "reason": "store_error"}
    return sample("litellm_ratebalance_admission_decisions_total", labels)


def window_start_of(limiter: PriorityRateLimiter, data: dict[str, Any]) -> int | None:
    """The window an admitted request was counted in, or None if it was admitted uncounted (fail open).

    Read from the limiter's open reservations (``_tickets``), so call it before the request reports back.
    """
    entry = (data.get("metadata") or {}).get(TICKET_KEY)
    if entry is None:
        return None
    ticket = limiter._tickets.get(entry["id"])
    assert ticket is not None, "an admitted request's reservation is open until it reports back"
    return ticket.window_start_ms


async def decide(limiter: PriorityRateLimiter, data: dict[str, Any]) -> int:
    """Run the pre-call hook: 200 (admitted), or the status of the HTTPException it raised. Anything else
    it raised propagates and fails the test: no other exception may reach a client."""
    try:
        await limiter.async_pre_call_hook(auth(), None, data, "acompletion")
    except HTTPException as exc:
        return int(exc.status_code)
    return 200


async def recovered(store: RedisStore, server: RedisServer) -> None:
    """Restart Redis (same port, empty) and wait until the store can reach it and its breaker has cooled."""
    server.start()
    for _ in range(100):
        try:
            await store.ping()
            break
        except Exception:
            await asyncio.sleep(0.05)
    await asyncio.sleep(RETRY_AFTER_S + 0.05)


# -- fail open, one request at a time: exact accounting per phase ------------------------------------------
async def test_fail_open_admits_uncounted_while_down_and_counts_exactly_after(own_redis: RedisServer) -> None:
    limiter = outage_limiter(own_redis, make_router(rpm=40, tpm=1_000_000), "open")
    store = store_of(limiter)
    errors_before, open_before = store_errors("open"), failed_open_admissions()

    # Up: 25 admitted and counted; 10 of them are still in flight when Redis dies.
    before = [request(max_tokens=20) for _ in range(25)]
    assert [await decide(limiter, data) for data in before] == [200] * 25
    old_window = {window_start_of(limiter, data) for data in before}
    assert len(old_window) == 1 and None not in old_window
    for data in before[:15]:
        await finish(limiter, data, 30)
    snapshot = await store.admission_snapshot("m", WINDOW_MS)
    assert snapshot is not None and (snapshot.requests, snapshot.tokens) == (25, 15 * 30 + 10 * store_cost(before))

    # Down: every request admitted, none counted; 5 in-flight requests report back and their reconcile fails:
    # twice each, since they were admitted before anything was learned (their corrections are sent at once,
    # then again by finish()'s flush).
    own_redis.stop()
    during = [request(max_tokens=20) for _ in range(20)]
    assert [await decide(limiter, data) for data in during] == [200] * 20
    assert all(window_start_of(limiter, data) is None for data in during)
    for data in before[15:20]:
        await finish(limiter, data, 30)
    assert failed_open_admissions() == open_before + 20
    assert store_errors("open") == errors_before + 20 + 2 * 5

    # Back (empty): counting resumes from zero, the rpm limit (40) holds exactly in the new window.
    await recovered(store, own_redis)
    after = [request(max_tokens=20) for _ in range(50)]
    statuses = [await decide(limiter, data) for data in after]
    assert statuses == [200] * 40 + [429] * 10
    new_window = {window_start_of(limiter, data) for data, status in zip(after, statuses, strict=True) if status == 200}
    assert len(new_window) == 1 and new_window != old_window

    # Everything reports back after recovery: the last 5 pre-crash requests, the 20 uncounted ones, the 40.
    for data in before[20:] + during:
        await finish(limiter, data, 30)
    for data, status in zip(after, statuses, strict=True):
        if status == 200:
            await finish(limiter, data, 30)
    snapshot = await store.admission_snapshot("m", WINDOW_MS)
    assert snapshot is not None
    # Nothing lost, nothing counted twice. The last 5 pre-crash answers outran their reservation by
    # 30 - cost each: their window is gone, so the excess is counted in the current one (docs/admission.md, "Windows and
    # carry"). The 5 corrections queued while Redis was down went with the first admission after it, when
    # the restarted Redis had no window at all: dropped.
    assert (snapshot.requests, snapshot.tokens) == (40, 40 * 30 + 5 * (30 - store_cost(before)))
    assert store_errors("open") == errors_before + 30  # no store error after recovery
    assert failed_open_admissions() == open_before + 20


def store_cost(datas: list[dict[str, Any]]) -> int:
    """The tokens reserved per request (prompt estimate + max_tokens), the same for these equal requests."""
    from litellm_ratebalance.proxy.tokens import estimate_tokens

    costs = {estimate_tokens("m", data, "total", 256, 32_768) for data in datas}
    assert len(costs) == 1
    return costs.pop()


# -- fail local: this replica's share of the limit while Redis is down ---------------------------------------
def local_admissions(reason: str = "local") -> float:
    labels = {"model_group": "m", "priority": "default", "result": "admitted", "reason": reason}
    return sample("litellm_ratebalance_admission_decisions_total", labels)


async def test_fail_local_holds_its_share_of_the_limit_while_down_then_counts_on_redis(own_redis: RedisServer) -> None:
    limiter = outage_limiter(own_redis, make_router(rpm=40, tpm=1_000_000), "local", local_fallback_share=0.25)
    store = store_of(limiter)
    errors_before, local_before = store_errors("local"), local_admissions()

    before = [request(max_tokens=20) for _ in range(5)]
    assert [await decide(limiter, data) for data in before] == [200] * 5

    # Down: this replica admits a quarter of rpm 40 on its own, whatever Redis counted before, then 429.
    own_redis.stop()
    during = [request(max_tokens=20) for _ in range(14)]
    assert [await decide(limiter, data) for data in during] == [200] * 10 + [429] * 4
    assert local_admissions() == local_before + 10
    assert store_errors("local") == errors_before + 14
    # Their corrections go to the local store: the local window holds exactly their actual tokens.
    for data in during[:10]:
        await finish(limiter, data, 30)
    local = limiter._runtime().local_store()
    snapshot = await local.admission_snapshot("m", WINDOW_MS)
    assert snapshot is not None and (snapshot.requests, snapshot.tokens) == (10, 10 * 30)

    # Back: decided on Redis again (the restarted one is empty), against the whole limit.
    await recovered(store, own_redis)
    after = [request(max_tokens=20) for _ in range(45)]
    assert [await decide(limiter, data) for data in after] == [200] * 40 + [429] * 5
    assert local_admissions() == local_before + 10
    shared = await store.admission_snapshot("m", WINDOW_MS)
    assert shared is not None and shared.requests == 40


# -- mid-load: concurrent callers while Redis is killed and restarted ---------------------------------------
@dataclass
class LoadResult:
    statuses: Counter[int] = field(default_factory=Counter)
    counted: dict[int, list[int]] = field(default_factory=dict)
    """Per window start: the actual tokens of each request counted in that window."""
    uncounted: int = 0


KILL_AT_S, RESTART_AT_S, LOAD_S = 0.6, 1.4, 2.6
"""Load timeline: Redis is killed 0.6 s in, restarted 1.4 s in, and the load stops at 2.6 s (the breaker
cools within RETRY_AFTER_S of the restart, so about a second of counted traffic follows)."""


async def run_load(limiter: PriorityRateLimiter, server: RedisServer, *, workers: int, seed: int) -> LoadResult:
    """``workers`` concurrent callers, each sending a request every ~30 ms for ``LOAD_S`` seconds (at most
    ~200 requests/s in all); each admitted call lasts 10-40 ms before it reports back. Redis is killed and
    restarted (same port, empty) on the timeline above."""
    rng = random.Random(seed)
    result = LoadResult()
    in_flight: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def complete(data: dict[str, Any], tokens: int) -> None:
        await asyncio.sleep(rng.uniform(0.01, 0.04))
        await finish(limiter, data, tokens)

    async def chaos() -> None:
        await asyncio.sleep(KILL_AT_S)
        server.stop()
        await asyncio.sleep(RESTART_AT_S - KILL_AT_S)
        server.start()

    async def worker() -> None:
        while loop.time() - started < LOAD_S:
            data = request(max_tokens=rng.randint(5, 40))
            status = await decide(limiter, data)
            result.statuses[status] += 1
            if status == 200:
                tokens = rng.randint(10, 60)
                start = window_start_of(limiter, data)
                if start is None:
                    result.uncounted += 1
                else:
                    result.counted.setdefault(start, []).append(tokens)
                task = asyncio.create_task(complete(data, tokens))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.sleep(rng.uniform(0.02, 0.04))

    await asyncio.wait_for(asyncio.gather(chaos(), *(worker() for _ in range(workers))), timeout=30)
    if in_flight:
        await asyncio.wait_for(asyncio.gather(*in_flight), timeout=30)
    return result


async def test_fail_open_mid_load_serves_everything_and_the_new_window_is_exact(own_redis: RedisServer) -> None:
    limiter = outage_limiter(own_redis, make_router(rpm=100_000, tpm=10_000_000), "open")
    store = store_of(limiter)
    errors_before, open_before = store_errors("open"), failed_open_admissions()

    result = await run_load(limiter, own_redis, workers=6, seed=1)

    total = result.statuses.total()
    assert result.statuses == {200: total}  # fail open: always served, never an error
    assert result.uncounted >= 1 and failed_open_admissions() == open_before + result.uncounted
    assert store_errors("open") >= errors_before + result.uncounted  # plus the reconciles that failed
    assert len(result.counted) == 2  # the window before the crash, and the one the empty Redis started
    new_start = max(result.counted)
    snapshot = await store.admission_snapshot("m", WINDOW_MS)
    assert snapshot is not None and snapshot.window_start_ms == new_start
    # Every request counted after the restart is in the window once, with its actual tokens; no request
    # admitted before the crash or while Redis was down leaked into it. Tokens: answers of the pre-crash
    # window that outran their reservation and reported back after the restart add their excess (their
    # window is gone: docs/admission.md, "Windows and carry"), never more than those answers used.
    assert snapshot.requests == len(result.counted[new_start])
    old_start = min(result.counted)
    excess = snapshot.tokens - sum(result.counted[new_start])
    assert 0 <= excess <= sum(result.counted[old_start])
    assert sum(len(tokens) for tokens in result.counted.values()) + result.uncounted == total


async def test_fail_closed_mid_load_answers_only_503_while_down(own_redis: RedisServer) -> None:
    limiter = outage_limiter(own_redis, make_router(rpm=100_000, tpm=10_000_000), "closed")
    store = store_of(limiter)
    errors_before = store_errors("closed")

    result = await run_load(limiter, own_redis, workers=6, seed=2)

    assert set(result.statuses) == {200, 503}  # nothing but admissions and the documented 503
    assert result.uncounted == 0  # fail closed never admits without counting
    assert store_errors("closed") >= errors_before + result.statuses[503]
    new_start = max(result.counted)
    snapshot = await store.admission_snapshot("m", WINDOW_MS)
    assert snapshot is not None and snapshot.window_start_ms == new_start
    assert snapshot.requests == len(result.counted[new_start])
    assert len(result.counted) == 2
    # As with fail open: only pre-crash answers that outran their reservation add their excess.
    excess = snapshot.tokens - sum(result.counted[new_start])
    assert 0 <= excess <= sum(result.counted[min(result.counted)])
    assert sum(len(tokens) for tokens in result.counted.values()) + result.statuses[503] == result.statuses.total()


async def test_fail_closed_503_carries_retry_after_and_recovery_is_exact(own_redis: RedisServer) -> None:
    limiter = outage_limiter(own_redis, make_router(rpm=5), "closed")
    store = store_of(limiter)
    assert [await decide(limiter, request()) for _ in range(3)] == [200] * 3
    own_redis.stop()
    refusals: list[HTTPException] = []
    for _ in range(4):
        try:
            await limiter.async_pre_call_hook(auth(), None, request(), "acompletion")
        except HTTPException as exc:
            refusals.append(exc)
    assert [exc.status_code for exc in refusals] == [503] * 4
    assert all((exc.headers or {}).get("retry-after") == "1" for exc in refusals)
    assert all("fail_mode is 'closed'" in str(exc.detail) for exc in refusals)
    await recovered(store, own_redis)
    # The restarted Redis is empty: the 3 counted before the crash are forgotten, the limit (5) holds anew.
    assert [await decide(limiter, request()) for _ in range(7)] == [200] * 5 + [429] * 2


# -- stale pooled connections after a restart -------------------------------------------------------------
# From redis-py 8.2 the asyncio pool reconnects a connection whose socket the server closed when it hands it
# out, so a restart costs no call at all; before it, the first call on each stale connection fails.
REDIS_PY_RECONNECTS_CLOSED_SOCKETS = tuple(int(part) for part in redis.__version__.split(".")[:2]) >= (8, 2)


async def test_after_a_restart_stale_pooled_connections_fail_once_together(own_redis: RedisServer) -> None:
    """After a restart every pooled connection is stale. The first connection error drops the pool's idle
    connections, so a later, wider burst gets fresh ones: one fault window, not one per stale connection."""
    limiter = outage_limiter(own_redis, make_router(rpm=100_000, tpm=10_000_000), "open")
    store = store_of(limiter)

    stale = SettleBatch()
    stale.add(0, "default", 1)

    async def burst(count: int) -> Counter[str]:
        async def one() -> str:
            try:
                await store.flush("m", stale)  # one script call (a stale window: a no-op)
            except StoreError:
                return "error"
            return "ok"

        return Counter(await asyncio.gather(*(one() for _ in range(count))))

    assert await burst(20) == {"ok": 20}  # 20 connections pooled
    own_redis.stop()
    own_redis.start()  # same port, empty: every pooled connection now points at a dead socket
    narrow = await burst(5)
    if REDIS_PY_RECONNECTS_CLOSED_SOCKETS:
        assert narrow == {"ok": 5}  # redis-py saw each socket closed when it took it from the pool
    else:
        assert narrow["error"] >= 1  # a stale connection was used and failed: the breaker opened
    await asyncio.sleep(RETRY_AFTER_S + 0.05)
    assert await burst(20) == {"ok": 20}  # the other 15 stale connections were dropped, not reused
