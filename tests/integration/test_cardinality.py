"""Cardinality is bounded by configuration, not by traffic (issue 7, "Safe keys and bounded state").

A flood of requests that each bring a new priority (key and team metadata), a new feature (key metadata,
request body, tags) and, every other one, a new model name goes through the priority limiter and the
traffic contracts hooks on the real redis-server. Measured before and after the flood, after a warm-up of
the same shapes: the Redis key count, the hash fields in every key, the local caches (the limiter's model
capacity cache and open reservations, the contracts' open reservations, the routing candidate cache) and
the Prometheus series of our metrics. All must stay flat.
"""

from __future__ import annotations

from typing import Any

import pytest
from litellm.proxy._types import UserAPIKeyAuth
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy.admission import PriorityRateLimiter
from litellm_ratebalance.proxy.contracts import TrafficContractsCallback
from litellm_ratebalance.proxy.routing import calls as routing_adapter
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.integration import contracts_support as contracts
from tests.integration import limiter_support as limiter

pytestmark = pytest.mark.redis

FLOOD = 2000
WARM_UP = 20
PREFIX = "rbcard"

SETTINGS: dict[str, Any] = {
    "priority_reservation": {"prod": 0.6, "dev": 0.2},
    "ratebalance": {
        "key_prefix": PREFIX,
        "traffic_contracts": {
            **contracts.EXAMPLE_CONTRACTS,
            "basket": {"rpm": 1_000_000, "tpm": 1_000_000_000},
            "trust_request_feature": True,  # the body may name a feature: the widest door for bogus names
        },
    },
}


def hostile_auth(index: int) -> UserAPIKeyAuth:
    return UserAPIKeyAuth(
        api_key=f"sk-flood-{index}",
        team_id=f"team-{index}",
        metadata={"priority": f"bogus-{index}", "feature": f"feature-{index}", "tags": [f"tag-{index}"]},
        team_metadata={"priority": f"team-bogus-{index}"} if index % 2 else None,
    )


def hostile_request(index: int) -> dict[str, Any]:
    model = "m" if index % 2 else f"no-such-model-{index}-{{tag}}:x"
    data = limiter.request(model, max_tokens=5)
    data["metadata"] = {"feature": f"body-feature-{index}", "priority": "prod", "tags": [f"body-tag-{index}"]}
    return data


async def redis_shape(client: Any) -> tuple[int, int]:
    """(keys, hash fields over all keys) under our prefix."""
    keys = [key async for key in client.scan_iter(match=f"{PREFIX}:*")]
    fields = sum([await client.hlen(key) for key in keys])
    return len(keys), fields


def series_count() -> int:
    """Prometheus samples of every ``litellm_ratebalance_*`` metric family."""
    return sum(len(family.samples) for family in REGISTRY.collect() if family.name.startswith("litellm_ratebalance_"))


def local_state(rate_limiter: PriorityRateLimiter, callback: TrafficContractsCallback) -> dict[str, int]:
    capacity = rate_limiter._capacity
    return {
        "capacity cache": len(capacity) if capacity is not None else 0,
        "limiter open reservations": len(rate_limiter._tickets),
        "contract open reservations": len(callback._tickets),
        "routing candidate cache": len(routing_adapter._candidate_cache),
    }


async def one(rate_limiter: PriorityRateLimiter, callback: TrafficContractsCallback, index: int) -> None:
    data, who = hostile_request(index), hostile_auth(index)
    assert await limiter.call(rate_limiter, data, who) is None
    assert await contracts.call(callback, data, who) is None
    await limiter.finish(rate_limiter, data, 12)
    await contracts.finish(callback, data, 12)


async def test_a_flood_of_bogus_names_leaves_redis_and_local_state_flat(redis_client: Any) -> None:
    store = RedisStore(redis_client, KeySpace(PREFIX))
    router = limiter.make_router(rpm=10_000_000, tpm=10_000_000_000)
    rate_limiter = limiter.make_limiter(store, router, SETTINGS)
    callback = contracts.make_callback(store, SETTINGS["ratebalance"]["traffic_contracts"], router=router)
    await contracts.room_in_window(3600, margin=30)

    for index in range(WARM_UP):
        await one(rate_limiter, callback, index)
    redis_before, local_before, series_before = await redis_shape(redis_client), None, series_count()
    local_before = local_state(rate_limiter, callback)

    for index in range(WARM_UP, WARM_UP + FLOOD):
        await one(rate_limiter, callback, index)

    assert await redis_shape(redis_client) == redis_before
    assert local_state(rate_limiter, callback) == local_before
    assert series_count() == series_before
    # What "flat" is here: one limiter window and one learned-output estimate for the one real model group
    # and one contract window pair;
    # the limiter's pool fields are the configured priorities and the default pool, the contract fields
    # the configured features, ``unassigned`` and the basket.
    assert redis_before[0] == 4
    assert local_before["capacity cache"] == 1
    assert all([await redis_client.ttl(key) > 0 async for key in redis_client.scan_iter(match=f"{PREFIX}:*")])


class CountingRouter:
    """Deployments for a fixed set of group names (and a wildcard route); counts model-list reads."""

    def __init__(self, groups: list[str]) -> None:
        self.groups = groups
        self.reads: list[str] = []

    def get_model_list(self, model_name: str) -> list[dict[str, Any]]:
        self.reads.append(model_name)
        if model_name in self.groups:
            return [{"model_name": model_name, "litellm_params": {"rpm": 10}}]
        if model_name.startswith("openai/"):
            return [{"model_name": "openai/*", "litellm_params": {"rpm": 7}}]
        return []


def test_the_capacity_cache_is_a_bounded_lru_that_never_stores_unknown_names() -> None:
    from litellm_ratebalance.proxy.admission.capacity import CapacityCache

    router = CountingRouter(["a", "b", "c", "d"])
    cache = CapacityCache(60.0, clock=lambda: 0.0, max_entries=3)
    for name in ("a", "b", "c", "a", "d"):  # "a" used again before "d" arrives: "b" is the least recent
        assert cache.get(router, name).rpm == 10
    assert len(cache) == 3
    router.reads.clear()
    for name in ("a", "c", "d", "b"):
        cache.get(router, name)
    assert router.reads == ["b"]  # a, c, d were cached; b had been evicted

    for index in range(50):
        assert cache.get(router, f"no-such-group-{index}").deployments == 0
    assert len(cache) == 3  # unknown names are never stored

    # A wildcard route matches any name under it: the capacity names the route, and the cache stays bounded.
    for index in range(50):
        capacity = cache.get(router, f"openai/model-{index}")
        assert (capacity.rpm, capacity.model_group) == (7, "openai/*")
    assert len(cache) == 3
    assert cache.get(router, "a").model_group == "a"


async def test_names_under_a_wildcard_route_share_one_window_and_one_label_set(redis_client: Any) -> None:
    """A route like ``openai/*`` with an rpm matches any name a client makes up: every such request counts
    in the route's one window (the limit is the route's), not in a key (and metric labels) per name."""
    store = RedisStore(redis_client, KeySpace(PREFIX))
    rate_limiter = limiter.make_limiter(store, CountingRouter([]), {"ratebalance": {"key_prefix": PREFIX}})
    refused = 0
    for index in range(12):
        outcome = await limiter.call(rate_limiter, limiter.request(f"openai/made-up-{index}"), limiter.auth())
        refused += outcome is not None
    keys = [key async for key in redis_client.scan_iter(match=f"{PREFIX}:*")]
    assert len(keys) == 1
    assert refused == 12 - 7  # the route's rpm 7 holds across all the names
    labels = {
        sample.labels.get("model_group")
        for family in REGISTRY.collect()
        if family.name == "litellm_ratebalance_admission_decisions"
        for sample in family.samples
    }
    assert "openai/*" in labels
    assert not any(str(label).startswith("openai/made-up-") for label in labels)
