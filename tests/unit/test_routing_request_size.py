"""A request's size: its work (output cap plus weighted prompt), the size fit of latency against size, and
requests judged against requests of their own size, in flight and finished."""

from __future__ import annotations

import math
from typing import Any

import pytest

from litellm_ratebalance.proxy.routing.calls import request_work
from litellm_ratebalance.routing import Candidate, RateBalancer
from litellm_ratebalance.routing.fits import SizeFit
from tests.unit.routing_support import T0, Clock, candidates, make_balancer, two_slot_load_fit

G = "group"
AB = candidates("a", "b")


def test_size_fit_learns_the_fixed_part_and_the_per_token_part() -> None:
    fit = SizeFit()
    assert fit.expected_latency(50.0) is None
    for t, work in enumerate([20.0, 60.0, 100.0, 140.0, 180.0, 40.0]):  # 0.1 s fixed + 100 tok/s
        fit.add(float(t), work, 0.1 + work / 100.0, half_life_seconds=0.0)
    assert fit.expected_latency(50.0) == pytest.approx(0.6)
    assert fit.expected_latency(300.0) == pytest.approx(3.1)
    assert fit.spread() == pytest.approx(0.0, abs=1e-9)  # each sample after the third was predicted exactly


def test_size_fit_spread_is_the_log_distance_from_the_prediction() -> None:
    fit = SizeFit()
    for t, work in enumerate([20.0, 60.0, 100.0]):
        fit.add(float(t), work, 0.1 + work / 100.0, half_life_seconds=0.0)
    for t, (work, factor) in enumerate([(50.0, 1.5), (50.0, 1 / 1.5), (50.0, 1.5)]):
        predicted = fit.expected_latency(work)
        assert predicted is not None
        fit.add(3.0 + t, work, predicted * factor, half_life_seconds=0.0)
    assert fit.spread() == pytest.approx(math.log(1.5))


def test_size_fit_of_equal_sizes_is_proportional_and_ignores_empty_samples() -> None:
    fit = SizeFit()
    fit.add(0.0, 0.0, 1.0, 0.0)  # no work: says nothing about a rate
    fit.add(0.0, 50.0, 0.0, 0.0)  # no latency: likewise
    for t in range(6):
        fit.add(float(t), 50.0, 1.0, half_life_seconds=0.0)
    assert fit.weight == 6.0
    assert fit.expected_latency(100.0) == pytest.approx(2.0)  # no spread of sizes: through the origin
    assert fit.spread() == pytest.approx(0.0)


def test_size_fit_fades_with_its_half_life() -> None:
    fit = SizeFit()
    for work in (20.0, 60.0, 100.0, 140.0):
        fit.add(0.0, work, work / 100.0, half_life_seconds=10.0)
    for work in (20.0, 60.0, 100.0, 140.0):  # 100 s later, five times slower
        fit.add(100.0, work, work / 20.0, half_life_seconds=10.0)
    predicted = fit.expected_latency(100.0)
    assert predicted is not None and predicted == pytest.approx(5.0, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "messages", "expected"),
    [
        ({"max_tokens": 40}, [{"role": "user", "content": "x" * 1000}], 40 + 1000 / 4 / 250),
        ({"max_completion_tokens": 10}, [{"role": "user", "content": [{"type": "text", "text": "y" * 400}]}], 10.4),
        ({"max_tokens": 40}, None, 40.0),
        ({}, [{"role": "user", "content": "x"}], None),
        ({"max_tokens": 0}, [], None),
        ({"max_tokens": True}, [], None),
        ({"max_tokens": "40"}, [], None),
        (None, [], None),
    ],
)
def test_request_work_is_the_output_cap_plus_the_weighted_prompt(
    kwargs: dict[str, object] | None, messages: object, expected: float | None
) -> None:
    work = request_work(messages, kwargs, 250.0)
    assert work == (pytest.approx(expected) if expected is not None else None)


async def sized_deployment(**overrides: Any) -> tuple[RateBalancer, Clock]:
    """a: 0.1 s fixed + 100 tok/s, answers of every size from 20 to 200 tokens (rates 67 to 180 tok/s, a wide
    spread of rates from size alone); b steady."""
    balancer, clock = make_balancer(
        in_flight_evidence=True, stall_latency_factor=0.0, change_detection_sigma=3.0, **overrides
    )
    for work in [20, 200, 60, 140, 100, 180, 40, 120, 80, 160] * 2:
        balancer.record(G, "a", latency=0.1 + work / 100.0, output_tokens=work)
        balancer.record(G, "b", latency=1.0, output_tokens=80)
    await balancer.refresh(G)
    assert balancer._views[G].changed == {}
    return balancer, clock


@pytest.mark.parametrize(("latency", "changed"), [(0.33, False), (0.9, True)])
async def test_a_finished_request_is_judged_against_requests_of_its_size(latency: float, changed: bool) -> None:
    # 20 tokens in 0.9 s is 22 tok/s: within three spreads of a's rates (mean ~120, spread ~37) but three
    # times what a 20-token request takes there.
    balancer, _ = await sized_deployment()
    balancer.choose(G, (Candidate("a"),), work=20.0)
    balancer.record(G, "a", latency=latency, output_tokens=20)
    assert ("a" in balancer._views[G].changed) is changed


@pytest.mark.parametrize(("work", "changed"), [(20.0, True), (None, False), (200.0, False)])
async def test_a_short_request_in_flight_is_overdue_for_its_size(work: float | None, changed: bool) -> None:
    # 1 s in flight: a 20-token request takes 0.3 s there (3.3 times late), a 200-token one 2.1 s, and one
    # of unknown size is judged by a's mean latency (1.2 s).
    balancer, clock = await sized_deployment()
    sent_at = clock.now
    balancer.choose(G, (Candidate("a"),), work=work)
    clock.advance(1.0)
    balancer.choose(G, AB)  # decisions run the detection
    view = balancer._views[G]
    assert ("a" in view.changed) is changed
    if changed:
        # The change came before the request was due (0.3 s after it was sent): samples from then on stay.
        assert view.cutoff_ms["a"] == pytest.approx((sent_at + 0.3 + view.offset) * 1000.0, abs=1.0)


@pytest.mark.parametrize(("load_aware", "changed"), [(True, False), (False, True)])
async def test_a_latency_its_load_explains_is_not_a_change_for_its_size(load_aware: bool, changed: bool) -> None:
    # a: 0.1 s + 200 tok/s at light load, two slots. Six requests sent together share it for the whole life
    # of the first (a load of 6, where the sized part takes 3 times as long): a 100-token answer then takes
    # about 3 times the 0.6 s of light load.
    balancer, clock = make_balancer(
        load_aware=load_aware, in_flight_evidence=True, change_detection_sigma=3.0, stall_latency_factor=0.0
    )
    view = balancer._view(G)
    sizes = view.sizes["a"] = SizeFit()
    for t, work in enumerate([20.0, 200.0, 60.0, 140.0, 100.0, 180.0, 40.0, 120.0]):
        sizes.add(T0 + t, work, 0.1 + work / 200.0, 0.0)
    loads = view.loads["a"] = two_slot_load_fit()
    slowdown = loads.slowdown(6.0)
    assert slowdown == pytest.approx(3.0)
    for _ in range(6):
        balancer.choose(G, (Candidate("a"),), work=100.0)
    clock.advance(0.6 * slowdown)
    balancer.record(G, "a", latency=0.6 * slowdown, output_tokens=100)
    assert ("a" in view.changed) is changed


@pytest.mark.parametrize(("wait", "changed"), [(1.2, False), (4.0, True)])
async def test_a_request_in_flight_is_judged_at_the_load_it_meets_now(wait: float, changed: bool) -> None:
    # a: 0.1 s + 200 tok/s at light load, two slots. Six 100-token requests go out together (0.6 s each at
    # light load); at six in flight each takes three times as long (1.8 s), so 1.2 s in flight is not late
    # even for the first two, which met a light load when they started. 4 s is.
    balancer, clock = make_balancer(
        load_aware=True, in_flight_evidence=True, change_detection_sigma=3.0, stall_latency_factor=0.0
    )
    for work in [20, 200, 60, 140, 100, 180, 40, 120]:
        balancer.record(G, "a", latency=0.1 + work / 200.0, output_tokens=work)
        balancer.record(G, "b", latency=1.0, output_tokens=80)
    await balancer.refresh(G)
    view = balancer._view(G)
    view.loads["a"] = two_slot_load_fit()
    for _ in range(6):
        balancer.choose(G, (Candidate("a"),), work=100.0)
    clock.advance(wait)
    balancer.choose(G, AB)  # decisions run the detection
    assert ("a" in view.changed) is changed
