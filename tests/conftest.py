"""Test session fixtures: a throwaway redis-server, and a ``store`` fixture run on every backend."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm_ratebalance.store import KeySpace, MemoryStore, RedisStore
from tests.servers import EXACT_COUNT_TIMEOUT_SECONDS, RedisServer

if TYPE_CHECKING:
    import redis.asyncio as aioredis

# Property tests check results, not speed: Hypothesis' default 200 ms deadline per example turns a pause of
# the shared, loaded CI machine (garbage collection, descheduling) into a failure.
hypothesis_settings.register_profile("ratebalance", deadline=None)
hypothesis_settings.load_profile("ratebalance")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (started on first use)."""
    with RedisServer() as server:
        yield server


async def fresh_redis_client(server: RedisServer) -> aioredis.Redis:
    """A client on an emptied database with the script cache flushed (so NOSCRIPT reloads are exercised)."""
    import redis.asyncio as aioredis

    # A blocking pool waits for a free connection instead of failing a burst of 200 concurrent calls.
    pool = aioredis.BlockingConnectionPool.from_url(server.url, max_connections=50, timeout=10)
    client = aioredis.Redis(connection_pool=pool)
    await client.flushdb()
    await client.script_flush()
    return client


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = await fresh_redis_client(redis_server)
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore | RedisStore]:
    """The behavioural suite's store: every test using it runs once per backend."""
    keys = KeySpace("rbtest")
    if request.param == "memory":
        yield MemoryStore(keys)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = await fresh_redis_client(server)
    # The suite checks behaviour (exact counts under concurrent bursts), not latency.
    yield RedisStore(client, keys, timeout_seconds=EXACT_COUNT_TIMEOUT_SECONDS)
    await client.aclose()


_LITELLM_CALLBACK_LISTS = (
    "callbacks",
    "input_callback",
    "success_callback",
    "failure_callback",
    "service_callback",
    "_async_input_callback",
    "_async_success_callback",
    "_async_failure_callback",
)


@pytest.fixture(autouse=True)
def _restore_litellm_callbacks() -> Iterator[None]:
    """Every ``litellm.Router`` appends its health callbacks to LiteLLM's global lists, which refuse new
    entries past 30: without this, a test's Router could silently lose its cooldown handling depending on
    how many Routers earlier tests made. Each test gets the lists back as they were (same list objects)."""
    import sys

    litellm = sys.modules.get("litellm")
    saved = {name: list(getattr(litellm, name)) for name in _LITELLM_CALLBACK_LISTS if litellm is not None}
    yield
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return
    for name in _LITELLM_CALLBACK_LISTS:
        current = getattr(litellm, name, None)
        if isinstance(current, list):
            current[:] = saved.get(name, [])
