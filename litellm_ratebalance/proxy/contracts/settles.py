"""Traffic-contract reconciles waiting to be sent: summed per window and feature, one store call per window.

After a call the contracts adapter knows what to release from the in-flight estimate and what to record as
actual usage. Instead of one store call per request, the amounts join this queue and are sent together
:data:`FLUSH_DELAY_SECONDS` after the first one queued (or at once by :meth:`ContractSettleQueue.flush_now`):
a busy replica sends a few calls a second instead of one per request. A request's usage so reaches the
counters up to that delay later; the sums recorded are the same.

A batch whose call fails is dropped, as a single reconcile was before: the estimates stay in flight until
their window's counters expire, and the fault is counted by the sender.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["FLUSH_DELAY_SECONDS", "ContractSettleQueue", "Deltas"]

FLUSH_DELAY_SECONDS = 0.1
"""Longest a reconcile waits for others to share its store call."""

Deltas = dict[str, tuple[int, int]]
"""feature -> (estimate tokens to release, actual tokens to record), summed over its requests."""


class ContractSettleQueue:
    """Pending reconciles of one adapter in one process (one event loop).

    ``send(window_start, deltas)`` is called once per window with what is pending for it; it starts the
    store call (a tracked background task, so the caller can wait for it) and handles faults itself."""

    __slots__ = ("_delay", "_pending", "_send", "_timer")

    def __init__(self, send: Callable[[int, Deltas], None], delay_seconds: float = FLUSH_DELAY_SECONDS) -> None:
        self._send = send
        self._delay = delay_seconds
        self._pending: dict[int, Deltas] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, window_start: int, feature: str, release_tokens: int, actual_tokens: int) -> None:
        """Queue one request's reconcile (nothing to do when both amounts are 0)."""
        if release_tokens <= 0 and actual_tokens <= 0:
            return
        deltas = self._pending.get(window_start)
        if deltas is None:
            deltas = self._pending[window_start] = {}
        release, actual = deltas.get(feature, (0, 0))
        deltas[feature] = (release + max(0, release_tokens), actual + max(0, actual_tokens))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self.flush_now)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def flush_now(self) -> None:
        """Hand everything pending to ``send``, one call per window."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, {}
        for window_start, deltas in pending.items():
            self._send(window_start, deltas)
