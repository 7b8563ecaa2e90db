"""In-flight slots of each deployment, shared by every proxy replica: the store behind backpressure.

A slot is a **lease**: an id with an expiry and the tokens its request reserved (prompt + max_tokens
estimate). The replica that took a lease renews it while its request runs and releases it when the request
ends; if that replica crashes, its leases expire after their time-to-live and the capacity comes back on
its own. Four operations, each one atomic step (one Redis round trip):

* :meth:`ConcurrencyStore.lease_acquire` takes a lease if fewer than ``slot_cap`` leases are alive, the
  reserved tokens stay within ``token_cap`` and (given the request's ``rank``) no higher tier waits in any
  replica's queue (:mod:`litellm_ratebalance.store.peers`);
* :meth:`ConcurrencyStore.lease_release` gives one back;
* :meth:`ConcurrencyStore.lease_renew` pushes out the expiry of live leases (an expired lease is not revived);
* :meth:`ConcurrencyStore.concurrency_snapshot` reads the totals.

Acquire and release also carry the request's cost marks when asked (``meter``): see
:mod:`litellm_ratebalance.store.metering`.

Expiry contract (both backends): a lease is alive while ``now < expiry``; every operation first purges the
expired ones and returns their tokens. Redis uses its server ``TIME``; the embedded store its injected clock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.store._scripts import ScriptRunner, map_late
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.metering import CostMark, MemorySharing, MeterEnd, MeterStart

__all__ = [
    "ConcurrencySnapshot",
    "ConcurrencyStore",
    "LeaseRefusal",
    "LeaseResult",
    "MemoryConcurrencyStore",
    "RedisConcurrencyStore",
]

_LEASE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


class LeaseRefusal(IntEnum):
    NONE = 0
    SLOTS = 1
    """``slot_cap`` leases are already alive."""
    TOKENS = 2
    """The reserved tokens would pass ``token_cap``."""
    WAITING = 3
    """A request of a higher tier than ``rank`` waits in some replica's queue (see
    :meth:`~litellm_ratebalance.store.peers.PeerStore.waiting_publish`)."""


@dataclass(frozen=True, slots=True)
class LeaseResult:
    acquired: bool
    refusal: LeaseRefusal
    inflight: int
    """Leases alive (after this one when acquired)."""
    reserved_tokens: int
    now_ms: int
    cost: CostMark | None = None
    """The start mark, when the call asked for one and the lease was newly taken."""


@dataclass(frozen=True, slots=True)
class ConcurrencySnapshot:
    inflight: int
    reserved_tokens: int
    changed: int = 0
    """Leases released (0 or 1) or renewed by the call that produced the snapshot."""
    cost: CostMark | None = None
    """The end mark, when the release asked for one."""


class ConcurrencyStore(Protocol):
    async def lease_acquire(
        self,
        deployment_id: str,
        lease_id: str,
        *,
        slot_cap: int,
        ttl_ms: int,
        cost_tokens: int = 0,
        token_cap: int | None = None,
        rank: int | None = None,
        meter: MeterStart | None = None,
    ) -> LeaseResult: ...

    async def lease_release(
        self, deployment_id: str, lease_id: str, meter: MeterEnd | None = None
    ) -> ConcurrencySnapshot: ...

    async def lease_renew(self, deployment_id: str, lease_ids: Sequence[str], ttl_ms: int) -> ConcurrencySnapshot: ...

    async def concurrency_snapshot(self, deployment_id: str) -> ConcurrencySnapshot: ...


def _check_lease_id(lease_id: str) -> str:
    if not _LEASE_ID.fullmatch(lease_id):
        raise ValueError(f"lease ids are 1 to 128 characters from [A-Za-z0-9_.:-] (got {lease_id!r})")
    return lease_id


def _check_ttl(ttl_ms: int) -> int:
    if ttl_ms < 1:
        raise ValueError(f"lease ttl must be at least 1 ms (got {ttl_ms})")
    return int(ttl_ms)


def _lease_result(reply: list[Any]) -> LeaseResult:
    """Decode ``concurrency_acquire``'s reply (see the script's header)."""
    acquired, refusal, inflight, tokens, now = reply[:5]
    mark = CostMark.from_script(reply[5:8], int(now)) if len(reply) >= 8 else None
    return LeaseResult(bool(int(acquired)), LeaseRefusal(int(refusal)), int(inflight), int(tokens), int(now), mark)


class RedisConcurrencyStore:
    """Leases over Redis: ``concurrency_acquire|release|renew.lua`` on two keys of one hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    def _lease_keys(self, deployment_id: str, metered: bool = False) -> list[str]:
        tag = self._keys.concurrency_tag(deployment_id)
        keys = [f"{tag}:leases", f"{tag}:tokens"]
        if metered:
            keys.append(self._keys.cost_state(deployment_id))  # the same hash tag
        return keys

    async def lease_acquire(
        self,
        deployment_id: str,
        lease_id: str,
        *,
        slot_cap: int,
        ttl_ms: int,
        cost_tokens: int = 0,
        token_cap: int | None = None,
        rank: int | None = None,
        meter: MeterStart | None = None,
    ) -> LeaseResult:
        keys = self._lease_keys(deployment_id)
        keys.append(self._keys.waiting_tiers(deployment_id))
        if meter is not None:
            keys.append(self._keys.cost_state(deployment_id))  # the same hash tag
        try:
            reply = await self._runner.run(
                "concurrency_acquire",
                keys,
                [
                    _check_lease_id(lease_id),
                    int(slot_cap),
                    _check_ttl(ttl_ms),
                    max(0, int(cost_tokens)),
                    -1 if token_cap is None else max(0, int(token_cap)),
                    -1 if rank is None else max(0, int(rank)),
                    *(meter.script_args() if meter is not None else ()),
                ],
            )
        except StoreError as exc:
            # Timed out: the lease may still be taken; the caller releases it from the late outcome.
            exc.late = map_late(exc.late, _lease_result)
            raise
        return _lease_result(reply)

    async def lease_release(
        self, deployment_id: str, lease_id: str, meter: MeterEnd | None = None
    ) -> ConcurrencySnapshot:
        reply = await self._runner.run(
            "concurrency_release",
            self._lease_keys(deployment_id, meter is not None),
            [_check_lease_id(lease_id), *(meter.script_args() if meter is not None else ())],
        )
        released, inflight, tokens = reply[:3]
        mark = CostMark.from_script(reply[4:7], int(reply[3])) if len(reply) >= 7 else None
        return ConcurrencySnapshot(int(inflight), int(tokens), int(released), mark)

    async def lease_renew(self, deployment_id: str, lease_ids: Sequence[str], ttl_ms: int) -> ConcurrencySnapshot:
        renewed, inflight, tokens = await self._runner.run(
            "concurrency_renew",
            self._lease_keys(deployment_id),
            [_check_ttl(ttl_ms), *(_check_lease_id(lease) for lease in lease_ids)],
        )
        return ConcurrencySnapshot(int(inflight), int(tokens), int(renewed))

    async def concurrency_snapshot(self, deployment_id: str) -> ConcurrencySnapshot:
        # A renew of no lease is a read that also purges expired leases (the count is then exact).
        snapshot = await self.lease_renew(deployment_id, (), 1)
        return ConcurrencySnapshot(snapshot.inflight, snapshot.reserved_tokens)


@dataclass(slots=True)
class _MemoryLeases:
    leases: dict[str, tuple[int, int]] = field(default_factory=dict)
    """lease id -> (expiry ms, tokens)"""
    tokens: int = 0

    def purge(self, now_ms: int) -> None:
        for lease_id in [i for i, (expiry, _) in self.leases.items() if expiry <= now_ms]:
            self.tokens -= self.leases.pop(lease_id)[1]


class MemoryConcurrencyStore:
    """Leases in process memory: same semantics, one lock (nothing awaits inside it)."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _concurrency_leases: dict[str, _MemoryLeases]
    _sharing: MemorySharing
    _highest_waiting: Callable[[str, int], int]
    """The highest tier waiting for a deployment in any queue, at a time in ms (``MemoryPeerStore``; the
    caller holds the lock)."""

    def _init_concurrency(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
        self._concurrency_leases = {}
        self._sharing = MemorySharing()

    def _lease_now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _deployment_leases(self, deployment_id: str, now_ms: int) -> _MemoryLeases:
        state = self._concurrency_leases.get(deployment_id)
        if state is None:
            state = self._concurrency_leases[deployment_id] = _MemoryLeases()
        state.purge(now_ms)
        return state

    def _forget_if_idle(self, deployment_id: str, state: _MemoryLeases) -> None:
        # Bounded memory: a deployment with no live lease keeps no state (Redis keys expire likewise).
        if not state.leases:
            self._concurrency_leases.pop(deployment_id, None)

    async def lease_acquire(
        self,
        deployment_id: str,
        lease_id: str,
        *,
        slot_cap: int,
        ttl_ms: int,
        cost_tokens: int = 0,
        token_cap: int | None = None,
        rank: int | None = None,
        meter: MeterStart | None = None,
    ) -> LeaseResult:
        _check_lease_id(lease_id)
        ttl = _check_ttl(ttl_ms)
        cost = max(0, int(cost_tokens))
        with self._lock:
            now = self._lease_now_ms()
            state = self._deployment_leases(deployment_id, now)
            alive = len(state.leases)
            existing = state.leases.get(lease_id)
            if existing is not None:
                state.leases[lease_id] = (now + ttl, existing[1])
                return LeaseResult(True, LeaseRefusal.NONE, alive, state.tokens, now)
            refusal = LeaseRefusal.NONE
            if rank is not None and self._highest_waiting(deployment_id, now) > max(0, int(rank)):
                refusal = LeaseRefusal.WAITING
            elif alive >= slot_cap:
                refusal = LeaseRefusal.SLOTS
            elif token_cap is not None and state.tokens + cost > max(0, int(token_cap)):
                refusal = LeaseRefusal.TOKENS
            if refusal is not LeaseRefusal.NONE:
                result = LeaseResult(False, refusal, alive, state.tokens, now)
                self._forget_if_idle(deployment_id, state)
                return result
            state.leases[lease_id] = (now + ttl, cost)
            state.tokens += cost
            mark = None if meter is None else self._sharing.mark(deployment_id, now, alive + 1, meter)
            return LeaseResult(True, LeaseRefusal.NONE, alive + 1, state.tokens, now, mark)

    async def lease_release(
        self, deployment_id: str, lease_id: str, meter: MeterEnd | None = None
    ) -> ConcurrencySnapshot:
        _check_lease_id(lease_id)
        with self._lock:
            now = self._lease_now_ms()
            state = self._deployment_leases(deployment_id, now)
            entry = state.leases.pop(lease_id, None)
            if entry is not None:
                state.tokens -= entry[1]
            mark = None if meter is None else self._sharing.mark(deployment_id, now, len(state.leases), meter)
            snapshot = ConcurrencySnapshot(len(state.leases), state.tokens, int(entry is not None), mark)
            self._forget_if_idle(deployment_id, state)
            return snapshot

    async def lease_renew(self, deployment_id: str, lease_ids: Sequence[str], ttl_ms: int) -> ConcurrencySnapshot:
        ttl = _check_ttl(ttl_ms)
        for lease_id in lease_ids:
            _check_lease_id(lease_id)
        with self._lock:
            now = self._lease_now_ms()
            state = self._deployment_leases(deployment_id, now)
            renewed = 0
            for lease_id in lease_ids:
                entry = state.leases.get(lease_id)
                if entry is not None:
                    state.leases[lease_id] = (now + ttl, entry[1])
                    renewed += 1
            snapshot = ConcurrencySnapshot(len(state.leases), state.tokens, renewed)
            self._forget_if_idle(deployment_id, state)
            return snapshot

    async def concurrency_snapshot(self, deployment_id: str) -> ConcurrencySnapshot:
        snapshot = await self.lease_renew(deployment_id, (), 1)
        return ConcurrencySnapshot(snapshot.inflight, snapshot.reserved_tokens)
