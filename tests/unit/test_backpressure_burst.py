"""The highest tier's slots past the concurrency limit (``top_burst_fraction``): the pure rule, its place in
the decision, and how the adaptive limit answers a tier that runs past it (explicit values, no clock)."""

from __future__ import annotations

import math

import pytest

from litellm_ratebalance.overload.limits import GradientLimit, LimitConfig
from litellm_ratebalance.overload.shedding import Reason, Verdict, burst_slots, decide, tier_slots


def verdict(rank: int, n_tiers: int = 2, **kw: object) -> Verdict:
    args: dict[str, object] = dict(
        rank=rank,
        n_tiers=n_tiers,
        shed_threshold=0.85,
        hard_threshold=0.95,
        server_signals={},
        inflight=0,
        limit=9,
        cost_tokens=100,
    )
    args.update(kw)
    return decide(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limit", "fraction", "slots"),
    [
        (9, 0.25, 3),  # 2.25 rounds up
        (8, 0.25, 2),  # exactly 2: no extra slot from float noise
        (1, 0.25, 1),
        (40, 0.1, 4),
        (4, 1.0, 4),
        (9, 0.0, 0),
        (9, -0.5, 0),
        (9, math.nan, 0),
        (0, 0.25, 0),
    ],
)
def test_burst_slots_are_the_fraction_of_the_limit_rounded_up(limit: int, fraction: float, slots: int) -> None:
    assert burst_slots(limit, fraction) == slots


def test_the_top_tier_takes_the_burst_slots_past_the_limit_then_waits() -> None:
    # Limit 9, 3 burst slots: the 10th to 12th top-tier requests are admitted, the 13th waits (429, queueable).
    assert verdict(1, inflight=9, top_burst=3).admitted
    assert verdict(1, inflight=11, top_burst=3).admitted
    full = verdict(1, inflight=12, top_burst=3)
    assert (full.admitted, full.status, full.reason, full.queueable) == (False, 429, Reason.CONCURRENCY_LIMIT, True)
    assert full.slots == 12  # the store's atomic slot cap is the same number
    assert full.completions_needed == 1.0
    # Without it the top tier waits at the limit.
    assert not verdict(1, inflight=9).admitted


def test_lower_tiers_never_use_the_burst_slots() -> None:
    # The low tier's cap (8 of 9 at 0.85: judged before the admission) does not move with the burst.
    assert tier_slots(0, 2, 9, 0.85, 0.95, top_burst=3) == tier_slots(0, 2, 9, 0.85, 0.95) == 8
    assert verdict(0, inflight=7, top_burst=3).admitted
    low = verdict(0, inflight=8, top_burst=3)
    assert (low.admitted, low.status, low.reason, low.slots) == (False, 503, Reason.COMPUTE_SATURATION, 8)
    # While the top tier runs past the limit, every lower tier is refused (the middle tier of three too).
    assert not verdict(0, inflight=10, top_burst=3).admitted
    assert not verdict(1, n_tiers=3, inflight=10, top_burst=3).admitted
    assert verdict(2, n_tiers=3, inflight=10, top_burst=3).admitted


def test_the_memory_checks_still_bind_a_request_past_the_limit() -> None:
    # KV cache of 1,000 tokens, the top tier's cap 950: 880 held + 100 does not fit, burst slots or not.
    short = verdict(1, inflight=10, top_burst=3, kv_cache_tokens=1000, reserved_tokens=880)
    assert (short.admitted, short.reason, short.signal) == (False, Reason.MEMORY_PRESSURE, "kv_cache")
    assert verdict(1, inflight=10, top_burst=3, kv_cache_tokens=1000, reserved_tokens=840).admitted
    # A measured KV cache at the top tier's threshold refuses it too.
    full = verdict(1, inflight=10, top_burst=3, server_signals={"kv_cache": 0.96})
    assert (full.admitted, full.reason) == (False, Reason.MEMORY_PRESSURE)


def test_a_single_tier_is_not_given_burst_slots_by_the_caller_but_decide_honours_them() -> None:
    # decide() applies what it is passed; the adapter passes 0 with one tier (everyone would be "top").
    assert verdict(0, n_tiers=1, inflight=9, top_burst=0).reason is Reason.CONCURRENCY_LIMIT
    assert verdict(0, n_tiers=1, inflight=9, top_burst=2).admitted


def _knee_server(fraction: float, samples: int) -> tuple[list[int], list[int]]:
    """A server whose per-token latency is flat (20 ms) up to 8 running and grows linearly past it, fed by
    a top tier that always fills the limit and every burst slot; (limits, requests in flight) per sample."""
    limit = GradientLimit(LimitConfig(initial_limit=2, max_limit=200, tolerance=1.1))
    limits: list[int] = []
    inflight: list[int] = []
    for i in range(samples):
        running = limit.limit + burst_slots(limit.limit, fraction)
        limits.append(limit.update(0.05 * (i + 1), 0.02 * max(1.0, running / 8), running, False))
        inflight.append(running)
    return limits, inflight


def test_running_past_the_limit_lowers_the_limit_but_does_not_collapse_it() -> None:
    # Without the burst the limit settles at tolerance x knee (8.8: 8-9). With a quarter more slots for a
    # top tier that always uses them, the latency past the knee backs the limit off until the total in flight
    # is where it was, 8-9: the burst does not run the server further past its knee, and the limit settles
    # at about tolerance x knee / 1.25 (7), not lower.
    plain_limits, plain_inflight = _knee_server(0.0, 3000)
    burst_limits, burst_inflight = _knee_server(0.25, 3000)
    assert (min(plain_limits[-1000:]), max(plain_limits[-1000:])) == (8, 9)
    assert (min(burst_limits[-1000:]), max(burst_limits[-1000:])) == (6, 7)
    assert (min(burst_inflight[-1000:]), max(burst_inflight[-1000:])) == (8, 9)
    assert max(burst_inflight[-1000:]) == max(plain_inflight[-1000:])
    # Even the whole limit again as burst leaves the limit at half the knee, not at min_limit.
    full_limits, full_inflight = _knee_server(1.0, 3000)
    assert min(full_limits[-1000:]) >= 4 and max(full_inflight[-1000:]) <= 10
