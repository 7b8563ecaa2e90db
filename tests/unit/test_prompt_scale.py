"""The learned ratio of the server's prompt tokens to LiteLLM's count (pure, no clock)."""

from __future__ import annotations

import pytest

from litellm_ratebalance.overload.prompt import BOUNDS, MIN_SAMPLES, PromptScale


def test_counts_are_kept_until_enough_answers_then_scaled_to_the_server() -> None:
    scale = PromptScale()
    for _ in range(MIN_SAMPLES - 1):
        scale.learn(300, 600)  # the server counts twice what LiteLLM's counter saw
    assert scale.factor == 1.0 and scale.apply(300) == 300
    scale.learn(300, 600)
    assert scale.factor == pytest.approx(2.0)
    assert scale.apply(301) == 602


def test_long_prompts_weigh_most_and_a_change_of_traffic_is_followed() -> None:
    scale = PromptScale()
    for _ in range(MIN_SAMPLES):
        scale.learn(1000, 1100)
        scale.learn(10, 40)
    # A ratio of sums: the long prompts' 1.1 outweighs the short ones' 4.0, as their tokens do in the cache.
    assert 1.05 < scale.factor < 1.2
    for _ in range(400):
        scale.learn(500, 400)  # a new tokenizer counts fewer
    assert scale.factor == pytest.approx(0.8, rel=0.01)


def test_nonsense_is_ignored_or_bounded() -> None:
    scale = PromptScale()
    for _ in range(10):
        scale.learn(0, 500)  # no messages counted
        scale.learn(100, 0)  # no usage reported
    assert scale.samples == 0 and scale.factor == 1.0
    for _ in range(10):
        scale.learn(1, 10_000)
    assert scale.factor == BOUNDS[1]
    other = PromptScale()
    for _ in range(10):
        other.learn(10_000, 1)
    assert other.factor == BOUNDS[0]
