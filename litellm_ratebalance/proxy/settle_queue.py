"""Settles waiting to be sent: the limiter's post-call work, without a store round trip of its own.

After a call the limiter knows how far the reservation was off (and a sample for the output estimate).
Instead of one store call per request, the correction joins its model group's :class:`SettleBatch` here.
The batch travels with the next admission of that model group (the same script applies it first), or,
when none comes, with one flush per model group :data:`FLUSH_DELAY_SECONDS` after the first correction
queued. A busy replica so makes one round trip per request in all.

What a lost batch (the process killed before it was sent) costs: reservations stay as estimated until
their window ends (never more admitted than the limit allows because of it), except that an answer
longer than its reservation goes uncounted by the difference.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from litellm_ratebalance.admission.estimate import SettleBatch

__all__ = ["FLUSH_DELAY_SECONDS", "SettleQueue"]

logger = logging.getLogger("litellm_ratebalance")

FLUSH_DELAY_SECONDS = 0.1
"""Longest a correction waits for an admission of its model group before it is sent on its own."""

_KEEP_WINDOWS = 4
"""A batch that cannot be sent (store down) keeps corrections of at most this many recent windows."""

Flush = Callable[[str, SettleBatch], Awaitable[bool]]


class SettleQueue:
    """Pending corrections per model group, for one limiter in one process (one event loop)."""

    __slots__ = ("_delay", "_flush", "_pending", "_task", "_timer")

    def __init__(self, flush: Flush, delay_seconds: float = FLUSH_DELAY_SECONDS) -> None:
        """``flush(model_group, batch)`` sends one batch and says whether it was sent; it handles store
        faults itself and may put the batch back with :meth:`put_back` (which does not arm the timer: a
        batch that failed waits for the next admission or correction of its model group)."""
        self._flush = flush
        self._delay = delay_seconds
        self._pending: dict[str, SettleBatch] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def batch(self, model_group: str) -> SettleBatch:
        """The model group's batch to add to; arms the flush timer."""
        found = self._pending.get(model_group)
        if found is None:
            found = self._pending[model_group] = SettleBatch()
        self._arm()
        return found

    def take(self, model_group: str) -> SettleBatch | None:
        """Remove and return what is pending for the model group (to send with its admission)."""
        batch = self._pending.pop(model_group, None)
        return batch if batch else None

    def put_back(self, model_group: str, batch: SettleBatch, window_ms: int) -> None:
        """Queue a batch again that could not be sent, keeping only recent windows (bounded memory)."""
        pending = self._pending.get(model_group)
        if pending is None:
            pending = self._pending[model_group] = SettleBatch()
        pending.merge(batch)
        newest = max((start for start, _ in pending.deltas), default=0)
        pending.drop_windows_before(newest - _KEEP_WINDOWS * window_ms)

    def _arm(self) -> None:
        if self._timer is not None or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller): the next admission carries the batch
        self._timer = loop.call_later(self._delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self.flush_all())

    async def flush_all(self) -> None:
        """Send every pending batch now, one store call per model group."""
        pending, self._pending = self._pending, {}
        all_sent = True
        for model_group, batch in pending.items():
            try:
                all_sent = await self._flush(model_group, batch) and all_sent
            except Exception:  # the callback handles store faults; nothing else may kill the event loop
                all_sent = False
                logger.exception("litellm_ratebalance rate_limiter: sending settles failed")
        self._task = None
        if self._pending and all_sent:
            self._arm()  # corrections queued while this flush waited
