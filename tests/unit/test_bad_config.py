# ruff: noqa: E501  (the HAND table keeps one row per line: setting, bad value, expected message)
"""Bad configuration, table-driven, every component: each invalid setting fails with a message naming its
full key path (``litellm_settings.<...>``) and what is valid (the range, the allowed values, the valid keys).

Two tables:

* ``GENERATED``: one row per setting, built by walking the settings models (so a new setting gets its row
  without anyone remembering to add it): every bounded number above its maximum and below its minimum,
  every fixed-choice setting with an unknown value, every boolean with a non-boolean, every section with
  an unknown key and with a non-mapping value. The expected text comes from the declarations
  (``Field(ge=, le=)``, ``Literal[...]``), so the message is checked against what the code enforces.
* ``HAND``: the rules that are not single-field bounds (cross-field rules, names, URLs, the forms of a
  reservation), with the expected text written out.

The end-to-end row (the real proxy exits with status 78 and the message) is in tests/e2e/test_bad_requests_e2e.py.
"""

from __future__ import annotations

import types
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

from litellm_ratebalance.contracts.config import ActionSettings
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.settings import Settings, parse_settings

ROOT = "litellm_settings"


@dataclass(frozen=True)
class Row:
    path: tuple[str, ...]
    """Where the bad value goes, under ``litellm_settings``."""
    value: Any
    expected: str
    """A line of the message: ``litellm_settings.<path>: <text>``."""

    @property
    def id(self) -> str:
        return ".".join(self.path) + f"={self.value!r}"[:40]


def nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    raw: Any = value
    for key in reversed(path):
        raw = {key: raw}
    assert isinstance(raw, dict)
    return raw


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """(the type inside ``Annotated[...]`` / ``X | None``, its constraint objects)."""
    constraints: list[Any] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            inner, *meta = get_args(annotation)
            for item in meta:
                constraints.extend(getattr(item, "metadata", [item]))
            annotation = inner
            continue
        if origin in (typing.Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, constraints


def _bounds(constraints: list[Any]) -> tuple[Any, Any, bool]:
    """(low, high, low is exclusive): our settings declare ``ge``/``gt`` and ``le``."""
    low = high = None
    low_open = False
    for item in constraints:
        if getattr(item, "ge", None) is not None:
            low, low_open = item.ge, False
        elif getattr(item, "gt", None) is not None:
            low, low_open = item.gt, True
        high = getattr(item, "le", high)
    return low, high, low_open


SKIPPED_MODELS = {ActionSettings}
"""Enforcement actions are written as ``reject`` / ``{cap_max_tokens: N}`` / ``{delay: {...}}`` and turned
into this model by a validator, so their fields are not keys a user writes: covered in ``HAND``."""


def generated_rows(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[Row]:
    if model in SKIPPED_MODELS:
        return
    where = ROOT + "." + ".".join(path) if path else ROOT
    if path:
        yield Row((*path, "no_such_setting"), 1, f"{where}.no_such_setting: unknown setting; valid keys here: ")
        yield Row(path, "not-a-mapping", f"{where}: must be a mapping of settings with keys ")
    for name, field in model.model_fields.items():
        annotation, constraints = _unwrap(field.annotation)
        constraints += list(field.metadata)
        key = (*path, name)
        full = f"{ROOT}.{'.'.join(key)}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from generated_rows(annotation, key)
        elif get_origin(annotation) is dict:
            value_type, _ = _unwrap(get_args(annotation)[1])
            if isinstance(value_type, type) and issubclass(value_type, BaseModel):
                yield from generated_rows(value_type, (*key, "entry"))
        elif get_origin(annotation) is Literal:
            allowed = " or ".join(repr(choice) for choice in get_args(annotation))
            allowed = allowed.replace(" or ", ", ", len(get_args(annotation)) - 2)
            yield Row(key, "bogus", f"{full}: must be {allowed} (got 'bogus')")
        elif annotation is bool:
            yield Row(key, "maybe", f"{full}: must be true or false (got 'maybe')")
        elif annotation in (int, float):
            low, high, low_open = _bounds(constraints)
            assert low is not None and high is not None, f"{full}: a number without both bounds"
            valid = f"must be more than {low} and at most {high}" if low_open else f"must be between {low} and {high}"
            too_low = low if low_open else low - 1
            yield Row(key, high * 2 + 1, f"{full}: {valid} (got {high * 2 + 1!r})")
            yield Row(key, too_low, f"{full}: {valid} (got {too_low!r})")
            yield Row(key, "lots", f"{full}: must be {'an integer' if annotation is int else 'a number'} (got 'lots')")


GENERATED = list(generated_rows(Settings, ()))

HAND = [
    # root ratebalance
    Row(("ratebalance", "key_prefix"), "a{b", "ratebalance.key_prefix: must be 1 to 64 characters from [A-Za-z0-9_.-:]"),
    Row(("ratebalance", "redis_url"), "http://x:6379", "ratebalance.redis_url: unsupported scheme 'http' (expected redis://"),
    Row(("ratebalance",), "yes", "ratebalance: must be a mapping of settings with keys backpressure, cost, fail_mode"),
    # priority_reservation (LiteLLM's keys)
    Row(("priority_reservation", "prod"), "high", "priority_reservation.prod: must be a number or a mapping with keys type, value (got 'high')"),
    Row(("priority_reservation", "prod"), 1.5, "priority_reservation: prod: a fraction must be between 0.0 and 1.0 (got 1.5)"),
    Row(("priority_reservation", "prod"), {"type": "rps", "value": 3}, "priority_reservation.prod.type: must be 'percent', 'rpm' or 'tpm' (got 'rps')"),
    # LiteLLM would take 90 as a weight of 90 and leave every other priority almost nothing.
    Row(("priority_reservation", "prod"), {"type": "percent", "value": 90}, "priority_reservation: prod.value: a percent reservation is a fraction 0..1; did you mean 0.9? (got 90)"),
    Row(("priority_reservation", "prod"), {"type": "rpm", "value": -3}, "priority_reservation.prod.value: must be between 0.0 and 1000000000000.0 (got -3)"),
    Row(("priority_reservation", "prod"), {"type": "rpm", "valu": 3}, "priority_reservation.prod.valu: unknown setting; valid keys here: type, value"),
    Row(("priority_reservation",), {"": 0.5}, "priority_reservation: priority names must be non-empty strings of at most 256 characters"),
    Row(("priority_reservation",), ["prod"], "priority_reservation: must be a mapping (got ['prod'])"),
    Row(("priority_reservation_settings", "saturation_threshold"), "half", "priority_reservation_settings.saturation_threshold: must be a number (got 'half')"),
    # limiter
    Row(("ratebalance", "limiter", "lendable"), {"x": 0.5}, "ratebalance.limiter.lendable: names priorities not in priority_reservation: ['x']"),
    Row(("ratebalance", "limiter", "lendable", "x"), 2, "ratebalance.limiter.lendable.x: must be between 0.0 and 1.0 (got 2)"),
    Row(("ratebalance", "limiter", "window_seconds"), 1.5, "ratebalance.limiter.window_seconds: must be an integer (no fractional part) (got 1.5)"),
    # routing
    Row(("ratebalance", "routing"), {"window_seconds": 3600, "bucket_seconds": 1}, "ratebalance.routing: max(window_seconds, failure_window_seconds, 60) / bucket_seconds must be at most 1200 (got 3600 / 1); raise bucket_seconds"),
    Row(("ratebalance", "routing", "input_to_output_ratio_by_model_group"), {"m": -1}, "ratebalance.routing.input_to_output_ratio_by_model_group.m: must be more than 0.0 and at most 1000000000.0 (got -1)"),
    # traffic contracts
    Row(("ratebalance", "traffic_contracts"), {"window_seconds": 60, "counter_ttl_seconds": 30}, "ratebalance.traffic_contracts.counter_ttl_seconds: must be greater than window_seconds (60)"),
    Row(("ratebalance", "traffic_contracts", "features"), {"__basket__": {"rpm": 1}}, "ratebalance.traffic_contracts.features: a feature name may not be '__basket__'"),
    Row(("ratebalance", "traffic_contracts", "features"), {"a": {"aliases": ["b"]}, "b": {}}, "ratebalance.traffic_contracts.features: a.aliases: 'b' is itself a configured feature"),
    Row(("ratebalance", "traffic_contracts", "features", "a", "aliases"), "ai", "ratebalance.traffic_contracts.features.a.aliases: must be a list (got 'ai')"),
    Row(("ratebalance", "traffic_contracts", "enforcement", "degraded"), "explode", "ratebalance.traffic_contracts.enforcement.degraded: must be allow, reject, delay, {cap_max_tokens: N} or {delay: {...}}, got 'explode'"),
    Row(("ratebalance", "traffic_contracts", "enforcement", "degraded"), {"cap_max_tokens": 0}, "ratebalance.traffic_contracts.enforcement.degraded.cap_max_tokens: must be between 1 and"),
    Row(("ratebalance", "traffic_contracts", "enforcement", "borrowed"), {"delay": {"max_seconds": 60}}, "ratebalance.traffic_contracts.enforcement.borrowed.max_seconds: must be between 0.0 and 30.0"),
    Row(("ratebalance", "traffic_contracts", "enforcement", "borrowed"), {"min_seconds": 1, "max_seconds": 2}, "ratebalance.traffic_contracts.enforcement.borrowed: min_seconds and max_seconds go under delay: write {delay: {min_seconds: A, max_seconds: B}}"),
    Row(("ratebalance", "traffic_contracts", "enforcement", "borrowed"), {"delay": {"min_seconds": 2, "max_seconds": 1}}, "ratebalance.traffic_contracts.enforcement.borrowed: delay min_seconds (2.0) must not exceed max_seconds (1.0)"),
    # backpressure
    Row(("ratebalance", "backpressure"), {"shed_threshold": 0.9, "hard_threshold": 0.5}, "ratebalance.backpressure: shed_threshold must not exceed hard_threshold (got 0.9 > 0.5)"),
    Row(("ratebalance", "backpressure", "limit"), {"min_limit": 10, "max_limit": 5}, "ratebalance.backpressure.limit: need min_limit <= initial_limit <= max_limit"),
    Row(("ratebalance", "backpressure", "tiers"), [], "ratebalance.backpressure.tiers: list at least one tier (lowest priority first)"),
    Row(("ratebalance", "backpressure", "tiers"), ["a", "a"], "ratebalance.backpressure.tiers: each tier may appear once (repeated: ['a'])"),
    Row(("ratebalance", "backpressure", "signals", "gpu_indices"), [2000], "ratebalance.backpressure.signals.gpu_indices.0: must be between 0 and 1023 (got 2000)"),
    Row(("ratebalance", "backpressure", "signals"), {"scrape_timeout_seconds": 5}, "ratebalance.backpressure.signals: scrape_timeout_seconds must not exceed scrape_interval_seconds (got 5.0 > 1.0)"),
    Row(("ratebalance", "backpressure", "deployments", "d1", "metrics_url"), "ftp://x", "ratebalance.backpressure.deployments.d1.metrics_url: metrics_url must be an http:// or https:// URL (got 'ftp://x')"),
    Row(("ratebalance", "backpressure", "deployments", "d1", "gpu_indices"), [-1], "ratebalance.backpressure.deployments.d1.gpu_indices.0: must be between 0 and 1023 (got -1)"),
]  # fmt: skip


def message_of(row: Row) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # routing warns (not fails) on extreme greediness
        with pytest.raises(ConfigurationError) as raised:
            parse_settings(nest(row.path, row.value))
    return str(raised.value)


@pytest.mark.parametrize("row", GENERATED, ids=[row.id for row in GENERATED])
def test_every_setting_refuses_a_bad_value_with_its_key_path_and_what_is_valid(row: Row) -> None:
    message = message_of(row)
    assert message.startswith("invalid configuration:\n  ")
    assert row.expected in message


@pytest.mark.parametrize("row", HAND, ids=[row.id for row in HAND])
def test_rules_beyond_one_field_name_the_key_path(row: Row) -> None:
    message = message_of(row)
    assert f"{ROOT}.{row.expected}" in message


COMPONENTS = {
    "ratebalance (root)": ("ratebalance", "fail_mode"),
    "limiter": ("ratebalance", "limiter"),
    "routing": ("ratebalance", "routing"),
    "traffic_contracts": ("ratebalance", "traffic_contracts"),
    "backpressure": ("ratebalance", "backpressure"),
    "priority_reservation": ("priority_reservation",),
    "priority_reservation_settings": ("priority_reservation_settings",),
    "token_rate_limit_type": ("token_rate_limit_type",),
}


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_the_tables_cover_every_component(component: str) -> None:
    prefix = COMPONENTS[component]
    assert any(row.path[: len(prefix)] == prefix for row in GENERATED + HAND)


def test_every_leaf_setting_has_a_generated_row() -> None:
    """Each leaf setting of type number, choice or boolean has at least one generated row (a new setting
    of another type needs a HAND row and an entry here)."""
    covered = {row.path for row in GENERATED}
    assert len(covered) > 100
    assert ("ratebalance", "backpressure", "deployments", "entry", "queue_max_wait_seconds") in covered
    assert ("ratebalance", "routing", "bucket_seconds") in covered  # an optional bounded number


def test_all_problems_are_reported_at_once() -> None:
    raw = {
        "ratebalance": {"fail_mode": "sometimes", "limiter": {"window_seconds": 0}, "routing": {"greediness": 2}},
        "priority_reservation_settings": {"default_priority": -1},
    }
    with pytest.raises(ConfigurationError) as raised:
        parse_settings(raw)
    lines = str(raised.value).splitlines()[1:]
    assert [line.split(":", 1)[0].strip() for line in lines] == [
        "litellm_settings.ratebalance.fail_mode",
        "litellm_settings.ratebalance.limiter.window_seconds",
        "litellm_settings.ratebalance.routing.greediness",
        "litellm_settings.priority_reservation_settings.default_priority",
    ]
