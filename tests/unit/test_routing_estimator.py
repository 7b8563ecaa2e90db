"""The pure estimator: rates, histogram percentile, probabilities, shares, penalties, header parsing."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from litellm_ratebalance.routing.estimator import (
    DeploymentState,
    compute_shares,
    effective_rate,
    failure_multiplier,
    headroom_multiplier,
    pooled_percentile,
    probability_above,
    reweigh,
    weigh,
)
from litellm_ratebalance.routing.records import (
    NUM_BINS,
    RATE_FLOOR,
    RateAggregate,
    RateLimitObservation,
    bin_bounds,
    bin_index,
    parse_reset_seconds,
)


def agg(rates: list[float], failures: int = 0) -> RateAggregate:
    out = RateAggregate()
    for rate in rates:
        out.add(rate, latency=1.0)
    for _ in range(failures):
        out.add(0.0, ok=False, latency=1.0)
    return out


def test_effective_rate_counts_input_tokens_at_the_ratio() -> None:
    assert effective_rate(100, 2500, 2.0, 250.0) == pytest.approx((100 + 10) / 2.0)
    # A zero latency is clamped instead of dividing by zero.
    assert effective_rate(1, 0, 0.0, 250.0) == pytest.approx(1000.0)


@given(st.floats(min_value=RATE_FLOOR, max_value=1e5, allow_nan=False))
def test_a_rate_lies_inside_its_bin(rate: float) -> None:
    index = bin_index(rate)
    lower, upper = bin_bounds(index)
    assert 1 <= index < NUM_BINS
    assert lower * (1 - 1e-9) <= rate < upper * (1 + 1e-9)


def test_failures_and_tiny_rates_fall_in_bin_zero() -> None:
    assert bin_index(0.0) == 0 and bin_index(RATE_FLOOR / 2) == 0 and bin_index(float("nan")) == 0
    a = agg([], failures=3)
    assert a.bins == {0: 3} and a.mean == 0.0 and a.failures == 3


def test_aggregates_merge_like_one_set_of_samples() -> None:
    left, right = agg([10.0, 20.0]), agg([30.0], failures=1)
    left.merge(right)
    assert left == agg([10.0, 20.0, 30.0], failures=1)
    assert left.mean == pytest.approx(15.0)
    assert left.std == pytest.approx(float(np.std([10.0, 20.0, 30.0, 0.0])))
    assert left.mean_ok_latency == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=5000.0), min_size=2, max_size=300), st.floats(0.0, 1.0))
def test_pooled_percentile_is_within_a_bin_of_numpy(rates: list[float], q: float) -> None:
    exact = float(np.percentile(rates, q * 100))
    ours = pooled_percentile([agg(rates)], q)
    # Between the bins that hold the order statistics around the rank: at most two bin widths apart.
    growth = bin_bounds(2)[1] / bin_bounds(2)[0]
    assert exact / growth**2 <= ours <= exact * growth**2


def test_pooled_percentile_of_zero_rate_samples_is_zero() -> None:
    assert pooled_percentile([agg([50.0], failures=9)], 0.5) == 0.0
    with pytest.raises(ValueError):
        pooled_percentile([RateAggregate()], 0.5)


def test_normal_probability_matches_scipy() -> None:
    rng = random.Random(3)
    rates = [rng.gauss(100, 15) for _ in range(500)]
    a = agg(rates)
    mu, sigma = float(np.mean(rates)), float(np.std(rates))
    for sla in (60.0, 100.0, 130.0):
        assert probability_above(a, sla, "normal") == pytest.approx(1 - stats.norm.cdf(sla, mu, sigma), abs=1e-9)


def test_normal_fit_of_a_deployment_that_fails_is_of_its_answers_times_their_share() -> None:
    rng = random.Random(5)
    answers = [rng.gauss(120, 10) for _ in range(300)]
    flaky = agg(answers, failures=100)  # fails a quarter of its requests
    mu, sigma = float(np.mean(answers)), float(np.std(answers))
    for sla in (60.0, 110.0, 130.0):
        expected = 0.75 * (1 - stats.norm.cdf(sla, mu, sigma))
        assert probability_above(flaky, sla, "normal") == pytest.approx(expected, abs=1e-9)
    # One normal through the zeros and the answers (mean 90, spread ~53) would rate it well below a reliable
    # 100 tok/s deployment at an SLA of 100; three quarters of answers at 120 beat it three times in four.
    reliable = agg([rng.gauss(100, 10) for _ in range(300)])
    assert probability_above(flaky, 100.0, "normal") > 0.7 > 0.55 > probability_above(reliable, 100.0, "normal")
    assert probability_above(agg([], failures=4), 0.0, "normal") == 0.0
    assert probability_above(agg([40.0] * 3, failures=1), 30.0, "normal") == pytest.approx(0.75)


def test_identical_samples_give_a_point_mass() -> None:
    a = agg([40.0] * 5)
    assert probability_above(a, 30.0, "normal") == 1.0
    assert probability_above(a, 50.0, "normal") == 0.0
    assert probability_above(a, 40.0, "normal") == 0.5
    assert probability_above(RateAggregate(), 1.0, "normal") == 0.0


def test_empirical_probability_is_the_share_above() -> None:
    a = agg([10.0] * 3 + [100.0] * 7)
    assert probability_above(a, 50.0, "empirical") == pytest.approx(0.7)
    assert probability_above(a, 0.0, "empirical") == pytest.approx(1.0)
    assert probability_above(agg([10.0], failures=1), 0.0, "empirical") == pytest.approx(0.5)


def states(*aggs: RateAggregate, **kw: Any) -> list[DeploymentState]:
    return [DeploymentState(a, **kw) for a in aggs]


def test_faster_deployment_gets_the_larger_share() -> None:
    rng = random.Random(1)
    fast = agg([rng.gauss(120, 10) for _ in range(50)])
    slow = agg([rng.gauss(80, 10) for _ in range(50)])
    shares = compute_shares(states(fast, slow), greediness=0.5)
    assert shares.mode == "weighted"
    assert shares.shares[0] > 0.9 and sum(shares.shares) == pytest.approx(1.0)
    assert 80 < (shares.sla or 0) < 120


def test_bootstrap_until_every_candidate_has_samples() -> None:
    shares = compute_shares(states(agg([100.0] * 10), RateAggregate()), greediness=0.5)
    assert shares.mode == "bootstrap" and shares.shares == (0.5, 0.5)


@pytest.mark.parametrize("kw", [{"greediness": 0.0}, {"greediness": 0.5, "round_robin": True}])
def test_round_robin_edges_are_exactly_uniform(kw: dict[str, object]) -> None:
    failing = agg([], failures=10)
    shares = compute_shares(states(agg([100.0] * 10), failing, agg([1.0])), failure_penalty=4.0, **kw)  # type: ignore[arg-type]
    assert shares.mode == "round_robin" and shares.shares == pytest.approx((1 / 3,) * 3)


def test_failure_penalty_and_exploration_floor() -> None:
    rng = random.Random(2)
    rates = [rng.gauss(100, 10) for _ in range(20)]
    good = DeploymentState(agg(rates), recent_attempts=10, recent_failures=0)
    failing = DeploymentState(agg(rates, failures=10), recent_attempts=10, recent_failures=10)
    shares = compute_shares([good, failing], greediness=0.5, failure_penalty=4.0, exploration_share=0.1)
    # The failing one keeps exactly its exploration share: 0.1 / 2.
    assert shares.shares[1] == pytest.approx(0.05)
    half = DeploymentState(agg(rates), recent_attempts=10, recent_failures=5)
    shares = compute_shares([good, half], greediness=0.5, failure_penalty=2.0)
    assert shares.shares[1] / shares.shares[0] == pytest.approx(0.25)


def test_everyone_failing_means_no_preference() -> None:
    s = [DeploymentState(agg([], failures=5), recent_attempts=5, recent_failures=5) for _ in range(3)]
    assert compute_shares(s, greediness=0.5, failure_penalty=4.0).shares == pytest.approx((1 / 3,) * 3)


def test_capacity_scales_after_exploration_and_all_exhausted_is_uniform() -> None:
    a = agg([100.0] * 10)
    shares = compute_shares(
        [DeploymentState(a, capacity=1.0), DeploymentState(a, capacity=0.0)], greediness=0.5, exploration_share=0.2
    )
    assert shares.shares == (1.0, 0.0)
    shares = compute_shares([DeploymentState(a, capacity=0.0)] * 2, greediness=0.5)
    assert shares.shares == (0.5, 0.5)


def test_multipliers() -> None:
    assert failure_multiplier(0, 0, 4.0) == 1.0
    assert failure_multiplier(1, 4, 2.0) == pytest.approx(0.5625)
    assert failure_multiplier(5, 5, 4.0) == 0.0
    assert failure_multiplier(5, 5, 0.0) == 1.0
    assert headroom_multiplier(None, 0.2) == 1.0
    assert headroom_multiplier(0.5, 0.2) == 1.0
    assert headroom_multiplier(0.05, 0.2) == pytest.approx(0.25)
    assert headroom_multiplier(0.0, 0.2) == 0.0
    assert headroom_multiplier(0.05, 0.0) == 1.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("12", 12.0), (1.5, 1.5), ("soon", None), ("-3", None)],
)
def test_reset_header_parsing(value: object, seconds: float | None) -> None:
    got = parse_reset_seconds(value)
    assert got == (None if seconds is None else pytest.approx(seconds))


def test_rate_limit_observation_fraction_and_age() -> None:
    obs = RateLimitObservation(remaining_requests=50, limit_requests=100, remaining_tokens=100, limit_tokens=1000)
    assert obs.fraction_left() == pytest.approx(0.1)
    assert RateLimitObservation(remaining_tokens=0).fraction_left() == 0.0
    assert RateLimitObservation(remaining_tokens=5).fraction_left() is None
    stamped = RateLimitObservation(remaining_tokens=0, reset_seconds=5.0, observed_ms=10_000)
    assert stamped.is_current(14_999, 60.0) and not stamped.is_current(15_000, 60.0)
    assert not RateLimitObservation(observed_ms=0).is_current(60_000, 60.0)
    assert math.isfinite(obs.fraction_left() or 0.0)


def test_prior_pulls_sparse_deployments_toward_the_typical_share() -> None:
    rng = random.Random(4)
    busy = agg([rng.gauss(100, 10) for _ in range(100)])
    quiet = agg([40.0])
    plain = compute_shares(states(busy, quiet), greediness=0.5)
    with_prior = compute_shares(states(busy, quiet), greediness=0.5, prior_samples=3.0)
    assert plain.probabilities[1] == 0.0
    # One sample plus 3 prior samples at the typical 0.5: (1 * 0 + 3 * 0.5) / 4.
    assert with_prior.probabilities[1] == pytest.approx(0.375)
    assert with_prior.probabilities[0] == pytest.approx((100 * plain.probabilities[0] + 1.5) / 103)
    assert with_prior.shares[1] > 0.2


@pytest.mark.parametrize("estimator", ["normal", "empirical"])
@pytest.mark.parametrize("seed", range(6))
def test_reweigh_equals_computing_the_shares_afresh(estimator: str, seed: int) -> None:
    # The balancer reuses the weights of candidates whose state did not change and reweighs the others:
    # the result must be what compute_shares gives for the new states at the same SLA.
    rng = random.Random(seed)
    options: dict[str, Any] = {"greediness": 0.6, "failure_penalty": 4.0, "prior_samples": 2.0}

    def random_state() -> DeploymentState:
        return DeploymentState(
            window=agg([rng.uniform(10, 200) for _ in range(rng.randint(1, 30))], failures=rng.randint(0, 3)),
            recent_attempts=10.0,
            recent_failures=float(rng.randint(0, 4)),
            capacity=rng.choice([1.0, 0.5, 0.0]),
            load_shift=rng.uniform(-30, 30),
        )

    before = [random_state() for _ in range(8)]
    base = compute_shares(before, estimator=estimator, exploration_share=0.05, **options)  # type: ignore[arg-type]
    assert base.mode == "weighted" and base.sla is not None
    after = list(before)
    changed = {}
    for i in rng.sample(range(8), 3):
        after[i] = random_state()
        changed[i] = weigh(after[i], base.sla, estimator=estimator, **options)  # type: ignore[arg-type]
    fresh = compute_shares(
        after,
        estimator=estimator,  # type: ignore[arg-type]
        exploration_share=0.05,
        sla=base.sla,
        **options,
    )
    again = reweigh(base, after, changed, exploration_share=0.05)
    assert again.shares == pytest.approx(fresh.shares, abs=1e-12)
    assert again.probabilities == pytest.approx(fresh.probabilities, abs=1e-12)
    assert again.weights == pytest.approx(fresh.weights, abs=1e-12)
    assert again.sla == fresh.sla and again.mode == "weighted"


def test_reweigh_refuses_shares_that_are_not_weighted() -> None:
    states = [DeploymentState(window=agg([50.0])), DeploymentState(window=RateAggregate())]
    bootstrap = compute_shares(states, greediness=0.5)
    assert bootstrap.mode == "bootstrap"
    with pytest.raises(ValueError, match="weighted mode"):
        reweigh(bootstrap, states, {0: (1.0, 1.0)})


def test_a_stale_candidate_gets_its_exploration_share_without_a_bootstrap() -> None:
    measured = DeploymentState(window=agg([50.0, 60.0]))
    stale = DeploymentState(window=RateAggregate(), stale=True)
    shares = compute_shares([measured, stale], greediness=0.5, exploration_share=0.1)
    assert shares.mode == "weighted"
    assert shares.shares == pytest.approx((0.95, 0.05))
    assert shares.exploit == pytest.approx((1.0, 0.0))
    # Nothing measured in the window at all: no estimate to weigh by, equal chances.
    all_stale = compute_shares([stale, stale], greediness=0.5, exploration_share=0.1)
    assert all_stale.mode == "bootstrap" and all_stale.shares == pytest.approx((0.5, 0.5))
    # A candidate never measured still holds the whole set in bootstrap.
    unknown = DeploymentState(window=RateAggregate())
    assert compute_shares([measured, stale, unknown], greediness=0.5).mode == "bootstrap"
