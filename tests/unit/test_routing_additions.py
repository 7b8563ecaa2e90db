"""The additions to the proposal's algorithm, with explicit times: recency weighting, this replica's own
samples seen at once, in-flight evidence, the load fit, change detection with re-measuring probes, request
ids in the in-flight book-keeping, and the store-only status accessor."""

from __future__ import annotations

import math
from typing import Any

import pytest

from litellm_ratebalance.proxy.routing.calls import request_work
from litellm_ratebalance.routing import Candidate, RateBalancer, routing_status
from litellm_ratebalance.routing.estimator import recency_weight
from litellm_ratebalance.routing.fits import LoadFit, SizeFit
from litellm_ratebalance.routing_records import RateAggregate
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_support import T0, Clock, candidates, feed, make_balancer, settings

G = "group"
AB = candidates("a", "b")


def test_recency_weight_halves_per_half_life_and_is_off_at_zero() -> None:
    assert recency_weight(0.0, 10.0) == 1.0
    assert recency_weight(10.0, 10.0) == pytest.approx(0.5)
    assert recency_weight(30.0, 10.0) == pytest.approx(0.125)
    assert recency_weight(1e6, 0.0) == 1.0


def test_merge_scaled_weights_every_field() -> None:
    one = RateAggregate()
    one.add(100.0, latency=1.0, tokens=100)
    one.add(0.0, ok=False)
    target = RateAggregate()
    target.merge_scaled(one, 0.5)
    assert (target.count, target.failures, target.rate_sum, target.tokens) == (1.0, 0.5, 50.0, 50.0)
    assert target.mean == pytest.approx(50.0) and target.mean_ok_rate == pytest.approx(100.0)


async def test_recency_weighting_follows_a_rate_change_before_the_window_ends() -> None:
    """a was fast for 40 s, then slow; b steady. 12 s after the change (window 120 s): with a 4 s half-life
    the new samples dominate a's estimate, without it the old ones still do."""
    results = {}
    for half_life in (0.0, 4.0):
        balancer, clock = make_balancer(sample_half_life_seconds=half_life, bucket_seconds=1)
        for _ in range(40):
            feed(balancer, G, "a", [150.0, 160.0])
            feed(balancer, G, "b", [80.0, 90.0])
            await balancer.refresh(G)
            clock.advance(1.0)
        for _ in range(12):
            feed(balancer, G, "a", [30.0, 35.0])
            feed(balancer, G, "b", [80.0, 90.0])
            await balancer.refresh(G)
            clock.advance(1.0)
        await balancer.refresh(G)
        results[half_life] = (balancer.weights(G, AB)["a"], balancer.estimates(G, AB)["a"].mean_rate)
    assert results[0.0][1] > 100 and results[0.0][0] > 0.5  # plain window: a still looks best
    assert results[4.0][1] < 55 and results[4.0][0] < 0.3  # weighted: a is seen as slow


async def test_own_samples_count_before_the_sync_and_once_after_it() -> None:
    balancer, _ = make_balancer()
    feed(balancer, G, "a", [100.0] * 5)
    feed(balancer, G, "b", [50.0] * 5)
    assert balancer.estimates(G, AB)["a"].samples == 5
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].samples == 5  # written to the store, not counted twice


async def test_overdue_requests_in_flight_lower_a_deployments_share() -> None:
    balancer, clock = make_balancer(in_flight_evidence=True)
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0], latency=1.0)
    feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0], latency=1.0)
    await balancer.refresh(G)
    before = balancer.weights(G, AB)["a"]
    assert before > 0.5
    for _ in range(3):  # three requests to a that do not come back
        balancer.choose(G, (Candidate("a"),))
    clock.advance(0.5)
    assert balancer.weights(G, AB)["a"] == pytest.approx(before)  # younger than its mean latency: no evidence
    clock.advance(4.5)  # 5 s in flight where requests take 1 s: each is a sample of at most ~20 tok/s
    assert balancer.weights(G, AB)["a"] < 0.25


async def test_timed_evidence_in_shares_is_at_most_the_recompute_lag_old() -> None:
    """Shares with overdue requests in them are reused for the same in-flight pattern for at most 50 ms (the
    lag the cached shares allow for own samples): the evidence grows with the request's age after that."""
    balancer, clock = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0)
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0], latency=1.0)
    feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0], latency=1.0)
    await balancer.refresh(G)
    balancer.choose(G, (Candidate("a"),))
    clock.advance(2.0)  # twice its expected latency: a sample of at most ~half its rate
    first = balancer.weights(G, AB)["a"]
    clock.advance(0.03)
    assert balancer.weights(G, AB)["a"] == first  # within the lag: the same pattern's shares
    clock.advance(0.03)
    later = balancer.weights(G, AB)["a"]
    assert later < first  # 60 ms on: worked out again, the request is later still
    clock.advance(0.06)
    assert balancer.weights(G, AB)["a"] < later


async def test_shares_of_a_load_pattern_seen_before_are_those_of_a_fresh_view() -> None:
    """Going from one in-flight pattern to another and back gives the first pattern's shares, the same as a
    balancer that never left it (the shares of a pattern are kept, not those of the last decision). Each
    deployment has four slots, so its share depends on how many of them this replica fills."""
    a, b = Candidate("a", slots=4.0), Candidate("b", slots=4.0)
    shares = []
    for detour in (False, True):
        balancer, _ = make_balancer(in_flight_evidence=True)
        feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0], latency=1.0)
        feed(balancer, G, "b", [95.0, 100.0, 90.0, 98.0], latency=1.0)
        await balancer.refresh(G)
        balancer.choose(G, (a,), "one")
        first = balancer.weights(G, (a, b))
        if detour:
            for request_id in ("two", "three", "four"):
                balancer.choose(G, (a,), request_id)
            assert balancer.weights(G, (a, b))["a"] < first["a"]  # its slots are filling up
            for request_id in ("two", "three", "four"):
                balancer.release(G, "a", request_id)
        shares.append(balancer.weights(G, (a, b)))
    assert shares[0] == shares[1]


async def test_a_deployment_with_only_overdue_requests_ends_the_bootstrap() -> None:
    balancer, clock = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0)
    picks = {"a": 0, "b": 0}
    while not (picks["a"] and picks["b"]):
        picks[AB[balancer.choose(G, AB)].id] += 1
    # a answers at 100 tok/s in 1 s; b's requests are still running 3 s later.
    for _ in range(picks["a"]):
        balancer.record(G, "a", latency=1.0, output_tokens=100)
    assert balancer.estimates(G, AB)["a"].mode == "bootstrap"
    clock.advance(3.0)
    estimates = balancer.estimates(G, AB)
    assert estimates["a"].mode == "weighted"
    assert estimates["a"].share is not None and estimates["a"].share > 0.9


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


async def test_a_surprising_sample_drops_old_samples_and_probes_the_others() -> None:
    balancer, clock = make_balancer(change_detection_sigma=3.0, bucket_seconds=1)
    abc = candidates("a", "b", "c")
    feed(balancer, G, "a", [150.0, 140.0, 160.0, 150.0])
    feed(balancer, G, "b", [60.0, 65.0, 55.0, 60.0])
    feed(balancer, G, "c", [30.0, 32.0, 28.0, 30.0])
    await balancer.refresh(G)
    clock.advance(5.0)
    assert balancer.estimates(G, abc)["a"].samples == 4
    balancer.record(G, "a", latency=1.0, output_tokens=20)  # 20 tok/s, far below 150 +- 7
    estimates = balancer.estimates(G, abc)
    assert estimates["a"].samples == 1 and estimates["a"].mean_rate == pytest.approx(20.0)
    await balancer.refresh(G)  # the shared view does not bring the old samples back
    assert balancer.estimates(G, abc)["a"].samples == 1
    # The next two picks re-measure b and c (one request each), the third asks a for a second answer (its
    # window holds one), then the weights decide again.
    first, second = abc[balancer.choose(G, abc)].id, abc[balancer.choose(G, abc)].id
    assert {first, second} == {"b", "c"}
    assert balancer._views[G].probes == set()
    assert abc[balancer.choose(G, abc)].id == "a"


async def test_a_deployment_known_from_one_answer_is_asked_once_more() -> None:
    balancer, _ = make_balancer(bucket_seconds=1)
    feed(balancer, G, "b", [90.0, 100.0, 110.0])
    feed(balancer, G, "a", [20.0])  # its first answer met a hiccup: a point mass far below the SLA
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["a"] == 0.0
    assert AB[balancer.choose(G, AB)].id == "a"  # a second answer, to see a spread
    assert AB[balancer.choose(G, AB)].id == "b"  # not while that one is in flight
    balancer.record(G, "a", latency=1.0, output_tokens=300)
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["a"] > 0.3


async def test_a_second_opinion_waits_for_a_request_of_at_most_the_typical_size() -> None:
    balancer, _ = make_balancer(bucket_seconds=1)
    feed(balancer, G, "b", [90.0, 100.0, 110.0])
    feed(balancer, G, "a", [20.0])
    await balancer.refresh(G)
    balancer._view(G).typical_work = 50.0  # as learnt from earlier requests
    assert [AB[balancer.choose(G, AB, work=200.0)].id for _ in range(3)] == ["b"] * 3  # large: not to a
    assert AB[balancer.choose(G, AB, work=20.0)].id == "a"  # the next small request measures a


@pytest.mark.parametrize("work", [math.nan, math.inf, 0.0, -5.0])
async def test_a_size_that_is_not_a_positive_number_counts_as_unknown(work: float) -> None:
    balancer, _ = make_balancer(bucket_seconds=1)
    feed(balancer, G, "b", [90.0, 100.0, 110.0])
    feed(balancer, G, "a", [20.0])
    await balancer.refresh(G)
    balancer._view(G).typical_work = 50.0
    assert AB[balancer.choose(G, AB, work=work)].id == "a"  # like a request of unknown size, it may measure a
    assert balancer._view(G).typical_work == 50.0  # and the typical size does not move


def test_the_typical_size_settles_at_the_median() -> None:
    balancer, _ = make_balancer()
    view = balancer._view(G)
    for i in range(3000):
        balancer.choose(G, AB, work=10.0 + (i * 37 % 100))  # sizes 10..109 in a fixed shuffle
    assert view.typical_work is not None and 50.0 < view.typical_work < 70.0


async def test_exploration_goes_to_small_requests_at_the_same_overall_share() -> None:
    sent_to_b: dict[str, int] = {}
    for sized in (True, False):
        balancer, _ = make_balancer(seed=7, selection="least_loaded", exploration_share=0.1)
        feed(balancer, G, "a", [100.0, 105.0, 95.0] * 3)
        feed(balancer, G, "b", [20.0, 22.0, 18.0] * 3)  # far below the SLA: b gets only exploration
        await balancer.refresh(G)
        for i in range(4000):
            work = 10.0 + (i * 37 % 100)  # sizes 10..109 in a fixed shuffle: the typical size is about 60
            chosen = AB[balancer.choose(G, AB, work=work if sized else None)].id
            balancer.release(G, chosen)
            if chosen == "b":
                key = "unsized" if not sized else "small" if work <= 60.0 else "large"
                sent_to_b[key] = sent_to_b.get(key, 0) + 1
    assert sent_to_b.get("large", 0) <= 10, sent_to_b  # large ones only while the typical size was moving
    # 10 % of all decisions explore either way (half of them land on b): about 200 requests to b.
    assert 150 <= sent_to_b["small"] <= 250, sent_to_b
    assert 150 <= sent_to_b["unsized"] <= 250, sent_to_b


async def test_a_second_opinion_is_asked_once_per_window_length() -> None:
    balancer, clock = make_balancer(bucket_seconds=1, window_seconds=10)
    feed(balancer, G, "b", [90.0, 100.0, 110.0])
    feed(balancer, G, "a", [20.0])
    await balancer.refresh(G)
    assert AB[balancer.choose(G, AB)].id == "a"
    balancer.release(G, "a")  # the request failed on its own account: no answer, a still has one
    assert [AB[balancer.choose(G, AB)].id for _ in range(50)].count("a") == 0
    # A window length later (here its answer has left the window and a new one came), it is asked again.
    clock.advance(12.0)
    feed(balancer, G, "b", [90.0, 100.0, 110.0])
    feed(balancer, G, "a", [20.0])
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].samples == 1
    assert AB[balancer.choose(G, AB)].id == "a"


async def test_an_unsurprising_sample_changes_nothing() -> None:
    balancer, _ = make_balancer(change_detection_sigma=3.0)
    feed(balancer, G, "a", [150.0, 140.0, 160.0, 150.0])
    feed(balancer, G, "b", [60.0, 65.0, 55.0, 60.0])
    await balancer.refresh(G)
    balancer.record(G, "a", latency=1.0, output_tokens=135)
    assert balancer.estimates(G, AB)["a"].samples == 5 and not balancer._views[G].probes


async def test_request_ids_match_finishes_to_their_own_start() -> None:
    balancer, clock = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0)
    one = (Candidate("a"),)
    balancer.choose(G, one, request_id="slow")
    clock.advance(1.0)
    balancer.choose(G, one, request_id="fast")
    clock.advance(0.2)
    balancer.record(G, "a", latency=0.2, output_tokens=20, request_id="fast")
    queue = balancer._views[G].in_flight["a"]
    assert list(queue) == ["slow"] and queue["slow"][0] == T0  # the slow one is still in flight
    balancer.release(G, "a", request_id="slow")
    assert len(queue) == 0


async def test_a_finished_request_stops_counting_as_in_flight_before_its_record() -> None:
    balancer, clock = make_balancer(
        load_aware=True, in_flight_evidence=True, stall_latency_factor=0.0, end_pick_on_answer=True
    )
    one = (Candidate("a"),)
    balancer.choose(G, one, request_id="first")
    clock.advance(0.5)
    balancer.finish(G, "a", "first")  # its answer is back; LiteLLM logs it later
    balancer.finish(G, "a", "unknown")  # nothing picked under that id: nothing happens
    assert balancer.estimates(G, one)["a"].in_flight == 0
    balancer.choose(G, one, request_id="second")  # the caller's next request, before the log
    balancer.record(G, "a", latency=0.5, output_tokens=50, request_id="first")
    view = balancer._views[G]
    assert list(view.in_flight["a"]) == ["second"] and not view.finished
    # Its sample's load is the one it met and left (1, itself), not 1.5 with the next request counted.
    assert view.loads["a"].level_loads == [1.0] + [0.0] * (LoadFit.LEVELS - 1)
    balancer.release(G, "a", request_id="second")
    assert len(view.in_flight["a"]) == 0


async def test_an_answer_back_counts_in_flight_until_logged_by_default() -> None:
    balancer, _ = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0)
    one = (Candidate("a"),)
    balancer.choose(G, one, request_id="first")
    balancer.finish(G, "a", "first")
    assert list(balancer._views[G].in_flight["a"]) == ["first"]


async def test_a_finished_request_released_leaves_the_others_in_flight() -> None:
    balancer, _ = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0, end_pick_on_answer=True)
    one = (Candidate("a"),)
    balancer.choose(G, one, request_id="first")
    balancer.choose(G, one, request_id="second")
    balancer.finish(G, "a", "first")
    balancer.release(G, "a", request_id="first")  # e.g. the record found the request at fault
    assert list(balancer._views[G].in_flight["a"]) == ["second"] and not balancer._views[G].finished


async def test_routing_status_reads_the_store_alone() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    balancer, _ = make_balancer(clock)
    balancer._store = store
    feed(balancer, G, "a", [100.0, 110.0, 90.0])
    feed(balancer, G, "b", [50.0, 55.0, 45.0])
    await balancer.refresh(G)
    rows = await routing_status(store, settings(), G, ["b", "a", "unknown"])
    assert [r.deployment_id for r in rows] == ["b", "a", "unknown"]
    by_id = {r.deployment_id: r for r in rows}
    assert by_id["a"].samples == 3 and by_id["a"].mean_rate == pytest.approx(100.0)
    assert by_id["a"].std_rate == pytest.approx(8.165, rel=1e-3)
    assert by_id["unknown"].mode == "bootstrap" and by_id["a"].share == pytest.approx(1 / 3)
    two = await routing_status(store, settings(), G, ["a", "b"])
    live = balancer.weights(G, AB)
    assert {r.deployment_id: r.share for r in two} == pytest.approx(live)


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


async def test_a_failing_deployment_is_retried_once_per_failure_half_life() -> None:
    balancer, clock = make_balancer(failure_half_life_seconds=2.0, failure_window_seconds=10, bucket_seconds=1)
    feed(balancer, G, "b", [100.0] * 10)
    for _ in range(10):
        balancer.record(G, "a", latency=0.1, ok=False)
    await balancer.refresh(G)
    assert balancer.weights(G, AB)["a"] < 0.01
    view = balancer._view(G)
    view.last_attempt["a"] = clock.now
    clock.advance(1.0)
    assert [AB[balancer.choose(G, AB)].id for _ in range(20)].count("a") <= 1  # not due yet (shares only)
    view.in_flight.clear()
    view.last_attempt["a"] = clock.now
    clock.advance(2.0)
    assert AB[balancer.choose(G, AB)].id == "a"  # due: one request to see whether it recovered
    assert AB[balancer.choose(G, AB)].id == "b"  # and not another while that one is in flight


@pytest.mark.parametrize(("in_flight", "changed"), [(1, False), (4, True)])
async def test_several_late_requests_together_reveal_a_slowdown_that_one_does_not(
    in_flight: int, changed: bool
) -> None:
    balancer, clock = make_balancer(in_flight_evidence=True, stall_latency_factor=0.0, change_detection_sigma=3.0)
    feed(balancer, G, "a", [100.0, 120.0, 80.0, 100.0], latency=1.0)  # mean 100, spread ~16
    feed(balancer, G, "b", [60.0, 65.0, 55.0, 60.0], latency=1.0)
    await balancer.refresh(G)
    for _ in range(in_flight):
        balancer.choose(G, (Candidate("a"),))
    clock.advance(1.6)  # each is now a sample of at most 62.5 tok/s: 2.3 spreads low alone, 4.6 standard errors as 4
    balancer.choose(G, AB)  # decisions run the detection
    assert ("a" in balancer._views[G].changed) is changed
    assert (balancer.estimates(G, AB)["a"].samples < 4) is changed  # a change forgets the samples before it


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


@pytest.mark.parametrize(("rate", "changed"), [(200.0, False), (40.0, True)])
async def test_a_rate_its_load_explains_is_not_a_change(rate: float, changed: bool) -> None:
    # a: two slots at 200 tok/s. Its recent samples all came at load 6 (~67 tok/s), so against its window
    # alone an answer at 200 tok/s from an idle moment would look like a change; its load fit expects 200
    # at load 1. An answer at 40 tok/s at load 1 is a change all the same.
    balancer, clock = make_balancer(load_aware=True, change_detection_sigma=3.0, stall_latency_factor=0.0)
    feed(balancer, G, "a", [66.0, 68.0, 67.0, 66.5, 67.5, 66.0], latency=1.0)
    assert balancer._views[G].changed == {}
    fit = balancer._view(G).loads["a"] = LoadFit()  # as if those samples had come at load 6
    for load, sample in [(1.0, 200.0), (2.0, 195.0), (1.0, 205.0), (4.0, 100.0), (6.0, 66.7), (1.0, 198.0)] * 3:
        fit.add(clock.now, load, sample, 0.0)
    assert fit.spread() is not None
    balancer.choose(G, (Candidate("a"),))  # alone at a: load 1
    balancer.record(G, "a", latency=1.0, output_tokens=round(rate))
    assert ("a" in balancer._views[G].changed) is changed


def stuck_requests(count: int, wait: float) -> tuple[RateBalancer, float]:
    """a (mean latency 1 s, stall cut-off 2 s) and b answer; then ``count`` requests sent to a get no answer
    for ``wait`` seconds. Returns the balancer and a's share then."""
    balancer, clock = make_balancer(
        in_flight_evidence=True, stall_latency_factor=2.0, stall_min_seconds=0.1, failure_penalty=4.0
    )
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0, 95.0], latency=1.0)
    feed(balancer, G, "b", [60.0, 66.0, 54.0, 63.0, 57.0], latency=1.0)
    for _ in range(count):
        balancer.choose(G, (Candidate("a"),))
    clock.advance(wait)
    return balancer, balancer.weights(G, AB)["a"]


@pytest.mark.parametrize(
    ("count", "wait", "stalled_as_a_whole"),
    [
        (1, 2.5, True),  # stuck past the stall cut-off with no answer since
        (3, 1.2, True),  # three overdue together, no answer for a typical latency
        (2, 1.2, False),  # two overdue: not enough to tell yet
    ],
)
async def test_a_deployment_that_stopped_answering_loses_its_share(
    count: int, wait: float, stalled_as_a_whole: bool
) -> None:
    _, share = stuck_requests(count, wait)
    assert (share < 0.01) is stalled_as_a_whole, share


async def test_an_answer_ends_a_whole_stall() -> None:
    balancer, share = stuck_requests(1, 2.5)
    assert share < 0.01
    balancer.choose(G, (Candidate("a"),))
    balancer.record(G, "a", latency=1.0, output_tokens=100)  # a answers again (another request of it)
    assert balancer.weights(G, AB)["a"] > 0.2


async def test_a_whole_stall_counts_even_with_no_attempt_in_the_failure_window() -> None:
    # a's answers are older than the failure window (nothing recorded recently), then three requests sent to it
    # are overdue together with no answer: its failure share is 1 all the same.
    balancer, clock = make_balancer(
        in_flight_evidence=True, stall_latency_factor=2.0, stall_min_seconds=0.1, failure_window_seconds=5
    )
    feed(balancer, G, "a", [100.0, 110.0, 90.0, 105.0, 95.0], latency=1.0)
    feed(balancer, G, "b", [60.0, 66.0, 54.0, 63.0, 57.0], latency=1.0)
    await balancer.refresh(G)  # the samples reach the store now (write-behind: stored at sync time)
    clock.advance(20.0)
    await balancer.refresh(G)
    assert balancer.estimates(G, AB)["a"].recent_attempts == 0
    for _ in range(3):
        balancer.choose(G, (Candidate("a"),))
    clock.advance(1.2)
    assert balancer.weights(G, AB)["a"] < 0.01


def test_size_fit_learns_the_fixed_part_and_the_per_token_part() -> None:
    fit = SizeFit()
    assert fit.expected_latency(50.0) is None
    for t, work in enumerate([20.0, 60.0, 100.0, 140.0, 180.0, 40.0]):  # 0.1 s fixed + 100 tok/s
        fit.add(float(t), work, 0.1 + work / 100.0, half_life_seconds=0.0)
    assert fit.expected_latency(50.0) == pytest.approx(0.6)
    assert fit.expected_latency(300.0) == pytest.approx(3.1)
    assert fit.spread() == pytest.approx(0.0, abs=1e-9)  # each sample after the third was predicted exactly


def test_size_fit_spread_is_the_log_distance_from_the_prediction() -> None:
    fit = SizeFit()
    for t, work in enumerate([20.0, 60.0, 100.0]):
        fit.add(float(t), work, 0.1 + work / 100.0, half_life_seconds=0.0)
    for t, (work, factor) in enumerate([(50.0, 1.5), (50.0, 1 / 1.5), (50.0, 1.5)]):
        predicted = fit.expected_latency(work)
        assert predicted is not None
        fit.add(3.0 + t, work, predicted * factor, half_life_seconds=0.0)
    assert fit.spread() == pytest.approx(math.log(1.5))


def test_size_fit_of_equal_sizes_is_proportional_and_ignores_empty_samples() -> None:
    fit = SizeFit()
    fit.add(0.0, 0.0, 1.0, 0.0)  # no work: says nothing about a rate
    fit.add(0.0, 50.0, 0.0, 0.0)  # no latency: likewise
    for t in range(6):
        fit.add(float(t), 50.0, 1.0, half_life_seconds=0.0)
    assert fit.weight == 6.0
    assert fit.expected_latency(100.0) == pytest.approx(2.0)  # no spread of sizes: through the origin
    assert fit.spread() == pytest.approx(0.0)


def test_size_fit_fades_with_its_half_life() -> None:
    fit = SizeFit()
    for work in (20.0, 60.0, 100.0, 140.0):
        fit.add(0.0, work, work / 100.0, half_life_seconds=10.0)
    for work in (20.0, 60.0, 100.0, 140.0):  # 100 s later, five times slower
        fit.add(100.0, work, work / 20.0, half_life_seconds=10.0)
    predicted = fit.expected_latency(100.0)
    assert predicted is not None and predicted == pytest.approx(5.0, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "messages", "expected"),
    [
        ({"max_tokens": 40}, [{"role": "user", "content": "x" * 1000}], 40 + 1000 / 4 / 250),
        ({"max_completion_tokens": 10}, [{"role": "user", "content": [{"type": "text", "text": "y" * 400}]}], 10.4),
        ({"max_tokens": 40}, None, 40.0),
        ({}, [{"role": "user", "content": "x"}], None),
        ({"max_tokens": 0}, [], None),
        ({"max_tokens": True}, [], None),
        ({"max_tokens": "40"}, [], None),
        (None, [], None),
    ],
)
def test_request_work_is_the_output_cap_plus_the_weighted_prompt(
    kwargs: dict[str, object] | None, messages: object, expected: float | None
) -> None:
    work = request_work(messages, kwargs, 250.0)
    assert work == (pytest.approx(expected) if expected is not None else None)


async def sized_deployment(**overrides: Any) -> tuple[RateBalancer, Clock]:
    """a: 0.1 s fixed + 100 tok/s, answers of every size from 20 to 200 tokens (rates 67 to 180 tok/s, a wide
    spread of rates from size alone); b steady."""
    balancer, clock = make_balancer(
        in_flight_evidence=True, stall_latency_factor=0.0, change_detection_sigma=3.0, **overrides
    )
    for work in [20, 200, 60, 140, 100, 180, 40, 120, 80, 160] * 2:
        balancer.record(G, "a", latency=0.1 + work / 100.0, output_tokens=work)
        balancer.record(G, "b", latency=1.0, output_tokens=80)
    await balancer.refresh(G)
    assert balancer._views[G].changed == {}
    return balancer, clock


@pytest.mark.parametrize(("latency", "changed"), [(0.33, False), (0.9, True)])
async def test_a_finished_request_is_judged_against_requests_of_its_size(latency: float, changed: bool) -> None:
    # 20 tokens in 0.9 s is 22 tok/s: within three spreads of a's rates (mean ~120, spread ~37) but three
    # times what a 20-token request takes there.
    balancer, _ = await sized_deployment()
    balancer.choose(G, (Candidate("a"),), work=20.0)
    balancer.record(G, "a", latency=latency, output_tokens=20)
    assert ("a" in balancer._views[G].changed) is changed


@pytest.mark.parametrize(("work", "changed"), [(20.0, True), (None, False), (200.0, False)])
async def test_a_short_request_in_flight_is_overdue_for_its_size(work: float | None, changed: bool) -> None:
    # 1 s in flight: a 20-token request takes 0.3 s there (3.3 times late), a 200-token one 2.1 s, and one
    # of unknown size is judged by a's mean latency (1.2 s).
    balancer, clock = await sized_deployment()
    sent_at = clock.now
    balancer.choose(G, (Candidate("a"),), work=work)
    clock.advance(1.0)
    balancer.choose(G, AB)  # decisions run the detection
    view = balancer._views[G]
    assert ("a" in view.changed) is changed
    if changed:
        # The change came before the request was due (0.3 s after it was sent): samples from then on stay.
        assert view.cutoff_ms["a"] == pytest.approx((sent_at + 0.3 + view.offset) * 1000.0, abs=1.0)


@pytest.mark.parametrize(("load_aware", "changed"), [(True, False), (False, True)])
async def test_a_latency_its_load_explains_is_not_a_change_for_its_size(load_aware: bool, changed: bool) -> None:
    # a: 0.1 s + 200 tok/s at light load, two slots (peak 400 tok/s). Six requests sent together share it for
    # the whole life of the first (a load of 6, where each gets 400 / 6 = 67 tok/s instead of about 200): a
    # 100-token answer then takes 3 times the 0.6 s of light load.
    balancer, clock = make_balancer(
        load_aware=load_aware, in_flight_evidence=True, change_detection_sigma=3.0, stall_latency_factor=0.0
    )
    view = balancer._view(G)
    sizes = view.sizes["a"] = SizeFit()
    for t, work in enumerate([20.0, 200.0, 60.0, 140.0, 100.0, 180.0, 40.0, 120.0]):
        sizes.add(T0 + t, work, 0.1 + work / 200.0, 0.0)
    loads = view.loads["a"] = LoadFit()
    for load, sample in [(1.0, 200.0), (2.0, 195.0), (1.0, 205.0), (4.0, 100.0), (6.0, 66.7), (1.0, 198.0)] * 3:
        loads.add(T0, load, sample, 0.0)
    slowdown = loads.slowdown(6.0)
    assert slowdown == pytest.approx(199.5 / (400.2 / 6.0))  # light-load rate (the mean at loads <= 2) / 67
    for _ in range(6):
        balancer.choose(G, (Candidate("a"),), work=100.0)
    clock.advance(0.6 * slowdown)
    balancer.record(G, "a", latency=0.6 * slowdown, output_tokens=100)
    assert ("a" in view.changed) is changed


def two_slot_load_fit(fit: LoadFit | None = None) -> LoadFit:
    """About 200 tok/s at light load (199.5, the mean at loads <= 2) and two slots: peak 400.2 tok/s."""
    fit = fit or LoadFit()
    for load, sample in [(1.0, 200.0), (2.0, 195.0), (1.0, 205.0), (4.0, 100.0), (6.0, 66.7), (1.0, 198.0)] * 3:
        fit.add(T0, load, sample, 0.0)
    return fit


@pytest.mark.parametrize(("wait", "changed"), [(1.2, False), (4.0, True)])
async def test_a_request_in_flight_is_judged_at_the_load_it_meets_now(wait: float, changed: bool) -> None:
    # a: 0.1 s + 200 tok/s at light load, two slots. Six 100-token requests go out together (0.6 s each at
    # light load); at six in flight each takes three times as long (1.8 s), so 1.2 s in flight is not late
    # even for the first two, which met a light load when they started. 4 s is.
    balancer, clock = make_balancer(
        load_aware=True, in_flight_evidence=True, change_detection_sigma=3.0, stall_latency_factor=0.0
    )
    for work in [20, 200, 60, 140, 100, 180, 40, 120]:
        balancer.record(G, "a", latency=0.1 + work / 200.0, output_tokens=work)
        balancer.record(G, "b", latency=1.0, output_tokens=80)
    await balancer.refresh(G)
    view = balancer._view(G)
    view.loads["a"] = two_slot_load_fit()
    for _ in range(6):
        balancer.choose(G, (Candidate("a"),), work=100.0)
    clock.advance(wait)
    balancer.choose(G, AB)  # decisions run the detection
    assert ("a" in view.changed) is changed


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
