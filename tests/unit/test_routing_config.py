"""RoutingSettings: defaults, environment fallbacks (config wins), ranges, warnings."""

from __future__ import annotations

import warnings

import pytest

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.routing import RoutingSettings
from litellm_ratebalance.settings import parse_settings


@pytest.fixture(autouse=True)
def _no_algorithm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RB_LLM_CLIENT_SLIDING_WINDOW_SIZE",
        "RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO",
        "RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR",
    ):
        monkeypatch.delenv(name, raising=False)


def routing(**values: object) -> RoutingSettings:
    return parse_settings({"ratebalance": {"routing": values}}).ratebalance.routing


def test_defaults_are_the_plain_algorithms() -> None:
    s = RoutingSettings()
    assert (s.window_seconds, s.input_to_output_ratio, s.greediness) == (120, 250.0, 0.5)
    assert s.estimator == "normal" and s.refresh_interval == 1.0
    assert s.effective_bucket_seconds == 2
    assert not s.round_robin


def test_environment_variables_are_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RB_LLM_CLIENT_SLIDING_WINDOW_SIZE", "30")
    monkeypatch.setenv("RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO", "100")
    monkeypatch.setenv("RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR", "0.7")
    s = routing()
    assert (s.window_seconds, s.input_to_output_ratio, s.greediness) == (30, 100.0, 0.7)
    # The config wins over the environment.
    assert routing(greediness=0.4, window_seconds=60).greediness == 0.4
    assert routing(window_seconds=60).window_seconds == 60


@pytest.mark.parametrize(
    ("variable", "value", "text"),
    [
        ("RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR", "1.5", "must be between 0 and 1"),
        ("RB_LLM_CLIENT_SLIDING_WINDOW_SIZE", "2.5", "whole number of seconds"),
        ("RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO", "lots", "is not a number"),
        ("RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO", "0", "greater than 0"),
    ],
)
def test_bad_environment_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, text: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        routing()
    assert variable in str(info.value) and text in str(info.value)
    assert "litellm_settings.ratebalance.routing" in str(info.value)


def test_range_errors_name_the_key_path() -> None:
    with pytest.raises(ConfigurationError) as info:
        routing(greediness=1.5, exploration_share=0.9, estimator="magic")
    text = str(info.value)
    assert "litellm_settings.ratebalance.routing.greediness: must be between 0.0 and 1.0 (got 1.5)" in text
    assert "litellm_settings.ratebalance.routing.exploration_share: must be between 0.0 and 0.5" in text
    assert "litellm_settings.ratebalance.routing.estimator" in text
    with pytest.raises(ConfigurationError, match="unknown setting"):
        routing(greedyness=0.5)


def test_too_many_buckets_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="raise bucket_seconds"):
        routing(window_seconds=3600, bucket_seconds=1)
    assert routing(window_seconds=3600).effective_bucket_seconds == 60
    with pytest.raises(ConfigurationError, match="failure_window_seconds"):
        routing(window_seconds=60, failure_window_seconds=3600, bucket_seconds=1)


@pytest.mark.parametrize(("greediness", "warns"), [(0.1, True), (0.0, True), (0.2, False), (0.95, False), (0.97, True)])
def test_greediness_warnings(greediness: float, warns: bool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        routing(greediness=greediness)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert bool(messages) is warns
    if warns:
        assert ("round robin" in messages[0]) is (greediness < 0.2)


def test_round_robin_edges_and_ratio_resolution() -> None:
    with pytest.warns(UserWarning):
        assert routing(greediness=0.0).round_robin
    assert routing(window_seconds=0).round_robin
    s = routing(input_to_output_ratio=200, input_to_output_ratio_by_model_group={"g": 50})
    assert s.ratio_for("g") == 50 and s.ratio_for("h") == 200 and s.ratio_for("g", 10.0) == 10.0
    with pytest.raises(ConfigurationError, match="input_to_output_ratio_by_model_group"):
        routing(input_to_output_ratio_by_model_group={"g": 0})


def test_the_user_docs_list_every_setting() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "routing.md").read_text()
    missing = [key for key in RoutingSettings.model_fields if f"| `{key}` |" not in text]
    assert not missing, f"docs/routing.md's settings table lacks {missing}"
