"""The priority limiter and traffic contracts through their LiteLLM hooks, on the local Redis Cluster.

Each "replica" is a callback with its own ``RedisCluster`` client (its own connections), as two proxy
processes would have; the counts they share must be exact, whatever node a model group's keys live on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from litellm.router import Router

from litellm_ratebalance.proxy.tokens import estimate_tokens
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.cluster.cluster import RedisClusterNodes, cluster_key_count, cluster_keys, fresh_cluster_client
from tests.integration import contracts_support as contracts
from tests.integration import limiter_support as limiter

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

GROUPS = [f"group-{index}" for index in range(6)]
"""Enough model groups that their hash tags land on more than one of the three masters."""


def multi_group_router(rpm: int, tpm: int | None = None) -> Any:
    model_list = []
    for group in GROUPS:
        params: dict[str, Any] = {"model": "openai/fake", "api_key": "sk-fake", "mock_response": "hi", "rpm": rpm}
        if tpm is not None:
            params["tpm"] = tpm
        model_list.append({"model_name": group, "litellm_params": params, "model_info": {"id": f"{group}-0"}})
    return Router(model_list=model_list)


def new_cluster_client(cluster: RedisClusterNodes, **kwargs: Any) -> Any:
    """A client as LiteLLM builds one: not initialized (it reads the slot map on first use)."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes], **kwargs)


async def replica_clients(cluster: RedisClusterNodes, count: int = 2, **kwargs: Any) -> list[Any]:
    """``count`` clients on an emptied cluster, each initialized before the burst (see
    test_a_first_burst_on_an_uninitialized_client_counts_exactly for why)."""
    first = await fresh_cluster_client(cluster, **kwargs)
    others = [new_cluster_client(cluster, **kwargs) for _ in range(count - 1)]
    for client in others:
        await client.initialize()
    return [first, *others]


async def close_all(clients: list[Any]) -> None:
    for client in clients:
        await client.aclose()


def node_of(client: Any, key: str) -> str:
    return str(client.get_node_from_key(key).name)


async def test_two_limiters_admit_exactly_rpm_in_every_model_group(redis_cluster: RedisClusterNodes) -> None:
    clients = await replica_clients(redis_cluster)
    try:
        keys = KeySpace("rbcluster")
        router = multi_group_router(rpm=15)
        # A generous per-call timeout: 240 calls at once on a shared 2-core machine can queue for a pooled
        # connection past the default 0.5 s, and a timed-out call fails open (uncounted) by design; this test
        # is about exact counting across masters, not about the timeout.
        stores = [RedisStore(client, keys) for client in clients]
        limiters = [limiter.make_limiter(store, router) for store in stores]
        # 40 concurrent requests per group, 240 in all, alternating between the two replicas.
        jobs = [(group, index) for group in GROUPS for index in range(40)]
        results = await asyncio.gather(
            *(
                limiter.call(limiters[i % 2], limiter.request(group), limiter.auth())
                for i, (group, _) in enumerate(jobs)
            )
        )
        admitted = Counter(group for (group, _), refused in zip(jobs, results, strict=True) if refused is None)
        assert admitted == dict.fromkeys(GROUPS, 15)
        assert all(refused.status_code == 429 for refused in results if refused is not None)

        window_keys = [keys.admission_window(group) for group in GROUPS]
        assert len({node_of(clients[0], key) for key in window_keys}) >= 2  # really spread over masters
        for key in window_keys:
            counters = await clients[0].hgetall(key)
            assert int(counters[b"r"]) == 15
            assert await clients[0].pttl(key) > 0
        # One key per model group, nothing else.
        assert await cluster_key_count(clients[0]) == len(GROUPS)
    finally:
        await close_all(clients)


async def test_priorities_and_token_reconciliation_on_the_cluster(cluster_client: Any) -> None:
    settings = {
        "priority_reservation": {"prod": 0.8, "dev": 0.2},
        "priority_reservation_settings": {"saturation_threshold": 0.5},
        "ratebalance": {"limiter": {"token_rate_limit_type": "output"}},
    }
    store = RedisStore(cluster_client, KeySpace("rbcluster"))
    limiter_ = limiter.make_limiter(store, limiter.make_router(rpm=10, tpm=1000), settings)
    # Lenient until 5 of 10 requests; then dev is capped at its share (2), prod at 8.
    dev = [await limiter.call(limiter_, limiter.request(max_tokens=50), limiter.auth("dev")) for _ in range(7)]
    assert [r is None for r in dev] == [True] * 5 + [False] * 2
    prod_data = [limiter.request(max_tokens=50) for _ in range(6)]
    prod = [await limiter.call(limiter_, data, limiter.auth("prod")) for data in prod_data]
    assert [r is None for r in prod] == [True] * 5 + [False]  # the model's 10 are used up
    assert prod[-1] is not None and prod[-1].status_code == 429

    snapshot = await store.admission_snapshot("m", 60_000)
    assert snapshot is not None and (snapshot.requests, snapshot.tokens) == (10, 500)
    for data in prod_data[:5]:
        await limiter.finish(limiter_, data, 20)  # 10 output tokens each instead of 50 reserved
    snapshot = await store.admission_snapshot("m", 60_000)
    assert snapshot is not None and (snapshot.requests, snapshot.tokens) == (10, 5 * 50 + 5 * 10)


async def test_two_contract_callbacks_get_exact_modes(redis_cluster: RedisClusterNodes) -> None:
    window = 3600
    await contracts.room_in_window(window, margin=10)
    estimate = estimate_tokens("m", contracts.request(), "total", 256, 4096)
    settings = {
        "window_seconds": window,
        "counter_ttl_seconds": 2 * window,
        "basket": {"rpm": 60, "tpm": 50 * estimate},
        "features": {"smart-window": {"rpm": 20, "tpm": 30 * estimate}, "s2s": {"rpm": 100}},
    }
    clients = await replica_clients(redis_cluster)
    try:
        keys = KeySpace("rbcluster")
        callbacks = [contracts.make_callback(RedisStore(client, keys), settings) for client in clients]
        datas = [contracts.request() for _ in range(100)]
        results = await asyncio.gather(
            *(contracts.call(callbacks[i % 2], data, contracts.auth("smart-window")) for i, data in enumerate(datas))
        )
        assert all(refused is None for refused in results)  # observe-only actions: all served
        rpm = Counter(data["metadata"]["traffic_contract_rpm_mode"] for data in datas)
        tpm = Counter(data["metadata"]["traffic_contract_tpm_mode"] for data in datas)
        # Requests 1-20 of the window are normal, 21-60 borrowed (feature over, basket not), 61-100
        # degraded; by tokens (none reconciled yet) 30 / 20 / 50.
        assert rpm == {"normal": 20, "borrowed": 40, "degraded": 40}
        assert tpm == {"normal": 30, "borrowed": 20, "degraded": 50}

        await asyncio.gather(*(contracts.finish(callbacks[i % 2], data, 7) for i, data in enumerate(datas)))
        snapshot = await callbacks[1]._runtime().store().contract_window(window)
        assert snapshot is not None
        assert snapshot.requests == {"smart-window": 100, "__basket__": 100}
        assert snapshot.tokens["__basket__"] == 700 and snapshot.in_flight["__basket__"] == 0

        # The window's RPM and TPM hashes share one slot (the window start is their hash tag), and
        # every key carries a TTL.
        written = await cluster_keys(clients[0], "rbcluster:*")
        assert len(written) == 2
        assert len({clients[0].keyslot(key) for key in written}) == 1
        assert all([await clients[0].ttl(key) > 0 for key in written])
    finally:
        await close_all(clients)


async def test_contract_rejections_hold_exactly_across_replicas(redis_cluster: RedisClusterNodes) -> None:
    window = 3600
    await contracts.room_in_window(window, margin=10)
    settings = {
        "window_seconds": window,
        "counter_ttl_seconds": 2 * window,
        "basket": {"rpm": 30},
        "features": {"s2s": {"rpm": 10}},
        "enforcement": {"degraded": "reject"},
    }
    clients = await replica_clients(redis_cluster)
    try:
        keys = KeySpace("rbcluster")
        callbacks = [contracts.make_callback(RedisStore(client, keys), settings) for client in clients]
        results = await asyncio.gather(
            *(contracts.call(callbacks[i % 2], contracts.request(), contracts.auth("s2s")) for i in range(50))
        )
        statuses = Counter(None if refused is None else refused.status_code for refused in results)
        assert statuses == {None: 30, 429: 20}
    finally:
        await close_all(clients)


def litellm_cluster_client(cluster: RedisClusterNodes) -> tuple[Any, Any]:
    """(store client callable, client) exactly as the proxy hands them over: LiteLLM's ``RedisClusterCache``
    for ``startup_nodes``, whose ``init_async_client`` the runtime gives the store (not initialized yet)."""
    from litellm.caching.redis_cluster_cache import RedisClusterCache

    cache = RedisClusterCache(startup_nodes=[{"host": host, "port": port} for host, port in cluster.startup_nodes])
    return cache.init_async_client, cache.init_async_client()


async def test_a_burst_beyond_the_default_pool_size_is_still_exact(redis_cluster: RedisClusterNodes) -> None:
    admin = await fresh_cluster_client(redis_cluster)
    get_client, client = litellm_cluster_client(redis_cluster)
    try:
        await client.initialize()  # only the pool size is under test here
        store = RedisStore(get_client, KeySpace("rbcluster"))
        limiter_ = limiter.make_limiter(store, limiter.make_router(rpm=50))
        results = await asyncio.gather(*(limiter.call(limiter_, limiter.request(), limiter.auth()) for _ in range(150)))
        assert sum(refused is None for refused in results) == 50
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_first_burst_on_an_uninitialized_client_counts_exactly(redis_cluster: RedisClusterNodes) -> None:
    admin = await fresh_cluster_client(redis_cluster)
    get_client, client = litellm_cluster_client(redis_cluster)
    try:
        # Exactness under a lazy first connect is under test, not speed: the long timeout keeps a loaded machine
        # from failing calls open while the cluster client sets itself up.
        store = RedisStore(get_client, KeySpace("rbcluster"))
        limiter_ = limiter.make_limiter(store, limiter.make_router(rpm=1000))
        results = await asyncio.gather(
            *(limiter.call(limiter_, limiter.request(), limiter.auth()) for _ in range(60)), return_exceptions=True
        )
        assert all(result is None for result in results)  # all admitted, nothing raised
        counters = await admin.hgetall(KeySpace("rbcluster").admission_window("m"))
        assert int(counters[b"r"]) == 60  # each request counted once
    finally:
        await client.aclose()
        await admin.aclose()
