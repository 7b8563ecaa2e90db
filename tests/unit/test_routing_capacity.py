"""The capacity fit, with explicit times and seeded samples: saturation judged per token, so answers of very
mixed size neither hide a few-slot deployment's saturation nor fake one on a deployment with slots to spare."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from litellm_ratebalance.routing.capacity import GRID, CapacityFit


def _served(
    capacity: float,
    loads: list[float],
    samples: int,
    *,
    seed: int,
    mixed: bool = True,
    jitter: float = 0.2,
    token_rate: float = 150.0,
    prior: float | None = None,
) -> CapacityFit:
    """A fit fed with what a deployment of ``capacity`` slots at ``token_rate`` tokens/s per request answers
    (0.1 s fixed, prefill at 20,000 tokens/s, both stretched by load / capacity above it, and a lognormal
    speed jitter), at loads drawn from ``loads``. ``mixed``: answers of 8-400 tokens and prompts of 50-6,000,
    log-uniform; else 24-96 and 100-1,500, uniform."""
    rng = random.Random(seed)
    fit = CapacityFit(prior)
    for i in range(samples):
        load = rng.choice(loads) + rng.random() * 0.5
        if mixed:
            out = int(math.exp(rng.uniform(math.log(8), math.log(400))))
            prompt = int(math.exp(rng.uniform(math.log(50), math.log(6000))))
        else:
            out, prompt = rng.randint(24, 96), rng.randint(100, 1500)
        stretch = max(1.0, load / capacity)
        speed = math.exp(jitter * rng.gauss(0.0, 1.0))
        latency = 0.1 + (prompt / 20_000 + out / (token_rate * speed)) * stretch
        fit.add(0.1 * i, load, out + prompt / 250, latency, 0.0)
    return fit


@pytest.mark.parametrize("mixed", [True, False])
def test_a_deployment_with_slots_to_spare_is_never_called_saturated(mixed: bool) -> None:
    for seed in range(20):
        assert _served(12, [1, 2, 3, 4, 5, 6], 30, seed=seed, mixed=mixed).slots() is None


@pytest.mark.parametrize("mixed", [True, False])
def test_a_few_slot_deployment_loaded_beyond_them_shows_its_slots(mixed: bool) -> None:
    found = [_served(3, [1, 2, 3, 4, 5, 6, 7, 8], 30, seed=seed, mixed=mixed).slots() for seed in range(20)]
    known = [slots for slots in found if slots is not None]
    assert len(known) == len(found) and all(2.0 <= slots <= 4.0 for slots in known), found
    assert sorted(known)[10] == pytest.approx(2.0**1.5)  # the median: the grid's capacity nearest 3


def test_a_deployment_never_seen_beyond_its_slots_is_not_called_saturated() -> None:
    found = [_served(3, [1, 2, 3], 30, seed=seed).slots() for seed in range(20)]
    assert sum(slots is not None for slots in found) <= 1


def test_a_deployment_never_seen_nearly_idle_still_shows_its_slots() -> None:
    # Every sample met at least two requests: capacities below that fit alike, the largest of them is taken.
    found = [_served(3, [2, 3, 4, 5], 30, seed=seed).slots() for seed in range(20)]
    assert all(slots is not None and 2.0 <= slots <= 4.0 for slots in found), found


def test_too_few_samples_say_nothing() -> None:
    fit = CapacityFit()
    for t in range(3):
        fit.add(float(t), 8.0, 10.0, 5.0, 0.0)  # slow at a load of 8, but three samples only
    assert fit.slots() is None


def test_one_slow_answer_at_a_load_seen_once_is_not_saturation() -> None:
    fit = CapacityFit()
    for t in range(10):
        fit.add(float(t), 1.0, 50.0, 0.5 * (1.1 if t % 2 else 0.9), 0.0)  # about 100 tokens/s, alone
    fit.add(10.0, 9.0, 50.0, 4.5, 0.0)  # one at nine in flight, nine times slower
    assert fit.slots() is None
    fit.add(11.0, 9.0, 50.0, 4.5, 0.0)  # and a second: evidence enough
    assert fit.slots() == pytest.approx(1.0)


def test_samples_fade_with_the_half_life() -> None:
    fit = CapacityFit()
    for t in range(8):
        fit.add(float(t), 1.0 + 3.0 * (t % 2), 50.0, 0.5 * max(1.0, (1.0 + 3.0 * (t % 2)) / 2.0), 5.0)
    assert fit.slots() == pytest.approx(2.0)
    assert fit.weight == pytest.approx(sum(0.5 ** (t / 5.0) for t in range(8)))
    for t in range(60, 68):  # much later: at both loads at full speed
        fit.add(float(t), 1.0 + 3.0 * (t % 2), 50.0, 0.5, 5.0)
    assert fit.slots() is None


def test_a_prior_capacity_stands_until_the_samples_contradict_it() -> None:
    fit = CapacityFit(prior=3.0)
    assert fit.slots() == pytest.approx(2.0**1.5)  # the grid's capacity nearest 3
    for t in range(10):  # loads within it: nothing to contradict it
        fit.add(float(t), 1.0 + t % 3, 50.0, 0.5, 0.0)
    assert fit.slots() == pytest.approx(2.0**1.5)
    for t in range(10, 20):  # eight at once and no slower: it has more
        fit.add(float(t), 8.0, 50.0, 0.5, 0.0)
    assert fit.slots() is None


def test_factor_moves_a_rate_from_the_samples_mean_speed_to_a_load() -> None:
    fit = CapacityFit()
    assert fit.factor(10.0) == 1.0  # not saturated: the load changes nothing
    for t in range(12):
        load = 1.0 if t % 2 else 4.0
        fit.add(float(t), load, 50.0, 0.5 * max(1.0, load / 2.0), 0.0)
    assert fit.slots() == pytest.approx(2.0)
    # The samples ran at full speed half the time and at half speed the other half: a mean factor of 3/4.
    assert fit.factor(1.0) == pytest.approx(1.0 / 0.75)
    assert fit.factor(8.0) == pytest.approx(0.25 / 0.75)


def test_the_grid_spans_one_to_128_slots() -> None:
    assert GRID[0] == 1.0 and GRID[-1] == pytest.approx(128.0)
    assert all(b / a == pytest.approx(math.sqrt(2.0)) for a, b in itertools.pairwise(GRID))


def test_bad_samples_are_ignored() -> None:
    fit = CapacityFit()
    for load, work, latency in ((0.0, 10.0, 1.0), (1.0, 0.0, 1.0), (1.0, 10.0, 0.0), (-1.0, 10.0, 1.0)):
        fit.add(1.0, load, work, latency, 0.0)
    assert fit.weight == 0.0 and fit.slots() is None
