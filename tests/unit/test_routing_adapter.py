"""The LiteLLM-facing pieces without a Router: deployment dicts, logging payloads, the filter hook."""

from __future__ import annotations

from typing import Any

import pytest
from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance.proxy.routing import RateBalancedRouting, RateBalancerCallback
from litellm_ratebalance.proxy.routing.calls import deployment_candidates, finish_call, record_call
from litellm_ratebalance.proxy.runtime import get_runtime
from litellm_ratebalance.routing import Candidate
from litellm_ratebalance.routing.model_info import model_info_problems
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


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (8, 8.0),
        ("2", 2.0),
        (1, 1.0),
        (0.5, None),
        (0, None),
        (-3, None),
        ("x", None),
        (True, None),
        (float("nan"), None),
    ],
)
def test_candidates_read_configured_slots_and_ignore_values_below_one(value: object, expected: float | None) -> None:
    (got,) = deployment_candidates([deployment("a", model_info={"slots": value})]) or ()
    assert got.slots == expected


def test_model_info_problems_name_the_deployment_key_and_range() -> None:
    bad = [deployment("a", model_info={"slots": 0}), deployment("b", model_info={"input_to_output_ratio": "x"})]
    problems = model_info_problems([*bad, deployment("c", model_info={"slots": 4, "input_to_output_ratio": 100})])
    assert problems == [
        "deployment a (model_name g): model_info.slots=0 must be a number of at least 1 (ignored: the slots are"
        " learnt)",
        "deployment b (model_name g): model_info.input_to_output_ratio='x' must be a number greater than 0"
        " (ignored: the group's ratio is used)",
    ]
    # Where the model list is refused (the proxy's start-up, below), the message says no more than what is wrong.
    assert model_info_problems(bad, consequence=False) == [
        "deployment a (model_name g): model_info.slots=0 must be a number of at least 1",
        "deployment b (model_name g): model_info.input_to_output_ratio='x' must be a number greater than 0",
    ]


def test_sdk_install_refuses_a_model_list_with_bad_slots() -> None:
    class FakeRouter:
        model_list = [deployment("a", model_info={"slots": -2})]

    balancer, _ = make_balancer()
    expected = r"deployment a \(model_name g\): model_info\.slots=-2 must be a number of at least 1"
    with pytest.raises(ValueError, match=expected):
        RateBalancedRouting(FakeRouter(), balancer=balancer).install()


class _HealthyRouter:
    """Stands in for a ``litellm.Router``: what the strategy asks of it, two healthy deployments."""

    model_list = [deployment("a"), deployment("b")]

    def set_custom_routing_strategy(self, strategy: Any) -> None:
        # What LiteLLM's does: the strategy's methods replace the router's own, and nothing else.
        self.async_get_available_deployment = strategy.async_get_available_deployment

    async def async_get_healthy_deployments(self, **kwargs: Any) -> list[dict[str, Any]]:
        return list(self.model_list)


async def test_sdk_strategy_set_the_litellm_way_registers_its_recorder_at_its_first_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import litellm

    monkeypatch.setattr(litellm, "callbacks", [])
    router = _HealthyRouter()
    balancer, _ = make_balancer()
    strategy = RateBalancedRouting(router, balancer=balancer)
    assert strategy.recorder not in litellm.callbacks  # built, not yet used: no global side effect
    router.set_custom_routing_strategy(strategy)  # no install()
    for _ in range(3):
        pick = await router.async_get_available_deployment(model="g", request_kwargs={})
        assert pick["model_info"]["id"] in {"a", "b"}
    assert litellm.callbacks == [strategy.recorder]  # once, however many picks
    # Callback lists replaced (a config reload) or the recorder dropped: the next pick puts it back.
    litellm.callbacks = [other := CustomLogger()]
    await router.async_get_available_deployment(model="g", request_kwargs={})
    assert litellm.callbacks == [other, strategy.recorder]
    litellm.callbacks.remove(strategy.recorder)
    await router.async_get_available_deployment(model="g", request_kwargs={})
    assert litellm.callbacks == [other, strategy.recorder]
    strategy.uninstall()
    assert litellm.callbacks == [other]


async def test_two_sdk_strategies_in_one_process_each_register_their_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    monkeypatch.setattr(litellm, "callbacks", [])
    strategies = []
    for _ in range(2):
        router = _HealthyRouter()
        balancer, _ = make_balancer()
        strategy = RateBalancedRouting(router, balancer=balancer)
        router.set_custom_routing_strategy(strategy)
        await router.async_get_available_deployment(model="g", request_kwargs={})
        strategies.append(strategy)
    # LiteLLM's duplicate check (class name and public fields) must not take the second for the first.
    assert litellm.callbacks == [strategies[0].recorder, strategies[1].recorder]


async def test_sdk_strategy_warns_once_when_litellm_refuses_its_recorder(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import litellm
    from litellm.constants import MAX_CALLBACKS

    full: list[Any] = [CustomLogger() for _ in range(MAX_CALLBACKS)]
    monkeypatch.setattr(litellm, "callbacks", full)
    router = _HealthyRouter()
    balancer, _ = make_balancer()
    strategy = RateBalancedRouting(router, balancer=balancer)
    router.set_custom_routing_strategy(strategy)
    with caplog.at_level("WARNING", logger="litellm_ratebalance"):
        for _ in range(3):  # the picks still route
            pick = await router.async_get_available_deployment(model="g", request_kwargs={})
            assert pick["model_info"]["id"] in {"a", "b"}
    assert strategy.recorder not in litellm.callbacks
    assert caplog.text.count("did not add the rate balancer's recorder") == 1
    full.pop()  # room again: the next pick asks again, and is heard
    await router.async_get_available_deployment(model="g", request_kwargs={})
    assert full[-1] is strategy.recorder


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


def request_data(**overrides: Any) -> dict[str, Any]:
    """What LiteLLM passes ``async_post_call_success_deployment_hook`` (the call's kwargs), in part."""
    data: dict[str, Any] = {
        "model": "openai/a",
        "model_info": {"id": "a"},
        "metadata": {"model_group": "g"},
        "litellm_trace_id": "t1",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("overrides", "finished"),
    [
        ({}, True),
        ({"metadata": None, "litellm_metadata": {"model_group": "g"}}, True),  # the proxy's other routes
        ({"stream": True}, False),  # measured when it completes
        ({"litellm_trace_id": None}, False),
        ({"model_info": None}, False),
        ({"metadata": {}}, False),
    ],
)
def test_an_answer_back_ends_its_pick_in_flight(overrides: dict[str, Any], finished: bool) -> None:
    balancer, _ = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0, end_pick_on_answer=True)
    balancer.choose("g", (Candidate("a"), Candidate("b")), "t1")
    picked = next(d for d, queue in balancer._views["g"].in_flight.items() if queue)
    data = request_data(**overrides)
    if data.get("model_info"):
        data["model_info"] = {"id": picked}
    assert finish_call(balancer, data) is finished
    assert (not balancer._views["g"].in_flight[picked]) is finished


def test_an_answer_back_is_not_looked_at_with_end_pick_on_answer_off() -> None:
    balancer, _ = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0)
    balancer.choose("g", (Candidate("a"),), "t1")
    assert finish_call(balancer, request_data()) is False
    assert list(balancer._views["g"].in_flight["a"]) == ["t1"]


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


async def test_filter_passes_the_requests_size_to_the_balancer() -> None:
    balancer, _ = make_balancer(in_flight_evidence=True)
    for work in (20, 200, 60, 140, 100, 180):  # both: 0.1 s + 100 tok/s, whichever is picked
        for deployment_id in ("a", "b"):
            balancer.record("g", deployment_id, latency=0.1 + work / 100.0, output_tokens=work)
    callback = RateBalancerCallback(balancer=balancer)
    healthy = [deployment("a"), deployment("b")]
    messages = [{"role": "user", "content": "x" * 4000}]  # 1000 tokens: 4 work tokens at ratio 250
    for kwargs in ({"max_tokens": 46, "litellm_trace_id": "sized"}, {"litellm_trace_id": "unsized"}):
        await callback.async_filter_deployments("g", healthy, messages, request_kwargs=kwargs)
    entries = {key: entry for queue in balancer._views["g"].in_flight.values() for key, entry in queue.items()}
    assert entries["sized"][2] == pytest.approx(0.1 + 50 / 100.0)  # what a 50-token request takes there
    assert entries["unsized"][2] == 0.0  # no max_tokens: its size is unknown


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


async def test_filter_reads_each_list_of_the_same_dicts_like_the_first() -> None:
    # The Router builds a new list for every request, of the same dicts; a cooldown leaves a subset. The hook
    # remembers what it read of a set of dicts: every new list of them, and every subset, must still be
    # routed among exactly its own members.
    balancer, _ = make_balancer()
    callback = RateBalancerCallback(balancer=balancer)
    dicts = [deployment("a"), deployment("b"), deployment("c")]
    for _ in range(10):
        (pick,) = await callback.async_filter_deployments("g", list(dicts), None, request_kwargs={})
        assert pick in dicts
        (pick,) = await callback.async_filter_deployments("g", [dicts[2], dicts[0]], None, request_kwargs={})
        assert pick["model_info"]["id"] in {"a", "c"}
    ordered = [deployment("a", order=2), deployment("b", order=1)]
    for _ in range(5):
        (pick,) = await callback.async_filter_deployments("g", list(ordered), None, request_kwargs={})
        assert pick["model_info"]["id"] == "b"
    # A list the hook cannot route by is left to the Router, every time it comes again.
    no_id = [deployment("a"), {"model_name": "g", "litellm_params": {}}]
    not_mappings = [deployment("a"), "b"]
    for _ in range(2):
        assert await callback.async_filter_deployments("g", no_id, None, request_kwargs={}) == no_id
        assert await callback.async_filter_deployments("g", not_mappings, None, request_kwargs={}) == not_mappings


async def test_filter_errors_leave_the_routers_choice() -> None:
    class Broken:
        def choose(self, *args: object) -> int:
            raise RuntimeError("boom")

    callback = RateBalancerCallback(balancer=Broken())  # type: ignore[arg-type]
    healthy = [deployment("a"), deployment("b")]
    assert await callback.async_filter_deployments("g", healthy, None) == healthy


class _Gate:
    """Stands in for backpressure's deployment gate in the runtime's registry."""

    def __init__(self, refusing: set[str], *, gating: bool = True) -> None:
        self.refusing = refusing
        self.gating = gating
        self.asked: list[tuple[str, str | None]] = []

    def gates_deployments(self) -> bool:
        return self.gating

    def deployment_available(self, deployment_id: str, priority: str | None = None) -> bool:
        self.asked.append((deployment_id, priority))
        return deployment_id not in self.refusing


async def test_filter_skips_deployments_backpressure_would_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    balancer, _ = make_balancer()
    feed(balancer, "g", "a", [200.0] * 10)  # a is by far the best...
    feed(balancer, "g", "b", [50.0] * 10)
    feed(balancer, "g", "c", [40.0] * 10)
    gate = _Gate({"a"})  # ...but at its backpressure limit
    monkeypatch.setattr(get_runtime().registry, "deployment_gate", gate)
    callback = RateBalancerCallback(balancer=balancer)
    deployments = [deployment("a"), deployment("b"), deployment("c")]
    picks = {
        (await callback.async_filter_deployments("g", deployments, None, {}))[0]["model_info"]["id"] for _ in range(30)
    }
    assert picks <= {"b", "c"} and "b" in picks
    assert ("a", None) in gate.asked
    # Every candidate refusing: the list stays as it was (backpressure then answers with its own error).
    gate.refusing = {"a", "b", "c"}
    assert await callback.async_filter_deployments("g", deployments, None, {}) in ([d] for d in deployments)
    picked = {
        (await callback.async_filter_deployments("g", deployments, None, {}))[0]["model_info"]["id"] for _ in range(20)
    }
    assert "a" in picked  # the balancer's own choice among all of them again


async def test_filter_does_not_ask_backpressure_when_it_gates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    balancer, _ = make_balancer()
    feed(balancer, "g", "a", [200.0] * 10)
    feed(balancer, "g", "b", [50.0] * 10)
    gate = _Gate({"a"}, gating=False)  # would refuse a, but says it gates no deployment (off / none configured)
    monkeypatch.setattr(get_runtime().registry, "deployment_gate", gate)
    callback = RateBalancerCallback(balancer=balancer)
    picks = {
        (await callback.async_filter_deployments("g", [deployment("a"), deployment("b")], None, {}))[0]["model_info"][
            "id"
        ]
        for _ in range(30)
    }
    assert "a" in picks and gate.asked == []


async def test_filter_passes_the_callers_priority_to_backpressure(monkeypatch: pytest.MonkeyPatch) -> None:
    from litellm.proxy._types import UserAPIKeyAuth

    balancer, _ = make_balancer()
    gate = _Gate(set())
    monkeypatch.setattr(get_runtime().registry, "deployment_gate", gate)
    auth = UserAPIKeyAuth(api_key="sk-test", metadata={"priority": "batch"})
    kwargs = {"metadata": {"user_api_key_auth": auth}}
    await RateBalancerCallback(balancer=balancer).async_filter_deployments(
        "g", [deployment("a"), deployment("b")], None, kwargs
    )
    assert set(gate.asked) == {("a", "batch"), ("b", "batch")}


async def test_picks_and_weights_are_exported_as_metrics() -> None:
    from prometheus_client import REGISTRY

    balancer, _ = make_balancer()
    feed(balancer, "metrics-g", "a", [200.0, 210.0, 190.0])
    feed(balancer, "metrics-g", "b", [50.0, 55.0, 45.0])
    callback = RateBalancerCallback(balancer=balancer)
    deployments = [
        {"model_name": "metrics-g", "litellm_params": {"model": f"openai/{i}"}, "model_info": {"id": i}} for i in "ab"
    ]

    def value(name: str, deployment_id: str) -> float:
        got = REGISTRY.get_sample_value(name, {"model_group": "metrics-g", "deployment": deployment_id})
        return got if got is not None else 0.0

    before = value("litellm_ratebalance_routing_choices_total", "a") + value(
        "litellm_ratebalance_routing_choices_total", "b"
    )
    timed = {"component": "routing", "hook": "filter_deployments"}
    timed_before = REGISTRY.get_sample_value("litellm_ratebalance_hook_latency_seconds_count", timed) or 0.0
    for _ in range(5):
        await callback.async_filter_deployments("metrics-g", deployments, None, {})
    after = value("litellm_ratebalance_routing_choices_total", "a") + value(
        "litellm_ratebalance_routing_choices_total", "b"
    )
    assert after - before == 5
    assert REGISTRY.get_sample_value("litellm_ratebalance_hook_latency_seconds_count", timed) == timed_before + 5
    weights = balancer.weights("metrics-g", deployment_candidates(deployments))
    assert value("litellm_ratebalance_routing_weight", "a") == pytest.approx(weights["a"])
    assert value("litellm_ratebalance_routing_estimated_rate", "a") == pytest.approx(200.0)
    assert value("litellm_ratebalance_routing_estimated_rate", "b") == pytest.approx(50.0)
