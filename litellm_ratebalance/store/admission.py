"""Admission counters: the store operations behind the priority limiter.

Two operations, each one atomic step (one Redis round trip):

* :meth:`AdmissionStore.acquire` applies the settles sent with it, then decides a request against the
  live window and reserves it if admitted;
* :meth:`AdmissionStore.flush` applies settles alone (when no request of the model group comes soon).

The rules (settles per window, carry into the next window, the learned output estimate, the decision)
are those of :mod:`litellm_ratebalance.admission.ledger`, which the embedded backend runs as is and the
Redis script ``admission_acquire.lua`` mirrors.

Window contract (both backends): a model group's window starts at the first request decided while no
window is live, and lasts ``window_ms``; the first request at or after ``start + window_ms`` starts the
next one, with the tokens the ended window used past its tpm already counted (the carry).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from litellm_ratebalance.admission.estimate import DECAY_AT_SAMPLES, SettleBatch
from litellm_ratebalance.admission.ledger import HEADROOM_CAP, HEADROOM_WEIGHT, AdmissionLedger, RequestCost
from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    RejectReason,
    WindowCounters,
    protected_room,
)
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.store._scripts import ScriptRunner, map_late
from litellm_ratebalance.store.keys import KeySpace

__all__ = [
    "DEFAULT_QUANTILE",
    "AcquireResult",
    "AdmissionSnapshot",
    "AdmissionStore",
    "MemoryAdmissionStore",
    "RedisAdmissionStore",
]

DEFAULT_QUANTILE = None
"""The learned estimate is the mean of the answers unless a quantile is asked for."""
ESTIMATE_TTL_MS = 24 * 3600 * 1000
"""A model group's learned estimate is forgotten a day after its last sample."""


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
    cost_tokens: int
    """Tokens the request reserves (or would have)."""
    estimate: float | None
    """The model group's learned output estimate; ``None`` before any sample."""
    headroom: float = 0.0
    """Tokens of the tpm new reservations leave free (learned, see the ledger)."""


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """Read-only view of a model group's window, for status output."""

    window_start_ms: int
    window_end_ms: int
    requests: int
    tokens: int
    pools: dict[str, tuple[int, int]]
    carried_tokens: int = 0
    """Tokens the window before used past its tpm, counted in ``tokens``."""
    estimate: float | None = None


class AdmissionStore(Protocol):
    async def acquire(
        self,
        model_group: str,
        limits: AdmissionLimits,
        cost: RequestCost | int,
        window_ms: int,
        *,
        settles: SettleBatch | None = None,
        quantile: float | None = DEFAULT_QUANTILE,
    ) -> AcquireResult:
        """Apply ``settles``, then decide and (if admitted) reserve one request; ``cost`` as an int is
        a fixed reservation."""

    async def flush(self, model_group: str, settles: SettleBatch, *, quantile: float | None = DEFAULT_QUANTILE) -> None:
        """Apply ``settles`` of the model group without deciding anything."""

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None: ...


def _linger_ms(window_ms: int) -> int:
    # Keep an ended window readable a little (status, the carry, late settles), never forever.
    return max(window_ms, 10_000)


def _as_cost(cost: RequestCost | int) -> RequestCost:
    return cost if isinstance(cost, RequestCost) else RequestCost(int(cost))


def _opt(value: float | None) -> str:
    return "-1" if value is None else repr(float(value))


def _settles_arg(settles: SettleBatch | None) -> str:
    if not settles:
        return ""
    return " ".join(f"{start} {pool} {tokens} {requests}" for start, pool, tokens, requests in settles.delta_items())


def _samples_arg(settles: SettleBatch | None) -> str:
    if not settles:
        return ""
    return " ".join(f"{bucket} {count} {total}" for bucket, (count, total) in settles.samples.items())


def _settings_arg(limits: AdmissionLimits | None, window_ms: int, prior: int, quantile: float | None) -> str:
    """The script's ARGV[4]: what stays the same for every request of one pool under one configuration."""
    if limits is None:  # applying settles only: the limits are not read
        head = ["0", "-1", "-1", "0", "-", "-1", "-1"]
        floors: list[str] = ["0"]
    else:
        head = [
            str(int(window_ms)),
            "-1" if limits.rpm is None else str(int(limits.rpm)),
            "-1" if limits.tpm is None else str(int(limits.tpm)),
            repr(float(limits.saturation_threshold)),
            limits.pool,
            _opt(limits.pool_rpm),
            _opt(limits.pool_tpm),
        ]
        floors = [str(len(limits.floors))]
        for floor in limits.floors:
            floors.extend((floor.pool, repr(floor.requests), repr(floor.tokens)))
    wire_quantile = "-1" if quantile is None else repr(float(quantile))  # -1: the mean
    tail = [str(int(prior)), wire_quantile, str(_linger_ms(window_ms)), str(ESTIMATE_TTL_MS)]
    headroom = [repr(HEADROOM_WEIGHT), repr(HEADROOM_CAP)]
    return " ".join([*head, *tail, str(DECAY_AT_SAMPLES), *headroom, *floors])


class RedisAdmissionStore:
    """Admission over Redis: ``admission_acquire.lua``."""

    _runner: ScriptRunner
    _keys: KeySpace
    _settings_args: dict[tuple[AdmissionLimits, int, int, float | None], str]
    _key_pairs: dict[str, list[str]]

    def _init_admission(self) -> None:
        """The caches of the script's arguments (called by the store's ``__init__``, as each part's is)."""
        self._settings_args = {}
        self._key_pairs = {}

    def _admission_keys(self, model_group: str) -> list[str]:
        keys = self._key_pairs.get(model_group)
        if keys is None:
            if len(self._key_pairs) >= 1024:  # bounded: request model names are not all configured ones
                self._key_pairs.clear()
            keys = self._key_pairs[model_group] = [
                self._keys.admission_window(model_group),
                self._keys.admission_estimate(model_group),
            ]
        return keys

    async def acquire(
        self,
        model_group: str,
        limits: AdmissionLimits,
        cost: RequestCost | int,
        window_ms: int,
        *,
        settles: SettleBatch | None = None,
        quantile: float | None = DEFAULT_QUANTILE,
    ) -> AcquireResult:
        request = _as_cost(cost)
        key = (limits, window_ms, request.prior, quantile)
        settings = self._settings_args.get(key)
        if settings is None:
            if len(self._settings_args) >= 1024:  # bounded: pools x capacities x settings in use
                self._settings_args.clear()
            settings = self._settings_args[key] = _settings_arg(limits, window_ms, request.prior, quantile)
        args = [
            1,
            int(request.fixed),
            -1 if request.output_cap is None else int(request.output_cap),
            settings,
            _settles_arg(settles),
            _samples_arg(settles),
        ]
        try:
            reply = await self._runner.run("admission_acquire", self._admission_keys(model_group), args)
        except StoreError as exc:
            # Timed out: the script may still run (settles applied, a request reserved). The caller reconciles
            # from the late outcome, decoded like a reply in time.
            exc.late = map_late(exc.late, lambda late_reply: _acquire_result(late_reply, window_ms))
            raise
        return _acquire_result(reply, window_ms)

    async def flush(self, model_group: str, settles: SettleBatch, *, quantile: float | None = DEFAULT_QUANTILE) -> None:
        if not settles:
            return
        settings = _settings_arg(None, 0, 0, quantile)
        args = [0, 0, -1, settings, _settles_arg(settles), _samples_arg(settles)]
        await self._runner.run("admission_acquire", self._admission_keys(model_group), args)

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None:
        window_key, estimate_key = self._admission_keys(model_group)

        async def read(client: object) -> tuple[dict[bytes | str, bytes | str], bytes | str | None]:
            raw = await client.hgetall(window_key)  # type: ignore[attr-defined]
            estimate = await client.hget(estimate_key, "e")  # type: ignore[attr-defined]
            return raw, estimate

        # Through the runner: the same connection gate, timeout, breaker and error mapping as the scripts.
        raw, estimate = await self._runner.call("reading the admission window", read)
        if not raw:
            return None
        # Counters are integers; ``g`` (the headroom taken, see the script) is not and is not shown.
        values = {_text(k): int(float(_text(v))) for k, v in raw.items()}
        return _snapshot(values, window_ms, float(_text(estimate)) if estimate is not None else None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _acquire_result(reply: list[Any], window_ms: int) -> AcquireResult:
    """Decode ``admission_acquire``'s reply to a decision (see the script's header for its fields)."""
    admitted, reason, now, start, req, tok, preq, ptok, sat, strict, held_r, held_t, spent, estimate, room = reply
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
        cost_tokens=int(spent),
        estimate=float(estimate) if estimate not in (b"", "") else None,
        headroom=float(room),
    )


def _snapshot(values: dict[str, int], window_ms: int, estimate: float | None) -> AdmissionSnapshot:
    pools: dict[str, tuple[int, int]] = {}
    for name, value in values.items():
        if name.startswith(("r:", "t:")):
            requests, tokens = pools.get(name[2:], (0, 0))
            pools[name[2:]] = (value, tokens) if name[0] == "r" else (requests, value)
    start = values.get("start", 0)
    return AdmissionSnapshot(
        start, start + window_ms, values.get("r", 0), values.get("t", 0), pools, values.get("c", 0), estimate
    )


class MemoryAdmissionStore:
    """Admission in process memory: the :class:`AdmissionLedger` itself, under one lock.

    The lock makes each operation atomic across threads as well as tasks (nothing awaits inside).
    """

    _clock: Callable[[], float]
    _lock: threading.Lock
    _ledger: AdmissionLedger

    def _init_admission(self) -> None:
        self._ledger = AdmissionLedger()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def acquire(
        self,
        model_group: str,
        limits: AdmissionLimits,
        cost: RequestCost | int,
        window_ms: int,
        *,
        settles: SettleBatch | None = None,
        quantile: float | None = DEFAULT_QUANTILE,
    ) -> AcquireResult:
        with self._lock:
            now = self._now_ms()
            if len(self._ledger.windows) > 64:
                # Bounded memory: model groups come from the router's configuration, but a removed one
                # must not stay forever.
                self._ledger.forget_ended(now, window_ms)
            result = self._ledger.acquire(
                model_group, limits, _as_cost(cost), now_ms=now, window_ms=window_ms, batch=settles, quantile=quantile
            )
            held_r, held_t = protected_room(limits, result.counters)
            return AcquireResult(
                admitted=result.decision.admitted,
                reason=result.decision.reason,
                now_ms=now,
                window_start_ms=result.window.start_ms,
                window_end_ms=result.window.start_ms + window_ms,
                counters=result.counters,
                saturation=result.decision.saturation,
                strict=result.decision.strict,
                held_requests=held_r,
                held_tokens=held_t,
                cost_tokens=result.cost_tokens,
                estimate=result.estimate,
                headroom=result.headroom,
            )

    async def flush(self, model_group: str, settles: SettleBatch, *, quantile: float | None = DEFAULT_QUANTILE) -> None:
        with self._lock:
            self._ledger.apply(model_group, settles, quantile)

    async def admission_snapshot(self, model_group: str, window_ms: int) -> AdmissionSnapshot | None:
        with self._lock:
            window = self._ledger.windows.get(model_group)
            if window is None or self._now_ms() >= window.start_ms + window_ms + _linger_ms(window_ms):
                return None
            values = {"start": window.start_ms, "c": window.carry, **window.counts}
            return _snapshot(values, window_ms, self._ledger.estimate(model_group))
