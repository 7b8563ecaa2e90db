"""The open reservations of the requests a limiter process admitted: one ticket per request.

The hooks of one request run in the replica that admitted it, so the reservation a request still holds is
kept here, in memory, and each ticket is settled exactly once however many of LiteLLM's success and
failure hooks fire for it. Memory is bounded: tickets of requests that never report back are forgotten
once they expire, and the oldest go first past ``max_open``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace

__all__ = ["AdmissionTicket", "TicketBook"]


@dataclass(slots=True)
class AdmissionTicket:
    """What one admitted request reserved, and where."""

    model_group: str
    pool: str
    window_start_ms: int
    held_tokens: int
    """Tokens the request still holds in its window (0 once a failure gave them back)."""
    expires_at: float
    """``time.monotonic()`` after which the ticket may be forgotten."""
    learn_beyond: int | None
    """Teaches the output estimate: the sample is the actual tokens minus this (the part counted before
    the call); ``None`` when the request teaches nothing (no estimated output)."""
    local: bool = False
    """Admitted by this process's own store (``fail_mode: local``): its corrections go there."""
    on_prior: bool = False
    """Its output was reserved at ``default_output_tokens`` because nothing was learned yet (a cold start):
    its correction is large, and other replicas decide against it until it is sent, so it is sent at once
    instead of with the next admission (see :meth:`~.settle_queue.SettleQueue.send_now`)."""


class TicketBook:
    """Open tickets by id, oldest first."""

    __slots__ = ("_max_open", "_numbers", "_prefix", "_tickets")

    def __init__(self, max_open: int = 100_000) -> None:
        self._tickets: OrderedDict[str, AdmissionTicket] = OrderedDict()
        self._max_open = max_open
        # Ids only need to be unique among this book's open tickets (and not collide with a copy of another
        # process's metadata): a random prefix and a counter, cheaper than a uuid each.
        self._prefix = uuid.uuid4().hex[:12] + "-"
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._tickets)

    def get(self, ticket_id: str) -> AdmissionTicket | None:
        return self._tickets.get(ticket_id)

    def open(self, ticket: AdmissionTicket) -> str:
        """Keep ``ticket``; return its new id. Forgets expired tickets first (a correction that comes later
        is dropped), and the oldest past ``max_open``."""
        tickets = self._tickets
        now = time.monotonic()
        while tickets and (len(tickets) >= self._max_open or next(iter(tickets.values())).expires_at < now):
            tickets.popitem(last=False)
        ticket_id = f"{self._prefix}{next(self._numbers)}"
        tickets[ticket_id] = ticket
        return ticket_id

    def close(self, ticket_id: str) -> AdmissionTicket | None:
        """The request reported its usage: remove its ticket and return it (``None`` if unknown)."""
        return self._tickets.pop(ticket_id, None)

    def release(self, ticket_id: str) -> AdmissionTicket | None:
        """The request failed: return a copy holding what the ticket held, which now holds nothing (a later
        success still finds its window). ``None`` if unknown."""
        ticket = self._tickets.get(ticket_id)
        if ticket is None:
            return None
        held = ticket.held_tokens
        ticket.held_tokens = 0
        return replace(ticket, held_tokens=held, learn_beyond=None)

    def drop(self, ticket_id: str) -> None:
        self._tickets.pop(ticket_id, None)
