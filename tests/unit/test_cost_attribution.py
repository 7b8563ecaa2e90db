"""The pure core of cost attribution, with explicit times: the sharing integral, shares, decay, labels."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from litellm_ratebalance.attribution import (
    CostLabels,
    Efficiency,
    Mark,
    SharingClock,
    TeamLabels,
    advance,
    cost_labels,
    decayed,
    gpu_share,
)
from litellm_ratebalance.attribution.config import CostSettings
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import MemoryStore
from litellm_ratebalance.store.metering import MeterEnd, MeterStart


def test_a_new_clock_starts_an_epoch_at_now_with_nothing_integrated() -> None:
    assert advance(None, 5_000, 1) == SharingClock(epoch_ms=5_000, at_ms=5_000, inflight=1, integral=0.0)


def test_each_interval_is_divided_by_the_count_that_held_during_it() -> None:
    clock = advance(None, 0, 1)  # A starts alone
    clock = advance(clock, 1_000, 2)  # 1 s alone; B joins
    assert clock.integral == pytest.approx(1.0)
    clock = advance(clock, 3_000, 1)  # 2 s shared by two; A leaves
    assert clock.integral == pytest.approx(2.0)
    clock = advance(clock, 4_000, 0)  # 1 s with B alone; B leaves
    assert clock.integral == pytest.approx(3.0)
    idle = advance(clock, 9_000, 0)  # idle: nothing is charged to anyone
    assert idle.integral == pytest.approx(3.0) and idle.at_ms == 9_000


def test_shares_add_up_to_the_busy_time() -> None:
    # A: 0..3 s, B: 1..4 s, C: 2..2.5 s on one deployment; busy 0..4 s.
    events = [(0, "A", +1), (1_000, "B", +1), (2_000, "C", +1), (2_500, "C", -1), (3_000, "A", -1), (4_000, "B", -1)]
    clock: SharingClock | None = None
    inflight = 0
    starts: dict[str, Mark] = {}
    shares: dict[str, float] = {}
    for at, who, change in events:
        inflight += change
        clock = advance(clock, at, inflight)
        mark = Mark(clock.epoch_ms, clock.integral)
        if change > 0:
            starts[who] = mark
        else:
            share = gpu_share(starts[who], mark, 1.0)
            assert share is not None
            shares[who] = share
    assert sum(shares.values()) == pytest.approx(4.0)
    # A: 1 s alone, 1 s of two, 0.5 s of three, 0.5 s of two.
    assert shares["A"] == pytest.approx(1.0 + 0.5 + 0.5 / 3 + 0.25)
    assert shares["C"] == pytest.approx(0.5 / 3)


def test_time_never_runs_back() -> None:
    clock = advance(advance(None, 1_000, 1), 2_000, 1)
    earlier = advance(clock, 1_500, 2)
    assert earlier.integral == clock.integral and earlier.at_ms == 2_000 and earlier.inflight == 2


def test_a_share_scales_with_gpus_and_needs_one_epoch() -> None:
    assert gpu_share(Mark(7, 1.0), Mark(7, 3.5), 8) == pytest.approx(20.0)
    assert gpu_share(Mark(7, 1.0), Mark(9, 3.5), 8) is None  # the integral restarted in between
    assert gpu_share(Mark(7, 3.0), Mark(7, 2.0), 1) == 0.0


def test_decay_and_efficiency() -> None:
    assert decayed(8.0, 20.0, 10.0) == pytest.approx(2.0)
    assert decayed(8.0, -5.0, 10.0) == 8.0
    assert Efficiency(0.5, 2_000).per_1k_output_tokens() == pytest.approx(0.25)
    assert Efficiency(0.5, 0).per_1k_output_tokens() is None


def auth(**fields: object) -> SimpleNamespace:
    base: dict[str, object] = {"team_id": None, "team_alias": None, "metadata": {}, "team_metadata": None}
    return SimpleNamespace(**{**base, **fields})


def test_labels_take_configured_priorities_team_first_and_bound_teams() -> None:
    teams = TeamLabels(None, 2)
    prod = auth(team_id="t1", team_metadata={"priority": "prod"}, metadata={"priority": "dev"})
    assert cost_labels(prod, {"prod", "dev"}, teams, "search") == CostLabels("prod", "t1", "search")
    labels = cost_labels(auth(metadata={"priority": "platinum"}), {"prod"}, teams, "unassigned")
    assert (labels.priority, labels.team) == ("default", "none")
    assert cost_labels(auth(team_id="t2", team_alias="Search"), set(), teams, "x").team == "Search"
    assert cost_labels(auth(team_id="t3"), set(), teams, "x").team == "other"  # the third distinct team
    assert teams.overflowed and teams.label("t1") == "t1"
    assert cost_labels(None, {"prod"}, teams, "x").priority == "default"


def test_a_configured_team_list_is_the_only_one_labelled() -> None:
    teams = TeamLabels(["search"], 100)
    assert [teams.label(t) for t in ("search", "ads", None, "")] == ["search", "other", "none", "none"]
    assert not teams.overflowed


def test_settings_defaults_overrides_and_ranges() -> None:
    cost = parse_settings({"ratebalance": {"cost": {"gpus": 2, "deployments": {"gpu1": {"gpus": 8}}}}}).ratebalance.cost
    assert (cost.deployment_gpus("gpu1"), cost.deployment_gpus("gpu2")) == (8, 2)
    assert cost.deployment_gpu_hour_usd("gpu1") is None
    assert CostSettings(gpu_hour_usd=3.0).deployment_gpu_hour_usd("x") == 3.0
    with pytest.raises(ConfigurationError, match=r"ratebalance\.cost\.gpus: must be more than 0\.0"):
        parse_settings({"ratebalance": {"cost": {"gpus": 0}}})
    with pytest.raises(ConfigurationError, match=r"ratebalance\.cost\.deployments\.gpu1\.gpu_hour_usd"):
        parse_settings({"ratebalance": {"cost": {"deployments": {"gpu1": {"gpu_hour_usd": -1}}}}})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_embedded_store_shares_busy_time_with_explicit_times() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    start = MeterStart(half_life_ms=600_000, ttl_ms=3_600_000)
    taken_a = await store.lease_acquire("gpu1", "a", slot_cap=9, ttl_ms=60_000, meter=start)
    assert taken_a.acquired and taken_a.cost is not None
    clock.now += 1.0
    taken_b = await store.lease_acquire("gpu1", "b", slot_cap=9, ttl_ms=60_000, meter=start)
    assert taken_b.acquired and taken_b.cost is not None
    clock.now += 2.0
    meter_a = MeterEnd(taken_a.cost.mark, 2, 100, half_life_ms=600_000, ttl_ms=3_600_000)
    end_a = (await store.lease_release("gpu1", "a", meter_a)).cost
    clock.now += 1.0
    meter_b = MeterEnd(taken_b.cost.mark, 2, 300, half_life_ms=600_000, ttl_ms=3_600_000)
    end_b = (await store.lease_release("gpu1", "b", meter_b)).cost
    assert end_a is not None and end_b is not None
    assert end_a.share == pytest.approx(2 * (1.0 + 2.0 / 2))
    assert end_b.share == pytest.approx(2 * (2.0 / 2 + 1.0))
    efficiency = await store.cost_efficiency("gpu1", **{"half_life_ms": 600_000})
    assert efficiency is not None
    # Both ends decay together: a's sums lost 2^(-1/600) over the second before b's end.
    factor = 0.5 ** (1 / 600)
    assert efficiency.gpu_seconds == pytest.approx(4.0 * factor + 4.0)
    assert efficiency.output_tokens == pytest.approx(100 * factor + 300)
    clock.now += 600.0
    later = await store.cost_efficiency("gpu1", half_life_ms=600_000)
    assert later is not None and later.gpu_seconds == pytest.approx(efficiency.gpu_seconds / 2)
    assert await store.cost_efficiency("gpu2", half_life_ms=600_000) is None


async def test_the_embedded_state_expires_into_a_new_epoch() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    taken = await store.lease_acquire(
        "gpu1", "a", slot_cap=9, ttl_ms=600_000, meter=MeterStart(half_life_ms=1_000, ttl_ms=60_000)
    )
    first = taken.cost
    assert first is not None
    clock.now += 61.0
    meter = MeterEnd(first.mark, 1, 1, half_life_ms=1_000, ttl_ms=60_000)
    end = (await store.lease_release("gpu1", "a", meter)).cost
    assert end is not None
    assert end.share is None and end.mark.epoch_ms != first.mark.epoch_ms
    assert math.isclose(end.mark.integral, 0.0)
