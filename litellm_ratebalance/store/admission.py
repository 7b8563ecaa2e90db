"""Admission counters: the store operations behind the priority limiter.

Two operations, each one atomic step (one Redis round trip):

* :meth:`AdmissionStore.acquire` decides a request against the live window and reserves it if admitted;
* :meth:`AdmissionStore.settle` corrects the reservation after the call (reconcile or release).

Window contract (both backends): a model group's window starts at the first request decided while no
window is live, and lasts ``window_ms``; the first request at or after ``start + window_ms`` starts the
next one with all counters at zero. A settle for an ended window is dropped: usage belongs to the window
the request was admitted in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    RejectReason,
    WindowCounters,
    decide,
    protected_room,
)
from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.keys import KeySpace

__all__ = [
    "AcquireResult",
    "AdmissionSnapshot",
    "AdmissionStore",
    "MemoryAdmissionStore",
    "RedisAdmissionStore",
]


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """Outcome of one :meth:`AdmissionStore.acquire` call."""

    admitted: bool
    reason: RejectReason
    now_ms: int
    window_start_ms: int
    window_end_ms: int
    counters: WindowCounters
    """After the reservation when admitted; the counts decided on when refused."""
    saturation: float
    strict: bool
    held_requests: float
    held_tokens: float


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """Read-only view of a model group's window, for status output."""

    window_start_ms: int
    window_end_ms: int
    requests: int
    tokens: int
    pools: dict[str, tuple[int, int]]


class AdmissionStore(Protocol):
    async def acquire(
        self, model_group: str, limits: AdmissionLimits, cost_tokens: int, window_ms: int
    ) -> AcquireResult: ...

    async def settle(
        self, model_group: str, pool: str, window_start_ms: int, token_delta: int, request_delta: int = 0
    ) -> bool: ...

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None: ...


def _linger_ms(window_ms: int) -> int:
    # Keep an ended window readable a little (status, late settles are dropped anyway), never forever.
    return max(window_ms, 10_000)


def _floor_args(limits: AdmissionLimits) -> list[object]:
    out: list[object] = [len(limits.floors)]
    for floor in limits.floors:
        out.extend((floor.pool, repr(floor.requests), repr(floor.tokens)))
    return out


def _opt(value: float | None) -> str:
    return "-1" if value is None else repr(float(value))


class RedisAdmissionStore:
    """Admission over Redis: ``admission_acquire.lua`` / ``admission_settle.lua``."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def acquire(
        self, model_group: str, limits: AdmissionLimits, cost_tokens: int, window_ms: int
    ) -> AcquireResult:
        args: list[object] = [
            int(window_ms),
            -1 if limits.rpm is None else int(limits.rpm),
            -1 if limits.tpm is None else int(limits.tpm),
            repr(float(limits.saturation_threshold)),
            limits.pool,
            _opt(limits.pool_rpm),
            _opt(limits.pool_tpm),
            int(cost_tokens),
            _linger_ms(window_ms),
            *_floor_args(limits),
        ]
        reply = await self._runner.run("admission_acquire", [self._keys.admission_window(model_group)], args)
        admitted, reason, now, start, req, tok, preq, ptok, sat, strict, held_r, held_t = reply
        return AcquireResult(
            admitted=bool(int(admitted)),
            reason=RejectReason(int(reason)),
            now_ms=int(now),
            window_start_ms=int(start),
            window_end_ms=int(start) + window_ms,
            counters=WindowCounters(int(req), int(tok), int(preq), int(ptok)),
            saturation=float(sat),
            strict=bool(int(strict)),
            held_requests=float(held_r),
            held_tokens=float(held_t),
        )

    async def settle(
        self, model_group: str, pool: str, window_start_ms: int, token_delta: int, request_delta: int = 0
    ) -> bool:
        if token_delta == 0 and request_delta == 0:
            return True
        reply = await self._runner.run(
            "admission_settle",
            [self._keys.admission_window(model_group)],
            [int(window_start_ms), pool, int(token_delta), int(request_delta)],
        )
        return bool(int(reply))

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None:
        key = self._keys.admission_window(model_group)
        # Through the runner: the same connection gate, timeout, breaker and error mapping as the scripts.
        raw = await self._runner.call("reading the admission window", lambda client: client.hgetall(key))
        if not raw:
            return None
        values = {_text(k): int(_text(v)) for k, v in raw.items()}
        return _snapshot(values, window_ms)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _snapshot(values: dict[str, int], window_ms: int) -> AdmissionSnapshot:
    pools: dict[str, tuple[int, int]] = {}
    for name, value in values.items():
        if name.startswith(("r:", "t:")):
            requests, tokens = pools.get(name[2:], (0, 0))
            pools[name[2:]] = (value, tokens) if name[0] == "r" else (requests, value)
    start = values.get("start", 0)
    return AdmissionSnapshot(start, start + window_ms, values.get("r", 0), values.get("t", 0), pools)


@dataclass(slots=True)
class _MemoryWindow:
    start_ms: int
    counts: dict[str, int] = field(default_factory=dict)


class MemoryAdmissionStore:
    """Admission in process memory: same semantics, :func:`decide` itself, one lock.

    The lock makes each operation atomic across threads as well as tasks (nothing awaits inside).
    """

    _clock: Callable[[], float]
    _lock: threading.Lock
    _admission_windows: dict[str, _MemoryWindow]

    def _init_admission(self) -> None:
        self._admission_windows = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def acquire(
        self, model_group: str, limits: AdmissionLimits, cost_tokens: int, window_ms: int
    ) -> AcquireResult:
        with self._lock:
            now = self._now_ms()
            window = self._admission_windows.get(model_group)
            if window is None or now >= window.start_ms + window_ms:
                window = _MemoryWindow(now)
                self._admission_windows[model_group] = window
            self._evict_ended_admission_windows(now, window_ms)
            counts = window.counts
            pool = limits.pool
            counters = WindowCounters(
                counts.get("r", 0),
                counts.get("t", 0),
                counts.get("r:" + pool, 0),
                counts.get("t:" + pool, 0),
                {f.pool: (counts.get("r:" + f.pool, 0), counts.get("t:" + f.pool, 0)) for f in limits.floors},
            )
            decision = decide(counters, limits, cost_tokens)
            if decision.admitted:
                for name, delta in (
                    ("r", 1),
                    ("r:" + pool, 1),
                    ("t", cost_tokens),
                    ("t:" + pool, cost_tokens),
                ):
                    counts[name] = counts.get(name, 0) + delta
                counters = WindowCounters(
                    counts["r"], counts["t"], counts["r:" + pool], counts["t:" + pool], counters.other_pools
                )
            held_r, held_t = protected_room(limits, counters)
            return AcquireResult(
                admitted=decision.admitted,
                reason=decision.reason,
                now_ms=now,
                window_start_ms=window.start_ms,
                window_end_ms=window.start_ms + window_ms,
                counters=counters,
                saturation=decision.saturation,
                strict=decision.strict,
                held_requests=held_r,
                held_tokens=held_t,
            )

    def _evict_ended_admission_windows(self, now_ms: int, window_ms: int) -> None:
        # Bounded memory: model groups come from the router's configuration, but drop ended windows
        # anyway so a removed model group does not stay forever.
        if len(self._admission_windows) <= 64:
            return
        for name in [n for n, w in self._admission_windows.items() if now_ms >= w.start_ms + 2 * window_ms]:
            del self._admission_windows[name]

    async def settle(
        self, model_group: str, pool: str, window_start_ms: int, token_delta: int, request_delta: int = 0
    ) -> bool:
        with self._lock:
            window = self._admission_windows.get(model_group)
            if window is None or window.start_ms != window_start_ms:
                return False
            for name, delta in (
                ("t", token_delta),
                ("t:" + pool, token_delta),
                ("r", request_delta),
                ("r:" + pool, request_delta),
            ):
                if delta:
                    window.counts[name] = max(0, window.counts.get(name, 0) + delta)
            return True

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None:
        with self._lock:
            window = self._admission_windows.get(model_group)
            if window is None or self._now_ms() >= window.start_ms + window_ms + _linger_ms(window_ms):
                return None
            return _snapshot({"start": window.start_ms, **window.counts}, window_ms)
