"""Change detection, with explicit times: a surprising sample drops old samples and probes the others, a
second opinion for a deployment known from one answer, exploration of small requests, retries of failing
deployments, and changes the load explains."""

from __future__ import annotations

import math

import pytest

from litellm_ratebalance.routing import Candidate, evidence
from litellm_ratebalance.routing.fits import LoadFit
from litellm_ratebalance.routing.records import RateAggregate
from tests.unit.routing_support import candidates, feed, make_balancer, served

G = "group"
AB = candidates("a", "b")


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


@pytest.mark.parametrize(("rate", "changed"), [(200.0, False), (600.0, True)])
def test_a_rate_its_load_explains_is_not_a_change(rate: float, changed: bool) -> None:
    # a: two slots at 200 tok/s, seen alone and at six in flight (67 tok/s each): its window mixes both. An
    # answer at 200 tok/s at load 1 is what its slots predict there, though far above the window's mean;
    # one at 600 is a change all the same.
    fit = LoadFit()
    window = RateAggregate()
    for t, (load, sample) in enumerate([(1.0, 200.0), (6.0, 66.7), (1.0, 198.0), (6.0, 67.5), (6.0, 65.8)] * 3):
        served(fit, float(t), load, sample)
        window.add(sample, latency=100.0 / sample)
    assert fit.slots() == pytest.approx(2.0)
    assert evidence.surprising(3.0, rate, 1.0, 100.0, 100.0 / rate, None, fit, window) is changed
