"""Replica health reports: the same behaviour on every backend (the ``store`` fixture)."""

from __future__ import annotations

import asyncio

import pytest

from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.replicas import ReplicaHealth

pytestmark = [pytest.mark.redis]


def health(name: str, *, lag: float = 0.01, errors: dict[str, int] | None = None) -> ReplicaHealth:
    return ReplicaHealth(
        replica=name,
        interval_seconds=10.0,
        store_calls=120,
        store_call_max_seconds=0.004,
        loop_lag_max_seconds=lag,
        store_errors=errors or {},
    )


async def test_each_replica_keeps_its_latest_report(store: MemoryStore | RedisStore) -> None:
    assert await store.report_replica(health("a:1", lag=0.5), keep_ms=30_000) == 1
    assert await store.report_replica(health("b:2", errors={"timeout": 3}), keep_ms=30_000) == 2
    assert await store.report_replica(health("a:1", lag=0.02), keep_ms=30_000) == 2

    reports = await store.replica_health()
    assert [r.replica for r in reports] == ["a:1", "b:2"]
    assert reports[0].loop_lag_max_seconds == 0.02  # replaced, not added
    assert reports[1].store_errors == {"timeout": 3}
    assert all(r.reported_ms > 0 for r in reports)
    assert (reports[1].store_calls, reports[1].store_call_max_seconds) == (120, 0.004)


async def test_a_replica_that_stopped_reporting_is_forgotten(store: MemoryStore | RedisStore) -> None:
    await store.report_replica(health("gone:1"), keep_ms=100)
    await asyncio.sleep(0.15)
    assert await store.report_replica(health("alive:2"), keep_ms=100) == 1
    assert [r.replica for r in await store.replica_health()] == ["alive:2"]


async def test_names_from_any_host_are_stored_safely(store: MemoryStore | RedisStore) -> None:
    await store.report_replica(health("host {with} braces:12"), keep_ms=30_000)
    assert [r.replica for r in await store.replica_health()] == ["host {with} braces:12"]
