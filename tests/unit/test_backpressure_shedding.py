"""The pure shedding policy: tiers, utilisation, token headroom, the decision, retry-after and advice."""

from __future__ import annotations

from typing import Any

import pytest

from litellm_ratebalance.overload.shedding import (
    DeploymentLoad,
    Reason,
    Tiers,
    TierThresholds,
    Verdict,
    advice,
    decide,
    retry_after_seconds,
    tier_slots,
    tier_threshold,
    worst_signal,
)


def verdict(
    rank: int = 0,
    n_tiers: int = 3,
    *,
    shed_threshold: float = 0.85,
    hard_threshold: float = 0.95,
    cost_tokens: int = 100,
    **kw: Any,
) -> Verdict:
    load: dict[str, Any] = {"server_signals": {}, "inflight": 0, "limit": 20}
    load.update(kw)
    return decide(TierThresholds(n_tiers, shed_threshold, hard_threshold), rank, cost_tokens, DeploymentLoad(**load))


def test_tier_thresholds_spread_from_shed_to_hard() -> None:
    assert [tier_threshold(r, 3, 0.85, 0.95) for r in range(3)] == pytest.approx([0.85, 0.90, 0.95])
    assert tier_threshold(0, 1, 0.85, 0.95) == 0.95  # a single tier is the highest
    assert [tier_slots(r, 3, 20, 0.85, 0.95) for r in range(3)] == [17, 18, 20]
    # Judged before the admission: 7 of 9 in flight is 0.78 < 0.85, so the 8th is admitted, the 9th not.
    assert tier_slots(0, 2, 9, 0.85, 0.95) == 8
    assert verdict(0, 2, inflight=7, limit=9).admitted
    assert not verdict(0, 2, inflight=8, limit=9).admitted
    # One slot stays for the tiers above; a low threshold still leaves a slot to the lower tier when idle.
    assert tier_slots(0, 2, 2, 0.85, 0.95) == 1 and tier_slots(0, 2, 1, 0.85, 0.95) == 0
    assert tier_slots(0, 2, 4, 0.1, 0.95) == 1


def test_tiers_resolve_names_and_default() -> None:
    tiers = Tiers(["batch", "default", "interactive"])
    assert tiers.rank("interactive") == 2 and tiers.is_top(2)
    assert tiers.rank(None) == 1 and tiers.rank("unknown") == 1
    assert Tiers(["low", "high"]).rank(None) == 0  # no "default" tier: unprioritised callers are lowest
    with pytest.raises(ValueError):
        Tiers([])


def test_utilisation_is_the_worst_signal() -> None:
    worst = worst_signal({"kv_cache": 0.4, "server_queue": 0.7, "gpu_memory": 0.6})
    assert worst.value == 0.7 and worst.signal == "server_queue" and worst.reason is Reason.QUEUE_OVERFLOW
    assert worst_signal({}).value == 0.0 and worst_signal({}).reason is None
    with pytest.raises(ValueError, match="unknown signal"):
        worst_signal({"temperature": 0.1})


def test_lowest_tier_is_shed_first_then_the_next_then_all() -> None:
    def admitted(u: float) -> list[bool]:
        return [verdict(rank=r, server_signals={"kv_cache": u}).admitted for r in range(3)]

    assert admitted(0.80) == [True, True, True]
    assert admitted(0.86) == [False, True, True]
    assert admitted(0.92) == [False, False, True]
    assert admitted(0.95) == [False, False, False]
    refused = verdict(rank=0, server_signals={"kv_cache": 0.86})
    assert (refused.status, refused.reason, refused.signal) == (503, Reason.MEMORY_PRESSURE, "kv_cache")


def test_reason_follows_the_worst_server_signal() -> None:
    assert verdict(server_signals={"gpu_compute": 0.99}).reason is Reason.COMPUTE_SATURATION
    assert verdict(server_signals={"server_queue": 1.5, "kv_cache": 0.9}).reason is Reason.QUEUE_OVERFLOW
    assert verdict(server_signals={"gpu_memory": 0.97}).reason is Reason.MEMORY_PRESSURE


def test_token_aware_check_counts_reservations_and_measured_cache() -> None:
    # Capacity 10 000 tokens; the lowest tier may fill 85% = 8500.
    ok = verdict(inflight=4, reserved_tokens=8000, cost_tokens=400, kv_cache_tokens=10_000)
    assert ok.admitted and ok.token_cap == 8500
    full = verdict(inflight=4, reserved_tokens=8200, cost_tokens=400, kv_cache_tokens=10_000)
    assert not full.admitted and full.reason is Reason.MEMORY_PRESSURE and full.status == 503
    assert not full.never_fits and full.completions_needed >= 1
    # The measured cache (0.84 x 10 000) says more is held than the reservations do.
    measured = verdict(reserved_tokens=1000, cost_tokens=200, kv_cache_tokens=10_000, server_signals={"kv_cache": 0.84})
    assert not measured.admitted and measured.reason is Reason.MEMORY_PRESSURE
    # The top tier still fits where the lowest does not.
    assert verdict(rank=2, inflight=4, reserved_tokens=8200, cost_tokens=400, kv_cache_tokens=10_000).admitted


def test_a_request_larger_than_the_cache_never_fits() -> None:
    huge = verdict(rank=2, cost_tokens=20_000, kv_cache_tokens=10_000)
    assert not huge.admitted and huge.never_fits
    assert advice(huge, 1, 30) == "reroute"


def test_concurrency_top_tier_fills_the_limit_lower_tiers_keep_room() -> None:
    assert verdict(rank=2, inflight=19).admitted
    at_limit = verdict(rank=2, inflight=20)
    assert (at_limit.status, at_limit.reason, at_limit.queueable) == (429, Reason.CONCURRENCY_LIMIT, True)
    assert verdict(rank=0, inflight=16).admitted  # the 17th slot of 20 is the lowest tier's last
    low = verdict(rank=0, inflight=17)
    assert (low.status, low.reason, low.queueable) == (503, Reason.COMPUTE_SATURATION, False)
    assert low.utilisation == pytest.approx(17 / 20)
    single = verdict(rank=0, n_tiers=1, inflight=20)
    assert single.reason is Reason.CONCURRENCY_LIMIT and single.status == 429


def test_retry_after_from_the_drain_rate() -> None:
    # 10 in flight, 2 s each: 5 completions per second; 12 needed -> 3 s (rounded up).
    assert retry_after_seconds(12, 10, 2.0) == 3
    assert retry_after_seconds(0.5, 10, 2.0) == 1  # at least the floor
    assert retry_after_seconds(1000, 10, 2.0, cap=30) == 30
    assert retry_after_seconds(5, 0, None) == 1  # no estimate yet


def test_advice_reroutes_long_waits() -> None:
    shed = verdict(rank=0, server_signals={"kv_cache": 0.9})
    assert advice(shed, 3, 30) == "retry"
    assert advice(shed, 30, 30) == "reroute"
