"""What a replica sees before the next sync, with explicit times: recency weighting, its own samples at once,
requests in flight (overdue ones, stalls, request ids matched to their finish) and the store-only status
accessor."""

from __future__ import annotations

import pytest

from litellm_ratebalance.routing import Candidate, RateBalancer, routing_status
from litellm_ratebalance.routing.estimator import recency_weight
from litellm_ratebalance.routing.fits import LoadFit
from litellm_ratebalance.routing.records import RateAggregate
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
