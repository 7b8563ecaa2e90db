"""Settles waiting to be sent: the limiter's post-call work, without a store round trip of its own.

After a call the limiter knows how far the reservation was off (and a sample for the output estimate).
Instead of one store call per request, the correction joins its model group's :class:`SettleBatch` here.
The batch travels with the next admission of that model group (the same script applies it first), or,
when none comes, with one flush per model group :data:`FLUSH_DELAY_SECONDS` after the first correction
queued. A busy replica so makes one round trip per request in all.

Corrections that other replicas must see before their next decision skip the wait
(:meth:`SettleQueue.send_now`): those of requests reserved on the prior before anything was learned (a cold
start). Each frees most of what it reserved (``default_output_tokens`` against a short answer) or adds what
a long answer used past it, and teaches the estimate every replica reserves with; held back, another
replica refuses (or admits) on reservations that no longer stand, and in a cold burst a client that
honours ``retry-after`` does not come back within the window. They are a model group's first requests
only, so the extra round trips are few.

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

logger = logging.getLogger("litellm_ratebalance.admission")

FLUSH_DELAY_SECONDS = 0.1
"""Longest a correction waits for an admission of its model group before it is sent on its own."""

_KEEP_WINDOWS = 4
"""A batch that cannot be sent (store down) keeps corrections of at most this many recent windows."""

Flush = Callable[[str, SettleBatch], Awaitable[bool]]


class SettleQueue:
    """Pending corrections per model group, for one limiter in one process (one event loop)."""

    __slots__ = ("_delay", "_flush", "_pending", "_sending", "_task", "_timer", "_urgent")

    def __init__(self, flush: Flush, delay_seconds: float = FLUSH_DELAY_SECONDS) -> None:
        """``flush(model_group, batch)`` sends one batch and says whether it was sent; it handles store
        faults itself and may put the batch back with :meth:`put_back` (which does not arm the timer: a
        batch that failed waits for the next admission or correction of its model group)."""
        self._flush = flush
        self._delay = delay_seconds
        self._pending: dict[str, SettleBatch] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._sending: dict[str, asyncio.Event] = {}
        """Model groups with a :meth:`send_now` in flight: the event is set once it is done."""
        self._urgent: set[str] = set()
        """Model groups with a correction queued by :meth:`send_now` and not yet sent."""

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

    async def take_after_send(self, model_group: str) -> SettleBatch | None:
        """:meth:`take`, once a :meth:`send_now` of the model group in flight is done: an admission of this
        process never reaches the store ahead of a correction this process sent before it (the order that
        carrying the correction with the admission gives)."""
        sending = self._sending.get(model_group)
        if sending is not None:
            await sending.wait()
        return self.take(model_group)

    async def send_now(self, model_group: str) -> None:
        """Send the model group's pending batch now (module doc), and return once it is sent (or failed).

        One send per model group at a time: when one is in flight, what is queued meanwhile goes in one more
        send right after it (the caller then returns before its correction is in). Whatever was pending goes
        along, corrections queued for later included."""
        self._urgent.add(model_group)
        if model_group in self._sending:
            return
        done = self._sending[model_group] = asyncio.Event()
        try:
            while model_group in self._urgent:
                self._urgent.discard(model_group)
                batch = self.take(model_group)
                if batch is None:
                    return  # an admission took it along
                try:
                    if not await self._flush(model_group, batch):
                        return  # put back by the callback: it waits for the next admission
                except Exception:  # the callback handles store faults; nothing else may fail the caller's hook
                    logger.exception("litellm_ratebalance rate_limiter: sending settles failed")
                    return
        finally:
            del self._sending[model_group]
            self._urgent.discard(model_group)
            done.set()

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
