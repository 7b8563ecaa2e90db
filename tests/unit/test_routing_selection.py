"""How picks follow the shares (``selection``), and the capped in-flight bound of a deployment without
successful samples. Explicit times."""

from __future__ import annotations

from typing import Any

import pytest

from litellm_ratebalance.routing import Candidate, RateBalancer
from litellm_ratebalance.routing.selection import smooth_pick as _smooth_pick
from tests.unit.routing_support import candidates, feed, make_balancer

G = "group"
AB = candidates("a", "b")
ABC = candidates("a", "b", "c")


def test_smooth_pick_follows_shares_in_an_explicit_sequence() -> None:
    credits: dict[str, float] = {}
    picks = [ABC[_smooth_pick(credits, ABC, (0.5, 0.25, 0.25))].id for _ in range(8)]
    assert picks == ["a", "b", "c", "a", "a", "b", "c", "a"]


def test_smooth_pick_gives_each_share_within_one_pick_and_never_a_zero_share() -> None:
    credits: dict[str, float] = {}
    shares = (0.7, 0.2, 0.1, 0.0)
    group = candidates("a", "b", "c", "d")
    counts = dict.fromkeys("abcd", 0)
    for n in range(1, 201):
        counts[group[_smooth_pick(credits, group, shares)].id] += 1
        for i, c in enumerate(group):
            assert abs(counts[c.id] - n * shares[i]) <= 1.0
    assert counts["d"] == 0


def test_smooth_pick_bounds_credit_after_a_share_change() -> None:
    credits: dict[str, float] = {}
    for _ in range(50):
        _smooth_pick(credits, AB, (0.99, 0.01))
    # b's share jumps: it is owed at most one pick from before, then follows the new shares.
    picks = [AB[_smooth_pick(credits, AB, (0.0, 1.0))].id for _ in range(3)]
    assert picks == ["b", "b", "b"]
    assert all(-1.0 <= value <= 1.0 for value in credits.values())


def test_smooth_pick_with_no_positive_share_takes_the_first() -> None:
    assert _smooth_pick({}, AB, (0.0, 0.0)) == 0


async def test_smooth_selection_follows_the_weights_exactly() -> None:
    balancer, _ = make_balancer(selection="smooth")
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0])
    feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0])
    await balancer.refresh(G)
    weights = balancer.weights(G, AB)
    picks = [AB[balancer.choose(G, AB)].id for _ in range(40)]
    assert abs(picks.count("a") - 40 * weights["a"]) <= 1.0


async def test_smooth_bootstrap_sends_an_unmeasured_busy_candidate_nothing_more() -> None:
    balancer, _ = make_balancer(selection="smooth", in_flight_evidence=True, stall_latency_factor=0.0)
    first = [ABC[balancer.choose(G, ABC)].id for _ in range(3)]
    assert sorted(first) == ["a", "b", "c"]
    feed(balancer, G, "a", [100.0])
    # Still bootstrap (b and c have not answered): their one request each is their chance.
    assert balancer.estimates(G, ABC)["a"].mode == "bootstrap"
    assert balancer.weights(G, ABC)["b"] == pytest.approx(1 / 3)  # reported shares stay equal
    assert [ABC[balancer.choose(G, ABC)].id for _ in range(4)] == ["a"] * 4


async def test_smooth_bootstrap_with_every_candidate_busy_goes_to_the_least_busy() -> None:
    balancer, _ = make_balancer(selection="smooth", in_flight_evidence=True, stall_latency_factor=0.0)
    picks = [AB[balancer.choose(G, AB)].id for _ in range(6)]
    assert picks.count("a") == 3 and picks.count("b") == 3


async def test_random_selection_is_the_plain_algorithms_draw() -> None:
    balancer, _ = make_balancer(selection="random")
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0])
    feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0])
    await balancer.refresh(G)
    picks = [AB[balancer.choose(G, AB)].id for _ in range(2000)]
    assert picks.count("a") / 2000 == pytest.approx(balancer.weights(G, AB)["a"], abs=0.04)


async def test_an_unmeasured_deployments_overdue_bound_does_not_beat_the_sla() -> None:
    """b has no successful answer (two failures, not penalised here); its request has been in flight a little
    longer than the group's typical latency, so its bound (the group's typical work / age) is far above a low
    SLA. Capped below the SLA, it does not lift b's share."""
    abc = candidates("a", "b", "c")
    shares = {}
    for cap in (0.9, 100.0):
        balancer, clock = make_balancer(
            in_flight_evidence=True, stall_latency_factor=0.0, greediness=0.3, failure_penalty=0.0
        )
        feed(balancer, G, "a", [150.0, 155.0, 145.0, 150.0, 152.0, 148.0], latency=1.0)
        feed(balancer, G, "c", [30.0, 32.0, 28.0, 30.0], latency=1.0)
        for _ in range(2):
            balancer.record(G, "b", latency=0.1, ok=False)
        await balancer.refresh(G)
        balancer.choose(G, (Candidate("b"),))
        clock.advance(1.05)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("litellm_ratebalance.routing.evidence.UNMEASURED_BOUND", cap)
            estimates = balancer.estimates(G, abc)
        assert estimates["b"].mode == "weighted" and estimates["b"].share is not None
        shares[cap] = estimates["b"].share
    assert shares[0.9] < 0.5 * shares[100.0]


# -- selection: least_loaded (the default) ----------------------------------------------------------------
def two_close_deployments(seed: int, **overrides: Any) -> tuple[RateBalancer, dict[str, float]]:
    balancer, _ = make_balancer(seed=seed, selection="least_loaded", **overrides)
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0, 95.0])
    feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0, 97.0])
    weights = balancer.weights(G, AB)
    assert 0.55 < weights["a"] < 0.8  # a a little ahead
    return balancer, weights


async def test_least_loaded_with_nothing_in_flight_picks_the_highest_expected_rate() -> None:
    # Greedy when idle, as the oracle is: by expected rate, not by share. a is steady above the SLA (the
    # 30th percentile), b faster on average but spread wide; a has the bigger share, b the higher rate.
    balancer, _ = make_balancer(seed=3, selection="least_loaded", greediness=0.3)
    feed(balancer, G, "a", [100.0, 101.0, 99.0, 100.0, 100.0, 101.0, 99.0, 100.0])
    feed(balancer, G, "b", [60.0, 300.0, 90.0, 250.0])
    weights = balancer.weights(G, AB)
    assert weights["a"] > weights["b"], weights
    for _ in range(50):
        picked = AB[balancer.choose(G, AB)].id
        assert picked == "b"
        balancer.release(G, picked)
    balancer.choose(G, (Candidate("b"),))  # one in flight at b: the load decides again, a's turn
    assert AB[balancer.choose(G, AB)].id == "a"


async def test_least_loaded_passes_over_a_deployment_whose_requests_pile_up() -> None:
    balancer, weights = two_close_deployments(seed=4)
    for _ in range(6):
        balancer.choose(G, (Candidate("a"),))  # six requests stuck at a, none at b
    # b until its (in flight + 1) / share reaches a's 7 / share_a.
    picks = [AB[balancer.choose(G, AB)].id for _ in range(3)]
    assert picks == ["b", "b", "b"], weights


async def test_least_loaded_keeps_requests_in_flight_in_proportion_to_the_shares() -> None:
    balancer, weights = two_close_deployments(seed=6)
    picks = [AB[balancer.choose(G, AB)].id for _ in range(400)]  # none finishes
    assert abs(picks.count("a") - 400 * weights["a"]) <= 2


async def test_least_loaded_counts_a_failure_as_in_flight_for_a_typical_latency() -> None:
    # c fails at once, so it never has requests in flight; counted only by what is in flight it would look
    # idle next to busy a and b and take every request. Its failures count as in flight for the group's
    # typical latency instead, so it gets about its share.
    # (No failure penalty, so c's share stays put and the in-flight count alone is under test.)
    balancer, clock = make_balancer(seed=5, selection="least_loaded", failure_penalty=0.0)
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0, 95.0], latency=2.0)
    feed(balancer, G, "b", [98.0, 108.0, 88.0, 103.0, 93.0], latency=2.0)
    feed(balancer, G, "c", [96.0, 106.0, 86.0, 101.0, 91.0], latency=2.0)
    for _ in range(40):  # the healthy ones are busy
        balancer.choose(G, (Candidate("a"),))
        balancer.choose(G, (Candidate("b"),))
    share_c = balancer.weights(G, ABC)["c"]
    assert share_c > 0.1
    picks = []
    for _ in range(60):  # 60 decisions within 0.6 s, c failing at once each time
        picked = ABC[balancer.choose(G, ABC)].id
        picks.append(picked)
        if picked == "c":
            balancer.record(G, "c", latency=0.01, ok=False)
        clock.advance(0.01)
    assert picks.count("c") < 20, (share_c, picks.count("c"))  # counted as idle it takes all 60
    assert picks.count("c") > 0
