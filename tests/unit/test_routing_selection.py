"""How picks follow the shares (``selection``), and the capped in-flight bound of a deployment without
successful samples. Explicit times."""

from __future__ import annotations

import pytest

from litellm_ratebalance.routing import Candidate
from litellm_ratebalance.routing.balancer import _smooth_pick
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


async def test_random_selection_is_the_proposals_draw() -> None:
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
            patch.setattr("litellm_ratebalance.routing.balancer._UNMEASURED_BOUND", cap)
            estimates = balancer.estimates(G, abc)
        assert estimates["b"].mode == "weighted" and estimates["b"].share is not None
        shares[cap] = estimates["b"].share
    assert shares[0.9] < 0.5 * shares[100.0]
