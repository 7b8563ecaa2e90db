"""How long this process's event loop could not run callbacks: the time a store call must not blame on Redis.

A proxy busy with a burst runs LiteLLM's per-request work for hundreds of requests between two polls of its
sockets. A reply Redis sent in a millisecond then sits unread until the loop comes back to it, and a plain
``asyncio.timeout`` around the call expires although Redis was fine. :class:`LoopStallClock` measures those
stalls: a callback scheduled every ``tick`` seconds notes how late it ran, and whatever exceeds the tick is
time during which no reply could have been read. A store deadline (:class:`ResponsiveDeadline`) counts only
the rest, the time during which the loop was free to read the reply: a call times out when Redis did not
answer within that much *responsive* time, however busy the process was meanwhile.

A stall still in progress (the loop is running one long batch of callbacks right now, so even the tick is
late) is included by :meth:`LoopStallClock.stalled`, so a deadline checked in the same loop iteration as the
late tick sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["DEFAULT_TICK_SECONDS", "LagWatermark", "LoopStallClock", "ResponsiveDeadline", "StallTimeout"]

DEFAULT_TICK_SECONDS = 0.02
"""The clock's resolution: a stall shorter than this is not noticed (and does not matter against timeouts of
a tenth of a second and more). 50 callbacks a second cost a few microseconds of CPU each."""


class LagWatermark:
    """The longest stall one reader has not seen yet (each reader of the clock keeps its own)."""

    __slots__ = ("_clock", "_longest")

    def __init__(self, clock: LoopStallClock) -> None:
        self._clock = clock
        self._longest = 0.0

    def note(self, stall: float) -> None:
        if stall > self._longest:
            self._longest = stall

    def take(self) -> float:
        """The longest stall since the last take (the one in progress included), and start over."""
        longest = max(self._longest, self._clock.lag())
        self._longest = 0.0
        return longest


class LoopStallClock:
    """Accumulated stall time of one event loop, from a self-rescheduling tick.

    ``stalled()`` is monotonic: the seconds, since the clock started, during which the loop was late by more
    than one tick. :meth:`watermark` gives a reader the longest single stall since it last looked (a gauge
    for operators).
    """

    __slots__ = ("_handle", "_last_tick", "_loop", "_stalled", "_tick", "_watermarks")

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = DEFAULT_TICK_SECONDS) -> None:
        if tick <= 0:
            raise ValueError(f"tick must be positive, got {tick}")
        self._loop = loop
        self._tick = tick
        self._stalled = 0.0
        self._watermarks: list[LagWatermark] = []
        self._last_tick = loop.time()
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._last_tick + tick, self._on_tick)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def watermark(self) -> LagWatermark:
        """A new reader of the longest stall (see :class:`LagWatermark`)."""
        mark = LagWatermark(self)
        self._watermarks.append(mark)
        return mark

    def _on_tick(self) -> None:
        now = self._loop.time()
        late = now - self._last_tick - self._tick
        if late > 0:
            self._stalled += late
            for mark in self._watermarks:
                mark.note(late)
        self._last_tick = now
        self._handle = self._loop.call_at(now + self._tick, self._on_tick)

    def stalled(self) -> float:
        """Seconds of stall so far, including one still in progress."""
        pending = self._loop.time() - self._last_tick - self._tick
        return self._stalled + pending if pending > 0 else self._stalled

    def lag(self) -> float:
        """How late the loop is right now (0 when it is keeping up)."""
        return max(0.0, self._loop.time() - self._last_tick - self._tick)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class StallTimeout(TimeoutError):
    """A deadline ran out. ``busy`` is True when it ran out on its wall-clock cap, with most of the wait spent
    in loop stalls: this process was too busy to read the reply, which says nothing about Redis."""

    def __init__(self, message: str, *, busy: bool) -> None:
        super().__init__(message)
        self.busy = busy


class ResponsiveDeadline:
    """``seconds`` of responsive time (wall time less the loop's stalls), and at most ``cap`` of wall time.

    Started at construction. :meth:`wait` awaits a future within what is left; the same deadline can bound
    several waits in a row (a connection slot, then the call), so their sum stays within it.
    """

    __slots__ = ("_cap", "_clock", "_seconds", "_stalled_at_start", "_started")

    def __init__(self, clock: LoopStallClock, seconds: float, cap: float) -> None:
        self._clock = clock
        self._seconds = seconds
        self._cap = max(cap, seconds)
        self._started = clock.loop.time()
        self._stalled_at_start = clock.stalled()

    def elapsed(self) -> float:
        """Wall seconds since the start."""
        return self._clock.loop.time() - self._started

    def responsive(self) -> float:
        """Seconds since the start during which the loop was not stalled."""
        return self.elapsed() - (self._clock.stalled() - self._stalled_at_start)

    def _left(self) -> float:
        """Wall seconds to wait before checking again (<= 0: expired)."""
        return min(self._seconds - self.responsive(), self._cap - self.elapsed())

    def _expired(self) -> StallTimeout:
        elapsed, responsive = self.elapsed(), self.responsive()
        busy = elapsed >= self._cap and responsive < self._seconds
        if busy:
            message = (
                f"this process's event loop was stalled for {elapsed - responsive:.2f}s of {elapsed:.2f}s: "
                "no reply could be read"
            )
        else:
            message = f"no reply within {self._seconds:g}s while the event loop was free ({elapsed:.2f}s elapsed)"
        return StallTimeout(message, busy=busy)

    def arm(self, target: asyncio.Future[Any]) -> _Rearming:
        """Fail ``target`` with :class:`StallTimeout` when the deadline runs out, unless it is done by then.

        Returns the timer: cancel it once ``target`` is done. The timer re-arms itself while the loop's
        stalls account for the time, so it fires after ``seconds`` of responsive time or at the cap. The
        caller awaits ``target`` itself: nothing stands between the producer and the caller (under a burst
        every loop iteration is long, so an extra hop costs real time)."""
        loop = self._clock.loop
        handle: list[asyncio.TimerHandle] = []

        def check() -> None:
            if target.done():
                return
            left = self._left()
            if left <= 0:
                target.set_exception(self._expired())
            else:
                handle[0] = loop.call_later(left, check)

        handle.append(loop.call_later(max(self._left(), 0.0), check))
        return _Rearming(handle)

    async def wait(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable`` until the deadline, raising :class:`StallTimeout` if it runs out first; a
        task or future is then left running (a coroutine is wrapped in a task and cancelled)."""
        waiter = asyncio.ensure_future(awaitable)
        if waiter.done():
            return waiter.result()
        proxy: asyncio.Future[Any] = self._clock.loop.create_future()

        def relay(done: asyncio.Future[Any]) -> None:
            if proxy.done():
                return
            if done.cancelled():
                proxy.cancel()
            elif (error := done.exception()) is not None:
                proxy.set_exception(error)
            else:
                proxy.set_result(done.result())

        waiter.add_done_callback(relay)
        timer = self.arm(proxy)
        try:
            return await proxy
        except StallTimeout:
            if not isinstance(awaitable, asyncio.Future):
                waiter.cancel()
            raise
        finally:
            timer.cancel()
            waiter.remove_done_callback(relay)


class _Rearming:
    """The current timer of an armed deadline (each re-arm replaces it); cancelling stops the chain."""

    __slots__ = ("_handle",)

    def __init__(self, handle: list[asyncio.TimerHandle]) -> None:
        self._handle = handle

    def cancel(self) -> None:
        self._handle[0].cancel()
