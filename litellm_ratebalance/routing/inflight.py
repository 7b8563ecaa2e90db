"""The in-flight book: this replica's requests in flight at one deployment, with the load they shared.

Local to a replica (never synced): requests in flight here feed the evidence (stalls, overdue requests,
load) and the least-loaded pick. Times are the caller's, explicit.
"""

from __future__ import annotations

import itertools
import math

__all__ = ["MAX_IN_FLIGHT", "InFlight"]

MAX_IN_FLIGHT = 4096
"""Entries kept per deployment (and answers waiting for their record); the oldest go first."""

_ANONYMOUS_PICKS = itertools.count()
"""Private keys of picks made without a request id (see :class:`InFlight`)."""


class InFlight(dict[object, tuple[float, float, float]]):
    """This replica's requests in flight at one deployment, oldest first: key -> (start, load area at start,
    expected latency: seconds a request of its size takes there at light load, or 0 when unknown).

    The key is the request's id when the caller knows it (LiteLLM's ``litellm_trace_id``), so a finished
    request removes its own entry; picks without an id get a private key and a finish without a known id
    removes the oldest entry (requests do not finish in order, so ages are then underestimated, never
    overestimated). A dict (insertion order = start order) so that size and truth tests cost nothing.

    The **load area** is the integral over time of the number of requests in flight here, kept up to date at
    every change of that number (times are the caller's, explicit). :meth:`take` turns it into the mean load a
    request shared the deployment with over its whole life, itself included: the loads it met and left
    alone read a request low whenever a crowd came and went while it ran, which under processor sharing is
    exactly when it is slowed down.
    """

    __slots__ = ("_area", "_since")

    def __init__(self) -> None:
        super().__init__()
        self._area = 0.0
        self._since = -math.inf

    def _advance(self, now: float) -> float:
        """The load area up to ``now`` (a time before the last change counts as that change's time)."""
        if now > self._since:
            if self and self._since > -math.inf:
                self._area += len(self) * (now - self._since)
            self._since = now
        return self._area

    def add(self, now: float, request_id: str | None, expected_latency: float = 0.0) -> None:
        """A request starts at ``now`` (the same id again restarts it; beyond :data:`MAX_IN_FLIGHT` entries the
        oldest is dropped). ``expected_latency``: what a request of its size takes there at light load (0:
        unknown)."""
        area = self._advance(now)
        if len(self) >= MAX_IN_FLIGHT:
            del self[next(iter(self))]
        key: object = request_id if request_id is not None else next(_ANONYMOUS_PICKS)
        self.pop(key, None)  # the same request again (a retry here): it starts anew
        self[key] = (now, area, expected_latency)

    def take(self, request_id: str | None, now: float) -> tuple[float, float, float] | None:
        """Remove the request's entry (the oldest when its id is unknown) at ``now``; its (start, mean load
        over its life, itself included, expected latency). A request with no time in flight gets the load
        it leaves, itself included."""
        key: object | None = request_id if request_id is not None and request_id in self else None
        if key is None:
            if not self:
                return None
            key = next(iter(self))
        area = self._advance(now)
        load = float(len(self))
        start, area_at_start, expected = self.pop(key)
        if now > start and area > area_at_start:
            load = (area - area_at_start) / (now - start)
        return start, max(load, 1.0), expected

    def forget_before(self, cutoff: float, now: float) -> None:
        """Drop the entries that started before ``cutoff`` (picks whose call never reported back)."""
        self._advance(now)
        while self:
            key = next(iter(self))
            if self[key][0] >= cutoff:
                return
            del self[key]
