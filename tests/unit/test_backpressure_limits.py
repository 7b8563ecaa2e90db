"""The adaptive concurrency limit, fed explicit RTT sequences (no clock, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litellm_ratebalance.overload.limits import GradientLimit, LimitConfig, per_token_rtt


def feed(
    limit: GradientLimit, rtts: list[float], *, start: float = 0.0, step: float = 0.1, busy: bool = True
) -> list[int]:
    """Feed samples one ``step`` apart; ``busy``: the deployment uses every slot (not app-limited)."""
    out = []
    for i, rtt in enumerate(rtts):
        out.append(limit.update(start + i * step, rtt, limit.limit if busy else 1, False))
    return out


def test_grows_while_rtt_is_stable() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=4, max_limit=100))
    history = feed(limit, [0.02] * 60)
    assert history[-1] > 4 * 2
    assert history == sorted(history)  # never shrinks on a flat RTT


def test_does_not_grow_while_app_limited() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=10))
    feed(limit, [0.02] * 50, busy=False)  # 1 of 10 slots in use: no evidence that more would be used
    assert limit.limit == 10


def test_backs_off_when_rtt_rises() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=20, max_limit=100))
    feed(limit, [0.02] * 5)
    before = limit.limit
    history = feed(limit, [0.06] * 20, start=1.0)  # per-token latency tripled: the server is queueing
    # The first sample could be an outlier (it moves the short RTT by at most 50%); from the third on, the
    # rise is sustained and the limit comes down, steadily.
    assert max(history[2:]) < before
    assert history[-1] < before / 2
    assert history[2:] == sorted(history[2:], reverse=True)


def test_a_lower_baseline_does_not_read_as_congestion() -> None:
    # The first samples were short generations whose fixed overhead inflated their per-token RTT (0.035);
    # the real no-load figure (0.021) arrives with the load. The limit must not be cut for it.
    limit = GradientLimit(LimitConfig(initial_limit=8, max_limit=100, tolerance=1.1))
    feed(limit, [0.036, 0.035, 0.037, 0.035])
    before = limit.limit
    history = feed(limit, [0.021, 0.0215, 0.021, 0.022] * 5, start=1.0)
    assert min(history) >= before
    assert limit.baseline_rtt == pytest.approx(0.021, rel=1e-3)


def test_a_lone_spike_does_not_cut_the_limit() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=10, max_limit=100, tolerance=1.1))
    feed(limit, [0.02] * 10)
    before = limit.limit
    history = feed(limit, [0.2] + [0.02] * 10, start=1.0)  # one sample 10x slower (a pause in the proxy)
    assert min(history) >= before - 1
    assert history[-1] >= before


def test_settles_near_the_knee_of_a_saturating_server() -> None:
    # Per-token latency flat up to 8 in flight, then growing linearly (throughput flat): the limit must
    # end up near tolerance x knee (9.6), not run off to max_limit nor collapse.
    limit = GradientLimit(LimitConfig(initial_limit=2, max_limit=200, tolerance=1.2, growth=1.0))
    t = 0.0
    seen = []
    for _ in range(2000):
        in_flight = limit.limit
        t += 0.05
        seen.append(limit.update(t, 0.02 * max(1.0, in_flight / 8), in_flight, False))
    assert min(seen[-500:]) >= 8 and max(seen[-500:]) <= 10


def test_no_probing_while_latency_is_above_tolerance() -> None:
    # 15% above the no-load baseline with tolerance 1.1: the limit only shrinks, it does not probe for
    # more (probing there would settle past the knee, where every extra slot slows every request down).
    limit = GradientLimit(LimitConfig(initial_limit=12, max_limit=100, tolerance=1.1))
    feed(limit, [0.02])
    above = 0
    for i in range(40):
        before = limit.estimate
        limit.update(1.0 + i * 0.1, 0.023, limit.limit, False)
        assert limit.short_rtt is not None and limit.baseline_rtt is not None
        if limit.short_rtt > 1.1 * limit.baseline_rtt:  # the smoothed latency is past tolerance
            above += 1
            assert limit.estimate < before
    assert above > 20 and limit.limit < 12


def test_overshoot_is_bounded_when_latency_lags_the_load() -> None:
    # Each sample reports the load of its request's lifetime (the last 10 samples), as a completed request
    # does: the signal lags the limit. The limit must still stay close to tolerance x knee (8.8).
    limit = GradientLimit(LimitConfig(initial_limit=8, max_limit=200, tolerance=1.1, growth=1.0))
    loads: list[int] = []
    seen = []
    for i in range(3000):
        loads.append(limit.limit)
        lifetime = loads[-10:]
        rtt = 0.02 * max(1.0, sum(lifetime) / len(lifetime) / 8)
        seen.append(limit.update(i * 0.1, rtt, limit.limit, False))
    settled = seen[-2000:]
    assert min(settled) >= 8 and max(settled) <= 10
    assert sum(settled) / len(settled) < 9.5  # (probing past tolerance averaged ~10, peaking at 11)


def test_a_drop_backs_off_once_per_cooldown() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=50, backoff_ratio=0.5, drop_cooldown_seconds=1.0))
    assert limit.update(10.0, 0.0, 50, True) == 25
    # A crash failing every request in flight: many drops at once back off once.
    for i in range(20):
        limit.update(10.0 + i * 0.01, 0.0, 50, True)
    assert limit.limit == 25
    assert limit.update(11.5, 0.0, 25, True) == 12


def test_respects_bounds() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=5, min_limit=3, max_limit=7))
    feed(limit, [0.02] * 200)
    assert limit.limit == 7
    for i in range(50):
        limit.update(100.0 + 2 * i, 0.0, 7, True)
    assert limit.limit == 3
    fresh = GradientLimit(LimitConfig(initial_limit=5, min_limit=3, max_limit=7))
    fresh.update(0.0, 0.02, 5, False)
    for i in range(50):
        fresh.update(1.0 + i, 1.0, 6, False)  # 50x slower with the slots busy: shrink, but not below min
    assert fresh.limit == 3


def test_baseline_is_relearnt_from_samples_at_no_load() -> None:
    # The server became 3x slower for good. Samples at (near) no load re-teach the baseline, so the
    # limit can grow again instead of staying pinned at its minimum.
    limit = GradientLimit(LimitConfig(initial_limit=4, min_limit=2, max_limit=64))
    feed(limit, [0.02] * 10)
    for i in range(40):
        limit.update(10.0 + i * 0.1, 0.06, 2, False)
    assert limit.baseline_rtt == pytest.approx(0.06, rel=0.05)
    history = feed(limit, [0.06] * 60, start=20.0)
    assert history[-1] > history[0]


def test_sustained_overload_moves_the_baseline_only_by_the_drift_allowance() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=10, baseline_drift_per_minute=0.01))
    limit.update(0.0, 0.02, 10, False)
    for i in range(1, 61):
        limit.update(float(i), 0.04, 10, False)  # one minute of loaded samples at twice the baseline
    assert limit.baseline_rtt == pytest.approx(0.02 * 1.01, rel=1e-3)  # compounded per sample


def test_ignores_nonsense_samples() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=5))
    for rtt in (0.0, -1.0, float("nan"), float("inf")):
        assert limit.update(1.0, rtt, 5, False) == 5
    assert limit.baseline_rtt is None


def test_rtt_is_normalised_per_output_token() -> None:
    # Same per-token speed, very different lengths: no congestion signal.
    assert per_token_rtt(40.0, 4000) == pytest.approx(per_token_rtt(0.5, 50))
    assert per_token_rtt(0.3, 0) == pytest.approx(0.3)
    limit = GradientLimit(LimitConfig(initial_limit=8, max_limit=64))
    samples = [per_token_rtt(0.5, 50) if i % 2 else per_token_rtt(40.0, 4000) for i in range(30)]
    history = feed(limit, samples)
    assert history == sorted(history)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="min_limit <= initial_limit <= max_limit"):
        LimitConfig(initial_limit=10, max_limit=5)
    with pytest.raises(ValueError, match="tolerance"):
        LimitConfig(tolerance=0.5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 5.0), st.integers(0, 300), st.booleans()),
        max_size=80,
    ),
    st.integers(1, 20),
    st.integers(0, 40),
)
def test_limit_always_within_bounds(samples: list[tuple[float, int, bool]], low: int, span: int) -> None:
    limit = GradientLimit(LimitConfig(initial_limit=low, min_limit=low, max_limit=low + span))
    for i, (rtt, inflight, dropped) in enumerate(samples):
        value = limit.update(float(i), rtt, inflight, dropped)
        assert low <= value <= low + span


def test_probing_slows_to_one_slot_per_turnover_after_the_first_back_off() -> None:
    limit = GradientLimit(LimitConfig(initial_limit=10, max_limit=100, tolerance=1.1))
    feed(limit, [0.02] * 11)
    fast = limit.estimate
    assert fast == pytest.approx(10 + 11 * 0.2)  # fast start: smoothing x growth per sample
    feed(limit, [0.05] * 3, start=2.0)  # past tolerance: backs off, the fast start is over
    feed(limit, [0.02] * 30, start=3.0)  # let the short RTT come back within tolerance
    settled = limit.estimate
    feed(limit, [0.02] * 10, start=10.0)
    # About one slot per turnover of ~10 slots (10 samples): + growth / limit per sample.
    assert limit.estimate - settled == pytest.approx(10 / settled, rel=0.15)
