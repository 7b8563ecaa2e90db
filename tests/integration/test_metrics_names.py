"""The limiter's and the contracts' Prometheus series, with their labels, after driving their real hooks.

The dashboard (litellm_ratebalance/dashboards/litellm-ratebalance.json) queries these names;
tests/unit/test_dashboard.py checks that each name it uses is one the package defines. Counts are compared as
deltas: the registry is global.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from prometheus_client import REGISTRY

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.store import MemoryStore
from tests.integration import contracts_support, limiter_support

P = "litellm_ratebalance_"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(P + name, labels) or 0.0


def label_sets(name: str) -> list[dict[str, str]]:
    """Label sets of every sample of the metric family ``name`` (without the prefix)."""
    for family in REGISTRY.collect():
        if family.name == P + name:
            return [dict(sample.labels) for sample in family.samples]
    return []


class FailingStore(MemoryStore):
    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("redis down (test)")


async def test_limiter_series_carry_model_priority_result_and_reason() -> None:
    model = "metrics-limiter"
    settings = {"priority_reservation": {"prod": 1.0}}  # strict at 1 of 2, but prod may use it all
    limiter = limiter_support.make_limiter(MemoryStore(), limiter_support.make_router(model, rpm=2), settings)
    decisions = "admission_decisions_total"
    before_admitted = value(decisions, model_group=model, priority="prod", result="admitted", reason="")
    before_rejected = value(
        decisions, model_group=model, priority="default", result="rejected", reason="model_requests"
    )
    latency = {
        hook: value("hook_latency_seconds_count", component="rate_limiter", hook=hook) for hook in _LIMITER_HOOKS
    }

    first = limiter_support.request(model)
    assert await limiter_support.call(limiter, first, limiter_support.auth("prod")) is None
    await limiter_support.finish(limiter, first, 20)
    second = limiter_support.request(model)
    assert await limiter_support.call(limiter, second, limiter_support.auth("prod")) is None
    await limiter.async_log_failure_event({"metadata": second["metadata"], "exception": RuntimeError()}, None, 0, 0)
    await limiter.async_post_call_failure_hook(second, RuntimeError(), limiter_support.auth("prod"))
    refused = await limiter_support.call(limiter, limiter_support.request(model), limiter_support.auth())
    assert isinstance(refused, HTTPException) and refused.status_code == 429

    assert value(decisions, model_group=model, priority="prod", result="admitted", reason="") == before_admitted + 2
    assert (
        value(decisions, model_group=model, priority="default", result="rejected", reason="model_requests")
        == before_rejected + 1
    )
    assert value("admission_saturation", model_group=model) == 1.0  # 2 of rpm 2 at the refused decision
    for hook in _LIMITER_HOOKS:
        assert value("hook_latency_seconds_count", component="rate_limiter", hook=hook) >= latency[hook] + 1, hook
    assert {"component", "hook", "le"} <= set(label_sets("hook_latency_seconds")[0])


_LIMITER_HOOKS = ("pre_call", "log_success", "log_failure", "post_call_failure")


async def test_store_errors_are_counted_by_component_mode_and_cause() -> None:
    model = "metrics-store-error"
    limiter = limiter_support.make_limiter(FailingStore(), limiter_support.make_router(model, rpm=2))
    before = value("store_errors_total", component="rate_limiter", mode="open", cause="error")
    admitted = value(
        "admission_decisions_total", model_group=model, priority="default", result="admitted", reason="store_error"
    )
    assert await limiter_support.call(limiter, limiter_support.request(model), limiter_support.auth()) is None
    assert value("store_errors_total", component="rate_limiter", mode="open", cause="error") == before + 1
    assert (
        value(
            "admission_decisions_total", model_group=model, priority="default", result="admitted", reason="store_error"
        )
        == admitted + 1
    )


async def test_contract_series_carry_feature_modes_actions_usage_and_limits() -> None:
    contracts = {
        "window_seconds": 3600,
        "counter_ttl_seconds": 7200,
        "basket": {"rpm": 3},
        # A feature name of contracts_support.EXAMPLE_CONTRACTS: test_contracts_hooks checks that the shared
        # registry holds no other feature label.
        "features": {"s2s-android": {"rpm": 1, "tpm": 5000}},
        "enforcement": {"degraded": "reject"},
    }
    callback = contracts_support.make_callback(MemoryStore(), contracts)
    feature = "s2s-android"
    requests = "traffic_contract_requests_total"
    normal = value(requests, feature=feature, model_group="m", rpm_mode="normal", tpm_mode="normal")
    borrowed = value(requests, feature=feature, model_group="m", rpm_mode="borrowed", tpm_mode="normal")
    rejects = value("traffic_contract_actions_total", feature=feature, action="reject")
    latency = {
        hook: value("hook_latency_seconds_count", component="traffic_contracts", hook=hook)
        for hook in ("pre_call", "log_success", "log_failure", "post_call_failure")
    }

    outcomes = []
    for _ in range(4):
        data = contracts_support.request()
        outcomes.append(await contracts_support.call(callback, data, contracts_support.auth(feature)))
        if outcomes[-1] is None:
            await contracts_support.finish(callback, data, 30)
    failed = contracts_support.request()
    await callback.async_log_failure_event({"metadata": failed.get("metadata", {})}, None, 0, 0)
    await callback.async_post_call_failure_hook(failed, RuntimeError(), contracts_support.auth(feature))

    assert [o is None for o in outcomes] == [True, True, True, False]  # the 4th is degraded: rejected
    assert value(requests, feature=feature, model_group="m", rpm_mode="normal", tpm_mode="normal") == normal + 1
    assert value(requests, feature=feature, model_group="m", rpm_mode="borrowed", tpm_mode="normal") == borrowed + 2
    assert value(requests, feature=feature, model_group="m", rpm_mode="degraded", tpm_mode="normal") >= 1
    assert value("traffic_contract_actions_total", feature=feature, action="reject") == rejects + 1
    assert value("traffic_contract_usage", feature=feature, kind="rpm") == 3
    assert value("traffic_contract_usage", feature=feature, kind="tpm") == 90
    assert value("traffic_contract_usage", feature="__basket__", kind="rpm") == 3
    assert value("traffic_contract_limit", feature=feature, kind="rpm") == 1
    assert value("traffic_contract_limit", feature="__basket__", kind="rpm") == 3
    for hook, before in latency.items():
        assert value("hook_latency_seconds_count", component="traffic_contracts", hook=hook) >= before + 1, hook
