"""Backpressure settings: validation messages and the merge of defaults, deployments and model_info."""

from __future__ import annotations

import pytest

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.overload.config import BackpressureSettings
from litellm_ratebalance.settings import parse_settings


def backpressure(raw: dict[str, object]) -> BackpressureSettings:
    return parse_settings({"ratebalance": {"backpressure": raw}}).ratebalance.backpressure


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"shed_threshold": 0.99}, "shed_threshold must not exceed hard_threshold (got 0.99 > 0.95)"),
        ({"hard_threshold": 1.5}, "backpressure.hard_threshold: must be between 0.0 and 1.0 (got 1.5)"),
        ({"tiers": []}, "backpressure.tiers: list at least one tier"),
        ({"tiers": ["a", "b", "a"]}, "each tier may appear once (repeated: ['a'])"),
        ({"limit": {"min_limit": 10}}, "need min_limit <= initial_limit <= max_limit (got 10, 8, 256)"),
        ({"queue": {"max_wait_seconds": 0}}, "queue.max_wait_seconds: must be between 0.01 and 600.0 (got 0)"),
        ({"top_reserve_quantile": 1.0}, "backpressure.top_reserve_quantile: must be between 0.0 and 0.99 (got 1.0)"),
        ({"kv_headroom_requests": -1}, "backpressure.kv_headroom_requests: must be between 0.0 and 100.0 (got -1)"),
        ({"signals": {"scrape_timeout_seconds": 5}}, "must not exceed scrape_interval_seconds"),
        ({"deployments": {"d": {"metrics_url": "gpu1:8000"}}}, "metrics_url must be an http:// or https:// URL"),
        ({"shed_treshold": 0.8}, "backpressure.shed_treshold: unknown setting; valid keys here:"),
    ],
)
def test_bad_settings_name_the_key_and_the_range(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        backpressure(raw)
    assert message in str(info.value)


def test_model_info_overrides_deployments_which_override_defaults() -> None:
    settings = backpressure(
        {
            "kv_cache_tokens": 1000,
            "queue": {"enabled": True},
            "deployments": {"gpu1": {"max_limit": 32, "kv_cache_tokens": 2000, "server": "tgi"}},
        }
    )
    config = settings.for_deployment("gpu1", {"id": "gpu1", "backpressure": {"kv_cache_tokens": 3000}})
    assert (config.kv_cache_tokens, config.max_limit, config.server, config.queue_enabled) == (3000, 32, "tgi", True)
    other = settings.for_deployment("gpu2", {"id": "gpu2"})
    assert (other.kv_cache_tokens, other.max_limit, other.server) == (1000, 256, "auto")


def test_bad_model_info_names_the_deployment_and_key() -> None:
    settings = backpressure({})
    with pytest.raises(ConfigurationError) as info:
        settings.for_deployment("gpu1", {"backpressure": {"max_limit": 0, "colour": "red"}})
    text = str(info.value)
    assert "deployment 'gpu1': model_info.backpressure.max_limit: must be between 1 and 100000 (got 0)" in text
    assert "deployment 'gpu1': model_info.backpressure.colour: unknown setting" in text
    with pytest.raises(ConfigurationError, match="need min_limit <= initial_limit <= max_limit after overrides"):
        settings.for_deployment("gpu1", {"backpressure": {"max_limit": 4}})


def test_only_configured_deployments_are_managed_unless_all_deployments() -> None:
    settings = backpressure({"deployments": {"gpu2": {"max_limit": 8}}})
    assert not settings.for_deployment("cloud", {"id": "cloud"}).enabled  # e.g. a provider beside your GPUs
    assert settings.for_deployment("gpu1", {"id": "gpu1", "backpressure": {}}).enabled
    assert settings.for_deployment("gpu2", {"id": "gpu2"}).enabled
    assert not settings.for_deployment("gpu3", {"backpressure": {"enabled": False}}).enabled
    everything = backpressure({"all_deployments": True})
    assert everything.for_deployment("cloud", {"id": "cloud"}).enabled
    assert not backpressure({"enabled": False}).for_deployment("gpu1", {"backpressure": {}}).enabled
