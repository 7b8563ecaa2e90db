"""The LiteLLM-facing pieces without a Router: deployment dicts, logging payloads, the filter hook."""

from __future__ import annotations

from typing import Any

import pytest

from litellm_ratebalance.proxy.routing import RateBalancerCallback, deployment_candidates, record_call
from litellm_ratebalance.routing import Candidate
from tests.unit.routing_support import feed, make_balancer


def deployment(i: str, **params: Any) -> dict[str, Any]:
    info = params.pop("model_info", {})
    return {"model_name": "g", "litellm_params": {"model": f"openai/{i}", **params}, "model_info": {"id": i, **info}}


def payload(model_id: str | None = "a", **overrides: Any) -> dict[str, Any]:
    slo: dict[str, Any] = {
        "model_id": model_id,
        "model_group": "g",
        "prompt_tokens": 500,
        "completion_tokens": 98,
        "startTime": 100.0,
        "endTime": 102.0,
        "completionStartTime": 100.4,
        "stream": False,
        "cache_hit": None,
        "error_information": None,
        "hidden_params": {"additional_headers": {}},
    }
    slo.update(overrides)
    return {"standard_logging_object": slo, "litellm_params": {"model_info": {"id": model_id}}}


def test_candidates_read_ratio_and_limits() -> None:
    got = deployment_candidates(
        [
            deployment("a", tpm=1000, model_info={"input_to_output_ratio": 100}),
            deployment("b", rpm="60"),
            {"model_name": "g", "litellm_params": {}, "model_info": {"id": "c"}, "tpm": 5},
        ]
    )
    assert got == (Candidate("a", 100.0, 1000.0, None), Candidate("b", None, None, 60.0), Candidate("c", None, 5.0))
    assert deployment_candidates([{"litellm_params": {}}]) is None


async def test_success_payload_becomes_a_sample_with_headers() -> None:
    balancer, _ = make_balancer()
    headers = {
        "x_ratelimit_remaining_tokens": 100,
        "x_ratelimit_limit_tokens": 10_000,
        "x_ratelimit_reset_tokens": "6m0s",
    }
    kwargs = payload(stream=True, hidden_params={"additional_headers": headers})
    assert record_call(balancer, kwargs, ok=True)
    await balancer.refresh("g")
    estimate = balancer.estimates("g", (Candidate("a"),))["a"]
    assert estimate.mean_rate == pytest.approx((98 + 500 / 250) / 2.0)
    assert estimate.mean_ttft == pytest.approx(0.4)
    assert estimate.capacity == pytest.approx(0.01 / 0.2)


@pytest.mark.parametrize(
    ("overrides", "counted"),
    [
        ({"error_information": {"error_code": "429"}}, True),
        ({"error_information": {"error_code": "500"}}, True),
        ({"error_information": {"error_code": "400"}}, False),
        ({"error_information": {"error_code": "422"}}, False),
        ({"error_information": None}, True),
    ],
)
async def test_failures_count_unless_the_request_was_at_fault(overrides: dict[str, Any], counted: bool) -> None:
    balancer, _ = make_balancer()
    assert record_call(balancer, payload(**overrides), ok=False) is counted
    await balancer.refresh("g")
    estimate = balancer.estimates("g", (Candidate("a"),))["a"]
    assert estimate.failures == (1 if counted else 0)
    if counted:
        assert estimate.mean_rate == 0.0


def test_calls_without_a_deployment_or_from_cache_are_not_samples() -> None:
    balancer, _ = make_balancer()
    assert not record_call(balancer, payload(model_id=None), ok=False)
    assert not record_call(balancer, payload(cache_hit=True), ok=True)
    assert not record_call(balancer, {}, ok=True)


async def test_filter_narrows_to_one_weighted_pick() -> None:
    balancer, _ = make_balancer()
    feed(balancer, "g", "a", [100.0 + i for i in range(20)])
    feed(balancer, "g", "b", [10.0 + i for i in range(20)])
    await balancer.refresh("g")
    callback = RateBalancerCallback(balancer=balancer)
    healthy = [deployment("a"), deployment("b")]
    picks = [
        await callback.async_filter_deployments("g", healthy, [{"role": "user", "content": "hi"}]) for _ in range(50)
    ]
    assert all(len(p) == 1 for p in picks)
    assert sum(p[0]["model_info"]["id"] == "a" for p in picks) >= 45


async def test_filter_keeps_fanout_lookups_and_single_deployments() -> None:
    balancer, _ = make_balancer()
    callback = RateBalancerCallback(balancer=balancer)
    healthy = [deployment("a"), deployment("b")]
    fanout = [{"role": "user", "content": "files-api-fake-text"}]
    assert await callback.async_filter_deployments("g", healthy, fanout) == healthy
    assert await callback.async_filter_deployments("g", healthy[:1], None) == healthy[:1]


async def test_filter_picks_inside_the_order_group_the_router_keeps() -> None:
    balancer, _ = make_balancer()
    callback = RateBalancerCallback(balancer=balancer)
    healthy = [deployment("a", order=2), deployment("b", order=1), deployment("c", order=1)]
    for _ in range(20):
        (pick,) = await callback.async_filter_deployments("g", healthy, None, request_kwargs={})
        assert pick["model_info"]["id"] in {"b", "c"}
    for _ in range(5):
        (pick,) = await callback.async_filter_deployments("g", healthy, None, request_kwargs={"_target_order": 2})
        assert pick["model_info"]["id"] == "a"
    kwargs = {"_excluded_deployment_ids": ["b"]}
    for _ in range(5):
        (pick,) = await callback.async_filter_deployments("g", healthy, None, request_kwargs=kwargs)
        assert pick["model_info"]["id"] == "c"
    assert kwargs == {"_excluded_deployment_ids": ["b"]}  # read, not consumed


async def test_filter_errors_leave_the_routers_choice() -> None:
    class Broken:
        def choose(self, *args: object) -> int:
            raise RuntimeError("boom")

    callback = RateBalancerCallback(balancer=Broken())  # type: ignore[arg-type]
    healthy = [deployment("a"), deployment("b")]
    assert await callback.async_filter_deployments("g", healthy, None) == healthy
