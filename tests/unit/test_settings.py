"""Settings: defaults, LiteLLM's own keys, and errors that name the key path and the valid range."""

from __future__ import annotations

import pytest

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.settings import parse_settings


def test_defaults_match_litellm() -> None:
    settings = parse_settings({})
    prs = settings.priority_reservation_settings
    assert (prs.default_priority, prs.saturation_threshold, prs.saturation_check_cache_ttl) == (0.25, 0.5, 60)
    assert settings.ratebalance.key_prefix == "ratebalance"
    assert settings.ratebalance.fail_mode == "open"
    assert settings.ratebalance.limiter.window_seconds == 60
    assert settings.effective_token_type == "total"


def test_litellm_reservation_forms_are_accepted() -> None:
    settings = parse_settings(
        {"priority_reservation": {"prod": 0.9, "dev": {"type": "rpm", "value": 1}, "x": {"type": "tpm", "value": 5}}}
    )
    assert settings.reservation_values() == {
        "prod": 0.9,
        "dev": {"type": "rpm", "value": 1.0},
        "x": {"type": "tpm", "value": 5.0},
    }


def test_a_percent_reservation_is_a_fraction() -> None:
    settings = parse_settings({"priority_reservation": {"prod": {"type": "percent", "value": 0.9}, "dev": 0.1}})
    assert settings.reservation_values()["prod"] == {"type": "percent", "value": 0.9}
    with pytest.raises(
        ConfigurationError, match=r"prod\.value: a percent reservation is a fraction 0\.\.1; did you mean 0\.9\?"
    ):
        parse_settings({"priority_reservation": {"prod": {"type": "percent", "value": 90}, "dev": 0.1}})


def test_pydantic_object_from_litellm_is_read() -> None:
    from litellm.types.utils import PriorityReservationSettings

    settings = parse_settings({"priority_reservation_settings": PriorityReservationSettings(saturation_threshold=0.8)})
    assert settings.priority_reservation_settings.saturation_threshold == 0.8


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"ratebalance": {"limiter": {"window_seconds": 0}}},
            "ratebalance.limiter.window_seconds: must be between 1 and 3600",
        ),
        (
            {"ratebalance": {"limiter": {"lendable": {"prod": 2}}}, "priority_reservation": {"prod": 0.5}},
            "ratebalance.limiter.lendable.prod: must be between 0.0 and 1.0",
        ),
        (
            {"ratebalance": {"limiter": {"lendable": {"ghost": 0}}}},
            "ratebalance.limiter.lendable: names priorities not in priority_reservation",
        ),
        (
            {"ratebalance": {"fail_mode": "sometimes"}},
            "ratebalance.fail_mode: must be 'open', 'closed' or 'local' (got 'sometimes')",
        ),
        ({"ratebalance": {"limitr": {}}}, "ratebalance.limitr: unknown setting; valid keys here:"),
        ({"priority_reservation": {"prod": 1.5}}, "a fraction must be between 0.0 and 1.0"),
        ({"priority_reservation": {"prod": {"type": "rps", "value": 1}}}, "priority_reservation.prod"),
        (
            {"priority_reservation_settings": {"saturation_threshold": 1.2}},
            "priority_reservation_settings.saturation_threshold: must be between 0.0 and 1.0",
        ),
        ({"token_rate_limit_type": "both"}, "token_rate_limit_type"),
        ({"ratebalance": {"key_prefix": "a{b}"}}, "ratebalance.key_prefix"),
    ],
)
def test_bad_values_name_key_path_and_range(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_settings(raw)
    assert expected in str(info.value)
    assert "litellm_settings." in str(info.value)
