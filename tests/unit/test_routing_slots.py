"""Presumed slots (slow start, ``presume_slots``, off by default), with explicit times: a deployment whose
slots are neither configured nor learnt is presumed to have a few, then twice the most requests it has been
seen to serve at once at full speed; its share shrinks as this replica's requests in flight fill them."""

from __future__ import annotations

import pytest

from litellm_ratebalance.routing import Candidate, RoutingSettings, changes, evidence
from litellm_ratebalance.routing.fits import PRESUMED_SLOTS, SLOTS_GROWTH, LoadFit
from tests.unit.routing_support import Clock, feed, make_balancer, served

G = "group"


def test_a_fit_without_samples_presumes_a_few_slots() -> None:
    assert LoadFit().presumed_slots() == PRESUMED_SLOTS
    fit = LoadFit()
    for t in range(2):  # too few samples to say anything
        served(fit, float(t), 6.0, 100.0, 0.0)
    assert fit.slots() is None and fit.presumed_slots() == PRESUMED_SLOTS


def test_presumed_slots_grow_with_the_load_served_at_full_speed() -> None:
    fit = LoadFit()
    for t in range(3):  # alone, at full speed
        served(fit, float(t), 1.0, 100.0, 0.0)
    assert fit.slots() is None and fit.presumed_slots() == PRESUMED_SLOTS  # 2 x 1 is below the floor
    for t in range(3, 6):  # three at once, no slower
        served(fit, float(t), 3.0, 100.0, 0.0)
    assert fit.slots() is None and fit.presumed_slots() == pytest.approx(SLOTS_GROWTH * 3.0)
    for t in range(6, 9):  # six at once, no slower: proven again, the presumption doubles again
        served(fit, float(t), 6.0, 98.0, 0.0)
    assert fit.slots() is None and fit.presumed_slots() == pytest.approx(SLOTS_GROWTH * 6.0)


def test_a_load_level_with_too_little_weight_proves_nothing() -> None:
    fit = LoadFit()
    for t in range(4):
        served(fit, float(t), 1.0, 100.0, 0.0)
    served(fit, 4.0, 7.0, 100.0, 0.0)  # one answer at seven in flight: not enough to rely on
    assert fit.presumed_slots() == PRESUMED_SLOTS


def test_presumed_slots_fade_with_the_samples_that_proved_them() -> None:
    fit = LoadFit()
    for t in range(4):
        served(fit, float(t), 4.0, 100.0, 5.0)
    assert fit.presumed_slots() == pytest.approx(8.0)
    served(fit, 30.0, 1.0, 100.0, 5.0)  # six half-lives later the busy level has faded below its weight
    assert fit.presumed_slots() == PRESUMED_SLOTS


def test_presumed_slots_shrink_the_share_as_they_fill() -> None:
    presumed = PRESUMED_SLOTS
    assert evidence.load_correction(None, presumed / 2, 50.0, presume=True)[1] == 1.0  # half free: no change yet
    assert evidence.load_correction(None, 0.75 * presumed, 50.0, presume=True)[1] == pytest.approx(0.5)
    assert evidence.load_correction(None, presumed, 50.0, presume=True)[1] == 0.0
    assert evidence.load_correction(None, presumed, 50.0)[1] == 1.0  # not presumed: unknown slots are unlimited
    # Configured and learnt slots win over the presumption.
    assert evidence.load_correction(None, 4.0, 50.0, configured_slots=16.0, presume=True)[1] == 1.0
    learnt = LoadFit()
    for t, load, rate in [(0, 1.0, 200.0), (1, 1.0, 200.0), (2, 1.0, 200.0), (3, 8.0, 25.0)] + [
        (4 + i, 8.0, 25.0) for i in range(3)
    ]:
        served(learnt, float(t), load, rate, 0.0)
    assert learnt.slots() == pytest.approx(1.0, rel=0.01)
    assert evidence.load_correction(learnt, 1.0, 100.0, presume=True)[1] == 0.0


def test_a_change_of_rate_keeps_the_load_proven_before() -> None:
    balancer, clock = make_balancer(load_aware=True, change_detection_sigma=3.0)
    view = balancer._view(G)
    fit = view.loads["a"] = LoadFit()
    for t in range(4):
        served(fit, clock.now + t, 5.0, 100.0, 0.0)
    assert fit.presumed_slots() == pytest.approx(10.0)
    assert changes.changed(view, balancer.settings, "a", clock.now + 5.0, clock.now + 4.0)
    assert view.loads["a"].slots() is None and view.loads["a"].presumed_slots() == pytest.approx(10.0)


@pytest.mark.parametrize("presume", [True, False])
async def test_a_faster_deployment_of_unknown_slots_is_not_piled_onto(presume: bool) -> None:
    """a answers at twice b's rate; nothing is known of a's slots (b is configured with many). Twenty
    requests sent before any answer: with the presumption a takes at most its presumed slots and b the
    rest; without it, a takes most of them."""
    balancer, _ = make_balancer(
        load_aware=True,
        presume_slots=presume,
        in_flight_evidence=True,
        stall_latency_factor=0.0,
        selection="least_loaded",
    )
    feed(balancer, G, "a", [200.0, 190.0, 210.0, 200.0])
    feed(balancer, G, "b", [100.0, 90.0, 110.0, 100.0])
    await balancer.refresh(G)
    pair = (Candidate("a"), Candidate("b", slots=64.0))
    picks = [pair[balancer.choose(G, pair, f"r{i}")].id for i in range(20)]
    if presume:
        assert 1 <= picks.count("a") <= PRESUMED_SLOTS
    else:
        assert picks.count("a") > 10


def test_the_plain_preset_presumes_nothing() -> None:
    # (its load awareness is off, and the presumption acts only with it)
    assert not RoutingSettings(preset="plain").load_aware


def test_slots_are_not_presumed_by_default() -> None:
    assert RoutingSettings().load_aware and not RoutingSettings().presume_slots


async def test_recorded_answers_at_full_speed_raise_the_presumption() -> None:
    """Requests that finish at full speed while three are in flight prove three slots: six are presumed."""
    clock = Clock()
    balancer, _ = make_balancer(clock, load_aware=True, in_flight_evidence=True, stall_latency_factor=0.0)
    only_a = (Candidate("a"),)
    for round_no in range(3):
        ids = [f"r{round_no}-{i}" for i in range(3)]
        for request_id in ids:
            balancer.choose(G, only_a, request_id)
        clock.advance(1.0)
        for request_id in ids:
            balancer.record(G, "a", latency=1.0, output_tokens=100, request_id=request_id)
    fit = balancer._view(G).loads["a"]
    assert fit.slots() is None
    assert fit.presumed_slots() == pytest.approx(SLOTS_GROWTH * fit.level_loads[1] / fit.level_weights[1])
    assert fit.presumed_slots() > PRESUMED_SLOTS
