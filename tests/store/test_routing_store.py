"""Behavioural suite of the routing statistics operation, on the embedded store and a real redis-server."""

from __future__ import annotations

import pytest

from litellm_ratebalance.routing.records import RateAggregate, RateLimitObservation
from litellm_ratebalance.store import MemoryStore, RedisStore
from litellm_ratebalance.store.routing import RoutingSnapshot

pytestmark = pytest.mark.redis

WIDTH = 60_000  # one-minute buckets: a test never straddles more than one bucket boundary


def aggregate(*rates: float, failures: int = 0, tokens: int = 10, ttft: float | None = None) -> RateAggregate:
    agg = RateAggregate()
    for rate in rates:
        agg.add(rate, latency=0.5, tokens=tokens, ttft=ttft)
    for _ in range(failures):
        agg.add(0.0, ok=False, latency=2.0)
    return agg


async def now_bucket(store: MemoryStore | RedisStore, group: str = "probe") -> int:
    snapshot = await store.routing_sync(
        group, {}, {}, first_bucket=0, last_bucket=0, bucket_ms=WIDTH, bucket_ttl_ms=1000, limits_ttl_ms=1000
    )
    return snapshot.now_ms // WIDTH


async def sync(
    store: MemoryStore | RedisStore,
    group: str,
    deltas: dict[str, RateAggregate],
    current: int,
    *,
    first_bucket: int | None = None,
    last_bucket: int | None = None,
) -> RoutingSnapshot:
    """Sync with the range ``current - 1 .. current + 1`` unless told otherwise."""
    return await store.routing_sync(
        group,
        deltas,
        {},
        first_bucket=current - 1 if first_bucket is None else first_bucket,
        last_bucket=current + 1 if last_bucket is None else last_bucket,
        bucket_ms=WIDTH,
        bucket_ttl_ms=300_000,
        limits_ttl_ms=60_000,
    )


async def test_deltas_land_in_the_current_bucket_and_read_back_exactly(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    first = aggregate(10.0, 20.0, failures=1, ttft=0.2)
    snapshot = await sync(store, "g", {"dep-a": first, "dep/b {x}": aggregate(5.0)}, current)
    assert snapshot.written
    bucket_index = snapshot.now_ms // WIDTH
    assert set(snapshot.buckets) == {bucket_index}
    got = snapshot.buckets[bucket_index]
    assert set(got) == {"dep-a", "dep/b {x}"}
    assert got["dep-a"] == first
    assert got["dep-a"].count == 3 and got["dep-a"].failures == 1
    assert got["dep-a"].ok_latency_sum == pytest.approx(1.0)
    assert got["dep-a"].mean_ttft == pytest.approx(0.2)


async def test_replicas_add_up_in_one_bucket(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    await sync(store, "g", {"d": aggregate(10.0, 30.0)}, current)
    snapshot = await sync(store, "g", {"d": aggregate(20.0)}, current)
    got = snapshot.buckets[snapshot.now_ms // WIDTH]["d"]
    assert got.count == 3
    assert got.rate_sum == pytest.approx(60.0)
    assert got.rate_sq_sum == pytest.approx(100.0 + 900.0 + 400.0)
    assert sum(got.bins.values()) == 3
    assert got.tokens == 30


async def test_model_groups_are_separate(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    await sync(store, "g1", {"d": aggregate(10.0)}, current)
    snapshot = await sync(store, "g2", {}, current)
    assert snapshot.buckets == {}


async def test_nothing_is_written_when_the_current_bucket_is_not_in_the_range(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    snapshot = await sync(store, "g", {"d": aggregate(10.0)}, current - 10)
    assert not snapshot.written
    again = await sync(store, "g", {}, current)
    assert again.buckets == {}
    # An empty write is always "written" (there was nothing to place).
    assert (await sync(store, "g", {}, current - 10)).written


async def test_range_returns_only_requested_buckets(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    await sync(store, "g", {"d": aggregate(10.0)}, current)
    snapshot = await sync(store, "g", {}, current + 5, first_bucket=current + 3, last_bucket=current + 5)
    assert snapshot.buckets == {}
    assert (snapshot.first_bucket, snapshot.last_bucket) == (current + 3, current + 5)


async def test_rate_limit_headers_are_stamped_with_store_time(store: MemoryStore | RedisStore) -> None:
    current = await now_bucket(store)
    obs = RateLimitObservation(remaining_requests=3, remaining_tokens=None, limit_requests=100, reset_seconds=6.0)
    snapshot = await store.routing_sync(
        "g",
        {},
        {"d": obs},
        first_bucket=current,
        last_bucket=current + 1,
        bucket_ms=WIDTH,
        bucket_ttl_ms=1000,
        limits_ttl_ms=60_000,
    )
    got = snapshot.limits["d"]
    assert got.remaining_requests == 3 and got.limit_requests == 100
    assert got.remaining_tokens is None and got.limit_tokens is None
    assert got.reset_seconds == 6.0
    assert got.observed_ms == snapshot.now_ms
    assert got.fraction_left() == pytest.approx(0.03)


async def test_every_key_has_a_ttl(store: MemoryStore | RedisStore) -> None:
    if not isinstance(store, RedisStore):
        pytest.skip("key TTLs are a Redis property (the memory store expires entries itself)")
    current = await now_bucket(store)
    await store.routing_sync(
        "g",
        {"d": aggregate(10.0)},
        {"d": RateLimitObservation(remaining_tokens=5)},
        first_bucket=current - 1,
        last_bucket=current + 1,
        bucket_ms=WIDTH,
        bucket_ttl_ms=300_000,
        limits_ttl_ms=70_000,
    )
    keys = [k.decode() async for k in store.client.scan_iter(match="rbtest:*")]
    assert keys, "the sync wrote no key"
    for key in keys:
        assert key.startswith("rbtest:{rt:g}:"), key
        ttl = await store.client.pttl(key)
        assert 0 < ttl <= 300_000, (key, ttl)


async def test_memory_store_expires_buckets_and_headers() -> None:
    clock = [1_000_000.0]
    store = MemoryStore(clock=lambda: clock[0])
    current = int(clock[0] * 1000) // WIDTH
    kw = dict(
        first_bucket=current, last_bucket=current + 1, bucket_ms=WIDTH, bucket_ttl_ms=120_000, limits_ttl_ms=30_000
    )
    await store.routing_sync("g", {"d": aggregate(10.0)}, {"d": RateLimitObservation(remaining_tokens=1)}, **kw)  # type: ignore[arg-type]
    clock[0] += 31
    snapshot = await store.routing_sync("g", {}, {}, **kw)  # type: ignore[arg-type]
    assert snapshot.limits == {}
    assert snapshot.buckets[current]["d"].count == 1
    clock[0] += 90
    snapshot = await store.routing_sync("g", {}, {}, **kw)  # type: ignore[arg-type]
    assert snapshot.buckets == {}


async def test_bad_range_is_refused(store: MemoryStore | RedisStore) -> None:
    with pytest.raises(ValueError):
        await store.routing_sync(
            "g", {}, {}, first_bucket=5, last_bucket=4, bucket_ms=WIDTH, bucket_ttl_ms=1, limits_ttl_ms=1
        )
