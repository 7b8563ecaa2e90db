"""The contracts adapter's pending reconciles: summed per window and feature, one send per window."""

from __future__ import annotations

import asyncio

from litellm_ratebalance.proxy.contracts.settles import ContractSettleQueue, Deltas


async def test_reconciles_are_summed_per_window_and_feature() -> None:
    sent: list[tuple[int, Deltas]] = []
    queue = ContractSettleQueue(lambda start, deltas: sent.append((start, deltas)))
    queue.add(60, "a", 100, 30)
    queue.add(60, "a", 100, 40)
    queue.add(60, "b", 50, 0)  # a failed attempt: its estimate given back, nothing used
    queue.add(0, "a", 10, 12)  # a late one of the previous window
    queue.add(60, "c", 0, 0)  # nothing to send
    assert queue
    queue.flush_now()
    assert sorted(sent) == [(0, {"a": (10, 12)}), (60, {"a": (200, 70), "b": (50, 0)})]
    assert not queue
    queue.flush_now()
    assert len(sent) == 2  # nothing pending: nothing sent


async def test_the_first_reconcile_arms_one_send_for_the_batch() -> None:
    sent: list[tuple[int, Deltas]] = []
    first_send = asyncio.get_running_loop().create_future()

    def send(start: int, deltas: Deltas) -> None:
        sent.append((start, deltas))
        if not first_send.done():
            first_send.set_result(None)

    queue = ContractSettleQueue(send, delay_seconds=0.0)
    queue.add(60, "a", 100, 30)
    queue.add(60, "a", 100, 40)
    assert sent == []  # never sent from the hook itself
    await asyncio.wait_for(first_send, 5.0)  # the timer armed by the first one sends both
    assert sent == [(60, {"a": (200, 70)})] and not queue
    queue.add(120, "a", 5, 5)  # the next one arms a timer of its own
    queue.flush_now()
    assert sent[-1] == (120, {"a": (5, 5)})
