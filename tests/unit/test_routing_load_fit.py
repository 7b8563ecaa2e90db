"""The load fit, with explicit times: a deployment's rate against its load, the slots it learns (or is
given in ``model_info.slots``), and shares that shrink as those slots fill."""

from __future__ import annotations

import pytest

from litellm_ratebalance.routing import Candidate
from litellm_ratebalance.routing.fits import LoadFit
from tests.unit.routing_support import T0, candidates, feed, make_balancer, served, two_slot_load_fit

G = "group"
AB = candidates("a", "b")


def test_load_fit_moves_a_window_mean_by_the_speed_factor_of_its_slots() -> None:
    fit = LoadFit()
    assert fit.factor(5.0) == 1.0 and fit.shift(5.0, mean_rate=150.0) == 0.0  # nothing known: nothing moves
    # Two slots at 200 tok/s: alone or in pairs 200 each, at load 4 half of it.
    for t, (load, rate) in enumerate([(1, 200.0), (2, 200.0), (4, 100.0), (2, 195.0)] * 3):
        served(fit, float(t), float(load), rate)
    assert fit.slots() == pytest.approx(2.0)
    # The samples ran at full speed three times in four and at half speed once: a mean speed of 7/8.
    assert fit.factor(1.0) == pytest.approx(8.0 / 7.0)
    assert fit.factor(5.0) == pytest.approx(0.4 * 8.0 / 7.0)  # two slots shared by five
    assert fit.shift(5.0, mean_rate=150.0) == pytest.approx(150.0 * (0.4 * 8.0 / 7.0 - 1.0))
    assert fit.slowdown(5.0) == pytest.approx(2.5) and fit.slowdown(2.0) == 1.0


def test_load_fit_forgets_a_busy_level_once_its_samples_have_faded() -> None:
    fit = LoadFit()
    for t in range(5):
        served(fit, float(t), 1.0, 100.0, half_life=20.0)
    for t in range(5, 10):  # two slots: half the rate at four in flight
        served(fit, float(t), 4.0, 50.0, half_life=20.0)
    assert fit.slots() == pytest.approx(2.0)
    for t in range(120, 140):  # six half-lives later, light load again: the busy samples weigh ~0.1
        served(fit, float(t), 1.0, 100.0, half_life=20.0)
    assert fit.slots() is None


async def test_load_aware_shares_move_away_from_a_busy_deployment_with_few_slots() -> None:
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0)
    view = balancer._view(G)
    feed(balancer, G, "a", [200.0, 200.0, 100.0, 66.0, 133.0])
    feed(balancer, G, "b", [115.0, 125.0, 118.0, 122.0, 120.0])
    # As if those samples had come at these loads: a has 2 slots at 200 tok/s, b gives 120 at any load seen.
    view.loads["a"], view.loads["b"] = LoadFit(), LoadFit()
    for load, rate in [(1, 200.0), (2, 200.0), (4, 100.0), (6, 66.0), (3, 133.0)]:
        served(view.loads["a"], clock.now, float(load), rate)
        served(view.loads["b"], clock.now, float(load), 120.0)
    assert view.loads["a"].slots() == pytest.approx(2.0) and view.loads["b"].slots() is None
    view.cache.clear()
    idle = balancer.weights(G, AB)["a"]
    for _ in range(5):
        balancer.choose(G, (Candidate("a"),))  # five requests in flight at a
    busy = balancer.weights(G, AB)["a"]
    assert idle > 0.6 and busy < 0.3, (idle, busy)


async def test_shares_worked_out_once_per_load_equal_a_fresh_computation() -> None:
    # A decision reuses each candidate's state and weight at a given load (until the cache clears): the
    # shares must be those of computing everything again, at every load.
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0, in_flight_evidence=True)
    abc = candidates("a", "b", "c")
    feed(balancer, G, "a", [200.0, 200.0, 100.0, 66.7, 180.0])
    feed(balancer, G, "b", [90.0, 110.0, 95.0, 105.0, 100.0])
    feed(balancer, G, "c", [60.0, 70.0, 65.0, 55.0, 62.0])
    fit = balancer._view(G).loads["a"] = LoadFit()
    for load, rate in [(1.0, 200.0), (2.0, 200.0), (1.0, 200.0), (4.0, 100.0), (6.0, 66.7)] * 3:
        served(fit, clock.now, load, rate)
    assert fit.slots() == pytest.approx(2.0)
    seen = set()
    for pick in ["a", "b", "a", "c", "a", "b"]:
        balancer.choose(G, (Candidate(pick),))
        first = balancer.weights(G, abc)
        again = balancer.weights(G, abc)  # from what the first call worked out
        balancer._view(G).cache.clear()
        fresh = balancer.weights(G, abc)
        assert again == first and fresh == pytest.approx(first, abs=1e-12)
        seen.add(round(first["a"], 6))
    assert len(seen) >= 2  # the loads did move the shares (to 0 once its two slots are taken)


def test_load_fit_learns_slots_only_once_saturated() -> None:
    fit = LoadFit()
    for t, load in enumerate([1.0, 2.0, 1.0, 2.0, 1.5, 2.0]):  # never busier than its two slots
        served(fit, float(t), load, 150.0)
    assert fit.slots() is None
    for t, load in enumerate([6.0, 6.0, 7.0], start=10):  # 2 slots at 150 tok/s shared by 6 or 7 requests
        served(fit, float(t), load, 300.0 / load)
    assert fit.slots() == pytest.approx(2.0)


def test_load_fit_judges_saturation_per_token_not_by_mean_rates() -> None:
    # Many slots, answers of very mixed size: 0.2 s fixed + 150 tok/s. The short ones happened to meet more
    # requests (loads 4-6), the long ones fewer (1-2): by mean rates the busy loads look three times slower,
    # per token they are not.
    fit = LoadFit()
    for t in range(12):
        work, load = (20.0, 4.0 + t % 3) if t % 2 else (300.0, 1.0 + t % 2)
        fit.add(float(t), load, work, 0.2 + work / 150.0, 0.0)
    assert fit.slots() is None
    # Three slots, answers as mixed, long and short ones at light and at heavy loads: per token, the busy
    # ones took twice as long.
    fit = LoadFit()
    for t in range(16):
        work, load = (300.0 if t % 4 < 2 else 20.0), (6.0 if t % 2 else 1.0 + t % 3)
        fit.add(float(t), load, work, 0.2 + work / 150.0 * max(1.0, load / 3.0), 0.0)
    assert fit.slots() == pytest.approx(2.0**1.5)  # the grid's capacity nearest 3


async def test_shares_shrink_as_learnt_slots_fill_up() -> None:
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0)
    feed(balancer, G, "a", [200.0, 200.0, 200.0, 100.0, 66.7])
    feed(balancer, G, "b", [90.0, 110.0, 95.0, 105.0, 100.0])
    fit = balancer._view(G).loads["a"] = LoadFit()  # as if a's samples had come at these loads
    for load, rate in [(1.0, 200.0), (2.0, 200.0), (1.0, 200.0), (4.0, 100.0), (6.0, 66.7)] * 3:
        served(fit, clock.now, load, rate)
    assert fit.slots() == pytest.approx(2.0)
    balancer.choose(G, (Candidate("a"),))
    one_busy = balancer.weights(G, AB)["a"]
    balancer.choose(G, (Candidate("a"),))
    assert one_busy > 0.5 and balancer.weights(G, AB)["a"] < 0.01  # both learnt slots taken


@pytest.mark.parametrize("load_aware", [False, True])
async def test_configured_slots_cap_the_share_before_any_are_learnt(load_aware: bool) -> None:
    """a (2 slots configured, e.g. ``model_info.slots``) is faster than b; its share falls to nothing once
    this replica has 2 requests there, with no load fit (or one that has learnt no slots). Without the
    setting (and with unknown slots not presumed, see test_routing_slots.py), the same two requests leave
    most of the share with a."""
    for configured, busy_share_at_most, busy_share_at_least in ((2.0, 0.01, 0.0), (None, 1.0, 0.5)):
        balancer, _ = make_balancer(
            load_aware=load_aware,
            presume_slots=False,
            in_flight_evidence=True,
            stall_latency_factor=0.0,
            exploration_share=0.0,
        )
        feed(balancer, G, "a", [200.0, 190.0, 210.0, 200.0])
        feed(balancer, G, "b", [100.0, 90.0, 110.0, 100.0])
        await balancer.refresh(G)
        pair = (Candidate("a", slots=configured), Candidate("b"))
        if load_aware:
            assert balancer._view(G).loads["a"].slots() is None  # nothing learnt: the setting alone acts
        idle_share = balancer.weights(G, pair)["a"]
        balancer.choose(G, (pair[0],))
        one_busy = balancer.weights(G, pair)["a"]
        balancer.choose(G, (pair[0],))
        two_busy = balancer.weights(G, pair)["a"]
        assert idle_share > 0.5 and one_busy > 0.5
        assert busy_share_at_least <= two_busy <= busy_share_at_most
        picks = [pair[balancer.choose(G, pair)].id for _ in range(5)]
        assert (picks.count("a") == 0) is (configured is not None)


def test_load_fit_of_a_deployment_never_seen_idle_still_learns_its_slots() -> None:
    # Two slots at ~230 tok/s, but every sample met at least two other requests (loads 3..6): every capacity
    # up to the lightest load seen fits alike, and the largest of them is taken.
    fit = LoadFit()
    for t, (load, rate) in enumerate([(3.0, 153.0), (4.0, 115.0), (6.0, 76.7), (3.5, 131.0)] * 3):
        served(fit, float(t), load, rate)
    slots = fit.slots()
    assert slots is not None and 2.0 <= slots <= 2.0**1.5
    assert fit.factor(8.0) < fit.factor(4.0) < fit.factor(3.0)


def test_load_fit_without_saturation_moves_nothing() -> None:
    fit = LoadFit()
    for t, load in enumerate([3.0, 4.0, 3.0, 6.0, 1.0, 2.0]):  # many slots: the same rate at every load
        served(fit, float(t), load, 150.0)
    assert fit.slots() is None
    for load in (1.0, 3.5, 6.0, 12.0):  # the window mean stands at any load, seen or not
        assert fit.factor(load) == 1.0 and fit.shift(load, mean_rate=140.0) == 0.0 and fit.slowdown(load) == 1.0


def test_load_fit_carries_slots_over_until_its_regime_shows_its_own() -> None:
    fit = LoadFit(carried_slots=2.0)
    assert fit.slots() == 2.0  # from the first decision after the change on
    for t in range(3):
        served(fit, float(t), 1.0, 100.0)
    assert fit.slots() == 2.0 and fit.factor(4.0) == pytest.approx(0.5)  # two slots shared by four
    for t, load in enumerate([3.0, 3.5, 3.0, 3.5, 3.0, 3.5], start=3):  # busier than two, no slower for it
        served(fit, float(t), load, 100.0)
    assert fit.slots() is None and fit.factor(3.0) == 1.0


def test_load_fit_carried_slots_give_way_to_the_ones_learnt_after_the_change() -> None:
    fit = LoadFit(carried_slots=2.0)
    samples = [(1.0, 100.0), (3.0, 100.0), (1.5, 100.0), (6.0, 50.0), (3.0, 100.0), (6.0, 50.0)]
    for t, (load, rate) in enumerate(samples * 2):
        served(fit, float(t), load, rate)
    assert fit.slots() == pytest.approx(2.0**1.5)  # three at full speed, six at half: the grid's nearest to 3


async def test_a_detected_change_keeps_the_slots_its_load_fit_had_learnt() -> None:
    balancer, clock = make_balancer(load_aware=True, change_detection_sigma=3.0, stall_latency_factor=0.0)
    feed(balancer, G, "a", [200.0] * 6, latency=1.0)
    feed(balancer, G, "b", [100.0] * 6, latency=1.0)
    view = balancer._view(G)
    slots = two_slot_load_fit(view.loads.setdefault("a", LoadFit())).slots()
    assert slots is not None
    assert balancer._changed(view, "a", clock.now, clock.now - 1.0)
    fit = view.loads["a"]
    assert fit.samples == 0  # the rates before the change are gone
    assert fit.slots() == pytest.approx(slots)  # its capacity is not


def two_slot_samples(base: float) -> list[tuple[float, float, float]]:
    """(load, work, latency) of a deployment with ``base`` seconds of fixed latency, then 200 tokens/s for one
    request and two slots shared beyond that (processor sharing: the sized part stretches by load / 2)."""
    samples = []
    for load in (1.0, 2.0, 1.0, 4.0, 6.0, 1.5):
        for work in (40.0, 100.0, 160.0):
            samples.append((load, work, base + work / 200.0 * max(1.0, load / 2.0)))
    return samples


@pytest.mark.parametrize("base", [0.0, 0.3])
def test_load_fit_learns_slots_whatever_the_fixed_part_of_the_latency(base: float) -> None:
    # The fixed part is the line's intercept, fitted beside the per-token part the load stretches.
    fit = LoadFit()
    for load, work, latency in two_slot_samples(base):
        fit.add(T0, load, work, latency, 0.0)
    assert fit.slots() == pytest.approx(2.0)


async def test_the_load_of_a_sample_is_the_mean_in_flight_over_its_life() -> None:
    # a: a 2 s request met nothing, a second one joined it from 0.5 s to 1.0 s and then left: it shared the
    # deployment with 1.25 requests on average (itself included), not the 1 it met and the 1 it left.
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0)
    view = balancer._view(G)
    balancer.choose(G, (Candidate("a"),), request_id="long")
    clock.advance(0.5)
    balancer.choose(G, (Candidate("a"),), request_id="short")
    clock.advance(0.5)
    balancer.record(G, "a", latency=0.5, output_tokens=50, request_id="short")
    fit = view.loads["a"]
    assert fit.level_loads[0] == pytest.approx(2.0)  # in flight with the long one all its life
    clock.advance(1.0)
    balancer.record(G, "a", latency=2.0, output_tokens=200, request_id="long")
    # The first sample has faded for the 1 s since (the fit's half-life is the window).
    faded = 0.5 ** (1.0 / balancer.settings.window_seconds)
    assert fit.level_loads[0] - 2.0 * faded == pytest.approx(1.25)
