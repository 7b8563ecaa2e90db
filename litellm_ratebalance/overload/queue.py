"""Pure bounded wait queue of one deployment: strict priority between tiers, weighted fair by token cost
between clients (keys / teams) within a tier, with a deadline per entry.

Fairness follows the Virtual Token Counter idea (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024): every client has a counter of the tokens it was served divided by its weight; the next
request served is the one of the waiting client with the lowest counter, so a client that sent one
10 000-token request waits behind one that sent a hundred 100-token ones, and a client that used less than
its share goes first without locking others out. Two rules keep the counters honest:

* a client that starts waiting while others wait is lifted to the lowest counter among the waiting clients
  (an idle client cannot bank credit and then monopolise the deployment);
* counters are kept only while somebody waits: when the queue empties they are dropped (memory stays
  bounded by the clients seen during one backlog).

Charges are made when a request leaves the queue (its estimated cost); :meth:`FairQueue.charge` corrects
them with the actual tokens afterwards.

Nothing here reads a clock or does I/O: ``now`` and deadlines are passed in (seconds, any origin).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FairQueue", "QueueEntry"]

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class QueueEntry(Generic[T]):
    """One waiting request (compared by identity)."""

    item: T
    client: str
    rank: int
    cost: float
    weight: float
    enqueued_at: float
    deadline: float
    seq: int = field(default=0)


class FairQueue(Generic[T]):
    """Bounded; ``push`` refuses past ``max_depth``. Not thread-safe (one event loop owns it)."""

    __slots__ = ("_clients", "_counters", "_depth", "_max_depth", "_seq")

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1 (got {max_depth})")
        self._max_depth = max_depth
        # rank -> client -> FIFO of that client's entries in that tier
        self._clients: dict[int, dict[str, deque[QueueEntry[T]]]] = {}
        self._counters: dict[str, float] = {}
        self._depth = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._depth

    @property
    def max_depth(self) -> int:
        return self._max_depth

    def counter(self, client: str) -> float | None:
        """The client's virtual counter (``None`` when it has none: nobody is waiting, or it is new)."""
        return self._counters.get(client)

    def _waiting_clients(self) -> set[str]:
        return {client for tier in self._clients.values() for client in tier}

    def push(
        self, item: T, *, client: str, rank: int, cost: float, now: float, max_wait: float, weight: float = 1.0
    ) -> QueueEntry[T] | None:
        """Enqueue; return the entry, or ``None`` when the queue is full."""
        if self._depth >= self._max_depth:
            return None
        if weight <= 0:
            raise ValueError(f"weight must be positive (got {weight})")
        waiting = self._waiting_clients()
        if client not in waiting:
            floor = min((self._counters.get(c, 0.0) for c in waiting), default=None)
            current = self._counters.get(client, 0.0)
            self._counters[client] = current if floor is None else max(current, floor)
        entry = QueueEntry(item, client, rank, max(0.0, cost), weight, now, now + max_wait, next(self._seq))
        self._clients.setdefault(rank, {}).setdefault(client, deque()).append(entry)
        self._depth += 1
        return entry

    def ranks(self) -> tuple[int, ...]:
        """The tiers with a waiting entry, lowest first."""
        return tuple(sorted(self._clients))

    def top_rank(self) -> int | None:
        """The highest tier with a waiting entry (``None`` when the queue is empty)."""
        return max(self._clients) if self._clients else None

    def peek(self) -> QueueEntry[T] | None:
        """The entry to serve next: highest tier; within it, the client with the lowest counter (ties: the
        one waiting longest); within a client, first in first out."""
        if not self._clients:
            return None
        tier = self._clients[max(self._clients)]
        best: QueueEntry[T] | None = None
        best_key: tuple[float, int] | None = None
        for client, entries in tier.items():
            head = entries[0]
            key = (self._counters.get(client, 0.0), head.seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def pop(self, entry: QueueEntry[T] | None = None) -> QueueEntry[T] | None:
        """Remove and return ``entry`` (default: :meth:`peek`'s), charging its client ``cost / weight``.

        Passing the entry a caller peeked at earlier serves exactly that one, even if a request of a higher
        tier arrived in between (it is next)."""
        if entry is None:
            entry = self.peek()
        if entry is None or not self._contains(entry):
            return None
        self._remove(entry)
        self._counters[entry.client] = self._counters.get(entry.client, 0.0) + entry.cost / entry.weight
        self._forget_if_empty()
        return entry

    def _contains(self, entry: QueueEntry[T]) -> bool:
        entries = self._clients.get(entry.rank, {}).get(entry.client)
        return entries is not None and any(e is entry for e in entries)

    def remove(self, entry: QueueEntry[T]) -> bool:
        """Take out an entry that gave up (timed out, cancelled) without charging it."""
        if not self._contains(entry):
            return False
        self._remove(entry)
        self._forget_if_empty()
        return True

    def expire(self, now: float) -> list[QueueEntry[T]]:
        """Remove and return every entry whose deadline is at or before ``now``."""
        expired = [e for tier in self._clients.values() for es in tier.values() for e in es if e.deadline <= now]
        for entry in expired:
            self._remove(entry)
        self._forget_if_empty()
        return expired

    def next_deadline(self) -> float | None:
        deadlines = [e.deadline for tier in self._clients.values() for es in tier.values() for e in es]
        return min(deadlines, default=None)

    def charge(self, client: str, tokens: float, weight: float = 1.0) -> None:
        """Correct a client's counter once its actual usage is known (``tokens`` may be negative)."""
        if client in self._counters and weight > 0:
            self._counters[client] = max(0.0, self._counters[client] + tokens / weight)

    def _remove(self, entry: QueueEntry[T]) -> None:
        tier = self._clients[entry.rank]
        entries = tier[entry.client]
        entries.remove(entry)
        if not entries:
            del tier[entry.client]
        if not tier:
            del self._clients[entry.rank]
        self._depth -= 1

    def _forget_if_empty(self) -> None:
        if self._depth == 0:
            self._counters.clear()
