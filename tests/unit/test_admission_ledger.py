"""The admission ledger and the learned output estimate, with explicit times (no store, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from litellm_ratebalance.admission.estimate import (
    DECAY_AT_SAMPLES,
    SettleBatch,
    bucket_of,
    decayed,
    estimate_from_histogram,
    reserved_output,
)
from litellm_ratebalance.admission.ledger import HEADROOM_WEIGHT, AdmissionLedger, RequestCost, next_headroom
from litellm_ratebalance.admission.policy import AdmissionLimits, RejectReason

W = 60_000


def limits(**overrides: object) -> AdmissionLimits:
    base: dict[str, object] = dict(rpm=None, tpm=1000, saturation_threshold=1.0, pool="d", pool_rpm=None, pool_tpm=None)
    base.update(overrides)
    return AdmissionLimits(**base)  # type: ignore[arg-type]


def batch(*deltas: tuple[int, str, int], samples: tuple[int, ...] = ()) -> SettleBatch:
    out = SettleBatch()
    for start, pool, tokens in deltas:
        out.add(start, pool, tokens)
    for sample in samples:
        out.learn(sample)
    return out


# -- the estimate -------------------------------------------------------------------------------------
def test_buckets_are_log_spaced_and_monotonic() -> None:
    assert bucket_of(0) == 0
    assert [bucket_of(2**k - 1) for k in range(1, 6)] == [4, 8, 12, 16, 20]
    values = [bucket_of(n) for n in range(0, 5000)]
    assert values == sorted(values)


def test_no_sample_means_no_estimate_and_the_prior_applies() -> None:
    assert estimate_from_histogram({}, 0.5) is None
    assert reserved_output(4096, None, 256) == 256
    assert reserved_output(100, None, 256) == 100  # the request's max_tokens caps the prior too


def test_constant_answers_are_estimated_exactly() -> None:
    learned = SettleBatch()
    for _ in range(7):
        learned.learn(20)
    histogram = {b: (float(c), float(s)) for b, (c, s) in learned.samples.items()}
    assert estimate_from_histogram(histogram, 0.5) == 20.0
    assert estimate_from_histogram(histogram, 0.99) == 20.0


def test_quantile_picks_the_bucket_where_the_cumulative_count_is_reached() -> None:
    learned = SettleBatch()
    for sample in [10] * 50 + [100] * 40 + [1000] * 10:
        learned.learn(sample)
    histogram = {b: (float(c), float(s)) for b, (c, s) in learned.samples.items()}
    assert estimate_from_histogram(histogram, 0.5) == 10.0  # reached exactly at the first bucket
    assert estimate_from_histogram(histogram, 0.6) == 100.0
    assert estimate_from_histogram(histogram, 0.95) == 1000.0
    assert reserved_output(400, estimate_from_histogram(histogram, 0.95), 256) == 400


def test_decay_halves_counts_and_sums_once_the_memory_is_full() -> None:
    histogram = {3: (600.0, 6000.0), 9: (400.0, 40000.0)}
    same, total = decayed(histogram, 999.0)
    assert same == histogram and total == 999.0
    halved, total = decayed(histogram, DECAY_AT_SAMPLES)
    assert halved == {3: (300.0, 3000.0), 9: (200.0, 20000.0)} and total == DECAY_AT_SAMPLES / 2
    assert estimate_from_histogram(halved, 0.5) == estimate_from_histogram(histogram, 0.5)


def test_by_default_the_estimate_is_the_mean_so_corrections_cancel_out() -> None:
    learned = SettleBatch()
    for sample in [10] * 50 + [100] * 40 + [1000] * 10:
        learned.learn(sample)
    histogram = {b: (float(c), float(s)) for b, (c, s) in learned.samples.items()}
    assert estimate_from_histogram(histogram, None) == (500 + 4000 + 10_000) / 100


@given(
    st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=200),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_the_estimate_lies_within_the_samples(samples: list[int], quantile: float | None) -> None:
    learned = SettleBatch()
    for sample in samples:
        learned.learn(sample)
    histogram = {b: (float(c), float(s)) for b, (c, s) in learned.samples.items()}
    estimate = estimate_from_histogram(histogram, quantile)
    assert estimate is not None and min(samples) <= estimate <= max(samples)


# -- the ledger ---------------------------------------------------------------------------------------
def test_a_request_reserves_its_fixed_part_plus_the_capped_estimate() -> None:
    ledger = AdmissionLedger()
    first = ledger.acquire("m", limits(), RequestCost(10, output_cap=4096, prior=256), now_ms=0, window_ms=W)
    assert first.cost_tokens == 266 and first.estimate is None
    learned = batch((0, "d", 30 - 266), samples=(20,))
    second = ledger.acquire(
        "m", limits(), RequestCost(10, output_cap=4096, prior=256), now_ms=1, window_ms=W, batch=learned
    )
    assert second.cost_tokens == 30 and second.estimate == 20.0
    assert second.counters.tokens == 60  # the first settled to its 30 before the second was decided
    capped = ledger.acquire("m", limits(), RequestCost(10, output_cap=5, prior=256), now_ms=2, window_ms=W)
    assert capped.cost_tokens == 15


def test_quick_start_serves_two_then_refuses() -> None:
    """tpm 60, answers of 30 tokens (10 prompt + 20 output), one request at a time, no max_tokens."""
    ledger = AdmissionLedger()
    lim = limits(tpm=60)
    cost = RequestCost(10, output_cap=32_768, prior=256)
    pending: SettleBatch | None = None
    outcomes = []
    for now in range(4):
        result = ledger.acquire("m", lim, cost, now_ms=now, window_ms=W, batch=pending)
        outcomes.append(result.decision.admitted)
        pending = (
            batch((result.window.start_ms, "d", 30 - result.cost_tokens), samples=(20,))
            if result.decision.admitted
            else None
        )
    assert outcomes == [True, True, False, False]


def test_overshoot_is_carried_into_the_next_window_only() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(), RequestCost(900), now_ms=0, window_ms=W)
    ledger.apply("m", batch((0, "d", 300)), 0.5)  # the answer was 300 tokens longer: 1200 of 1000
    nxt = ledger.acquire("m", limits(), RequestCost(700), now_ms=W, window_ms=W)
    assert nxt.window.carry == 200 and nxt.counters.tokens == 900 and nxt.decision.admitted
    refused = ledger.acquire("m", limits(), RequestCost(101), now_ms=W + 1, window_ms=W)
    assert refused.decision.reason is RejectReason.MODEL_TOKENS
    # A window that does not follow directly carries nothing: the idle window in between paid for it.
    ledger.apply("m", batch((W, "d", 500)), 0.5)
    later = ledger.acquire("m", limits(), RequestCost(1), now_ms=3 * W, window_ms=W)
    assert later.window.carry == 0 and later.counters.tokens == 1


def test_late_settles_of_the_previous_window_move_the_carry_both_ways() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(), RequestCost(1000), now_ms=0, window_ms=W)
    ledger.acquire("m", limits(), RequestCost(100), now_ms=W, window_ms=W)  # carry 0, tokens 100
    ledger.apply("m", batch((0, "d", 250)), 0.5)  # the previous window's answer was longer
    assert ledger.windows["m"].carry == 250 and ledger.windows["m"].counts["t"] == 350
    ledger.apply("m", batch((0, "d", -400)), 0.5)  # and another one shorter: 1000 + 250 - 400 < 1000
    assert ledger.windows["m"].carry == 0 and ledger.windows["m"].counts["t"] == 100


def test_late_settles_of_older_windows_count_only_when_positive() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(), RequestCost(10), now_ms=0, window_ms=W)
    ledger.acquire("m", limits(), RequestCost(10), now_ms=W, window_ms=W)
    ledger.acquire("m", limits(), RequestCost(10), now_ms=2 * W, window_ms=W)
    ledger.apply("m", batch((0, "d", -5)), 0.5)
    assert ledger.windows["m"].counts["t"] == 10
    ledger.apply("m", batch((0, "d", 40)), 0.5)
    assert ledger.windows["m"].counts["t"] == 50


def test_settles_without_any_window_are_dropped_but_samples_are_learned() -> None:
    ledger = AdmissionLedger()
    ledger.apply("m", batch((0, "d", 40), samples=(33,)), 0.5)
    assert "m" not in ledger.windows and ledger.estimate("m") == 33.0


def test_counters_never_go_below_zero() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(rpm=5), RequestCost(40), now_ms=0, window_ms=W)
    out = SettleBatch()
    out.add(0, "d", -1000, -1)
    ledger.apply("m", out, 0.5)
    assert ledger.windows["m"].counts == {"r": 0, "r:d": 0, "t": 0, "t:d": 0}


def test_a_batch_aggregates_by_window_and_pool() -> None:
    out = SettleBatch()
    out.add(0, "d", 10)
    out.add(0, "d", -4)
    out.add(0, "p.a", 3, -1)
    out.add(5, "d", 0)
    assert sorted(out.delta_items()) == [(0, "d", 6, 0), (0, "p.a", 3, -1)]
    other = SettleBatch()
    other.add(0, "d", 1)
    other.learn(7)
    out.merge(other)
    assert dict(((s, p), (t, r)) for s, p, t, r in out.delta_items())[(0, "d")] == (7, 0)
    assert out.samples == {bucket_of(7): [1, 7]}
    out.drop_windows_before(1)
    assert list(out.delta_items()) == []


def test_headroom_moves_part_way_towards_a_saturated_windows_overshoot_within_its_cap() -> None:
    assert HEADROOM_WEIGHT == 0.3  # the figures below
    assert next_headroom(0.0, 1200, 1000) == pytest.approx(60.0)
    assert next_headroom(100.0, 1000, 1000) == pytest.approx(100.0)  # ended at limit + 100: it was right
    assert next_headroom(100.0, 850, 1000) == pytest.approx(55.0)
    assert next_headroom(10.0, 500, 1000) == 0.0  # never negative
    assert next_headroom(0.0, 5000, 1000) == 200.0  # at most HEADROOM_CAP x tpm


def test_the_headroom_is_learned_from_the_saturated_window_before_last() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(), RequestCost(900), now_ms=0, window_ms=W)
    refused = ledger.acquire("m", limits(), RequestCost(200), now_ms=1, window_ms=W)
    assert refused.decision.reason is RejectReason.MODEL_TOKENS and refused.window.full
    ledger.apply("m", batch((0, "d", 300)), None)  # its answer outran the reservation: 1200 of 1000
    second = ledger.acquire("m", limits(), RequestCost(10), now_ms=W, window_ms=W)
    assert second.window.prev_full and second.headroom == 0.0  # corrections may still come: not yet
    third = ledger.acquire("m", limits(), RequestCost(850), now_ms=2 * W, window_ms=W)
    assert third.headroom == pytest.approx(60.0) and third.decision.admitted
    # 850 + 100 fits the tpm but not the headroom the last saturated window showed was needed.
    assert ledger.acquire("m", limits(), RequestCost(100), now_ms=2 * W + 1, window_ms=W).decision.reason is (
        RejectReason.MODEL_TOKENS
    )
    # That window ended at 850, 90 under what it admitted against (940): the headroom comes down.
    ledger.acquire("m", limits(), RequestCost(1), now_ms=3 * W, window_ms=W)
    assert ledger.acquire("m", limits(), RequestCost(1), now_ms=4 * W, window_ms=W).headroom == pytest.approx(15.0)
    # A window that was never saturated teaches nothing.
    assert ledger.acquire("m", limits(), RequestCost(1), now_ms=5 * W, window_ms=W).headroom == pytest.approx(15.0)


def test_headroom_a_pool_took_within_its_share_counts_as_admitted_against() -> None:
    # The window admitted against 1000 - 100 + 40 (reservations within their share took 40 of the headroom)
    # and ended at 1000: 60 above what it admitted against, not 100.
    assert next_headroom(100.0, 1000, 1000, taken=40.0) == pytest.approx(0.7 * 100 + 0.3 * 60)
    assert next_headroom(100.0, 1000, 1000, taken=0.0) == next_headroom(100.0, 1000, 1000)
    assert next_headroom(100.0, 1000, 1000, taken=500.0) == pytest.approx(70.0)  # never more than it kept


def test_a_pool_within_its_share_may_take_the_headroom_and_the_headroom_does_not_wind_up() -> None:
    ledger = AdmissionLedger()
    ledger.acquire("m", limits(), RequestCost(900), now_ms=0, window_ms=W)
    assert ledger.acquire("m", limits(), RequestCost(200), now_ms=1, window_ms=W).window.full
    ledger.apply("m", batch((0, "d", 300)), None)  # 1200 of 1000: the headroom becomes 60 two windows on
    ledger.acquire("m", limits(), RequestCost(10), now_ms=W, window_ms=W)
    # The docs' two teams: tpm 1000, 0.5 each, threshold 0.5.
    team_a = limits(pool="p.team_a", pool_tpm=500.0, saturation_threshold=0.5)
    team_b = limits(pool="p.team_b", pool_tpm=500.0, saturation_threshold=0.5)
    first = ledger.acquire("m", team_a, RequestCost(500), now_ms=2 * W, window_ms=W)
    assert first.decision.admitted and first.headroom == pytest.approx(60.0)
    assert ledger.acquire("m", team_b, RequestCost(350), now_ms=2 * W + 1, window_ms=W).decision.admitted
    # 950 is past what borrowing may take (940) but within team_b's share: admitted.
    within = ledger.acquire("m", team_b, RequestCost(100), now_ms=2 * W + 2, window_ms=W)
    assert within.decision.admitted and within.counters.tokens == 950
    assert within.window.headroom_taken == pytest.approx(10.0)
    # Past its share team_b borrows, and borrowing leaves the headroom free.
    past = ledger.acquire("m", team_b, RequestCost(100), now_ms=2 * W + 3, window_ms=W)
    assert past.decision.reason is RejectReason.MODEL_TOKENS and past.window.full
    ledger.apply("m", batch((2 * W, "p.team_b", 30)), None)  # the window ends at 980
    assert ledger.acquire("m", team_a, RequestCost(1), now_ms=3 * W, window_ms=W).headroom == pytest.approx(60.0)
    # It admitted against 1000 - 60 + 10 and ended 30 above that: 0.7 x 60 + 0.3 x 30.
    fifth = ledger.acquire("m", team_a, RequestCost(1), now_ms=4 * W, window_ms=W)
    assert fifth.headroom == pytest.approx(51.0)
