"""The top tier's reserve of slots (overload/reserve.py) and how the shedding rule applies it
(overload/shedding.py). Explicit times and counts; no clock."""

from __future__ import annotations

import math
from typing import Any

import pytest

from litellm_ratebalance.overload.reserve import RATE_WINDOW_SECONDS, TopDemand, reserve_slots
from litellm_ratebalance.overload.shedding import DeploymentLoad, Reason, TierThresholds, Verdict, decide


def verdict(
    rank: int,
    *,
    n_tiers: int = 2,
    shed_threshold: float = 0.85,
    hard_threshold: float = 0.95,
    cost_tokens: int = 100,
    **kw: Any,
) -> Verdict:
    load: dict[str, Any] = {"server_signals": {}, "inflight": 0, "limit": 9}
    load.update(kw)
    return decide(TierThresholds(n_tiers, shed_threshold, hard_threshold), rank, cost_tokens, DeploymentLoad(**load))


def test_reserve_is_the_poisson_quantile_of_the_top_tiers_requests_in_flight() -> None:
    # Poisson(6): P(X <= 5) = 0.446, P(X <= 6) = 0.606, P(X <= 8) = 0.847, P(X <= 9) = 0.916.
    assert reserve_slots(6.0, 0.5) == 6
    assert reserve_slots(6.0, 0.75) == 8
    assert reserve_slots(6.0, 0.9) == 9
    # Little demand: most of the time nothing of the top tier is in flight (P(X = 0) = e^-0.3 = 0.74).
    assert reserve_slots(0.3, 0.5) == 0 and reserve_slots(0.3, 0.9) == 1
    # Off, or no demand.
    assert reserve_slots(6.0, 0.0) == 0 and reserve_slots(0.0, 0.9) == 0 and reserve_slots(math.nan, 0.5) == 0
    # Large means: the normal approximation, about the mean at the median.
    assert reserve_slots(1000.0, 0.5) == 1000
    assert 1030 <= reserve_slots(1000.0, 0.84) <= 1033


def test_arrival_rate_is_unbiased_before_a_whole_window() -> None:
    demand = TopDemand()
    assert demand.rate(0.0) == 0.0
    demand.arrive(0.0)
    assert demand.rate(1.0) == 0.0  # one arrival is no rate
    for i in range(1, 11):  # 5 per second for 2 s: far less than the 30 s window
        demand.arrive(i * 0.2)
    assert demand.rate(2.0) == pytest.approx(5.0, rel=0.05)
    for i in range(11, 501):  # and after many windows
        demand.arrive(i * 0.2)
    assert demand.rate(100.0) == pytest.approx(5.0, rel=0.05)


def test_arrival_rate_decays_when_the_top_tier_goes_quiet() -> None:
    demand = TopDemand()
    for i in range(301):
        demand.arrive(i * 0.2)  # 5 per second until t = 60
    quiet = demand.rate(60.0 + RATE_WINDOW_SECONDS)
    assert quiet == pytest.approx(5.0 / math.e, rel=0.1)
    assert demand.rate(60.0 + 5 * RATE_WINDOW_SECONDS) < 0.05


def test_expected_in_flight_is_rate_times_service_time() -> None:
    demand = TopDemand()
    for i in range(51):
        demand.arrive(i * 0.2)  # 5 per second
    assert demand.expected_inflight(10.0) == 0.0  # no service time known
    assert demand.expected_inflight(10.0, fallback_service_seconds=1.0) == pytest.approx(5.0, rel=0.05)
    demand.served(1.2)
    assert demand.service_seconds == 1.2
    demand.served(0.2)  # smoothed: one fast answer moves the mean by a tenth of the difference
    assert demand.service_seconds == pytest.approx(1.1)
    demand.served(-1.0)  # nonsense is ignored
    assert demand.service_seconds == pytest.approx(1.1)
    assert demand.expected_inflight(10.0, fallback_service_seconds=9.0) == pytest.approx(5.5, rel=0.05)
    assert demand.reserve(10.0, 0.5) == reserve_slots(demand.expected_inflight(10.0), 0.5)


def test_lower_tiers_leave_the_reserve_less_the_top_tiers_requests_in_flight() -> None:
    # Without a reserve the low tier fills 8 of 9 slots (one always stays free).
    assert verdict(0, inflight=7).admitted
    assert not verdict(0, inflight=8).admitted
    # A reserve of 6 with nothing of the top tier in flight: the low tier stops at 3.
    assert verdict(0, inflight=2, top_reserve=6).admitted
    held = verdict(0, inflight=3, top_reserve=6)
    assert (held.admitted, held.reason, held.status, held.slots) == (False, Reason.COMPUTE_SATURATION, 503, 3)
    assert held.count_based and held.completions_needed == 1.0
    # 4 top-tier requests in flight count towards the reserve: 2 more slots stay free, so the low tier may
    # hold 3 beside them (7 in flight, the 8th refused).
    assert verdict(0, inflight=6, top_reserve=6, top_inflight=4).admitted
    assert verdict(0, inflight=7, top_reserve=6, top_inflight=4).slots == 7
    assert not verdict(0, inflight=7, top_reserve=6, top_inflight=4).admitted
    # The top tier fills its reserve and more: the one free slot of the tier rule still applies.
    assert verdict(0, inflight=7, top_reserve=6, top_inflight=7).admitted
    assert not verdict(0, inflight=8, top_reserve=6, top_inflight=7).admitted
    # A reserve as large as the limit leaves nothing to the low tier while the top tier is idle.
    assert verdict(0, top_reserve=12).slots == 0 and not verdict(0, top_reserve=12).admitted


def test_the_top_tier_ignores_its_own_reserve() -> None:
    assert verdict(1, inflight=8, top_reserve=6).admitted
    full = verdict(1, inflight=9, top_reserve=6)
    assert (full.admitted, full.reason, full.queueable, full.slots) == (False, Reason.CONCURRENCY_LIMIT, True, 9)


def test_middle_tiers_leave_the_reserve_too() -> None:
    # Three tiers: only the highest owns the reserve; the middle one is held back like the lowest.
    assert verdict(1, n_tiers=3, inflight=3, limit=10, top_reserve=6).admitted
    middle = verdict(1, n_tiers=3, inflight=4, limit=10, top_reserve=6)
    assert (middle.admitted, middle.slots) == (False, 4)
    assert not verdict(0, n_tiers=3, inflight=4, limit=10, top_reserve=6).admitted
    assert verdict(2, n_tiers=3, inflight=9, limit=10, top_reserve=6).admitted
