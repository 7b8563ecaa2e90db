"""``example_config.yaml`` is valid as is and lists every setting of every component.

The coverage check walks the settings models (``model_fields``, recursively through nested models, dicts,
lists and unions), so a setting added to any model without an example line in the file fails here. A field
counts as listed when the file sets it explicitly somewhere (pydantic's ``model_fields_set`` of the parsed
instances, so ``key: null`` counts and a default filled in by pydantic does not).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from litellm_ratebalance.cli import load_config_settings
from litellm_ratebalance.overload.config import BackpressureSettings, DeploymentOverrides
from litellm_ratebalance.settings import Settings, parse_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "example_config.yaml"
CALLBACKS = {
    "prometheus",
    "litellm_ratebalance.rate_limiter",
    "litellm_ratebalance.traffic_contracts",
    "litellm_ratebalance.backpressure",
    "litellm_ratebalance.rate_balancer",
    "litellm_ratebalance.cost",
}


def models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """Settings model classes anywhere inside a type annotation (``dict[str, X]``, ``X | None``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from models_in(arg)


def reachable_models(root: type[BaseModel]) -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    pending = [root]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            pending.extend(models_in(field.annotation))
    return seen


def instances(value: object) -> Iterator[BaseModel]:
    """Every model instance inside a parsed settings value."""
    if isinstance(value, BaseModel):
        yield value
        for name in type(value).model_fields:
            yield from instances(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from instances(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from instances(item)


def raw_config() -> dict[str, Any]:
    loaded = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def model_info_overrides(config: dict[str, Any]) -> dict[str, DeploymentOverrides]:
    found: dict[str, DeploymentOverrides] = {}
    for entry in config["model_list"]:
        info = entry.get("model_info") or {}
        if "backpressure" in info:
            found[info["id"]] = DeploymentOverrides.model_validate(info["backpressure"])
    return found


def test_example_config_is_valid_as_is() -> None:
    settings = parse_settings(load_config_settings(EXAMPLE))
    assert isinstance(settings, Settings)
    config = raw_config()
    assert set(config["litellm_settings"]["callbacks"]) == CALLBACKS
    # Per-deployment backpressure blocks validate and merge with the part's defaults and deployments.<id>.
    overrides = model_info_overrides(config)
    assert overrides, "no model_info.backpressure example"
    backpressure: BackpressureSettings = settings.ratebalance.backpressure
    for entry in config["model_list"]:
        info = entry.get("model_info") or {}
        merged = backpressure.for_deployment(info["id"], info)
        assert merged.enabled == (info["id"] in overrides or info["id"] in backpressure.deployments)


def test_every_setting_of_every_model_is_in_the_example() -> None:
    settings = parse_settings(load_config_settings(EXAMPLE))
    config = raw_config()
    listed: dict[type[BaseModel], set[str]] = defaultdict(set)
    for instance in [*instances(settings), *model_info_overrides(config).values()]:
        listed[type(instance)] |= instance.model_fields_set
    missing = sorted(
        f"{model.__name__}.{name}"
        for model in reachable_models(Settings) | {DeploymentOverrides}
        for name in model.model_fields
        if name not in listed[model]
    )
    assert not missing, f"settings without an example in {EXAMPLE.name}: {missing}"


def test_every_deployment_shows_the_routing_ratio_override_somewhere() -> None:
    ratios = [(entry.get("model_info") or {}).get("input_to_output_ratio") for entry in raw_config()["model_list"]]
    assert any(isinstance(ratio, int | float) and ratio > 0 for ratio in ratios)


def test_the_walk_sees_nested_models() -> None:
    """Guard for the coverage test itself: it reaches the models nested in dicts and unions."""
    names = {model.__name__ for model in reachable_models(Settings)}
    assert {"ReservationSpec", "FeatureContract", "ActionSettings", "DeploymentOverrides", "SignalSettings"} <= names


def test_the_demo_config_derived_from_the_example_is_valid() -> None:
    """``make demo`` runs the example's structure with its own addresses and windows; that stays valid."""
    from litellm_ratebalance.demo.config import CHAT_DEPLOYMENTS, QUOTA_GROUP, demo_config, load_example

    config = demo_config(
        load_example(EXAMPLE),
        chat_api_bases={name: f"http://127.0.0.1:{9000 + i}/v1" for i, name in enumerate(CHAT_DEPLOYMENTS)},
        local_url="http://127.0.0.1:9100",
        kv_cache_tokens=1500,
        window_seconds=10,
        deployment_rpm=20,
        quota_rpm=30,
        redis_url="redis://127.0.0.1:6379/0",
    )
    settings = parse_settings(config["litellm_settings"])
    assert settings.ratebalance.limiter.window_seconds == 10
    assert settings.ratebalance.redis_url == "redis://127.0.0.1:6379/0"
    assert [e["litellm_params"]["api_base"] for e in config["model_list"][:3]] == [
        f"http://127.0.0.1:{9000 + i}/v1" for i in range(3)
    ]
    local = next(e for e in config["model_list"] if e["model_name"] == "local")
    merged = settings.ratebalance.backpressure.for_deployment(local["model_info"]["id"], local["model_info"])
    assert merged.metrics_url == "http://127.0.0.1:9100/metrics" and merged.kv_cache_tokens == 1500
    assert any(e["model_name"] == QUOTA_GROUP for e in config["model_list"])
    assert "master_key" not in config["general_settings"]
