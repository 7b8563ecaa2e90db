"""Scenarios, the oracle and the load driver's measures (pure parts, plus one child-process cluster)."""

from __future__ import annotations

import itertools
import math

import httpx
import pytest

from litellm_ratebalance.simulate import Behaviour, DeploymentSpec, MockClusterProcess
from litellm_ratebalance.simulate.load import RequestResult, effective_rate, percentile, summarise
from litellm_ratebalance.simulate.oracle import MOCK_NAME_KEY, OracleRouting, expected_effective_rate
from litellm_ratebalance.simulate.scenarios import SCENARIOS, build_scenario


def test_every_scenario_builds_and_plans_reproducibly() -> None:
    for name in SCENARIOS:
        scenario = build_scenario(name, duration=3.0, seed=5)
        plan = scenario.plan()
        assert plan == build_scenario(name, duration=3.0, seed=5).plan()
        assert plan != build_scenario(name, duration=3.0, seed=6).plan()
        assert plan and all(0 <= r.at < 3.0 for r in plan)
        assert [r.at for r in plan] == sorted(r.at for r in plan)
        assert len({s.name for s in scenario.deployments}) == len(scenario.deployments)


def test_drift_swaps_the_rates_at_forty_percent() -> None:
    scenario = build_scenario("drift", duration=10.0)
    before = {s.name: s.behaviour_at(3.9).token_rate for s in scenario.deployments}
    after = {s.name: s.behaviour_at(4.0).token_rate for s in scenario.deployments}
    assert before == {"a": 150.0, "b": 90.0, "c": 60.0, "d": 30.0}
    assert after == {"a": 30.0, "b": 60.0, "c": 90.0, "d": 150.0}


def test_flaky_has_bursts_a_budget_errors_and_a_stall_window() -> None:
    scenario = build_scenario("flaky", duration=9.0)
    a, b, c, _ = scenario.deployments
    assert any(a.behaviour_at(t / 10).rate_limited for t in range(90))
    assert a.behaviour.tpm is not None
    assert b.behaviour.error_rate > 0
    assert c.behaviour_at(4.5).stall_rate == 1.0 and c.behaviour_at(8.0).stall_rate < 1.0


def test_planned_messages_count_as_the_planned_prompt_tokens() -> None:
    from litellm_ratebalance.simulate.mock_openai import estimate_prompt_tokens

    for request in build_scenario("stable-heterogeneous", duration=2.0).plan()[:5]:
        assert estimate_prompt_tokens(request.messages()) == request.prompt_tokens


def test_expected_effective_rate() -> None:
    fast = Behaviour(token_rate=100.0, base_latency=0.0, prefill_rate=1e9, capacity=2)
    assert expected_effective_rate(fast, 0.0, 0, 0, 50, 250.0) == pytest.approx(100.0, rel=1e-6)
    # two already there: a third shares two slots, two thirds of the speed
    assert expected_effective_rate(fast, 0.0, 2, 0, 50, 250.0) == pytest.approx(200.0 / 3, rel=1e-6)
    assert expected_effective_rate(fast, 0.0, 0, 0, 50, 250.0, budget_left=False) == 0.0
    failing = Behaviour(token_rate=100.0, base_latency=0.0, prefill_rate=1e9, error_rate=0.5)
    assert expected_effective_rate(failing, 0.0, 0, 0, 50, 250.0) == pytest.approx(50.0, rel=1e-6)
    assert expected_effective_rate(Behaviour(rate_limited=True), 0.0, 0, 0, 50, 250.0) == 0.0


class _Router:
    def __init__(self, names: list[str]) -> None:
        self.model_list = [{"model_name": "g", "model_info": {"id": n, MOCK_NAME_KEY: n}} for n in names]


async def test_oracle_picks_the_fastest_until_its_capacity_is_shared_and_tracks_in_flight() -> None:
    specs = {
        "slow": DeploymentSpec("slow", Behaviour(token_rate=60.0, base_latency=0.0, capacity=8)),
        "fast": DeploymentSpec("fast", Behaviour(token_rate=100.0, base_latency=0.0, capacity=1)),
    }
    oracle = OracleRouting(_Router(["slow", "fast"]), specs, epoch=0.0, clock=lambda: 1.0)
    messages = [{"role": "user", "content": "hi"}]
    first = await oracle.async_get_available_deployment(
        "g", messages, request_kwargs={"max_tokens": 50, "metadata": {"bench_request_id": "1"}}
    )
    second = await oracle.async_get_available_deployment(
        "g", messages, request_kwargs={"max_tokens": 50, "metadata": {"bench_request_id": "2"}}
    )
    assert first["model_info"]["id"] == "fast"
    assert second["model_info"]["id"] == "slow"  # fast shared by two would run at 50 < 60
    assert oracle.in_flight() == {"slow": 1, "fast": 1}
    oracle.finished("1")
    assert oracle.in_flight() == {"slow": 1, "fast": 0}


async def test_oracle_avoids_a_rate_limited_deployment() -> None:
    specs = {
        "limited": DeploymentSpec("limited", Behaviour(token_rate=500.0, rate_limited=True)),
        "ok": DeploymentSpec("ok", Behaviour(token_rate=10.0)),
    }
    oracle = OracleRouting(_Router(["limited", "ok"]), specs, epoch=0.0, clock=lambda: 0.0)
    chosen = await oracle.async_get_available_deployment("g", [{"role": "user", "content": "x"}], request_kwargs={})
    assert chosen["model_info"]["id"] == "ok"


async def test_a_lagged_oracle_sees_a_change_only_after_its_lag() -> None:
    """Drift swaps the rates at 40 % of the run: at 4.5 s of a 10 s run the oracle sends to the new fastest, one
    lagging by 1 s still to the old one, and by 5 s both see the swap."""
    scenario = build_scenario("drift", duration=10.0)
    specs = {spec.name: spec for spec in scenario.deployments}
    now = [4.5]
    oracle = OracleRouting(_Router(list(specs)), specs, epoch=0.0, clock=lambda: now[0])
    lagged = OracleRouting(_Router(list(specs)), specs, epoch=0.0, clock=lambda: now[0], lag_seconds=1.0)
    messages = [{"role": "user", "content": "x"}]

    async def pick(strategy: OracleRouting) -> str:
        chosen = await strategy.async_get_available_deployment("g", messages, request_kwargs={"max_tokens": 50})
        return str(chosen["model_info"]["id"])

    assert (await pick(oracle), await pick(lagged)) == ("d", "a")
    now[0] = 5.0
    assert (await pick(oracle), await pick(lagged)) == ("d", "d")
    with pytest.raises(ValueError, match="lag_seconds"):
        OracleRouting(_Router(list(specs)), specs, epoch=0.0, lag_seconds=-1.0)


def _result(index: int, latency: float, ok: bool, completion: int = 50, prompt: int = 500) -> RequestResult:
    return RequestResult(
        index, float(index), latency, ok, False, prompt, completion if ok else 0, None, None, None if ok else "APIError"
    )


def test_summary_counts_failures_as_zero_rate() -> None:
    results = [_result(0, 1.0, True), _result(1, 0.5, True), _result(2, 0.1, False)]
    assert effective_rate(results[0], 250.0) == pytest.approx(52.0)
    summary = summarise(results, 250.0)
    assert summary.mean_rate == pytest.approx((52.0 + 104.0 + 0.0) / 3)
    assert summary.errors == 1 and summary.error_kinds == {"APIError": 1}
    assert summary.p50_latency == pytest.approx(0.75)
    assert summary.goodput == pytest.approx(100 / 2.1)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 5) == pytest.approx(1.2)
    assert math.isnan(percentile([], 50))


def test_summary_p95_of_every_request_counts_the_wait_for_a_failure() -> None:
    # Nine quick answers and a timeout: the successful requests' p95 never sees the 4 s wait, the p95 of
    # every request does; fast failures pull it down instead.
    quick = [_result(i, 0.5 + 0.01 * i, True) for i in range(9)]
    summary = summarise([*quick, _result(9, 4.0, False)], 250.0)
    assert summary.p95_latency == pytest.approx(0.576)  # between 0.57 and 0.58
    assert summary.p95_latency_all == pytest.approx(percentile([r.latency for r in quick] + [4.0], 95))
    assert summary.p95_latency_all > 2.0
    fast_failures = summarise([*quick, *(_result(10 + i, 0.05, False) for i in range(5))], 250.0)
    assert fast_failures.p95_latency_all < fast_failures.p95_latency


async def test_cluster_in_a_child_process_serves_resets_and_updates() -> None:
    specs = [DeploymentSpec("a", Behaviour(token_rate=4000.0, base_latency=0.0))]
    async with MockClusterProcess(specs) as cluster, httpx.AsyncClient() as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        url = cluster.api_bases["a"] + "/chat/completions"
        assert (await client.post(url, json=body, headers={"x-bench-request-id": "7"})).status_code == 200
        assert [(r.request_id, r.status) for r in await cluster.served()] == [("7", 200)]
        await cluster.update("a", rate_limited=True)
        assert (await client.post(url, json=body)).status_code == 429
        await cluster.reset()
        assert await cluster.served() == []
        assert (await client.post(url, json=body)).status_code == 200
        with pytest.raises(ValueError, match="unknown Behaviour fields"):
            await cluster.update("a", bogus=True)


def test_plans_mix_exact_uncapped_and_loose_requests() -> None:
    from litellm_ratebalance.simulate.mock_openai import answer_length

    for name in SCENARIOS:
        plan = build_scenario(name, duration=30.0, seed=3).plan()
        kinds = {kind: [r for r in plan if r.kind == kind] for kind in ("exact", "uncapped", "loose")}
        assert all(kinds.values()), name
        assert all(r.max_tokens is None for r in kinds["uncapped"])
        assert all(r.max_tokens is not None and r.max_tokens >= 1024 for r in kinds["loose"])
        assert all(r.max_tokens == r.answer_tokens for r in kinds["exact"])
        # the mock writes the planned answer, whatever max_tokens says
        assert all(answer_length(r.messages(), r.max_tokens, 64)[0] == r.output_tokens == r.answer_tokens for r in plan)


def test_mixed_slots_has_few_slots_on_the_fastest_and_very_mixed_sizes() -> None:
    scenario = build_scenario("mixed-slots", duration=30.0, seed=2)
    capacities = [s.behaviour.capacity for s in scenario.deployments]
    rates = [s.behaviour.token_rate for s in scenario.deployments]
    assert capacities == sorted(capacities) and rates == sorted(rates, reverse=True)
    answers = sorted(r.answer_tokens for r in scenario.plan())
    assert answers[len(answers) // 2] < 100 < answers[-1]  # log-uniform: mostly short, some long
    assert scenario.workload.timeout > 400 / min(rates)  # the longest answer fits even on the slowest


def test_degrading_slows_one_deployment_step_by_step_without_failing() -> None:
    scenario = build_scenario("degrading", duration=20.0)
    a = scenario.spec("a")
    rates = [a.behaviour_at(t / 2).token_rate for t in range(41)]
    assert rates[0] == 160.0 and rates[-1] == 35.0
    assert all(later <= earlier for earlier, later in itertools.pairwise(rates))
    assert all(b == 0 for b in (a.behaviour_at(t).error_rate + a.behaviour_at(t).stall_rate for t in range(20)))
    others = [s.behaviour_at(19.0).token_rate for s in scenario.deployments if s.name != "a"]
    assert rates[0] > max(others) > rates[-1]


def test_fluctuating_rates_swing_so_the_fastest_deployment_changes() -> None:
    for seed in (1, 2, 3):
        scenario = build_scenario("fluctuating", duration=12.0, seed=seed)
        leaders = []
        for step in range(121):
            at = step / 10
            rates = {s.name: s.behaviour_at(at).rate_at(at) for s in scenario.deployments}
            assert all(0.5 * s.behaviour.token_rate - 1e-9 <= rates[s.name] for s in scenario.deployments)
            leaders.append(max(rates, key=lambda name: rates[name]))
        changes = sum(a != b for a, b in itertools.pairwise(leaders))
        assert changes >= 2, (seed, changes)
    periods = {s.behaviour.wave_period for s in build_scenario("fluctuating", duration=12.0, seed=1).deployments}
    assert all(6.0 <= p <= 12.0 for p in periods) and len(periods) == 4
