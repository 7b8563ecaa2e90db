"""Store deadlines count Redis's time, not this process's: the event loop's stalls are left out.

A stall is made the way a burst makes one: the loop runs a long callback (``time.sleep`` here) while the
"reply" arrives from another thread, so it can only be read once the stall ends.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from litellm_ratebalance.store.loop_clock import LoopStallClock, ResponsiveDeadline, StallTimeout


def stall_loop(seconds: float) -> None:
    """Block the running loop (one long callback, like LiteLLM's work for a whole burst)."""
    time.sleep(seconds)


def reply_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future[str], after_s: float) -> None:
    """Resolve ``future`` after ``after_s`` from another thread, as a socket's data would arrive."""

    def run() -> None:
        time.sleep(after_s)
        loop.call_soon_threadsafe(future.set_result, "reply")

    threading.Thread(target=run, daemon=True).start()


async def test_the_clock_counts_a_stall_once_it_exceeds_a_tick() -> None:
    clock = LoopStallClock(asyncio.get_running_loop(), tick=0.01)
    gauge, report = clock.watermark(), clock.watermark()
    try:
        await asyncio.sleep(0.05)
        before = clock.stalled()
        assert before < 0.03  # an idle loop keeps its ticks
        stall_loop(0.3)
        in_progress = clock.stalled()  # read in the stall itself: the tick has not run yet
        await asyncio.sleep(0.03)
        after = clock.stalled()
        assert 0.25 <= in_progress - before <= 0.35
        assert 0.25 <= after - before <= 0.4
        assert gauge.take() >= 0.25
        assert gauge.take() < 0.05  # taken: a reader sees each stall once
        assert report.take() >= 0.25  # another reader still sees it
    finally:
        clock.close()


async def test_a_reply_read_late_because_the_loop_was_busy_is_not_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    clock = LoopStallClock(loop, tick=0.01)
    try:
        reply: asyncio.Future[str] = loop.create_future()
        deadline = ResponsiveDeadline(clock, 0.1, cap=5.0)
        alarm = deadline.arm(reply)
        reply_from_thread(loop, reply, after_s=0.02)  # Redis answers at once ...
        stall_loop(0.4)  # ... while the loop is busy four times the timeout
        assert await reply == "reply"
        alarm.cancel()
        assert deadline.elapsed() >= 0.4
    finally:
        clock.close()


async def test_a_reply_that_never_comes_times_out_after_the_timeout_of_free_loop_time() -> None:
    loop = asyncio.get_running_loop()
    clock = LoopStallClock(loop, tick=0.01)
    try:
        deadline = ResponsiveDeadline(clock, 0.1, cap=5.0)
        stall_loop(0.3)  # time during which no reply could be read does not count ...
        started = time.monotonic()
        with pytest.raises(StallTimeout) as raised:
            await deadline.wait(loop.create_future())
        waited = time.monotonic() - started
        assert 0.08 <= waited <= 0.3  # ... the free time after it does
        assert not raised.value.busy
    finally:
        clock.close()


async def test_a_loop_that_never_frees_up_gives_up_at_the_wall_clock_cap_as_busy() -> None:
    loop = asyncio.get_running_loop()
    clock = LoopStallClock(loop, tick=0.01)
    stop = False

    def hog() -> None:  # a callback that stalls the loop 50 ms out of every ~51
        if not stop:
            time.sleep(0.05)
            loop.call_soon(hog)

    try:
        deadline = ResponsiveDeadline(clock, 0.2, cap=0.6)
        loop.call_soon(hog)
        with pytest.raises(StallTimeout) as raised:
            await deadline.wait(loop.create_future())
        assert raised.value.busy
        assert 0.55 <= deadline.elapsed() <= 1.0
    finally:
        stop = True
        clock.close()


async def test_waiting_on_a_task_leaves_it_running_past_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    clock = LoopStallClock(loop, tick=0.01)
    try:
        slow = asyncio.ensure_future(asyncio.sleep(0.2, result="late"))
        with pytest.raises(StallTimeout):
            await ResponsiveDeadline(clock, 0.05, cap=1.0).wait(slow)
        assert not slow.cancelled()
        assert await slow == "late"
    finally:
        clock.close()
