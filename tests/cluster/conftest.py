"""Redis Cluster fixtures: one local cluster of three masters for the session, a fresh
``redis.asyncio.RedisCluster`` client per test, and a ``store`` fixture that overrides the top-level one
(memory / redis) with a single backend, a :class:`RedisStore` on the cluster client.

Because fixtures resolve from the collecting module's directory, a behavioural suite re-exported into
this package (see :mod:`tests.cluster.suites`) runs unchanged on the cluster. Tests here are marked
``cluster``; without ``redis-server``/``redis-cli`` they are skipped (fail where CI requires a real server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from litellm_ratebalance.store import KeySpace, RedisStore
from tests.cluster.cluster import RedisClusterNodes, fresh_cluster_client
from tests.servers import skip_without_real_redis


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterNodes]:
    """Three masters on loopback free ports, started on first use, torn down at the end of the session."""
    skip_without_real_redis("redis-server", "redis-cli")
    with RedisClusterNodes() as cluster:
        yield cluster


SUITE_MAX_CONNECTIONS = 256
"""Per node. The async ``RedisCluster`` has no blocking pool (past ``max_connections``, redis-py's default
100, a call raises ``MaxConnectionsError``); the store's gate keeps its calls in flight at or below the
client's limit, so a burst waits instead. The suites fire bursts of 200 concurrent calls at one slot; this
size lets them run at once; test_cluster_hooks.py shows a default-sized client taking such a burst."""


@pytest.fixture
async def cluster_client(redis_cluster: RedisClusterNodes) -> AsyncIterator[Any]:
    client = await fresh_cluster_client(redis_cluster, max_connections=SUITE_MAX_CONNECTIONS)
    yield client
    await client.aclose()


@pytest.fixture(params=["cluster"])
async def store(cluster_client: Any) -> AsyncIterator[RedisStore]:
    """Overrides tests/conftest.py's ``store``: the behavioural suites' store, on the Redis Cluster."""
    yield RedisStore(cluster_client, KeySpace("rbtest"), timeout_seconds=5.0)  # bursts on 3 masters, 2 busy cores
