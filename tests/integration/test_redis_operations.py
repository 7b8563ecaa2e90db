"""Running on a real Redis: eviction-policy warning, bounded key count under hostile input, script reload."""

from __future__ import annotations

import logging

import pytest

from litellm_ratebalance.proxy.runtime import warn_if_evictable
from litellm_ratebalance.store import RedisStore
from tests.integration.limiter_support import auth, call, make_limiter, make_router, request
from tests.servers import RedisServer

pytestmark = pytest.mark.redis


async def test_evicting_policy_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    import redis.asyncio as aioredis

    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        client = aioredis.Redis.from_url(server.url)
        with caplog.at_level(logging.WARNING, logger="litellm_ratebalance"):
            assert await warn_if_evictable(RedisStore(client)) == "allkeys-lru"
        assert "can evict our counters" in caplog.text and "noeviction" in caplog.text
        await client.aclose()


async def test_noeviction_is_quiet(redis_client, caplog: pytest.LogCaptureFixture) -> None:
    await redis_client.config_set("maxmemory-policy", "noeviction")
    with caplog.at_level(logging.WARNING, logger="litellm_ratebalance"):
        assert await warn_if_evictable(RedisStore(redis_client)) == "noeviction"
    assert "evict" not in caplog.text


async def test_bogus_priorities_and_models_do_not_grow_redis(redis_client) -> None:
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


async def test_scripts_survive_script_flush(redis_client) -> None:
    limiter = make_limiter(RedisStore(redis_client), make_router(rpm=3))
    assert await call(limiter, request(), auth()) is None
    await redis_client.script_flush()
    assert await call(limiter, request(), auth()) is None  # NOSCRIPT -> reloaded by redis-py
    assert await call(limiter, request(), auth()) is None
    assert await call(limiter, request(), auth()) is not None
