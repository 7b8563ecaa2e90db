"""The routing core's algorithms one by one, fed explicit times (no clock, no sleeps): the in-flight book,
the windows of a sync, the sync's bucket range, the in-flight evidence, change detection and the pickers."""

from __future__ import annotations

import collections
import math
import random

import pytest

from litellm_ratebalance.routing import Candidate, RoutingSettings, changes, evidence, selection
from litellm_ratebalance.routing.estimator import DeploymentState
from litellm_ratebalance.routing.fits import LoadFit, SizeFit
from litellm_ratebalance.routing.inflight import InFlight
from litellm_ratebalance.routing.records import RateAggregate
from litellm_ratebalance.routing.snapshot import read_view, view_estimates
from litellm_ratebalance.routing.view import GroupView, SyncPlan
from litellm_ratebalance.routing.window import derive
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_support import Clock, feed, make_balancer, settings

A, B, C = Candidate("a"), Candidate("b"), Candidate("c")


def aggregate(*rates: float, failures: int = 0, latency: float = 1.0) -> RateAggregate:
    out = RateAggregate()
    for rate in rates:
        out.add(rate, latency=latency)
    for _ in range(failures):
        out.add(0.0, ok=False, latency=latency)
    return out


class Script(random.Random):
    """An rng that answers ``random()`` and ``randrange()`` from fixed lists, in order."""

    def __init__(self, uniform: list[float], ranges: list[int] | None = None) -> None:
        super().__init__(0)
        self.values = list(uniform)
        self.ranges = list(ranges or [])

    def random(self) -> float:
        return self.values.pop(0)

    def randrange(self, *args: int) -> int:  # type: ignore[override]
        return self.ranges.pop(0)


# -- the in-flight book ----------------------------------------------------------------------------------


def test_in_flight_book_gives_the_mean_load_over_a_requests_life() -> None:
    book = InFlight()
    book.add(0.0, "first")
    book.add(1.0, "second")
    # first: alone for 1 s, with second for 1 s -> mean load 1.5
    assert book.take("first", 2.0) == (0.0, 1.5, 0.0)
    # second: 1 s with first, then 2 s alone -> (2 + 2) / 3
    start, load, _ = book.take("second", 4.0) or (0.0, 0.0, 0.0)
    assert start == 1.0 and load == pytest.approx(4.0 / 3.0)
    assert book.take(None, 5.0) is None


def test_in_flight_book_without_ids_ends_the_oldest_and_forgets_lost_picks() -> None:
    book = InFlight()
    book.add(0.0, None)
    book.add(5.0, None, expected_latency=2.0)
    assert book.take(None, 6.0) is not None and len(book) == 1
    assert next(iter(book.values())) == (5.0, 5.0, 2.0)  # (start, load area then: 1 for 5 s, expected)
    book.forget_before(10.0, 20.0)
    assert not book


# -- the windows of a sync -------------------------------------------------------------------------------


def test_derive_puts_each_bucket_in_the_windows_it_ends_in() -> None:
    s = settings(window_seconds=10, bucket_seconds=1, failure_window_seconds=4, failure_half_life_seconds=2.0)
    now_ms = 100_000
    buckets = {
        99: {"a": aggregate(10.0, failures=1)},  # ends at now: every window; middle 0.5 s old
        95: {"a": aggregate(20.0)},  # ends 4 s before now: out of the 4 s failure window
        90: {"a": aggregate(30.0)},  # ends 9 s before now: in the 10 s window
        89: {"a": aggregate(40.0)},  # ends 10 s before now: out of the window, in the usage minute
        39: {"a": aggregate(50.0)},  # ends 60 s before now: out of everything
    }
    d = derive(s, buckets, now_ms)
    assert d.window["a"].count == 4 and d.window["a"].rate_sum == pytest.approx(60.0)
    assert d.recent["a"].count == 2 and d.recent["a"].failures == 1
    assert d.usage["a"].count == 5
    attempts, failures = d.failure_weights["a"]
    assert attempts == pytest.approx(2 * 0.5 ** (0.25)) and failures == pytest.approx(0.5 ** (0.25))
    assert d.expected["a"] == pytest.approx((1.0, 20.0))  # mean latency 1 s, mean work 20 tokens
    assert d.stall_after["a"] == s.stall_min_seconds


def test_derive_weighs_by_age_and_leaves_out_samples_from_before_a_change() -> None:
    s = settings(window_seconds=20, bucket_seconds=2, sample_half_life_seconds=4.0)
    buckets = {49: {"a": aggregate(10.0)}, 47: {"a": aggregate(10.0)}, 45: {"a": aggregate(10.0)}}
    d = derive(s, buckets, 100_000)
    # middles 1, 5 and 9 s old at a 4 s half-life
    assert d.window["a"].count == pytest.approx(sum(0.5 ** (age / 4.0) for age in (1.0, 5.0, 9.0)))
    after_change = derive(s, buckets, 100_000, cutoff_ms={"a": 96_000.0})  # changed 4 s ago
    assert after_change.window["a"].count == pytest.approx(0.5**0.25)
    assert after_change.usage["a"].count == 3  # usage still counts every request


def test_sync_asks_for_the_buckets_it_has_not_seen_closed() -> None:
    plan = SyncPlan(settings(window_seconds=10, bucket_seconds=1, failure_window_seconds=5))
    view = GroupView()
    assert plan.retention_buckets == 61  # usage needs the last minute
    assert plan.bucket_range(view, 100.0) == (100 - 61, 101)
    view.closed_through = 98
    view.offset = 2.0  # the store's clock is 2 s ahead
    assert plan.bucket_range(view, 100.0) == (99, 103)


async def test_status_reads_the_shares_from_one_snapshot_without_a_balancer() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    balancer, _ = make_balancer(clock)
    balancer._store = store
    feed(balancer, "g", "a", [100.0, 110.0, 90.0])
    feed(balancer, "g", "b", [50.0, 55.0, 45.0])
    await balancer.refresh("g")
    view = await read_view(store, settings(), "g", clock=clock)
    read = view_estimates(view, settings(), [A, B])
    live = balancer.estimates("g", [A, B])
    assert {d: e.share for d, e in read.items()} == pytest.approx({d: e.share for d, e in live.items()})
    assert sorted(view_estimates(view, settings())) == ["a", "b"]  # every deployment the store knows


# -- in-flight evidence ----------------------------------------------------------------------------------


def test_late_requests_are_judged_by_their_size_and_the_load_now() -> None:
    book = InFlight()
    book.add(0.0, "sized", expected_latency=2.0)  # a request of known size: 2 s at light load
    book.add(1.0, "unsized")  # judged by the deployment's mean latency
    late, earliest_due = evidence.late_requests(book, 5.0, latency=3.0, slowdown=1.0)
    assert late == [(5.0 / 2.0, 5.0, True), (4.0 / 3.0, 4.0, False)] and earliest_due == math.inf
    # Twice as slow at the load now: the sized one is due at 4 s, so only it is late at 4.5 s.
    late, _ = evidence.late_requests(book, 4.5, latency=4.0, slowdown=2.0)
    assert late == [(4.5 / 4.0, 4.5, True)]
    _, earliest_due = evidence.late_requests(book, 1.0, latency=4.0, slowdown=1.0)
    assert earliest_due == 2.0


def test_stalls_count_from_the_cut_off_and_a_whole_stall_needs_silence() -> None:
    book = InFlight()
    for start in (0.0, 1.0, 8.0):
        book.add(start, None)
    assert evidence.stalled_count(book, 0.0, stall_limit=2.0) == 2
    assert evidence.stalled_count(book, 0.0, stall_limit=None) == 0
    # Stuck requests, and no answer since the cut-off: stalled as a whole.
    assert evidence.whole_stall(2, 2.0, 0, None, last_answer=1.5, now=10.0)
    assert not evidence.whole_stall(2, 2.0, 0, None, last_answer=2.5, now=10.0)
    # Three late together, no answer for a typical latency.
    assert evidence.whole_stall(0, None, 3, 1.0, last_answer=8.5, now=10.0)
    assert not evidence.whole_stall(0, None, 2, 1.0, last_answer=8.5, now=10.0)


def test_overdue_requests_become_rate_bounds_and_whole_stalls_fail_every_attempt() -> None:
    window = aggregate(100.0, 100.0)
    overdue = evidence.overdue_window(window, [(4.0, 8.0, False), (2.0, 4.0, False)], 100.0, ceiling=None)
    assert overdue.count == 4 and overdue.rate_sum == pytest.approx(200.0 + 25.0 + 50.0)
    capped = evidence.overdue_window(RateAggregate(), [(1.5, 3.0, False)], 100.0, ceiling=30.0)
    assert capped.rate_sum == pytest.approx(30.0)
    state = DeploymentState(window, recent_attempts=4.0, recent_failures=1.0, capacity=0.8)
    partly = evidence.with_evidence(state, overdue, (0.0, 0.5), stalled=1, late=2, whole=False)
    assert (partly.recent_attempts, partly.recent_failures, partly.capacity) == (5.0, 2.0, 0.4)
    whole = evidence.with_evidence(state, overdue, (0.0, 1.0), stalled=1, late=2, whole=True)
    assert whole.recent_attempts == whole.recent_failures == 6.0


def test_configured_slots_shrink_the_share_as_they_fill() -> None:
    assert evidence.load_correction(None, 0.0, 50.0, configured_slots=4.0) == (0.0, 1.0)
    assert evidence.load_correction(None, 3.0, 50.0, configured_slots=4.0)[1] == pytest.approx(0.5)
    assert evidence.load_correction(None, 4.0, 50.0, configured_slots=4.0)[1] == 0.0
    assert evidence.load_correction(None, 9.0, 50.0) == (0.0, 1.0)  # nothing known: no correction


def test_a_finished_request_is_surprising_against_what_knows_its_spread() -> None:
    sizes = SizeFit()
    pairs = [(100.0, 1.0), (200.0, 2.1), (100.0, 0.95), (200.0, 1.9), (150.0, 1.5), (100.0, 1.05), (200.0, 2.0)]
    for t, (work, latency) in enumerate(pairs):
        sizes.add(float(t), work, latency, half_life_seconds=0.0)
    assert sizes.spread() is not None
    # A short answer that is slow only for being short is no change; one three times its size's latency is.
    assert not evidence.surprising(3.0, 10.0, 1.0, 10.0, 0.12, sizes, None, None)
    assert evidence.surprising(3.0, 33.0, 1.0, 100.0, 3.0, sizes, None, None)
    window = aggregate(100.0, 105.0, 95.0)  # no size fit: the window's mean and spread decide
    assert evidence.surprising(3.0, 50.0, 1.0, 0.0, 0.0, None, None, window)
    assert not evidence.surprising(3.0, 90.0, 1.0, 0.0, 0.0, None, None, window)
    assert not evidence.surprising(3.0, 1.0, 1.0, 0.0, 0.0, None, LoadFit(), aggregate(100.0))  # too few samples


def test_several_late_requests_show_a_slowdown_one_alone_does_not() -> None:
    window = aggregate(100.0, 100.0, 100.0, 110.0, 90.0)  # mean 100, spread at least 10
    one = [(1.25, 2.5, False)]  # bound 80: two spreads below, not three
    assert evidence.slowdown_evidence(3.0, one, 100.0, 10.0, None, window) is None
    four = [(1.25, 2.5, False)] * 4  # four together: 2 spreads over sqrt(4) standard errors each
    bound, first_due = evidence.slowdown_evidence(3.0, four, 100.0, 10.0, None, window) or (0.0, 0.0)
    assert bound == pytest.approx(80.0) and first_due == pytest.approx(10.0 - 2.5 + 2.0)
    # Sized requests are judged on log(lateness) against the size fit's spread (at least 10 %).
    assert evidence.slowdown_evidence(3.0, [(1.4, 1.4, True)], 100.0, 5.0, 0.05, None) is not None
    assert evidence.slowdown_evidence(3.0, [(1.3, 1.3, True)], 100.0, 5.0, 0.05, None) is None


# -- change detection --------------------------------------------------------------------------------------


def test_a_change_forgets_the_old_samples_once_per_half_life_and_probes_the_others() -> None:
    s = settings(sample_half_life_seconds=10.0, change_detection_sigma=3.0)
    view = GroupView()
    view.derived = derive(s, {0: {"a": aggregate(100.0), "b": aggregate(50.0)}}, 1_000)
    assert changes.changed(view, s, "a", now=100.0, since=99.0, evidence=20.0)
    assert view.cutoff_ms["a"] == 99_000.0 and view.derived.window["a"].mean == pytest.approx(20.0)
    assert view.probes == {"b"}
    assert not changes.changed(view, s, "a", now=105.0, since=104.0)  # within the half-life
    assert changes.probe(view, s, [A, B], now=105.0) == 1 and view.probes == set()


def test_a_failing_deployment_is_retried_once_per_failure_half_life() -> None:
    s = settings(failure_half_life_seconds=2.0)
    view = GroupView()
    view.derived = derive(s, {0: {"a": aggregate(failures=3), "b": aggregate(50.0)}}, 1_000)
    view.last_attempt["a"] = 10.0
    assert changes.probe(view, s, [A, B], now=11.0) is None
    assert changes.probe(view, s, [A, B], now=12.0) == 0


# -- selection ---------------------------------------------------------------------------------------------


def test_draw_follows_the_cumulative_shares() -> None:
    assert [selection.draw(Script([u]), (0.2, 0.5, 0.3)) for u in (0.1, 0.2, 0.69, 0.7, 0.999)] == [0, 1, 1, 2, 2]
    assert selection.draw(Script([0.9999999]), (0.5, 0.4999999, 0.0)) == 1  # rounding: last with a share


def test_least_loaded_scores_in_flight_per_share_and_counts_recent_failures() -> None:
    in_flight = {"a": InFlight(), "b": InFlight()}
    in_flight["a"].add(0.0, "x")
    in_flight["a"].add(0.0, "y")
    idle = [DeploymentState(aggregate(50.0))] * 3
    shares = (0.5, 0.3, 0.2)
    # a: (2 + 1) / 0.5 = 6; b: 1 / 0.3 = 3.3; c: 1 / 0.2 = 5
    assert selection.least_loaded_pick(Script([0.9]), 0.05, in_flight, {}, [A, B, C], shares, 1.0, idle) == 1
    # a failure at b counts as in flight until 3.0: b scores 6.7, c wins; after 3.0 it no longer counts.
    wasted = {"b": collections.deque([3.0])}
    assert selection.least_loaded_pick(Script([]), None, in_flight, wasted, [A, B, C], shares, 2.0, idle) == 2
    assert selection.least_loaded_pick(Script([]), None, in_flight, wasted, [A, B, C], shares, 3.0, idle) == 1
    # an exploration draw is uniform
    assert selection.least_loaded_pick(Script([0.01], [0]), 0.05, in_flight, {}, [A, B, C], shares, 1.0, idle) == 0


def test_least_loaded_with_nothing_in_flight_takes_the_best_expected_rate() -> None:
    idle = [DeploymentState(aggregate(50.0)), DeploymentState(aggregate(80.0)), DeploymentState(aggregate(90.0))]
    pick = selection.least_loaded_pick(Script([]), None, {}, {}, [A, B, C], (0.6, 0.4, 0.0), 0.0, idle)
    assert pick == 1  # c promises more but has no share
    unmeasured = [DeploymentState(aggregate(50.0)), DeploymentState(RateAggregate())]
    assert selection.best_expected_rate(unmeasured, (0.5, 0.5), fallback=0) == 0


def test_smooth_bootstrap_skips_an_unmeasured_candidate_with_a_request_out() -> None:
    in_flight = {"a": InFlight()}
    in_flight["a"].add(0.0, None)
    assert selection.bootstrap_picks({}, in_flight, [A, B], (0.5, 0.5)) == [0.0, 0.5]
    in_flight["b"] = InFlight()
    in_flight["b"].add(0.0, None)
    in_flight["b"].add(0.0, None)
    assert selection.bootstrap_picks({}, in_flight, [A, B], (0.5, 0.5)) == [1.0, 0.0]


def test_the_typical_size_is_a_running_median() -> None:
    assert selection.small_request(None, 80.0) == (True, 80.0)
    small, typical = selection.small_request(100.0, 80.0)
    assert small and typical == pytest.approx(100.0 / selection.MEDIAN_STEP)
    small, typical = selection.small_request(100.0, 120.0)
    assert not small and typical == pytest.approx(100.0 * selection.MEDIAN_STEP)
    typical = 10.0
    for work in [50.0, 150.0] * 200:  # half above 100, half below: the median settles between them
        _, typical = selection.small_request(typical, work)
    assert 50.0 <= typical <= 150.0


def test_settings_used_here_are_the_plain_algorithm() -> None:
    assert isinstance(settings(), RoutingSettings) and settings().exploration_share == 0.0
