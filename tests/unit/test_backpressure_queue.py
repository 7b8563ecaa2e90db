"""The fair wait queue: strict tiers, VTC fairness by token cost, bounds, deadlines."""

from __future__ import annotations

import pytest

from litellm_ratebalance.overload.queue import FairQueue, QueueEntry


def push(
    q: FairQueue[str], item: str, client: str, cost: float, *, rank: int = 0, now: float = 0.0, **kw: float
) -> QueueEntry[str] | None:
    return q.push(item, client=client, rank=rank, cost=cost, now=now, max_wait=kw.pop("max_wait", 10.0), **kw)


def drain(q: FairQueue[str]) -> list[str]:
    out = []
    while (entry := q.pop()) is not None:
        out.append(entry.item)
    return out


def test_higher_tier_first_fifo_within_a_client() -> None:
    q: FairQueue[str] = FairQueue(10)
    push(q, "low-1", "a", 10)
    push(q, "high-1", "b", 10, rank=2)
    push(q, "low-2", "a", 10)
    push(q, "high-2", "b", 10, rank=2)
    assert drain(q) == ["high-1", "high-2", "low-1", "low-2"]


def test_fair_by_token_cost_not_by_request_count() -> None:
    # Client "big" sends one 10 000-token request first, then more; "small" sends 100-token ones.
    q: FairQueue[str] = FairQueue(100)
    push(q, "big-1", "big", 10_000)
    push(q, "big-2", "big", 10_000)
    for i in range(5):
        push(q, f"small-{i}", "small", 100)
    order = drain(q)
    # big-1 goes first (oldest head, equal counters), then every small one before big's second.
    assert order == ["big-1", "small-0", "small-1", "small-2", "small-3", "small-4", "big-2"]


def test_weights_scale_the_share() -> None:
    q: FairQueue[str] = FairQueue(100)
    for i in range(4):
        push(q, f"gold-{i}", "gold", 100, weight=3.0)
        push(q, f"basic-{i}", "basic", 100)
    # gold pays a third per token: about three of its requests per basic one while both wait.
    assert drain(q) == ["gold-0", "basic-0", "gold-1", "gold-2", "basic-1", "gold-3", "basic-2", "basic-3"]


def test_a_newcomer_is_lifted_and_cannot_bank_credit() -> None:
    q: FairQueue[str] = FairQueue(100)
    for i in range(6):
        push(q, f"a-{i}", "a", 100)
    for _ in range(3):
        q.pop()  # a's counter is now 300
    push(q, "b-0", "b", 100)
    assert q.counter("b") == q.counter("a") == 300
    push(q, "b-1", "b", 100)
    # Alternating from here, not three b's in a row.
    assert drain(q)[:4] == ["a-3", "b-0", "a-4", "b-1"]


def test_bounded_and_counters_dropped_when_empty() -> None:
    q: FairQueue[str] = FairQueue(2)
    assert push(q, "1", "a", 1) is not None
    assert push(q, "2", "b", 1) is not None
    assert push(q, "3", "c", 1) is None
    assert len(q) == 2
    drain(q)
    assert len(q) == 0 and q.counter("a") is None


def test_expire_remove_and_charge() -> None:
    q: FairQueue[str] = FairQueue(10)
    short = push(q, "short", "a", 5, now=0.0, max_wait=1.0)
    long_ = push(q, "long", "b", 5, now=0.0, max_wait=5.0)
    push(q, "other", "c", 5, now=0.0, max_wait=5.0)
    assert q.next_deadline() == 1.0
    assert [e.item for e in q.expire(1.0)] == ["short"]
    assert short is not None and not q.remove(short)
    assert long_ is not None and q.remove(long_)
    assert [e.item for e in q.expire(10.0)] == ["other"]
    q2: FairQueue[str] = FairQueue(10)
    push(q2, "x", "a", 100)
    push(q2, "y", "a", 100)
    q2.pop()
    q2.charge("a", -60)  # it used 40 tokens, not the 100 reserved
    assert q2.counter("a") == pytest.approx(40)


def test_pop_of_a_peeked_entry_serves_exactly_it() -> None:
    q: FairQueue[str] = FairQueue(10)
    first = push(q, "low", "a", 1)
    assert q.peek() is first
    push(q, "high", "b", 1, rank=1)  # arrives while the head is being served
    assert first is not None and q.pop(first) is first
    assert drain(q) == ["high"]


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        FairQueue(0)
    with pytest.raises(ValueError, match="weight"):
        push(FairQueue(1), "x", "a", 1, weight=0.0)
