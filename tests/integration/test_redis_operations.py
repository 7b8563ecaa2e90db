"""Running on a real Redis: eviction-policy warning, bounded key count under hostile input, script reload;
the script runner's connection gate, cluster-safe error mapping and breaker (with fake clients where the
condition cannot be produced on demand)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis
from redis.exceptions import MaxConnectionsError

from litellm_ratebalance.admission.estimate import SettleBatch
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.proxy.runtime import warn_if_evictable
from litellm_ratebalance.store import KeySpace, RedisStore
from litellm_ratebalance.store._scripts import ScriptRunner
from tests.integration.limiter_support import auth, call, make_limiter, make_router, request
from tests.servers import RedisServer

pytestmark = pytest.mark.redis


async def test_evicting_policy_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        client = aioredis.Redis.from_url(server.url)
        with caplog.at_level(logging.WARNING, logger="litellm_ratebalance"):
            assert await warn_if_evictable(RedisStore(client)) == "allkeys-lru"
        assert "can evict our counters" in caplog.text and "noeviction" in caplog.text
        await client.aclose()


async def test_noeviction_is_quiet(
    redis_server: RedisServer, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # (redis_server: CONFIG SET needs the real server, fakeredis has no eviction policy)
    await redis_client.config_set("maxmemory-policy", "noeviction")
    with caplog.at_level(logging.WARNING, logger="litellm_ratebalance"):
        assert await warn_if_evictable(RedisStore(redis_client)) == "noeviction"
    assert "evict" not in caplog.text


async def test_bogus_priorities_and_models_do_not_grow_redis(redis_client: aioredis.Redis) -> None:
    """A flood of distinct priorities and unknown model names leaves the key and field counts flat."""
    settings = {"priority_reservation": {"prod": 0.5, "dev": 0.2}}
    limiter = make_limiter(RedisStore(redis_client), make_router(rpm=100_000), settings)
    for index in range(20):
        await call(limiter, request(), auth(f"bogus-{index}"))
    keys_before = await redis_client.dbsize()
    fields_before = sum([await redis_client.hlen(key) for key in await redis_client.keys("*")])
    for index in range(300):
        await call(limiter, request(), auth(f"flood-{index}", team_priority=f"team-{index}"))
        await call(limiter, request(model=f"no-such-model-{index}"), auth("prod"))
    assert await redis_client.dbsize() == keys_before == 1
    assert sum([await redis_client.hlen(key) for key in await redis_client.keys("*")]) == fields_before
    assert all([await redis_client.ttl(key) > 0 for key in await redis_client.keys("*")])


async def test_scripts_survive_script_flush(redis_client: aioredis.Redis) -> None:
    limiter = make_limiter(RedisStore(redis_client), make_router(rpm=3))
    assert await call(limiter, request(), auth()) is None
    await redis_client.script_flush()
    assert await call(limiter, request(), auth()) is None  # NOSCRIPT -> reloaded by redis-py
    assert await call(limiter, request(), auth()) is None
    assert await call(limiter, request(), auth()) is not None


# -- the script runner: gate, cluster initialisation, error mapping ------------------------------------------
class FakeScript:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    async def __call__(self, keys: list[str], args: list[object], client: object) -> object:
        return await self.client.run_one()


class FakeClient:
    """A client whose pool holds ``max_connections``; each call holds a connection for ``hold_s`` and
    raises like redis-py's non-blocking pool when none is free (or raises ``error`` if set)."""

    def __init__(self, max_connections: int, hold_s: float = 0.01, error: BaseException | None = None) -> None:
        self.connection_pool = type("Pool", (), {"max_connections": max_connections})()
        self.hold_s = hold_s
        self.error = error
        self.in_use = 0
        self.peak = 0

    def execute_command(self, *args: object) -> None:  # marks it as a client, not a factory
        raise NotImplementedError

    def register_script(self, source: str) -> FakeScript:
        return FakeScript(self)

    async def run_one(self) -> object:
        if self.error is not None:
            raise self.error
        if self.in_use >= self.connection_pool.max_connections:
            raise MaxConnectionsError("Too many connections")
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            self.in_use -= 1
        return 1


async def test_a_burst_past_the_pool_waits_for_a_connection_instead_of_failing() -> None:
    client = FakeClient(max_connections=5)
    runner = ScriptRunner(client, timeout_seconds=5.0, max_in_flight=500)
    replies = await asyncio.gather(*(runner.run("contract_settle", ["k"], []) for _ in range(60)))
    assert replies == [1] * 60
    assert client.peak == 5 and runner.max_in_flight == 5  # gated to the pool, not to the setting (500)


async def test_the_setting_caps_calls_in_flight_below_a_larger_pool() -> None:
    client = FakeClient(max_connections=1000)
    runner = ScriptRunner(client, timeout_seconds=5.0, max_in_flight=3)
    await asyncio.gather(*(runner.run("contract_settle", ["k"], []) for _ in range(20)))
    assert client.peak == 3


async def test_no_free_slot_in_time_fails_that_call_only_and_leaves_the_breaker_closed() -> None:
    client = FakeClient(max_connections=1)
    runner = ScriptRunner(client, timeout_seconds=0.1, cooldown_seconds=60.0)
    assert await runner.run("contract_settle", ["k"], []) == 1
    gate = runner._loop_state(client).gate
    await gate.acquire()  # another call holds the only slot past the timeout
    with pytest.raises(StoreError, match=r"no free Redis connection within 0\.1s"):
        await runner.run("contract_settle", ["k"], [])
    gate.release()
    assert await runner.run("contract_settle", ["k"], []) == 1  # not skipped: waiting is no Redis fault


async def test_an_unexpected_client_error_becomes_a_store_error() -> None:
    client = FakeClient(max_connections=5, error=AttributeError("'NoneType' object has no attribute 'writelines'"))
    runner = ScriptRunner(client, timeout_seconds=1.0, cooldown_seconds=60.0)
    with pytest.raises(StoreError, match="AttributeError") as raised:
        await runner.run("contract_settle", ["k"], [])
    assert isinstance(raised.value.__cause__, AttributeError)
    client.error = None
    with pytest.raises(StoreError, match="skipped"):  # a fault: the breaker is open
        await runner.run("contract_settle", ["k"], [])


async def test_a_failing_client_factory_becomes_a_store_error() -> None:
    def factory() -> object:
        raise RuntimeError("redis://:hunter2@cache:6379 is not reachable")

    with pytest.raises(StoreError) as raised:
        await ScriptRunner(factory).run("contract_settle", ["k"], [])
    assert "hunter2" not in str(raised.value) and "RuntimeError" in str(raised.value)


async def test_a_plain_pool_of_the_real_redis_is_gated_too(redis_server: RedisServer) -> None:
    """redis-py's non-blocking ConnectionPool raises past max_connections; the gate makes a burst wait."""
    client = aioredis.Redis.from_url(redis_server.url, max_connections=4)
    try:
        store = RedisStore(client, KeySpace("rbgate"))
        batch = SettleBatch()
        batch.add(0, "d", 1)
        replies = await asyncio.gather(*(store.flush("m", batch) for _ in range(100)))
        assert replies == [None] * 100  # every call ran (no window: nothing to settle), none failed
    finally:
        await client.aclose()
