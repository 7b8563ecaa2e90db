"""The load fit, with explicit times: a deployment's rate against its load, the slots it learns (or is
given in ``model_info.slots``), and shares that shrink as those slots fill."""

from __future__ import annotations

import math

import pytest

from litellm_ratebalance.routing import Candidate
from litellm_ratebalance.routing.fits import LoadFit
from tests.unit.routing_support import T0, candidates, feed, make_balancer, two_slot_load_fit

G = "group"
AB = candidates("a", "b")


def test_load_fit_peak_and_unloaded_rate() -> None:
    fit = LoadFit()
    assert fit.expected_rate(1.0) is None
    # Two slots at 200 tok/s: alone or in pairs 200 each, at load 4 half of it.
    for t, (load, rate) in enumerate([(1, 200.0), (2, 200.0), (4, 100.0), (2, 195.0)] * 3):
        fit.add(float(t), float(load), rate, half_life_seconds=0.0)
    assert fit.expected_rate(1.0) == pytest.approx(198.33, rel=1e-3)  # the unloaded mean, not peak / 1
    assert fit.expected_rate(5.0) == pytest.approx(80.0)  # peak 400 over 5 requests
    assert fit.shift(5.0, mean_rate=150.0) == pytest.approx(-70.0)
    assert fit.shift(1.0, mean_rate=150.0) == pytest.approx(48.33, rel=1e-3)


def test_load_fit_forgets_a_busy_level_once_its_samples_have_faded() -> None:
    fit = LoadFit()
    for t in range(5):
        fit.add(float(t), 1.0, 100.0, half_life_seconds=20.0)
    for t in range(5, 10):  # two slots: half the rate at four in flight
        fit.add(float(t), 4.0, 50.0, half_life_seconds=20.0)
    assert fit.slots() == pytest.approx(2.0, rel=0.01)
    for t in range(120, 123):  # over five half-lives later, light load again: the busy samples weigh ~0.1
        fit.add(float(t), 1.0, 100.0, half_life_seconds=20.0)
    assert fit.slots() is None
    assert fit.expected_rate(4.0) is None  # that level has too little weight left to say anything


async def test_load_aware_shares_move_away_from_a_busy_deployment_with_few_slots() -> None:
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0)
    view = balancer._view(G)
    # a: 2 slots at 200 tok/s (seen at loads 1..6); b: 120 tok/s at any load seen.
    for load, rate in [(1, 200.0), (2, 200.0), (4, 100.0), (6, 66.0), (3, 133.0)]:
        view.loads.setdefault("a", LoadFit()).add(clock.now, float(load), rate, 0.0)
    for load in (1, 2, 4, 6, 3):
        view.loads.setdefault("b", LoadFit()).add(clock.now, float(load), 120.0, 0.0)
    feed(balancer, G, "a", [200.0, 200.0, 100.0, 66.0, 133.0])
    feed(balancer, G, "b", [115.0, 125.0, 118.0, 122.0, 120.0])
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
        fit.add(clock.now, load, rate, 0.0)
    seen = set()
    for pick in ["a", "b", "a", "c", "a", "b"]:
        balancer.choose(G, (Candidate(pick),))
        first = balancer.weights(G, abc)
        again = balancer.weights(G, abc)  # from what the first call worked out
        balancer._view(G).cache.clear()
        fresh = balancer.weights(G, abc)
        assert again == first and fresh == pytest.approx(first, abs=1e-12)
        seen.add(round(first["a"], 6))
    assert len(seen) >= 3  # the loads did move the shares


def test_load_fit_learns_slots_only_once_saturated() -> None:
    fit = LoadFit()
    for t, load in enumerate([1.0, 2.0, 1.0, 3.0, 2.5, 3.5]):  # 12 slots, never busy enough to slow down
        fit.add(float(t), load, 150.0, half_life_seconds=0.0)
    assert fit.slots() is None
    for t, load in enumerate([6.0, 6.0, 7.0], start=10):  # 2 slots at 150 tok/s shared by 6 or 7 requests
        fit.add(float(t), load, 300.0 / load, half_life_seconds=0.0)
    slots = fit.slots()
    # The highest level throughput (loads 2-4: mean load 3 x 150 tok/s) over the light-load rate.
    assert slots is not None and slots == pytest.approx(450.0 / 150.0)


def test_load_fit_needs_samples_enough_at_a_level_to_call_it_saturated() -> None:
    # Many slots; the one answer at 4 in flight was short, so its rate was low (the fixed part of the latency
    # weighs more on few tokens): a level of one sample does not show saturation, three alike would.
    fit = LoadFit()
    for t, load in enumerate([1.0, 2.0, 1.5]):
        fit.add(float(t), load, 150.0, half_life_seconds=0.0)
    fit.add(3.0, 4.0, 60.0, half_life_seconds=0.0)
    assert fit.slots() is None
    for moment in (4.0, 5.0):
        fit.add(moment, 4.0, 60.0, half_life_seconds=0.0)
    assert fit.slots() == pytest.approx(4.0 * 60.0 / 150.0)


def test_load_fit_spread_is_the_distance_from_the_prediction() -> None:
    fit = LoadFit()
    for t in range(9):
        fit.add(float(t), 1.0, 140.0 if t % 2 else 160.0, half_life_seconds=0.0)
    spread = fit.spread()
    assert spread is not None and 8.0 < spread < 12.0


async def test_shares_shrink_as_learnt_slots_fill_up() -> None:
    balancer, clock = make_balancer(load_aware=True, stall_latency_factor=0.0)
    feed(balancer, G, "a", [200.0, 200.0, 200.0, 100.0, 66.7])
    feed(balancer, G, "b", [90.0, 110.0, 95.0, 105.0, 100.0])
    fit = balancer._view(G).loads["a"] = LoadFit()  # as if a's samples had come at these loads
    for load, rate in [(1.0, 200.0), (2.0, 200.0), (1.0, 200.0), (4.0, 100.0), (6.0, 66.7)] * 3:
        fit.add(clock.now, load, rate, 0.0)
    assert fit.slots() == pytest.approx(2.0, rel=0.01)
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
    # Two slots at ~230 tok/s, but every sample met at least two other requests (loads 3..6): the lightest
    # load level seen (above 2, up to 4) stands for the light-load rate, so the fit is not blank.
    fit = LoadFit()
    for t, (load, rate) in enumerate([(3.0, 133.0), (4.0, 100.0), (6.0, 66.7), (3.5, 114.0)] * 3):
        fit.add(float(t), load, rate, half_life_seconds=0.0)
    light = (133.0 + 100.0 + 114.0) / 3
    slots = fit.slots()
    # The light level's own throughput (mean load 3.5 x its mean rate) is the highest: 3.5 slots, below the
    # busiest load seen (6) by more than the saturation test asks.
    assert slots is not None and slots == pytest.approx(3.5, rel=1e-3)
    assert fit.expected_rate(3.0) == pytest.approx(light, rel=1e-3)
    assert fit.expected_rate(8.0) == pytest.approx(light * 3.5 / 8.0, rel=1e-3)  # 3.5 slots shared by 8


def test_load_fit_without_saturation_says_nothing_above_the_levels_it_has_seen() -> None:
    fit = LoadFit()
    for t, load in enumerate([3.0, 4.0, 3.0, 6.0]):  # many slots: the same rate at every load
        fit.add(float(t), load, 150.0, half_life_seconds=0.0)
    assert fit.slots() is None
    assert fit.expected_rate(3.5) == pytest.approx(150.0)
    assert fit.expected_rate(6.0) == pytest.approx(150.0)  # seen at loads 4-8: what it gave there
    assert fit.expected_rate(12.0) is None  # busier than any level seen, never seen slowed by it


def test_load_fit_before_saturation_shows_predicts_the_rate_seen_at_that_load() -> None:
    # First measured at 3-4 requests in flight; the samples at 4.5-5 in flight were a little slower, too
    # little for the throughput test (4.75 x 92.5 over the light-load rate is 4.05 slots, above 0.8 x 4.75).
    fit = LoadFit()
    for t, (load, rate) in enumerate([(3.0, 110.0), (4.0, 115.0), (3.5, 100.0), (4.5, 95.0), (5.0, 90.0)]):
        fit.add(float(t), load, rate, half_life_seconds=0.0)
    light = (110.0 + 115.0 + 100.0) / 3
    assert fit.slots() is None
    assert fit.expected_rate(4.0) == pytest.approx(light)  # the light-load level (up to 4)
    assert fit.expected_rate(4.5) == pytest.approx(92.5)  # the mean at loads 4-8, not the light-load rate
    assert fit.shift(4.5, mean_rate=90.0) == pytest.approx(2.5)
    assert fit.expected_rate(9.0) is None  # no level that busy seen
    for t, load in enumerate([4.5, 5.0], start=5):  # very fast answers at that level: at most the light rate
        fit.add(float(t), load, 200.0, half_life_seconds=0.0)
    assert fit.slots() is None
    assert fit.expected_rate(5.0) == pytest.approx(light)


def test_load_fit_sees_saturation_in_level_means_not_in_one_outlier() -> None:
    # Two slots at 160 tok/s: at ~6 in flight each request gets about a third. One answer that met eleven
    # others which all left at once was fast (load 6 by the mean of met and left, 140 tok/s): the best single
    # sample (6 x 140 = 840 tok/s, 5.25 "slots", not below 0.8 x 6.5) would hide the saturation; the level's
    # means (6.17 in flight x 81 tok/s) do not.
    fit = LoadFit()
    samples = [(1.0, 160.0), (2.0, 158.0), (1.5, 162.0), (6.0, 53.0), (6.5, 50.0), (6.0, 140.0)]
    for t, (load, rate) in enumerate(samples):
        fit.add(float(t), load, rate, half_life_seconds=0.0)
    throughput = (18.5 / 3) * (243.0 / 3)
    slots = fit.slots()
    assert slots is not None and slots == pytest.approx(throughput / 160.0, rel=1e-3)
    assert fit.expected_rate(8.0) == pytest.approx(throughput / 8.0, rel=1e-3)


def test_load_fit_carries_slots_over_until_its_regime_shows_its_own() -> None:
    fit = LoadFit(carried_slots=2.0)
    assert fit.slots() == 2.0  # from the first decision after the change on
    for t in range(3):
        fit.add(float(t), 1.0, 100.0, half_life_seconds=0.0)
    assert fit.expected_rate(1.0) == pytest.approx(100.0)
    assert fit.expected_rate(4.0) == pytest.approx(50.0)  # two slots shared by four
    for t, load in enumerate([3.0, 3.5, 3.0], start=3):  # busier than two slots, and no slower for it
        fit.add(float(t), load, 100.0, half_life_seconds=0.0)
    assert fit.slots() is None
    assert fit.expected_rate(3.0) == pytest.approx(100.0)


def test_load_fit_carried_slots_give_way_to_the_ones_learnt_after_the_change() -> None:
    fit = LoadFit(carried_slots=2.0)
    for t, (load, rate) in enumerate([(1.0, 100.0), (1.5, 100.0), (1.0, 100.0), (6.0, 50.0), (6.0, 50.0), (6.0, 50.0)]):
        fit.add(float(t), load, rate, half_life_seconds=0.0)
    assert fit.slots() == pytest.approx(3.0)  # 6 in flight at half the light-load rate


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
def test_load_fit_learns_slots_from_the_part_of_the_latency_the_load_stretches(base: float) -> None:
    told = LoadFit()  # given the fixed part (the size fit's base)
    untold = LoadFit()  # its samples' sizes, no base: the fixed part counts as stretched
    rates_only = LoadFit()  # no sizes: the samples' effective rates
    for load, work, latency in two_slot_samples(base):
        told.add(T0, load, work / latency, 0.0, work=work, latency=latency, base_latency=base)
        untold.add(T0, load, work / latency, 0.0, work=work, latency=latency)
        rates_only.add(T0, load, work / latency, 0.0)
    assert told.slots() == pytest.approx(2.0, rel=0.02)
    if base == 0.0:
        assert untold.slots() == pytest.approx(2.0, rel=0.02)
    else:
        # The fixed part flattens the fall with load: 0.3 s on top of 0.5 s reads as 2.5 slots or more.
        untold_slots, rates_slots = untold.slots(), rates_only.slots()
        assert untold_slots is not None and untold_slots > 2.5
        assert rates_slots is not None and rates_slots > 2.5


def test_load_fit_does_not_call_a_deployment_saturated_on_its_stretched_part_alone() -> None:
    # 0.5 s fixed, 0.5 s sized at light load; at 6 in flight the sized part takes 1.4 times as long. The whole
    # latency grows by a sixth (rate 0.83 of light load: 5 "slots" at a load of 6, not saturated by the
    # 80 % rule), the sized part by 40 % (4.3): noise magnified by taking the base out is not saturation.
    fit = LoadFit()
    for load, stretch in [(1.0, 1.0), (1.5, 1.0), (6.0, 1.4)] * 3:
        latency = 0.5 + 0.5 * stretch
        fit.add(T0, load, 100.0 / latency, 0.0, work=100.0, latency=latency, base_latency=0.5)
    assert fit.slots() is None


def test_load_fit_with_a_base_at_most_its_latencies_still_learns_no_more_slots_than_the_samples_show() -> None:
    # A base estimate at or above the latencies (early, from few samples) leaves a tenth of each level's
    # latency as its stretched part: no division by zero, and the slots still come from the level pools.
    fit = LoadFit()
    for load, work, latency in two_slot_samples(0.0):
        fit.add(T0, load, work / latency, 0.0, work=work, latency=latency, base_latency=5.0)
    slots = fit.slots()
    assert slots is not None and math.isfinite(slots) and 1.0 <= slots <= 6.0


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
