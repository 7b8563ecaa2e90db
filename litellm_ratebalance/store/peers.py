"""What the proxy replicas sharing one deployment tell each other, so that together they protect its server as
one proxy would: the store behind backpressure's replica sharing.

Two operations, each one atomic step (one Redis round trip):

* :meth:`PeerStore.waiting_publish`: the tiers (ranks) with requests waiting in this replica's queue for a
  deployment, replacing what this replica published before; returns the highest rank waiting in any
  replica. The lease acquire (:meth:`~litellm_ratebalance.store.concurrency.ConcurrencyStore.lease_acquire`
  with ``rank``) refuses a lower tier while a higher one waits anywhere.
* :meth:`PeerStore.peer_exchange`: this replica's state of a deployment in (an opaque string: learned
  limit, answer lengths, top-tier demand; see :mod:`litellm_ratebalance.overload.peers`), the other live
  replicas' states out.

Expiry contract (both backends): an entry or state is alive while ``now < expiry``; a replica that stops
publishing (crashed) drops out once its entries lapse. Redis uses its server ``TIME``; the embedded store its
injected clock (one proxy process uses one replica name, so it finds no peers there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.keys import KeySpace

__all__ = ["MemoryPeerStore", "PeerStore", "RedisPeerStore", "highest_waiting"]

MAX_STATE_CHARS = 16_000
"""A replica's state is refused above this length (it is a few hundred characters; the bound keeps a key small)."""


class PeerStore(Protocol):
    async def waiting_publish(self, deployment_id: str, replica: str, ranks: Iterable[int], ttl_ms: int) -> int:
        """Replace ``replica``'s waiting entries of the deployment by ``ranks`` (alive ``ttl_ms``); the highest
        rank waiting in any replica after that, -1 when none."""

    async def peer_exchange(self, deployment_id: str, replica: str, state: str, ttl_ms: int) -> dict[str, str]:
        """Store ``replica``'s ``state`` of the deployment (alive ``ttl_ms``); the other live replicas' states
        by name."""


def _check(replica: str, ttl_ms: int) -> int:
    if not replica:
        raise ValueError("the replica name must not be empty")
    ttl = int(ttl_ms)
    if ttl <= 0:
        raise ValueError(f"the time-to-live must be positive (got {ttl_ms} ms)")
    return ttl


def _ranks(ranks: Iterable[int]) -> list[int]:
    checked = sorted({int(r) for r in ranks})
    if checked and checked[0] < 0:
        raise ValueError(f"ranks are >= 0 (got {checked[0]})")
    return checked


def _check_state(state: str) -> str:
    if len(state) > MAX_STATE_CHARS:
        raise ValueError(f"a replica's state is at most {MAX_STATE_CHARS} characters (got {len(state)})")
    return state


def highest_waiting(entries: dict[tuple[int, str], int], now_ms: int) -> int:
    """The highest rank of the live entries (``(rank, replica) -> expiry ms``), dropping the expired ones;
    -1 when none (the embedded store's copy of ``_waiting.lua``)."""
    for key in [k for k, expiry in entries.items() if expiry <= now_ms]:
        del entries[key]
    return max((rank for rank, _ in entries), default=-1)


class RedisPeerStore:
    """Waiting tiers and replica states over Redis: ``waiting_publish.lua`` and ``peer_exchange.lua`` on
    the deployment's lease hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def waiting_publish(self, deployment_id: str, replica: str, ranks: Iterable[int], ttl_ms: int) -> int:
        ttl = _check(replica, ttl_ms)
        reply = await self._runner.run(
            "waiting_publish", [self._keys.waiting_tiers(deployment_id)], [replica, ttl, *_ranks(ranks)]
        )
        return int(reply)

    async def peer_exchange(self, deployment_id: str, replica: str, state: str, ttl_ms: int) -> dict[str, str]:
        ttl = _check(replica, ttl_ms)
        reply: list[Any] = await self._runner.run(
            "peer_exchange", list(self._keys.peer_keys(deployment_id)), [replica, ttl, _check_state(state)]
        )
        return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


class MemoryPeerStore:
    """The same in process memory, under the store's one lock, expiring on its clock."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _waiting: dict[str, dict[tuple[int, str], int]]
    _peer_states: dict[str, dict[str, tuple[str, int]]]

    def _init_peers(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
        self._waiting = {}
        self._peer_states = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _highest_waiting(self, deployment_id: str, now_ms: int) -> int:
        """The highest rank waiting for the deployment (caller holds the lock)."""
        entries = self._waiting.get(deployment_id)
        if entries is None:
            return -1
        highest = highest_waiting(entries, now_ms)
        if not entries:
            del self._waiting[deployment_id]
        return highest

    async def waiting_publish(self, deployment_id: str, replica: str, ranks: Iterable[int], ttl_ms: int) -> int:
        ttl = _check(replica, ttl_ms)
        checked = _ranks(ranks)
        with self._lock:
            now = self._now_ms()
            entries = self._waiting.setdefault(deployment_id, {})
            for key in [k for k in entries if k[1] == replica]:
                del entries[key]
            for rank in checked:
                entries[(rank, replica)] = now + ttl
            return self._highest_waiting(deployment_id, now)

    async def peer_exchange(self, deployment_id: str, replica: str, state: str, ttl_ms: int) -> dict[str, str]:
        ttl = _check(replica, ttl_ms)
        _check_state(state)
        with self._lock:
            now = self._now_ms()
            states = self._peer_states.setdefault(deployment_id, {})
            for name in [n for n, (_, expiry) in states.items() if expiry <= now]:
                del states[name]
            states[replica] = (state, now + ttl)
            return {name: text for name, (text, _) in states.items() if name != replica}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
