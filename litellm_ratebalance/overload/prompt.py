"""The prompt a request reserves in a deployment's KV cache: LiteLLM's count, scaled to the server's tokenizer.

Nothing here reads a clock or does I/O. The layer counts a request's prompt with LiteLLM's token counter
before the call, but the server's own tokenizer and chat template decide what the prompt takes in its KV
cache, and the two can differ by a factor (a model without a known tokenizer is counted with a generic
one; code, non-English text and long runs of one character split very differently). An under-count makes
every reservation too small and fills the cache past its end. One :class:`PromptScale` per deployment and
process learns the ratio from each successful answer's ``usage.prompt_tokens`` (the server's count) against
the count the layer reserved, and :meth:`PromptScale.apply` scales the next counts by it.

The ratio is of decayed sums (each new sample weighs :data:`MEMORY` samples' worth against the past), so long
prompts weigh most, as they do in the cache; it starts at 1 and is used after :data:`MIN_SAMPLES` answers,
within :data:`BOUNDS`.
"""

from __future__ import annotations

import math

__all__ = ["BOUNDS", "MIN_SAMPLES", "PromptScale"]

MIN_SAMPLES = 5
"""Answers learned before the ratio replaces 1: a few samples of one kind of prompt say little of the rest."""
MEMORY = 64.0
"""Samples the decayed sums remember (each new one takes a 1/64 share): follows a change of traffic."""
BOUNDS = (0.25, 8.0)
"""The ratio is kept within these: a server reporting nonsense cannot shrink reservations to nothing or
blow them up without end."""


class PromptScale:
    """Server prompt tokens per counted prompt token, learned for one deployment (one event loop owns it)."""

    __slots__ = ("_counted", "_reported", "_samples")

    def __init__(self) -> None:
        self._counted = 0.0
        self._reported = 0.0
        self._samples = 0

    @property
    def samples(self) -> int:
        return self._samples

    def learn(self, counted: int, reported: int) -> None:
        """Record one answer: the layer ``counted`` its prompt, the server ``reported`` it (both > 0, else
        ignored: a request without messages, or a server that reports no usage)."""
        if counted <= 0 or reported <= 0:
            return
        keep = 1.0 - 1.0 / MEMORY
        self._counted = self._counted * keep + counted
        self._reported = self._reported * keep + reported
        self._samples += 1

    @property
    def factor(self) -> float:
        """The learned ratio, within :data:`BOUNDS`; 1 before :data:`MIN_SAMPLES` answers."""
        if self._samples < MIN_SAMPLES or self._counted <= 0:
            return 1.0
        low, high = BOUNDS
        return min(high, max(low, self._reported / self._counted))

    def apply(self, counted: int) -> int:
        """The prompt tokens to reserve for a prompt the layer ``counted``."""
        factor = self.factor
        return counted if factor == 1.0 else math.ceil(counted * factor)
