"""``routing: {preset: plain}``: the plain rate-balancing algorithm in one line, validated, and routing as the
reference implementation of that algorithm does; ``preset: proposal``, its former name, still works and warns."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings
from litellm_ratebalance.routing.config import PRESETS
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_reference import ReferenceBalancer
from tests.unit.routing_support import T0, Clock, candidates
from tests.unit.test_routing_parity import WEIGHT_TOLERANCE, scenario


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


def test_the_preset_sets_every_addition_off() -> None:
    s = routing(preset="plain")
    assert s.preset == "plain"
    for key, value in PRESETS["plain"].items():
        assert getattr(s, key) == value, key
    # The algorithm's own defaults stand, and its knobs stay settable beside the preset.
    assert (s.window_seconds, s.greediness, s.input_to_output_ratio) == (120, 0.5, 250.0)
    tuned = routing(preset="plain", window_seconds=60, greediness=0.7, refresh_interval=0.5)
    assert (tuned.window_seconds, tuned.greediness, tuned.refresh_interval, tuned.selection) == (60, 0.7, 0.5, "random")


def test_without_a_preset_nothing_changes() -> None:
    s = routing()
    assert s.preset is None and s.remeasure and s.selection == "least_loaded" and s.exploration_share == 0.05


def test_a_setting_the_preset_fixes_is_refused_beside_it() -> None:
    with pytest.raises(ConfigurationError) as info:
        routing(preset="plain", selection="least_loaded", exploration_share=0.1)
    text = str(info.value)
    assert "litellm_settings.ratebalance.routing" in text
    assert "preset 'plain' sets exploration_share, selection" in text


def test_an_unknown_preset_names_the_valid_one() -> None:
    with pytest.raises(ConfigurationError, match=r"routing.preset: must be 'plain'"):
        routing(preset="fast")


def test_the_former_name_proposal_is_the_plain_preset_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match=r"preset: 'proposal' is deprecated, use 'plain'"):
        former = routing(preset="proposal")
    assert former == routing(preset="plain")
    with pytest.warns(FutureWarning), pytest.raises(ConfigurationError, match=r"preset 'plain' sets selection"):
        routing(preset="proposal", selection="random")


def test_the_environment_variables_apply_with_the_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RB_LLM_CLIENT_SLIDING_WINDOW_SIZE", "30")
    monkeypatch.setenv("RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR", "0.6")
    s = routing(preset="plain")
    assert (s.window_seconds, s.greediness) == (30, 0.6)


async def test_the_preset_routes_as_the_reference_does() -> None:
    names, events = scenario(5)
    reference = ReferenceBalancer(names, window_seconds=120, ratio=250, greediness=0.5)
    clock = Clock()
    settings = RoutingSettings(preset="plain", bucket_seconds=2, refresh_interval=300.0)
    ours = RateBalancer(MemoryStore(clock=clock), settings, clock=clock, rng=random.Random(3))
    current: float | None = None
    for at, name, sample in events:
        if current is not None and at != current:
            await ours.refresh("g")
        clock.now = current = at
        reference.record(name, sample)
        latency = sample.latency
        ours.record(
            "g",
            name,
            latency=latency,
            input_tokens=sample.input_tokens,
            output_tokens=sample.output_tokens,
            ok=sample.ok,
        )
    clock.now = T0 + 210
    await ours.refresh("g")
    expected = dict(zip(names, reference.weights(clock.now), strict=True))
    got = ours.weights("g", candidates(*names))
    for name in names:
        assert got[name] == pytest.approx(expected[name], abs=WEIGHT_TOLERANCE), (name, got, expected)
    # An independent weighted draw, with no re-measuring request in between: the picks follow the weights.
    n = 4000
    picks = Counter(names[ours.choose("g", candidates(*names))] for _ in range(n))
    for name in names:
        assert picks[name] / n == pytest.approx(got[name], abs=WEIGHT_TOLERANCE)


async def test_no_re_measuring_request_under_the_preset() -> None:
    clock = Clock()
    settings = RoutingSettings(preset="plain", bucket_seconds=2, refresh_interval=300.0)
    ours = RateBalancer(MemoryStore(clock=clock), settings, clock=clock, rng=random.Random(1))
    group = (Candidate("slow"), Candidate("fast"))
    for rate in (100.0, 110.0, 90.0, 105.0):
        ours.record("g", "fast", latency=1.0, output_tokens=round(rate))
    ours.record("g", "slow", latency=1.0, output_tokens=5)  # a single answer, far below the SLA
    await ours.refresh("g")
    # With re-measuring on, "slow" (known from one answer) would get the next request as a second opinion.
    picks = [group[ours.choose("g", group)].id for _ in range(50)]
    assert picks.count("slow") == 0
    assert ours.weights("g", group)["slow"] == 0.0
