"""The pure rules that let the top tier wait for memory, keep lower tiers off what drains while it waits,
and reserve the learned output instead of max_tokens (overload/shedding.py, overload/output.py,
overload/queue.py). Explicit counts; no clock."""

from __future__ import annotations

from typing import Any

import pytest

from litellm_ratebalance.admission.estimate import DECAY_AT_SAMPLES
from litellm_ratebalance.overload.output import MIN_SAMPLES, OutputEstimate
from litellm_ratebalance.overload.queue import FairQueue
from litellm_ratebalance.overload.shedding import DeploymentLoad, Reason, TierThresholds, Verdict, decide, store_refusal

KV = 3000  # token caps: low (0.85) 2550, high (0.95) 2850


def verdict(
    rank: int,
    *,
    n_tiers: int = 2,
    shed_threshold: float = 0.85,
    hard_threshold: float = 0.95,
    cost_tokens: int = 700,
    **kw: Any,
) -> Verdict:
    load: dict[str, Any] = {
        "server_signals": {},
        "inflight": 4,
        "limit": 12,
        "reserved_tokens": 2400,
        "kv_cache_tokens": KV,
    }
    load.update(kw)
    return decide(TierThresholds(n_tiers, shed_threshold, hard_threshold), rank, cost_tokens, DeploymentLoad(**load))


def test_top_tier_short_of_memory_may_wait_lower_tier_is_shed() -> None:
    high, low = verdict(1), verdict(0)
    assert (high.admitted, high.reason, high.status, high.queueable) == (False, Reason.MEMORY_PRESSURE, 503, True)
    assert (low.admitted, low.reason, low.queueable) == (False, Reason.MEMORY_PRESSURE, False)
    assert high.count_based  # the store's token check decides it as well


def test_a_request_that_never_fits_does_not_wait() -> None:
    huge = verdict(1, cost_tokens=2900, reserved_tokens=0, inflight=0)
    assert huge.never_fits and not huge.queueable


def test_measured_memory_at_the_top_threshold_is_waited_for_when_requests_drain() -> None:
    full = verdict(1, server_signals={"kv_cache": 0.97}, reserved_tokens=1000, cost_tokens=100)
    assert (full.reason, full.signal, full.queueable) == (Reason.MEMORY_PRESSURE, "kv_cache", True)
    # Nothing in flight: nothing will drain, so waiting cannot help.
    assert not verdict(1, server_signals={"kv_cache": 0.97}, inflight=0, reserved_tokens=0).queueable
    # A compute or server-queue signal is not waited for.
    assert not verdict(1, server_signals={"server_queue": 1.0}, reserved_tokens=0).queueable


def test_lower_tiers_are_refused_while_a_higher_tier_waits() -> None:
    roomy = {"reserved_tokens": 500, "cost_tokens": 100, "inflight": 2}
    assert verdict(0, **roomy).admitted
    blocked = verdict(0, waiting_rank=1, **roomy)
    assert (blocked.admitted, blocked.status, blocked.higher_waiting, blocked.queueable) == (False, 503, True, False)
    assert not blocked.count_based  # fresher counts would not change it
    # The tighter resource names the reason: 1500 of 3000 tokens (0.5) against 2 of 12 slots (0.17)...
    assert verdict(0, waiting_rank=1, reserved_tokens=1500, cost_tokens=100, inflight=2).reason is (
        Reason.MEMORY_PRESSURE
    )
    # ...and 100 of 3000 tokens (0.03) against 6 of 12 slots (0.5).
    assert verdict(0, waiting_rank=1, reserved_tokens=100, cost_tokens=100, inflight=6).reason is (
        Reason.COMPUTE_SATURATION
    )
    # The waiting tier itself, and tiers above the waiting one, are not blocked by rule 4.
    assert verdict(1, waiting_rank=1, **roomy).admitted
    assert verdict(1, waiting_rank=0, **roomy).admitted


def test_the_store_cap_takes_measured_usage_above_the_reservations_into_account() -> None:
    # Reservations 1000, measured 0.5 x 3000 = 1500: the store may admit up to 2850 - 500 reserved tokens.
    measured = verdict(1, server_signals={"kv_cache": 0.5}, reserved_tokens=1000, cost_tokens=100)
    assert measured.admitted and measured.token_cap == 2850 and measured.lease_token_cap == 2350
    # Measured below the reservations: the reservations decide, the cap is the tier's.
    assert verdict(1, server_signals={"kv_cache": 0.1}, reserved_tokens=1000, cost_tokens=100).lease_token_cap == 2850
    assert verdict(1, kv_cache_tokens=None).lease_token_cap is None


def test_store_refusals_of_the_top_tier_wait_lower_tiers_do_not() -> None:
    fresh = verdict(1, reserved_tokens=0, cost_tokens=100)
    assert fresh.admitted
    tokens = store_refusal(fresh, tokens=True, top=True)
    assert (tokens.admitted, tokens.reason, tokens.queueable, tokens.count_based) == (
        False,
        Reason.MEMORY_PRESSURE,
        True,
        True,
    )
    slots = store_refusal(verdict(0, reserved_tokens=0, cost_tokens=100), tokens=False, top=False)
    assert (slots.reason, slots.status, slots.queueable) == (Reason.COMPUTE_SATURATION, 503, False)


def test_queue_reports_its_highest_waiting_tier() -> None:
    queue: FairQueue[str] = FairQueue(10)
    assert queue.top_rank() is None
    low = queue.push("a", client="c", rank=0, cost=1, now=0.0, max_wait=5.0)
    queue.push("b", client="c", rank=2, cost=1, now=0.0, max_wait=5.0)
    assert queue.top_rank() == 2
    assert queue.pop() is not None and queue.top_rank() == 0
    assert low is not None and queue.remove(low) and queue.top_rank() is None


def test_learned_output_replaces_max_tokens_after_enough_answers() -> None:
    estimate = OutputEstimate()
    args = {"mode": "learned", "default_output_tokens": 256}
    # Before MIN_SAMPLES answers: the default, at most max_tokens.
    assert estimate.reserve(None, **args) == 256  # type: ignore[arg-type]
    assert estimate.reserve(100, **args) == 100  # type: ignore[arg-type]
    for i in range(MIN_SAMPLES):
        estimate.learn(40 + 20 * (i % 2))  # answers of 40 and 60 tokens: mean 50
    assert estimate.estimate() == pytest.approx(50.0)
    assert estimate.reserve(2048, **args) == 50  # type: ignore[arg-type]  # max_tokens far above the answers
    assert estimate.reserve(None, **args) == 50  # type: ignore[arg-type]  # no max_tokens
    assert estimate.reserve(30, **args) == 30  # type: ignore[arg-type]  # a tighter max_tokens still caps it
    # max_tokens mode ignores what was learned.
    assert estimate.reserve(2048, mode="max_tokens", default_output_tokens=256) == 2048
    assert estimate.reserve(None, mode="max_tokens", default_output_tokens=256) == 256


def test_learned_output_follows_a_change_of_answers() -> None:
    estimate = OutputEstimate()
    for _ in range(DECAY_AT_SAMPLES):
        estimate.learn(100)
    for _ in range(3 * DECAY_AT_SAMPLES):
        estimate.learn(10)
    learned = estimate.estimate()
    assert learned is not None and learned < 20  # the old answers were halved away
    assert estimate.samples < DECAY_AT_SAMPLES


def test_lower_tiers_leave_one_typical_request_of_memory_for_the_tiers_above() -> None:
    # Without headroom the low tier may reserve up to 0.85 x 3000 = 2550 tokens.
    assert verdict(0, reserved_tokens=2000, cost_tokens=500).admitted
    # A typical request of 600 tokens: the low tier stops at 0.95 x 3000 - 600 = 2250...
    held_back = verdict(0, reserved_tokens=2000, cost_tokens=500, headroom_tokens=600)
    assert (held_back.admitted, held_back.reason, held_back.token_cap) == (False, Reason.MEMORY_PRESSURE, 2250)
    # ...so the top tier finds its 600 tokens without waiting for a low request to end.
    assert verdict(1, reserved_tokens=2250, cost_tokens=600, headroom_tokens=600).admitted
    # The headroom never lifts a tier above its own threshold, and a small one changes nothing.
    assert verdict(0, headroom_tokens=100).token_cap == 2550
    assert verdict(0, headroom_tokens=5000).token_cap == 0
