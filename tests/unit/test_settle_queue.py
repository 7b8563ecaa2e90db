"""The settle queue's immediate sends (SettleQueue.send_now), with a recording flush callback."""

from __future__ import annotations

import asyncio

from litellm_ratebalance.admission.estimate import SettleBatch
from litellm_ratebalance.proxy.admission.settle_queue import SettleQueue


class Recorder:
    """A flush callback that records what it sends, and can be held until released."""

    def __init__(self, *, result: bool = True) -> None:
        self.sent: list[tuple[str, list[tuple[int, str, int, int]]]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.result = result

    async def __call__(self, model_group: str, batch: SettleBatch) -> bool:
        self.sent.append((model_group, sorted(batch.delta_items())))
        await self.release.wait()
        return self.result


async def test_send_now_sends_what_is_pending_before_it_returns() -> None:
    recorder = Recorder()
    queue = SettleQueue(recorder, delay_seconds=60)
    queue.batch("m").add(0, "d", -226)
    queue.batch("other").add(0, "d", 5)
    await queue.send_now("m")
    assert recorder.sent == [("m", [(0, "d", -226, 0)])]
    assert queue.take("m") is None and queue.take("other") is not None  # only its own model group


async def test_one_send_at_a_time_and_what_came_meanwhile_goes_right_after() -> None:
    recorder = Recorder()
    recorder.release.clear()
    queue = SettleQueue(recorder, delay_seconds=60)
    queue.batch("m").add(0, "d", -1)
    first = asyncio.create_task(queue.send_now("m"))
    await asyncio.sleep(0)
    assert len(recorder.sent) == 1  # in flight
    queue.batch("m").add(0, "d", -2)
    queue.batch("m").add(0, "d", -3)
    await asyncio.gather(queue.send_now("m"), queue.send_now("m"))  # return at once: one is in flight
    assert len(recorder.sent) == 1
    recorder.release.set()
    await first
    assert recorder.sent == [("m", [(0, "d", -1, 0)]), ("m", [(0, "d", -5, 0)])]


async def test_nothing_is_sent_when_an_admission_took_the_batch_along() -> None:
    recorder = Recorder()
    queue = SettleQueue(recorder, delay_seconds=60)
    queue.batch("m").add(0, "d", -1)
    assert queue.take("m") is not None
    await queue.send_now("m")
    assert recorder.sent == []


async def test_a_failed_send_stops_and_leaves_the_batch_to_the_callback() -> None:
    recorder = Recorder(result=False)  # the limiter's callback puts the batch back and says False
    queue = SettleQueue(recorder, delay_seconds=60)
    queue.batch("m").add(0, "d", -1)
    await queue.send_now("m")
    assert len(recorder.sent) == 1
    queue.batch("m").add(0, "d", -2)
    await queue.send_now("m")  # a later one is tried again
    assert len(recorder.sent) == 2


async def test_an_admission_waits_for_a_send_in_flight_and_then_takes_what_came_since() -> None:
    recorder = Recorder()
    recorder.release.clear()
    queue = SettleQueue(recorder, delay_seconds=60)
    queue.batch("m").add(0, "d", -1)
    sending = asyncio.create_task(queue.send_now("m"))
    await asyncio.sleep(0)
    queue.batch("m").add(0, "d", -2)  # not urgent: waits for an admission
    taking = asyncio.create_task(queue.take_after_send("m"))
    await asyncio.sleep(0.01)
    assert not taking.done()  # the correction sent first reaches the store first
    recorder.release.set()
    await sending
    taken = await taking
    assert taken is not None and list(taken.delta_items()) == [(0, "d", -2, 0)]
    assert await queue.take_after_send("other") is None  # nothing in flight: no wait
