"""Pure traffic-contract policy: feature resolution and trust, modes, actions, the ledger; settings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from litellm_ratebalance.contracts.policy import (
    Action,
    ContractBook,
    ContractLedger,
    ContractLimits,
    Mode,
    action_for,
    capped_max_tokens,
    classify,
    delay_seconds,
    rejection_message,
    resolve_feature,
    seconds_to_window_end,
    window_start,
)
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.settings import parse_settings

N, B, D = Mode.NORMAL, Mode.BORROWED, Mode.DEGRADED
BOOK = ContractBook(
    features={"smart-window": (2, 5000), "s2s": (10, None)},
    aliases={"ai": "smart-window", "memories": "smart-window"},
    basket_rpm=4,
    basket_tpm=10000,
)


def contracts(**raw: object):  # type: ignore[no-untyped-def]
    return parse_settings({"ratebalance": {"traffic_contracts": raw}}).ratebalance.traffic_contracts


# -- feature resolution -----------------------------------------------------------------------------------


def test_resolution_order_request_key_team_tag() -> None:
    everything: dict[str, Any] = dict(
        request_feature="s2s", key_feature="ai", team_feature="s2s", admin_tags=["memories"]
    )
    assert resolve_feature(BOOK, **everything, trust_request_feature=True).source == "request"
    assert resolve_feature(BOOK, **everything).feature == "smart-window"  # body not trusted: key next
    assert resolve_feature(BOOK, team_feature="s2s", admin_tags=["ai"]).source == "team"
    tagged = resolve_feature(BOOK, admin_tags=["prod", "memories"])
    assert (tagged.feature, tagged.source) == ("smart-window", "tag")
    assert resolve_feature(BOOK).feature == "unassigned"


def test_request_body_and_request_tags_count_only_when_trusted() -> None:
    untrusted = resolve_feature(BOOK, request_feature="s2s", request_tags=["ai"])
    assert (untrusted.feature, untrusted.source) == ("unassigned", "none")
    assert resolve_feature(BOOK, request_tags=["ai"], trust_request_feature=True).feature == "smart-window"


def test_unconfigured_names_are_skipped_not_counted() -> None:
    # A bogus name from any source neither creates a feature nor hides a later, valid source.
    result = resolve_feature(
        BOOK, request_feature="bogus", key_feature="also-bogus", team_feature="s2s", trust_request_feature=True
    )
    assert result.feature == "s2s"
    assert resolve_feature(BOOK, request_feature=42, key_feature=["ai"], trust_request_feature=True).feature == (
        "unassigned"
    )


@given(st.text(max_size=50), st.text(max_size=50), st.lists(st.text(max_size=20), max_size=5))
def test_resolved_feature_is_always_configured_or_unassigned(body: str, key: str, tags: list[str]) -> None:
    result = resolve_feature(BOOK, request_feature=body, key_feature=key, request_tags=tags, trust_request_feature=True)
    assert result.feature in {"smart-window", "s2s", "unassigned"}


# -- modes ---------------------------------------------------------------------------------------------


def test_classify_counts_the_request_itself() -> None:
    assert classify(1, 1, 1, 2, 4) is N  # the 2nd request of a 2 rpm feature is within contract
    assert classify(2, 2, 1, 2, 4) is B
    assert classify(2, 4, 1, 2, 4) is D  # basket over wins over feature over
    assert classify(0, 4, 1, None, 4) is D
    assert classify(100, 0, 1, None, None) is N  # no contract is never exceeded
    assert classify(0, 0, 1, 0, None) is B  # a zero contract allows nothing


def test_classify_oversize_rule_and_exact_fit() -> None:
    assert classify(0, 0, 9000, 5000, 10000) is N  # bigger than the whole feature contract, empty window
    assert classify(1, 1, 9000, 5000, 10000) is B
    assert classify(4000, 9000, 1000, 5000, 10000) is N  # exactly at both limits still fits


def test_windows_are_epoch_aligned() -> None:
    assert window_start(1789057680_000, 60) == 1789057680
    assert window_start(1789057739_999, 60) == 1789057680
    assert window_start(1789057740_000, 60) == 1789057740
    assert seconds_to_window_end(1789057680_000, 1789057680, 60) == 60
    assert seconds_to_window_end(1789057739_900, 1789057680, 60) == 1


def test_ledger_rejected_requests_are_not_counted() -> None:
    ledger = ContractLedger()
    limits = ContractLimits(feature_rpm=1, basket_rpm=10)
    kw = dict(now_ms=0, window_seconds=60, ttl_seconds=120, field_name="f", limits=limits, estimate_tokens=5)
    assert ledger.admit(**kw, reject_modes={B}).counted  # type: ignore[arg-type]
    refused = ledger.admit(**kw, reject_modes={B})  # type: ignore[arg-type]
    assert not refused.counted and refused.rpm_mode is B and refused.feature_requests == 1
    window = ledger.window(now_ms=0, window_start=0)
    assert window is not None and window.requests == {"f": 1, "__basket__": 1}
    assert window.in_flight == {"f": 5, "__basket__": 5}


def test_ledger_holds_a_bounded_number_of_windows() -> None:
    ledger = ContractLedger()
    for second in range(0, 3600, 7):
        ledger.admit(
            now_ms=second * 1000,
            window_seconds=10,
            ttl_seconds=20,
            field_name="f",
            limits=ContractLimits(),
            estimate_tokens=0,
        )
        assert len(ledger._windows) <= 3


# -- actions ---------------------------------------------------------------------------------------------


def test_action_per_mode_and_normal_always_allowed() -> None:
    actions = {B: Action("delay", None, 0.2, 0.6), D: Action("reject")}
    assert action_for(N, actions).kind == "allow"
    assert action_for(B, actions).kind == "delay"
    assert action_for(D, actions).kind == "reject"
    assert action_for(D, {}).kind == "allow"


def test_delay_is_jittered_within_bounds() -> None:
    action = Action("delay", None, 0.2, 0.6)
    assert delay_seconds(action, 0.0) == pytest.approx(0.2)
    assert delay_seconds(action, 0.5) == pytest.approx(0.4)
    assert delay_seconds(action, 7.0) == pytest.approx(0.6)
    assert delay_seconds(Action("allow"), 0.5) == 0.0


def test_cap_keeps_a_smaller_request_limit() -> None:
    assert capped_max_tokens(None, 256) == 256
    assert capped_max_tokens(1000, 256) == 256
    assert capped_max_tokens(100, 256) == 100
    assert capped_max_tokens(True, 256) == 256
    assert capped_max_tokens("50", 256) == 256


def test_rejection_message_names_feature_contract_and_mode() -> None:
    ledger = ContractLedger()
    limits = BOOK.limits("smart-window")
    kw = dict(now_ms=30_000, window_seconds=60, ttl_seconds=120, field_name="smart-window", limits=limits)
    for _ in range(2):
        ledger.admit(**kw, estimate_tokens=10)  # type: ignore[arg-type]
    refused = ledger.admit(**kw, estimate_tokens=10, reject_modes={B})  # type: ignore[arg-type]
    message = rejection_message("smart-window", refused, limits)
    assert message.startswith("Traffic contract exceeded for feature 'smart-window': mode borrowed")
    assert "(rpm mode: borrowed, tpm mode: normal)" in message
    assert "Contract: feature rpm 2, tpm 5000; basket rpm 4, tpm 10000." in message
    assert "This window: feature 2 requests, 20 tokens; basket 2 requests, 20 tokens." in message
    assert message.endswith("Retry after 30s.")


# -- settings --------------------------------------------------------------------------------------------


def test_settings_defaults() -> None:
    settings = contracts()
    assert (settings.window_seconds, settings.counter_ttl_seconds) == (60, 120)
    assert settings.fail_open is True and settings.trust_request_feature is False
    assert settings.enforcement.borrowed.kind == "allow" and settings.enforcement.degraded.kind == "allow"


def test_settings_action_forms() -> None:
    settings = contracts(
        enforcement={
            "borrowed": {"delay": {"min_seconds": 0.05, "max_seconds": 0.5}},
            "degraded": {"cap_max_tokens": 64},
        }
    )
    borrowed, degraded = Action.from_settings(settings.enforcement.borrowed), settings.enforcement.degraded
    assert (borrowed.kind, borrowed.min_seconds, borrowed.max_seconds) == ("delay", 0.05, 0.5)
    assert (degraded.kind, degraded.cap_max_tokens) == ("cap_max_tokens", 64)
    assert contracts(enforcement={"degraded": "reject"}).enforcement.degraded.kind == "reject"
    assert contracts(enforcement={"degraded": "delay"}).enforcement.degraded.max_seconds == 1.0


PREFIX = "litellm_settings.ratebalance.traffic_contracts"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"counter_ttl_seconds": 60}, f"{PREFIX}.counter_ttl_seconds: must be greater than window_seconds (60)"),
        ({"window_seconds": 0}, f"{PREFIX}.window_seconds: must be between 1 and 3600"),
        (
            {"features": {"a": {"aliases": ["x"]}, "b": {"aliases": ["x"]}}},
            f"{PREFIX}.features: b.aliases: 'x' is already an alias of feature 'a'",
        ),
        ({"features": {"a": {"aliases": ["b"]}, "b": {}}}, f"{PREFIX}.features: a.aliases: 'b' is itself a configured"),
        ({"features": {"a": {"aliases": ["y", "y"]}}}, f"{PREFIX}.features.a.aliases: alias 'y' is listed twice"),
        ({"features": {"__basket__": {}}}, "may not be '__basket__'"),
        ({"features": {"a": {"aliases": ["unassigned"]}}}, f"{PREFIX}.features.a.aliases: an alias may not be"),
        ({"features": {"a": {"rpm": -1}}}, f"{PREFIX}.features.a.rpm: must be between 0 and"),
        ({"basket": {"rpn": 4}}, f"{PREFIX}.basket.rpn: unknown setting; valid keys here: rpm, tpm"),
        ({"enforcement": {"degraded": "drop"}}, f"{PREFIX}.enforcement.degraded: must be allow, reject, delay"),
        ({"enforcement": {"normal": "reject"}}, f"{PREFIX}.enforcement.normal: unknown setting"),
        (
            {"enforcement": {"degraded": {"cap_max_tokens": 0}}},
            f"{PREFIX}.enforcement.degraded.cap_max_tokens: must be between 1 and",
        ),
        (
            {"enforcement": {"borrowed": {"delay": {"max_seconds": 60}}}},
            f"{PREFIX}.enforcement.borrowed.max_seconds: must be between 0.0 and 30.0",
        ),
        (
            {"enforcement": {"borrowed": {"delay": {"min_seconds": 2, "max_seconds": 1}}}},
            f"{PREFIX}.enforcement.borrowed: delay min_seconds (2.0) must not exceed max_seconds (1.0)",
        ),
    ],
)
def test_settings_errors_name_the_key_path(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        contracts(**raw)
    assert expected in str(info.value)
