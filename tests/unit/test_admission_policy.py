"""The pure admission policy with explicit counts (no store, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from litellm_ratebalance.admission.policy import (
    DEFAULT_POOL,
    RejectReason,
    WindowCounters,
    build_limits,
    decide,
    effective_remaining,
    fits,
    normalised_weights,
    rate_limit_headers,
    rejection_message,
    reset_seconds,
    saturation,
)


def limits_for(priority: str | None, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(
        rpm=100,
        tpm=10_000,
        priority=priority,
        reservations={"prod": 0.6, "dev": 0.2},
        default_priority=0.25,
        saturation_threshold=0.5,
        lendable={},
        field_of={"prod": "p.prod", "dev": "p.dev"},
    )
    args.update(kw)
    return build_limits(**args)  # type: ignore[arg-type]


def test_weights_over_one_are_normalised_and_absolute_values_converted() -> None:
    assert normalised_weights({"a": 0.6, "b": 0.8}, None, None) == pytest.approx({"a": 0.6 / 1.4, "b": 0.8 / 1.4})
    assert normalised_weights({"a": {"type": "rpm", "value": 9}, "b": 0.1}, 10, None) == pytest.approx(
        {"a": 0.9, "b": 0.1}
    )
    assert normalised_weights({"a": {"type": "tpm", "value": 100}}, None, 1000) == pytest.approx({"a": 0.1})
    # An absolute reservation on a limit the model does not have reserves nothing.
    assert normalised_weights({"a": {"type": "tpm", "value": 100}}, 10, None) == {"a": 0.0}


def test_unknown_priority_uses_default_pool_with_default_weight() -> None:
    lim = limits_for("something-else")
    assert lim.pool == DEFAULT_POOL
    assert lim.pool_rpm == pytest.approx(25.0)
    assert limits_for("prod").pool_rpm == pytest.approx(60.0)


def test_no_reservations_means_model_cap_only() -> None:
    lim = limits_for(None, reservations={}, field_of={})
    assert lim.pool_rpm is None and lim.pool_tpm is None
    decision = decide(WindowCounters(requests=99, pool_requests=99), lim, 0)
    assert decision.admitted and decision.strict


def test_saturation_is_the_worse_of_requests_and_tokens() -> None:
    assert saturation(10, 9000, 100, 10_000) == pytest.approx(0.9)
    assert saturation(80, 0, 100, 10_000) == pytest.approx(0.8)
    assert saturation(5, 5, None, None) == 0.0


def test_lenient_mode_lets_a_pool_borrow_beyond_its_share() -> None:
    lim = limits_for("dev")  # dev's share: 20 requests
    decision = decide(WindowCounters(requests=40, pool_requests=40), lim, 0)
    assert decision.admitted and not decision.strict


def test_strict_mode_caps_the_pool_and_reports_pool_reason() -> None:
    lim = limits_for("dev")
    decision = decide(WindowCounters(requests=50, pool_requests=20), lim, 0)
    assert decision.strict and not decision.admitted
    assert decision.reason is RejectReason.POOL_REQUESTS
    assert decide(WindowCounters(requests=50, pool_requests=19), lim, 0).admitted


def test_model_cap_always_applies() -> None:
    lim = limits_for("prod")
    decision = decide(WindowCounters(requests=100, pool_requests=10), lim, 0)
    assert decision.reason is RejectReason.MODEL_REQUESTS
    token_decision = decide(WindowCounters(requests=1, tokens=9_990), lim, 20)
    assert token_decision.reason is RejectReason.MODEL_TOKENS


def test_the_headroom_comes_out_of_borrowing_never_out_of_a_pools_own_share() -> None:
    """The docs' two teams (tpm 1000, 0.5 each, threshold 0.5) with a learned headroom of 100."""
    teams = {"team_a": 0.5, "team_b": 0.5}
    fields = {"team_a": "p.team_a", "team_b": "p.team_b"}
    team_b = limits_for("team_b", rpm=None, tpm=1000, reservations=teams, field_of=fields)
    # team_a holds its 500, team_b 350 of its 500: 60 more keeps team_b within its share, so the room kept
    # for answers in flight (900 = 1000 - 100) does not apply to it; only the tpm does.
    within = decide(WindowCounters(requests=14, tokens=850, pool_requests=6, pool_tokens=350), team_b, 60, 100.0)
    assert within.admitted and within.strict
    assert decide(WindowCounters(tokens=940, pool_tokens=440), team_b, 60, 100.0).admitted  # to its 500, at 1000
    over_tpm = decide(WindowCounters(tokens=960, pool_tokens=400), team_b, 60, 100.0)
    assert over_tpm.reason is RejectReason.MODEL_TOKENS  # its share is within the tpm, never past it
    # Past its share (lenient, so the pool cap does not apply): borrowing, which leaves the headroom free.
    lenient_b = limits_for("team_b", rpm=None, tpm=1000, reservations=teams, field_of=fields, saturation_threshold=1.0)
    borrowing = decide(WindowCounters(tokens=850, pool_tokens=480), lenient_b, 60, 100.0)
    assert borrowing.reason is RejectReason.MODEL_TOKENS
    assert decide(WindowCounters(tokens=840, pool_tokens=480), lenient_b, 60, 100.0).admitted  # 900 exactly
    # With no reservation configured there are no shares: every request leaves the headroom free.
    alone = limits_for(None, rpm=None, tpm=1000, reservations={}, field_of={})
    assert decide(WindowCounters(tokens=850, pool_tokens=850), alone, 60, 100.0).reason is RejectReason.MODEL_TOKENS


def test_non_lendable_floor_is_held_back_from_other_pools() -> None:
    lim = limits_for("dev", lendable={"prod": 0.0}, saturation_threshold=1.0)
    # prod's floor is 60 requests; with prod unused, others can reach only 40.
    assert decide(WindowCounters(requests=39), lim, 0).admitted
    assert decide(WindowCounters(requests=40), lim, 0).reason is RejectReason.MODEL_REQUESTS
    # Once prod has used 30 of its floor, only 30 stay held.
    used = WindowCounters(requests=69, other_pools={"p.prod": (30, 0)})
    assert decide(used, lim, 0).admitted
    # prod itself is not held back by its own floor.
    prod = limits_for("prod", lendable={"prod": 0.0}, saturation_threshold=1.0)
    assert decide(WindowCounters(requests=99), prod, 0).admitted


def test_partly_lendable_floor() -> None:
    lim = limits_for("dev", lendable={"prod": 0.5}, saturation_threshold=1.0)
    assert lim.floors[0].requests == pytest.approx(30.0)


def test_oversize_request_fits_only_an_unused_limit() -> None:
    assert fits(0, 5000, 1000)
    assert not fits(1, 5000, 1000)
    assert not fits(0, 1, 0)
    assert fits(999, 1, 1000) and not fits(1000, 1, 1000)


@given(
    used=st.integers(0, 2000),
    need=st.integers(0, 5000),
    limit=st.floats(0, 3000, allow_nan=False),
)
def test_fits_never_admits_past_limit_except_into_an_empty_one(used: int, need: int, limit: float) -> None:
    if fits(used, need, limit):
        assert used + need <= limit or (used + min(need, limit) <= limit and need > limit)


def test_remaining_takes_pool_share_in_strict_mode() -> None:
    lim = limits_for("dev")
    requests, tokens = effective_remaining(WindowCounters(60, 1000, 15, 300), lim, True)
    assert requests == 5 and tokens == 2000 - 300
    requests, tokens = effective_remaining(WindowCounters(60, 1000, 15, 300), lim, False)
    assert requests == 40 and tokens == 9000


def test_messages_follow_litellm_structure() -> None:
    model_msg = rejection_message(
        model="gpt",
        priority="prod",
        reason=RejectReason.MODEL_TOKENS,
        rpm=None,
        tpm=1000,
        remaining=0,
        saturation_value=1.0,
    )
    assert model_msg == (
        "Model capacity reached for gpt. Priority: prod, Rate limit type: tokens, Model TPM: 1000, "
        "Model RPM: not configured, Remaining: 0"
    )
    pool_msg = rejection_message(
        model="gpt",
        priority="dev",
        reason=RejectReason.POOL_TOKENS,
        rpm=None,
        tpm=1000,
        remaining=0,
        saturation_value=0.528,
    )
    assert pool_msg == (
        "Priority-based rate limit exceeded. Model: gpt, Priority: dev, Rate limit type: tokens, "
        "Model TPM: 1000, Model RPM: not configured, Remaining: 0, Model saturation: 52.8%"
    )


def test_reset_and_headers() -> None:
    assert reset_seconds(1_000, 60_000) == 59
    assert reset_seconds(59_999, 60_000) == 1
    assert reset_seconds(70_000, 60_000) == 1
    lim = limits_for("dev")
    headers = rate_limit_headers(
        limits=lim,
        counters=WindowCounters(60, 1000, 15, 300),
        strict=True,
        saturation_value=0.6,
        priority_label="dev",
        now_ms=0,
        window_end_ms=12_500,
    )
    assert headers == {
        "x-litellm-priority": "dev",
        "x-litellm-saturation": "0.600",
        "x-ratelimit-limit-requests": "20",
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-requests": "13s",
        "x-ratelimit-limit-tokens": "2000",
        "x-ratelimit-remaining-tokens": "1700",
        "x-ratelimit-reset-tokens": "13s",
    }


def test_scale_limits_takes_a_share_of_every_limit_rounding_model_limits_up() -> None:
    from litellm_ratebalance.admission.policy import AdmissionLimits, Floor, scale_limits

    limits = AdmissionLimits(
        rpm=10,
        tpm=1001,
        saturation_threshold=0.8,
        pool="p.high",
        pool_rpm=6.0,
        pool_tpm=600.0,
        floors=(Floor("d", 2.0, 100.0),),
    )
    half = scale_limits(limits, 0.5)
    assert (half.rpm, half.tpm, half.pool_rpm, half.pool_tpm) == (5, 501, 3.0, 300.0)
    assert half.floors == (Floor("d", 1.0, 50.0),)
    assert half.saturation_threshold == 0.8 and half.pool == "p.high"
    assert scale_limits(limits, 1.0) is limits
    tiny = scale_limits(AdmissionLimits(1, None, 0.8, "d", None, None), 0.01)
    assert (tiny.rpm, tiny.tpm) == (1, None)
