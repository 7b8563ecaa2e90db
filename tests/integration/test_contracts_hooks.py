"""TrafficContractsCallback through its hooks, on both store backends (the real redis-server for Redis)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from litellm_ratebalance.contracts.policy import ContractLimits, Mode
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.proxy.contracts import TrafficContractsCallback
from litellm_ratebalance.store import MemoryStore, RedisStore
from tests.integration.contracts_support import (
    EXAMPLE_CONTRACTS,
    auth,
    call,
    finish,
    headers_of,
    make_callback,
    request,
    requests_total,
    room_in_window,
    sample,
    success_kwargs,
)

pytestmark = pytest.mark.redis


def with_enforcement(**enforcement: Any) -> dict[str, Any]:
    return {**EXAMPLE_CONTRACTS, "enforcement": enforcement}


async def test_example_flow_through_the_hooks(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store)
    flow = [
        ("ai", "normal"),
        ("memories", "normal"),
        ("ai", "borrowed"),
        ("s2s", "normal"),
        ("s2s-android", "degraded"),
    ]
    seen = []
    for name, expected_rpm in flow:
        data = request()
        assert await call(callback, data, auth(name)) is None  # observe only: every request is served
        headers = await headers_of(callback, data)
        seen.append((headers["x-traffic-contract-feature"], headers["x-traffic-contract-rpm-mode"]))
        assert headers["x-traffic-contract-rpm-mode"] == expected_rpm
        await finish(callback, data, 30)
    assert [feature for feature, _ in seen] == ["smart-window", "smart-window", "smart-window", "s2s", "s2s-android"]
    window = await store.contract_window(3600)
    assert window is not None
    assert window.requests == {"smart-window": 3, "s2s": 1, "s2s-android": 1, "__basket__": 5}
    assert window.tokens["__basket__"] == 150 and window.in_flight["__basket__"] == 0


async def test_modes_reach_logging_metadata_and_metrics(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store)
    before = requests_total("smart-window", "normal", "normal")
    data = request(spend_logs_metadata={"team": "x"})
    assert await call(callback, data, auth("ai")) is None
    metadata = data["metadata"]
    assert metadata["traffic_contract_feature"] == "smart-window"
    assert metadata["traffic_contract_rpm_mode"] == "normal"
    assert metadata["traffic_contract_tpm_mode"] == "normal"
    # spend_logs_metadata is what LiteLLM's standard logging payload (Langfuse, Datadog, ...) carries.
    assert metadata["spend_logs_metadata"] == {
        "team": "x",
        "traffic_contract_feature": "smart-window",
        "traffic_contract_rpm_mode": "normal",
        "traffic_contract_tpm_mode": "normal",
    }
    assert requests_total("smart-window", "normal", "normal") == before + 1
    assert sample("litellm_ratebalance_traffic_contract_limit", {"feature": "smart-window", "kind": "rpm"}) == 2
    assert sample("litellm_ratebalance_traffic_contract_limit", {"feature": "__basket__", "kind": "tpm"}) == 10000
    await finish(callback, data, 42)
    assert sample("litellm_ratebalance_traffic_contract_usage", {"feature": "smart-window", "kind": "rpm"}) >= 1
    assert sample("litellm_ratebalance_traffic_contract_usage", {"feature": "smart-window", "kind": "tpm"}) >= 42


async def test_reject_is_a_429_naming_feature_contract_and_mode(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store, with_enforcement(borrowed="reject"))
    assert await call(callback, request(), auth("ai")) is None
    assert await call(callback, request(), auth("ai")) is None
    refused_data = request()
    refused = await call(callback, refused_data, auth("ai"))
    assert refused is not None and refused.status_code == 429
    message = cast(dict[str, str], refused.detail)["error"]  # FastAPI types detail as str; the hook sends a dict
    assert "feature 'smart-window': mode borrowed" in message
    assert "Contract: feature rpm 2, tpm 5000; basket rpm 4, tpm 10000." in message
    headers = refused.headers or {}
    assert headers["x-traffic-contract-rpm-mode"] == "borrowed"
    assert 1 <= int(headers["retry-after"]) <= 3600
    # The rejected request is not counted: other features still find the basket's room.
    window = await store.contract_window(3600)
    assert window is not None and window.requests["smart-window"] == 2 and window.requests["__basket__"] == 2
    # The response-headers hook also runs for rejected requests (response None) and labels them.
    assert (await headers_of(callback, refused_data, None))["x-traffic-contract-feature"] == "smart-window"
    assert await call(callback, request(), auth("s2s")) is None


async def test_cap_max_tokens_lowers_the_request_limit(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store, with_enforcement(borrowed={"cap_max_tokens": 5}))
    for _ in range(2):
        data = request(max_tokens=100)
        await call(callback, data, auth("ai"))
        assert data["max_tokens"] == 100  # normal: untouched
    capped = request(max_tokens=100)
    assert await call(callback, capped, auth("ai")) is None
    assert capped["max_tokens"] == 5
    unset = request(max_tokens=None)
    await call(callback, unset, auth("ai"))
    assert unset["max_tokens"] == 5
    small = request(max_tokens=3)
    await call(callback, small, auth("ai"))
    assert small["max_tokens"] == 3


async def test_delay_waits_a_bounded_jittered_time(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    callback = make_callback(
        store,
        with_enforcement(degraded={"delay": {"min_seconds": 0.2, "max_seconds": 0.6}}),
        uniform=lambda: 0.5,
        sleep=fake_sleep,
    )
    for _ in range(6):
        assert await call(callback, request(), auth("s2s")) is None
    # Requests 5 and 6 are over the basket's 4 rpm: degraded, each waited once.
    assert waits == [pytest.approx(0.4), pytest.approx(0.4)]


async def test_trust_boundary_for_the_request_body(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    untrusted = make_callback(store)
    data = request(feature="s2s", tags=["ai"])
    await call(untrusted, data, auth())
    assert data["metadata"]["traffic_contract_feature"] == "unassigned"
    keyed = request(feature="s2s")
    await call(untrusted, keyed, auth("ai"))
    assert keyed["metadata"]["traffic_contract_feature"] == "smart-window"
    admin_tagged = request()
    await call(untrusted, admin_tagged, auth(tags=["memories"]))
    assert admin_tagged["metadata"]["traffic_contract_feature"] == "smart-window"

    trusted = make_callback(store, {**EXAMPLE_CONTRACTS, "trust_request_feature": True})
    body = request(feature="s2s")
    await call(trusted, body, auth("ai"))
    assert body["metadata"]["traffic_contract_feature"] == "s2s"
    bogus = request(feature="made-up")
    await call(trusted, bogus, auth("ai"))
    assert bogus["metadata"]["traffic_contract_feature"] == "smart-window"
    tag = request(tags=["memories"])
    await call(trusted, tag, auth())
    assert tag["metadata"]["traffic_contract_feature"] == "smart-window"


async def test_team_feature_used_when_key_has_none(store: MemoryStore | RedisStore) -> None:
    callback = make_callback(store)
    data = request()
    await call(callback, data, auth(team_feature="s2s-android"))
    assert data["metadata"]["traffic_contract_feature"] == "s2s-android"


async def test_a_flood_of_bogus_names_leaves_counters_and_labels_flat(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store, {**EXAMPLE_CONTRACTS, "trust_request_feature": True})
    for index in range(200):
        data = request(f"model-{index}", feature=f"feature-{index}", tags=[f"tag-{index}", "{x}"])
        await call(callback, data, auth(f"key-{index}", team_feature=f"team-{index}"))
    window = await store.contract_window(3600)
    assert window is not None and set(window.requests) == {"unassigned", "__basket__"}
    assert window.requests["unassigned"] == 200
    labelled_models = set()
    for metric in callback._requests.collect():
        for s in metric.samples:
            labelled_models.add(s.labels["model_group"])
            assert s.labels["feature"] in {"smart-window", "s2s", "s2s-android", "unassigned"}
    assert not any(name.startswith("model-") for name in labelled_models)
    assert "other" in labelled_models


async def test_reconcile_survives_retries_and_never_double_counts(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store)
    data = request(max_tokens=100)
    await call(callback, data, auth("s2s"))
    window = await store.contract_window(3600)
    assert window is not None and window.in_flight["s2s"] > 100
    # A failed attempt gives the estimate back once; the retry's success records its usage once.
    failure: dict[str, Any] = {"litellm_params": {"metadata": data["metadata"]}, "exception": RuntimeError("x")}
    await callback.async_log_failure_event(failure, None, None, None)
    await callback.async_log_failure_event(failure, None, None, None)
    await callback.drain()
    await callback.async_log_success_event(success_kwargs(data, 77), None, None, None)
    await callback.async_log_success_event(success_kwargs(data, 77), None, None, None)
    await callback.drain()
    window = await store.contract_window(3600)
    assert window is not None
    assert window.in_flight["s2s"] == 0 and window.tokens["s2s"] == 77 and window.requests["s2s"] == 1


async def test_tpm_mode_uses_the_in_flight_estimates(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    contracts = {**EXAMPLE_CONTRACTS, "features": {"f": {"tpm": 250}}, "basket": {}}
    callback = make_callback(store, contracts)
    first, second = request(max_tokens=200), request(max_tokens=200)
    await call(callback, first, auth("f"))
    await call(callback, second, auth("f"))  # the first's ~200 tokens are still in flight
    assert first["metadata"]["traffic_contract_tpm_mode"] == "normal"
    assert second["metadata"]["traffic_contract_tpm_mode"] == "borrowed"
    await finish(callback, first, 10)
    await finish(callback, second, 10)
    third = request(max_tokens=200)
    await call(callback, third, auth("f"))
    assert third["metadata"]["traffic_contract_tpm_mode"] == "normal"


class _BrokenStore:
    backend = "broken"

    async def contract_admit(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("redis script 'contract_admit' failed: ConnectionError")

    async def contract_settle(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("redis script 'contract_settle' failed: ConnectionError")


async def test_store_fault_fails_open_with_unknown_modes() -> None:
    callback = make_callback(_BrokenStore())  # type: ignore[arg-type]
    errors = {"component": "traffic_contracts", "mode": "open"}
    before = sample("litellm_ratebalance_store_errors_total", errors)
    data = request()
    assert await call(callback, data, auth("ai")) is None
    headers = await headers_of(callback, data)
    assert headers == {
        "x-traffic-contract-feature": "smart-window",
        "x-traffic-contract-rpm-mode": "unknown",
        "x-traffic-contract-tpm-mode": "unknown",
    }
    assert sample("litellm_ratebalance_store_errors_total", errors) == before + 1


async def test_store_fault_fails_closed_with_503() -> None:
    callback = make_callback(_BrokenStore(), {**EXAMPLE_CONTRACTS, "fail_open": False})  # type: ignore[arg-type]
    errors = {"component": "traffic_contracts", "mode": "closed"}
    before = sample("litellm_ratebalance_store_errors_total", errors)
    refused = await call(callback, request(), auth("ai"))
    assert refused is not None and refused.status_code == 503
    assert sample("litellm_ratebalance_store_errors_total", errors) == before + 1


async def test_unexpected_errors_never_reach_the_client(store: MemoryStore | RedisStore) -> None:
    callback = make_callback(store)

    async def explode(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("bug")

    callback._runtime().store().contract_admit = explode  # type: ignore[method-assign]
    assert await call(callback, request(), auth("ai")) is None


def test_hooks_are_defined_on_the_class_itself() -> None:
    # The proxy calls these hooks only when the registered class defines them itself: it checks
    # ``"async_pre_call_hook" in vars(type(callback))``, so an inherited one would be skipped silently.
    own = vars(TrafficContractsCallback)
    for hook in ("async_pre_call_hook", "async_post_call_response_headers_hook", "async_log_success_event"):
        assert hook in own


def test_ready_instance_is_exported() -> None:
    import litellm_ratebalance

    assert isinstance(litellm_ratebalance.traffic_contracts, TrafficContractsCallback)


async def test_limits_without_tpm_skip_token_estimates(store: MemoryStore | RedisStore) -> None:
    await room_in_window(3600)
    callback = make_callback(store, {"window_seconds": 3600, "counter_ttl_seconds": 7200, "basket": {"rpm": 10}})
    data = request(max_tokens=500)
    await call(callback, data, auth())
    window = await store.contract_window(3600)
    assert window is not None and window.in_flight.get("unassigned", 0) == 0
    assert ContractLimits(basket_rpm=10).has_tpm is False
    assert data["metadata"]["traffic_contract_rpm_mode"] == Mode.NORMAL.label
