"""Test session fixtures: a throwaway redis-server, and a ``store`` fixture run on every backend.

Backends of ``store`` (and the server behind ``redis_client``): ``memory`` (the embedded store), and Redis:
a real ``redis-server`` started by the session when one is on PATH, else ``fakeredis`` (an in-process Redis
that runs our Lua scripts with ``lupa``), so the store suites run on a machine without redis-server too.
Tests that need a real server (restarts, outages, TLS, proxies sharing a Redis, the Redis Cluster) are
skipped there, and the run ends with one line naming them (:func:`pytest_terminal_summary`). With
``LITELLM_RATEBALANCE_REQUIRE_REDIS_SERVER=1`` (``make test``, CI) nothing falls back or skips for want
of a real server: such a test fails instead (tests/servers.py).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings as hypothesis_settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm_ratebalance.store import KeySpace, MemoryStore, RedisStore
from tests.servers import (
    NO_REDIS_SERVER,
    RedisServer,
    real_redis_required,
    redis_server_binary,
)

if TYPE_CHECKING:
    import redis.asyncio as aioredis

# Property tests check results, not speed: Hypothesis' default 200 ms deadline per example turns a pause of
# the shared, loaded CI machine (garbage collection, descheduling) into a failure.
hypothesis_settings.register_profile("ratebalance", deadline=None)
hypothesis_settings.load_profile("ratebalance")

REDIS_BACKEND = "redis" if redis_server_binary() is not None or real_redis_required() else "fakeredis"
"""The Redis behind ``store`` and ``redis_client``: decided once per session, so test ids say which ran
(``[redis]`` or ``[fakeredis]``). Where a real server is required, it is ``redis`` even without one (the
tests then fail, see tests/servers.py)."""


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


def fake_redis_client() -> aioredis.Redis:
    """A ``redis.asyncio`` client of a new, empty in-process fakeredis server that runs Lua (``fakeredis[lua]``,
    the ``test`` extra); skips the test when fakeredis or lupa is not installed."""
    fakeredis: Any = pytest.importorskip("fakeredis", reason=f"{NO_REDIS_SERVER} redis-server and fakeredis missing")
    pytest.importorskip("lupa", reason=f"{NO_REDIS_SERVER} redis-server missing, fakeredis without lua (lupa)")
    client: aioredis.Redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    return client


async def _backend_client(request: pytest.FixtureRequest) -> aioredis.Redis:
    if REDIS_BACKEND == "fakeredis":
        return fake_redis_client()
    return await fresh_redis_client(request.getfixturevalue("redis_server"))


@pytest.fixture
async def redis_client(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    """A client on an empty Redis: the session's redis-server (database flushed, scripts flushed), or a fresh
    fakeredis server where there is no redis-server (see the module docstring)."""
    client = await _backend_client(request)
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", REDIS_BACKEND])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore | RedisStore]:
    """The behavioural suite's store: every test using it runs once per backend."""
    keys = KeySpace("rbtest")
    if request.param == "memory":
        yield MemoryStore(keys)
        return
    client = await _backend_client(request)
    # Default store settings: exact counts under concurrent bursts must hold with what users get.
    yield RedisStore(client, keys)
    await client.aclose()


_skipped_for_redis: Counter[str] = Counter()
"""Tests skipped for want of a real redis-server, by test file (or directory, for tests/cluster)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and NO_REDIS_SERVER in str(longrepr[2]):
        path = report.nodeid.split("::", 1)[0]
        _skipped_for_redis["tests/cluster/" if path.startswith("tests/cluster/") else path] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: which suites needing a real redis-server were skipped, and why."""
    if not _skipped_for_redis:
        return
    where = ", ".join(f"{path} ({count})" for path, count in sorted(_skipped_for_redis.items()))
    fallback = "the store suites ran on fakeredis; " if REDIS_BACKEND == "fakeredis" else ""
    terminalreporter.write_line(
        f"redis-server is not on PATH: {fallback}skipped {sum(_skipped_for_redis.values())} tests that need a real "
        f"server: {where} (install redis-server to run them; CI runs them all)",
        yellow=True,
    )


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
