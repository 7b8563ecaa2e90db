"""RateBalancer over the embedded store with an explicit clock: weights, edges, expiry, penalties, sync."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.routing import Candidate, RateBalancer, RateLimitObservation
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_support import Clock, candidates, feed, make_balancer, settings

G = "group"
AB = candidates("a", "b")


def noisy(mean: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [max(1.0, rng.gauss(mean, mean * 0.1)) for _ in range(n)]


async def test_before_any_sample_choice_is_uniform_bootstrap() -> None:
    balancer, _ = make_balancer()
    assert balancer.weights(G, AB) == {"a": 0.5, "b": 0.5}
    assert {e.mode for e in balancer.estimates(G, AB).values()} == {"bootstrap"}


async def test_weights_follow_the_rates_after_a_sync() -> None:
    balancer, _ = make_balancer()
    feed(balancer, G, "a", noisy(120, 30, 1))
    feed(balancer, G, "b", noisy(60, 30, 2))
    # This replica's own samples count at once; the sync makes them shared and changes nothing here.
    before = balancer.weights(G, AB)
    assert before["a"] > 0.95
    await balancer.refresh(G)
    weights = balancer.weights(G, AB)
    assert weights == pytest.approx(before)
    other = RateBalancer(balancer._store, settings(), clock=balancer._clock)  # another replica, same store
    assert other.weights(G, AB) == {"a": 0.5, "b": 0.5}  # nothing seen before its first sync
    await other.refresh(G)
    assert other.weights(G, AB) == pytest.approx(weights)
    estimates = balancer.estimates(G, AB)
    assert estimates["a"].samples == 30 and estimates["a"].mode == "weighted"
    assert estimates["a"].mean_rate == pytest.approx(120, rel=0.1)
    assert estimates["b"].probability is not None and estimates["b"].probability < 0.05


async def test_bootstrap_while_one_candidate_has_no_sample() -> None:
    balancer, _ = make_balancer()
    feed(balancer, G, "a", noisy(120, 30))
    await balancer.refresh(G)
    assert balancer.weights(G, candidates("a", "b", "c")) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    # The candidate set is what counts: a and b alone are weighted once b has samples.
    feed(balancer, G, "b", noisy(60, 5))
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["a"] > 0.9


@pytest.mark.parametrize("overrides", [{"window_seconds": 0}, {"greediness": 0.0}])
async def test_round_robin_edges(overrides: dict[str, Any]) -> None:
    with pytest.warns(UserWarning) if overrides.get("greediness") == 0.0 else _no_warning():
        balancer, _ = make_balancer(**overrides)
    feed(balancer, G, "a", noisy(120, 30))
    feed(balancer, G, "b", noisy(10, 30))
    await balancer.refresh(G)
    assert balancer.weights(G, AB) == {"a": 0.5, "b": 0.5}
    picks = Counter(balancer.choose(G, AB) for _ in range(2000))
    assert 900 < picks[0] < 1100


class _no_warning:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_window_expiry() -> None:
    balancer, clock = make_balancer(window_seconds=60, bucket_seconds=1)
    feed(balancer, G, "a", noisy(120, 10))
    feed(balancer, G, "b", noisy(60, 10))
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].samples == 10
    # A sample leaves the window between window and window + bucket seconds after it was stored.
    clock.advance(60.5)
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].samples == 10
    clock.advance(0.6)
    feed(balancer, G, "b", noisy(60, 3))
    await balancer.refresh(G)
    estimates = balancer.estimates(G, AB)
    assert estimates["a"].samples == 0 and estimates["b"].samples == 3
    # (no exploration in these settings, so a cannot count as stale: see the next test)
    assert estimates["a"].mode == "bootstrap"


async def test_a_stale_deployment_keeps_only_its_exploration_share() -> None:
    """A deployment whose samples aged out of the window gets the exploration share (the issue's 'a
    deployment without recent samples keeps a small exploration share'), where the whole candidate set
    used to go back to equal chances (bootstrap) and send it 1/n of the traffic."""
    balancer, clock = make_balancer(window_seconds=10, bucket_seconds=1, exploration_share=0.1)
    abc = candidates("a", "b", "c")
    for name, rate in (("a", 120.0), ("b", 60.0), ("c", 30.0)):
        feed(balancer, G, name, noisy(rate, 10))
    await balancer.refresh(G)
    clock.advance(12)  # every sample is out of the window
    feed(balancer, G, "a", noisy(120, 5, 1))
    feed(balancer, G, "b", noisy(60, 5, 2))
    await balancer.refresh(G)
    estimates = balancer.estimates(G, abc)
    assert estimates["c"].samples == 0 and {e.mode for e in estimates.values()} == {"weighted"}
    assert balancer.weights(G, abc)["c"] == pytest.approx(0.1 / 3)
    # A candidate never measured still starts the bootstrap: equal chances until it has answered once.
    abcd = candidates("a", "b", "c", "d")
    assert balancer.weights(G, abcd) == pytest.approx(dict.fromkeys("abcd", 0.25))
    # Another replica learns from the shared store that c was measured within the last minute.
    other_settings = settings(window_seconds=10, bucket_seconds=1, exploration_share=0.1)
    other = RateBalancer(balancer._store, other_settings, clock=clock)
    await other.refresh(G)
    assert other.weights(G, abc)["c"] == pytest.approx(0.1 / 3)
    # Without exploration nothing would ever measure c again: it starts the bootstrap, as in the proposal.
    unexplored = RateBalancer(balancer._store, settings(window_seconds=10, bucket_seconds=1), clock=clock)
    await unexplored.refresh(G)
    assert unexplored.weights(G, abc) == pytest.approx(dict.fromkeys("abc", 1 / 3))


async def test_a_failing_deployment_loses_its_share_at_the_next_sync() -> None:
    balancer, clock = make_balancer(exploration_share=0.05)
    feed(balancer, G, "a", noisy(100, 40, 1))
    feed(balancer, G, "b", noisy(100, 40, 2))
    await balancer.refresh(G)
    before = balancer.weights(G, AB)["b"]
    assert 0.3 < before < 0.7
    # The good samples leave the 10 s failure window (2 s buckets: after 10 to 12 s), not the 120 s window.
    clock.advance(12)
    for _ in range(5):
        balancer.record(G, "b", latency=0.05, ok=False)
    feed(balancer, G, "a", noisy(100, 5, 3))
    await balancer.refresh(G)
    after = balancer.weights(G, AB)["b"]
    assert after == pytest.approx(0.025, abs=1e-9)  # only its exploration share is left
    estimates = balancer.estimates(G, AB)
    assert estimates["b"].recent_failures == 5 and estimates["b"].failures == 5


async def test_failure_penalty_is_graded_by_the_recent_failure_share() -> None:
    balancer, _ = make_balancer(failure_penalty=2.0)
    rates = noisy(100, 30)
    feed(balancer, G, "a", rates)
    feed(balancer, G, "b", rates[:20])
    for rate in rates[20:]:
        # Failures between successes: a failure share, not a streak (see the next test).
        balancer.record(G, "b", latency=1.0, ok=False)
        feed(balancer, G, "b", [rate])
        balancer.record(G, "a", latency=1.0, output_tokens=100)
    await balancer.refresh(G)
    estimates = balancer.estimates(G, AB)
    assert estimates["b"].recent_attempts == 40 and estimates["b"].recent_failures == 10
    weights = balancer.weights(G, AB)
    assert weights["b"] < weights["a"] * 0.75**2 * 1.01


async def test_failures_in_a_row_take_a_deployment_out_until_it_answers_again() -> None:
    """Four failures in a row at b, after 30 successes: its failure share is only 4/34, but it is failing as
    a whole. Its weight is 0 until it answers again, and it gets a re-measuring request once per failure
    half-life meanwhile (exploration is off here, so only that request can reach it)."""
    balancer, clock = make_balancer(failure_penalty=1.0, failure_half_life_seconds=2.0)
    rates = noisy(100, 30)
    feed(balancer, G, "a", rates)
    feed(balancer, G, "b", rates)
    only_b = (Candidate("b"),)

    def fail_at_b() -> None:
        balancer.choose(G, only_b)  # (a pick of b, so its last attempt is now)
        balancer.record(G, "b", latency=0.05, ok=False)

    def twenty_picks() -> list[str]:
        picks = [AB[balancer.choose(G, AB)].id for _ in range(20)]
        for pick in picks:
            balancer.release(G, pick)
        return picks

    for _ in range(3):
        fail_at_b()
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["b"] > 0.3  # three in a row: graded by its failure share
    fail_at_b()
    assert balancer.weights(G, AB)["b"] == 0.0  # at once, without a sync
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["b"] == 0.0
    assert balancer.estimates(G, AB)["b"].recent_failures == pytest.approx(4.0)  # the store holds 4 of 34
    assert "b" not in twenty_picks()
    clock.advance(2.0)
    assert twenty_picks().count("b") == 1  # the re-measuring request, one failure half-life later
    clock.advance(1.0)
    assert "b" not in twenty_picks()  # not due again yet
    feed(balancer, G, "b", [100.0])  # it answers
    assert balancer.weights(G, AB)["b"] > 0.3


async def test_rate_limit_headers_scale_the_share_until_they_expire() -> None:
    balancer, clock = make_balancer(rate_limit_headroom=0.2, rate_limit_header_max_age_seconds=30)
    rates = noisy(100, 30)
    feed(balancer, G, "a", rates)
    feed(balancer, G, "b", rates)
    balancer.record(
        G,
        "b",
        latency=1.0,
        output_tokens=100,
        rate_limits=RateLimitObservation(remaining_requests=5, limit_requests=100),
    )
    await balancer.refresh(G)
    weights = balancer.weights(G, AB)
    estimates = balancer.estimates(G, AB)
    assert estimates["b"].capacity == pytest.approx(0.25)
    assert weights["b"] / weights["a"] == pytest.approx(0.25 * _ratio_without(balancer), rel=0.35)
    clock.advance(31)
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["b"].capacity == 1.0


def _ratio_without(balancer: RateBalancer) -> float:
    estimates = balancer.estimates(G, AB)
    pa, pb = estimates["a"].probability or 1.0, estimates["b"].probability or 1.0
    return pb / pa


async def test_exhausted_headers_take_a_deployment_out() -> None:
    balancer, _ = make_balancer(exploration_share=0.1)
    feed(balancer, G, "a", noisy(100, 20))
    feed(balancer, G, "b", noisy(100, 20))
    balancer.record(G, "b", latency=1.0, output_tokens=100, rate_limits=RateLimitObservation(remaining_tokens=0))
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["b"] == 0.0
    assert all(balancer.choose(G, AB) == 0 for _ in range(200))


async def test_configured_tpm_against_last_minute_usage() -> None:
    balancer, clock = make_balancer(rate_limit_headroom=0.5)
    # 20 requests of 45 tokens: 900 of a 1000 tpm: 10 % left, half the 50 % headroom... 0.2.
    for _ in range(20):
        balancer.record(G, "a", latency=1.0, output_tokens=40, input_tokens=5)
        balancer.record(G, "b", latency=1.0, output_tokens=40, input_tokens=5)
    await balancer.refresh(G)
    limited = (Candidate("a", tpm=1000), Candidate("b"))
    estimates = balancer.estimates(G, limited)
    assert estimates["a"].tokens_last_minute == 900 and estimates["a"].requests_last_minute == 20
    assert estimates["a"].capacity == pytest.approx(0.2)
    assert balancer.estimates(G, (Candidate("a", rpm=25), Candidate("b")))["a"].capacity == pytest.approx(0.4)
    clock.advance(62)
    await balancer.refresh(G)
    assert balancer.estimates(G, limited)["a"].capacity == 1.0


async def test_stalled_requests_count_as_failures_until_they_finish() -> None:
    balancer, clock = make_balancer(stall_latency_factor=4.0, stall_min_seconds=2.0, exploration_share=0.0)
    feed(balancer, G, "a", noisy(100, 30, 1), latency=0.5)
    feed(balancer, G, "b", noisy(100, 30, 2), latency=0.5)
    await balancer.refresh(G)
    # Requests sent to b never come back; a answers at once.
    sent_to_b = 0
    for _ in range(40):
        if balancer.choose(G, AB) == 1:
            sent_to_b += 1
        else:
            balancer.record(G, "a", latency=0.5, output_tokens=50)
    assert sent_to_b > 5
    clock.advance(1.0)
    assert balancer.weights(G, AB)["b"] > 0.2  # not yet stalled (threshold max(2 s, 4 x 0.5 s))
    clock.advance(1.5)
    assert balancer.estimates(G, AB)["b"].in_flight == sent_to_b
    stalled_share = balancer.weights(G, AB)["b"]
    assert stalled_share < 0.1  # its 30 good recent samples still soften the penalty
    clock.advance(12)
    await balancer.refresh(G)  # the good samples have left the failure window: only stalls are recent
    assert balancer.weights(G, AB)["b"] < 1e-6
    for _ in range(sent_to_b):
        balancer.record(G, "b", latency=2.5, output_tokens=250)
    assert balancer.weights(G, AB)["b"] > 0.2


async def test_choose_never_touches_the_store() -> None:
    calls: list[str] = []

    class CountingStore(MemoryStore):
        async def routing_sync(self, model_group, deltas, limits, **kw):  # type: ignore[no-untyped-def]
            calls.append(model_group)
            return await super().routing_sync(model_group, deltas, limits, **kw)

    clock = Clock()
    balancer = RateBalancer(CountingStore(clock=clock), settings(refresh_interval=1.0), clock=clock)
    for _ in range(100):
        balancer.choose(G, AB)
        balancer.record(G, "a", latency=1.0, output_tokens=10)
    assert calls == []  # the syncs are background tasks; none has run yet
    await balancer.refresh(G)
    assert calls == [G, G]  # the one background sync the staleness check started, then refresh()
    clock.advance(0.5)
    balancer.choose(G, AB)
    await balancer.refresh(G)
    assert calls == [G, G, G]  # fresh: no background sync
    clock.advance(1.0)
    balancer.choose(G, AB)
    await balancer.refresh(G)
    assert len(calls) == 5


async def test_store_errors_keep_samples_for_the_next_sync() -> None:
    errors: list[BaseException] = []
    fail = [True]

    class FlakyStore(MemoryStore):
        async def routing_sync(self, model_group, deltas, limits, **kw):  # type: ignore[no-untyped-def]
            if fail[0]:
                raise StoreError("redis down")
            return await super().routing_sync(model_group, deltas, limits, **kw)

    clock = Clock()
    balancer = RateBalancer(FlakyStore(clock=clock), settings(), clock=clock, on_store_error=errors.append)
    feed(balancer, G, "a", noisy(100, 10))
    await balancer.refresh(G)
    # (The first record also started a background sync, which failed the same way.)
    assert errors and all(isinstance(e, StoreError) for e in errors)
    assert balancer.weights(G, AB) == {"a": 0.5, "b": 0.5}
    fail[0] = False
    feed(balancer, G, "a", noisy(100, 5))
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].samples == 15


async def test_draws_follow_the_shares() -> None:
    balancer, _ = make_balancer(seed=7)
    feed(balancer, G, "a", noisy(100, 40, 1))
    feed(balancer, G, "b", noisy(95, 40, 2))
    feed(balancer, G, "c", noisy(90, 40, 3))
    abc = candidates("a", "b", "c")
    await balancer.refresh(G)
    weights = balancer.weights(G, abc)
    n = 20_000
    picks = Counter(balancer.choose(G, abc) for _ in range(n))
    for i, name in enumerate("abc"):
        assert picks[i] / n == pytest.approx(weights[name], abs=0.015)


async def test_ratio_overrides_deployment_then_group_then_default() -> None:
    balancer, _ = make_balancer(input_to_output_ratio=100, input_to_output_ratio_by_model_group={G: 10})
    balancer.record(G, "a", latency=1.0, input_tokens=100)
    balancer.record(G, "b", latency=1.0, input_tokens=100, input_to_output_ratio=50)
    balancer.record("other", "c", latency=1.0, input_tokens=100)
    await balancer.refresh_all()
    assert balancer.estimates(G, AB)["a"].mean_rate == pytest.approx(10.0)
    assert balancer.estimates(G, AB)["b"].mean_rate == pytest.approx(2.0)
    assert balancer.estimates("other", candidates("c"))["c"].mean_rate == pytest.approx(1.0)


async def test_adaptive_window_follows_a_busy_deployment_faster() -> None:
    fixed, clock = make_balancer()
    adaptive, _ = make_balancer(clock, adaptive_window=True, adaptive_min_samples=20)
    for balancer in (fixed, adaptive):
        feed(balancer, G, "a", noisy(100, 200, 1))
        feed(balancer, G, "b", noisy(80, 200, 2))
        await balancer.refresh(G)
    clock.advance(30)
    # a gets slow; 30 fresh samples of it, b keeps its history.
    for balancer in (fixed, adaptive):
        feed(balancer, G, "a", noisy(40, 30, 3))
        await balancer.refresh(G)
    assert fixed.weights(G, AB)["a"] > 0.5
    assert adaptive.weights(G, AB)["a"] < 0.05


async def test_estimates_without_candidates_list_every_deployment_seen() -> None:
    balancer, _ = make_balancer()
    feed(balancer, G, "a", noisy(100, 5))
    feed(balancer, G, "b", noisy(100, 5))
    await balancer.refresh(G)
    assert set(balancer.estimates(G)) == {"a", "b"}
    assert sum(balancer.weights(G).values()) == pytest.approx(1.0)
    assert balancer.weights("unknown") == {}


async def test_time_to_first_token_is_kept() -> None:
    balancer, _ = make_balancer()
    balancer.record(G, "a", latency=2.0, output_tokens=100, ttft=0.3)
    balancer.record(G, "a", latency=2.0, output_tokens=100, ttft=0.5)
    await balancer.refresh(G)
    assert balancer.estimates(G, candidates("a"))["a"].mean_ttft == pytest.approx(0.4)


async def test_picks_that_never_report_back_are_forgotten() -> None:
    balancer, clock = make_balancer(window_seconds=1800, stall_latency_factor=4.0, stall_min_seconds=2.0)
    feed(balancer, G, "a", noisy(100, 30, 1))
    feed(balancer, G, "b", noisy(100, 30, 2))
    await balancer.refresh(G)
    for _ in range(20):
        balancer.choose(G, candidates("b"))  # picked, then lost before the call was made
    clock.advance(60)
    assert balancer.weights(G, AB)["b"] < 0.15  # they look stalled for now
    clock.advance(1750)
    # After max(900 s, the window) they are forgotten at the next sync (the samples, 1810 s old, are still
    # in the window).
    await balancer.refresh(G)
    assert 0.2 < balancer.weights(G, AB)["b"] < 0.8
    assert balancer.estimates(G, AB)["b"].in_flight == 0


async def test_an_answer_logged_with_zero_latency_breaks_nothing() -> None:
    """An answer reported with latency 0 (or below): it is taken as the shortest latency the rates use, so
    its deployment's expected latency, size fit and overdue test never divide by zero."""
    balancer, clock = make_balancer(in_flight_evidence=True, load_aware=True, change_detection_sigma=3.0)
    balancer.record(G, "a", latency=0.0, output_tokens=10)
    balancer.record(G, "a", latency=-1.0, output_tokens=10)
    balancer.record(G, "b", latency=1.0, output_tokens=100)
    balancer.choose(G, (Candidate("a"),), work=10.0)
    clock.advance(0.5)  # a's request is overdue by any expected latency a zero-latency answer could give
    assert balancer.choose(G, AB) in (0, 1)
    estimates = balancer.estimates(G, AB)
    assert estimates["a"].samples == 2 and estimates["a"].mean_latency == pytest.approx(1e-3)
