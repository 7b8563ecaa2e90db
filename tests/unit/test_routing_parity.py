"""Parity with the reference: the proposal's algorithm walking every sample vs. our aggregates.

Both are fed the same timestamped samples; with our additions switched off (no exploration, no failure
penalty, no rate-limit scaling, no stall detection) they must give the same weights, within the
histogram's resolution, and choose with the same frequencies.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from litellm_ratebalance.routing import RateBalancer
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_reference import ReferenceBalancer, Sample
from tests.unit.routing_support import T0, Clock, candidates, settings

WEIGHT_TOLERANCE = 0.05
"""Largest difference of one deployment's choice probability (measured worst case over 300 random
scenarios: 0.025 normal, 0.043 empirical; typical: under 0.01)."""
RECENCY_TOLERANCE = 0.06
"""The same with recency weighting (buckets weighted by the age of their middle, samples by their own)."""


def scenario(seed: int) -> tuple[list[str], list[tuple[float, str, Sample]]]:
    rng = random.Random(seed)
    names = [f"d{i}" for i in range(rng.randint(2, 8))]
    profiles = {n: (rng.uniform(5, 150), rng.uniform(0.05, 0.5), rng.random() < 0.3) for n in names}
    events: list[tuple[float, str, Sample]] = []
    for t in list(range(0, 20)) + list(range(150, 200)):  # an old stretch that must have expired
        for name in names:
            mean, cv, flaky = profiles[name]
            for _ in range(rng.randint(0, 3)):
                latency = rng.uniform(0.5, 4.0)
                ok = not (flaky and rng.random() < 0.2)
                rate = max(0.5, rng.gauss(mean, mean * cv))
                input_tokens = rng.randint(0, 5000)
                output_tokens = max(1, round(rate * latency - input_tokens / 250))
                events.append((T0 + t, name, Sample(latency, T0 + t, output_tokens, input_tokens, ok)))
    return names, events


async def feed_both(
    names: list[str], events: list[tuple[float, str, Sample]], estimator: str, half_life: float = 0.0
) -> tuple[ReferenceBalancer, RateBalancer, Clock]:
    reference = ReferenceBalancer(
        names, window_seconds=120, ratio=250, greediness=0.5, estimator=estimator, half_life=half_life
    )
    clock = Clock()
    ours = RateBalancer(
        MemoryStore(clock=clock),
        settings(
            estimator=estimator,
            failure_penalty=0.0,
            rate_limit_headroom=0.0,
            stall_latency_factor=0.0,
            bucket_seconds=2,
            sample_half_life_seconds=half_life,
        ),
        clock=clock,
        rng=random.Random(1),
    )
    current: float | None = None
    for at, name, sample in events:
        if current is not None and at != current:
            await ours.refresh("g")
        clock.now = current = at
        reference.record(name, sample)
        ours.record(
            "g",
            name,
            latency=sample.latency,
            input_tokens=sample.input_tokens,
            output_tokens=sample.output_tokens,
            ok=sample.ok,
        )
    await ours.refresh("g")
    clock.now = T0 + 210
    await ours.refresh("g")
    return reference, ours, clock


@pytest.mark.parametrize("estimator", ["normal", "empirical"])
@pytest.mark.parametrize("seed", range(12))
async def test_same_weights_as_the_reference(seed: int, estimator: str) -> None:
    names, events = scenario(seed)
    reference, ours, clock = await feed_both(names, events, estimator)
    expected = dict(zip(names, reference.weights(clock.now), strict=True))
    got = ours.weights("g", candidates(*names))
    assert set(got) == set(expected)
    for name in names:
        assert got[name] == pytest.approx(expected[name], abs=WEIGHT_TOLERANCE), (name, got, expected)
    # The old stretch expired in both: the sample counts agree exactly.
    window = {n: len(r) for n, r in zip(names, reference.rates(clock.now), strict=True)}
    assert {n: e.samples for n, e in ours.estimates("g", candidates(*names)).items()} == window


async def test_both_choose_with_the_same_frequencies() -> None:
    names, events = scenario(99)
    reference, ours, clock = await feed_both(names, events, "normal")
    n = 4000
    ref_picks = Counter(reference.choose(clock.now) for _ in range(n))
    our_picks = Counter(ours.choose("g", candidates(*names)) for _ in range(n))
    for i in range(len(names)):
        assert our_picks[i] / n == pytest.approx(ref_picks[i] / n, abs=WEIGHT_TOLERANCE)


@pytest.mark.parametrize("estimator", ["normal", "empirical"])
@pytest.mark.parametrize("seed", range(8))
async def test_recency_weighted_window_matches_the_weighted_reference(seed: int, estimator: str) -> None:
    """With ``sample_half_life_seconds`` on, the same weights as the reference weighting each sample by its
    exact age (ours weighs a 2 s bucket by the age of its middle: a little more tolerance)."""
    names, events = scenario(seed)
    reference, ours, clock = await feed_both(names, events, estimator, half_life=20.0)
    expected = dict(zip(names, reference.weights(clock.now), strict=True))
    got = ours.weights("g", candidates(*names))
    for name in names:
        assert got[name] == pytest.approx(expected[name], abs=RECENCY_TOLERANCE), (name, got, expected)
    weights = {n: sum(w for _, w in r) for n, r in zip(names, reference.weighted_rates(clock.now), strict=True)}
    samples = {n: e.samples for n, e in ours.estimates("g", candidates(*names)).items()}
    assert samples == pytest.approx(weights, rel=0.05)
