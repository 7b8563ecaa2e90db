"""Traffic-contract counters: the store operations behind the traffic-contract tracker.

Two atomic operations (one Redis round trip each, normally):

* :meth:`ContractStore.contract_admit`, before the call: classify the request's RPM and TPM modes
  against its feature's and the basket's contract in the current fixed window and, unless its worst
  mode is one the caller rejects, count it (1 request, its token estimate in flight). Check and count
  are one step, so concurrent requests cannot all see the same count (the race of a read-then-write).
* :meth:`ContractStore.contract_settle_many`, after the calls: release the estimates and record the actual
  tokens of finished requests, per feature, in the window they were counted in (a replica sends what
  finished in one window in one call; :meth:`ContractStore.contract_settle` is the same for one request).

Layout (both backends; see :class:`~litellm_ratebalance.contracts.policy.ContractLedger`): per window two
hashes, ``{prefix}:traffic_contract:rpm:{<start>}`` and ``...:tpm:{<start>}``, with one field per
feature (escaped with :func:`~litellm_ratebalance.store.keys.escape_name`) and ``__basket__``; the TPM
hash also holds ``<field>:inflight``. The window start is the hash tag, so both hashes of a window live
on one cluster slot. Keys expire at ``start + counter_ttl_seconds``.

Clock: Redis server ``TIME`` decides the window. The client only guesses which window's keys to send
(its clock corrected by the offset it has learnt from Redis' replies); a wrong guess costs one more
round trip, never a wrong count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from litellm_ratebalance.contracts.policy import (
    BASKET_FIELD,
    ContractAdmission,
    ContractLedger,
    ContractLimits,
    ContractSettlement,
    ContractSettlements,
    ContractWindow,
    Mode,
)
from litellm_ratebalance.contracts.policy import window_start as window_start_of
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.store._scripts import ScriptRunner, map_late
from litellm_ratebalance.store.keys import KeySpace

__all__ = [
    "ContractAdmission",
    "ContractSettlement",
    "ContractSettlements",
    "ContractStore",
    "ContractWindow",
    "MemoryContractStore",
    "RedisContractStore",
]

_INFLIGHT_SUFFIX = ":inflight"
_MAX_WINDOW_ATTEMPTS = 3


class ContractStore(Protocol):
    async def contract_admit(
        self,
        feature: str,
        limits: ContractLimits,
        estimate_tokens: int,
        *,
        window_seconds: int,
        ttl_seconds: int,
        reject_modes: Collection[Mode] = (),
    ) -> ContractAdmission:
        """Classify one request of ``feature`` and count it unless its worst mode is in ``reject_modes``."""
        ...

    async def contract_settle(
        self, feature: str, window_start: int, release_tokens: int, actual_tokens: int
    ) -> ContractSettlement:
        """Release ``release_tokens`` of in-flight estimate and record ``actual_tokens`` in that window."""
        ...

    async def contract_settle_many(
        self, window_start: int, deltas: Mapping[str, tuple[int, int]]
    ) -> ContractSettlements:
        """For each feature of ``deltas`` (at least one), release its in-flight estimates and record its actual
        tokens (``(release_tokens, actual_tokens)``, summed over its requests) in that window."""
        ...

    async def contract_window(self, window_seconds: int, window_start: int | None = None) -> ContractWindow | None:
        """The counters of one window (the current one by the store's clock when ``window_start`` is
        None), keyed by counter field; ``None`` if nothing was counted in it or it has expired."""
        ...


def _field(keys: KeySpace, feature: str) -> str:
    field_name = keys.field(feature)
    if field_name == BASKET_FIELD:
        raise ValueError(f"{BASKET_FIELD!r} is the basket counter, not a feature name")
    return field_name


def _limit(value: int | None) -> int:
    return -1 if value is None else int(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _contract_admission(reply: list[Any], window_seconds: int) -> ContractAdmission | None:
    """Decode ``contract_admit``'s reply; ``None`` when it wrote nothing (not the current window)."""
    if int(reply[0]) != 1:
        return None
    rpm_mode, tpm_mode, counted, f_req, b_req, f_tok, b_tok = (int(v) for v in reply[3:10])
    return ContractAdmission(
        now_ms=int(reply[1]),
        window_start=int(reply[2]),
        window_seconds=window_seconds,
        rpm_mode=Mode(rpm_mode),
        tpm_mode=Mode(tpm_mode),
        counted=bool(counted),
        feature_requests=f_req,
        basket_requests=b_req,
        feature_tokens=f_tok,
        basket_tokens=b_tok,
    )


def _window_from_hashes(start: int, rpm: dict[Any, Any], tpm: dict[Any, Any]) -> ContractWindow | None:
    if not rpm and not tpm:
        return None
    requests = {_text(k): int(_text(v)) for k, v in rpm.items()}
    tokens: dict[str, int] = {}
    in_flight: dict[str, int] = {}
    for raw_name, raw_value in tpm.items():
        name, value = _text(raw_name), int(_text(raw_value))
        if name.endswith(_INFLIGHT_SUFFIX):
            in_flight[name[: -len(_INFLIGHT_SUFFIX)]] = value
        else:
            tokens[name] = value
    return ContractWindow(start, requests, tokens, in_flight)


class RedisContractStore:
    """Contract counters over Redis: ``contract_admit.lua`` / ``contract_settle.lua``."""

    _runner: ScriptRunner
    _keys: KeySpace
    _contract_clock_offset_ms: int = 0
    """Redis TIME minus this host's clock, as last seen; only used to guess the current window's keys."""

    def _guess_window(self, window_seconds: int) -> int:
        return window_start_of(int(time.time() * 1000) + self._contract_clock_offset_ms, window_seconds)

    async def contract_admit(
        self,
        feature: str,
        limits: ContractLimits,
        estimate_tokens: int,
        *,
        window_seconds: int,
        ttl_seconds: int,
        reject_modes: Collection[Mode] = (),
    ) -> ContractAdmission:
        field_name = _field(self._keys, feature)
        start = self._guess_window(window_seconds)
        for _ in range(_MAX_WINDOW_ATTEMPTS):
            args: list[object] = [
                start,
                int(window_seconds),
                int(ttl_seconds),
                field_name,
                _limit(limits.feature_rpm),
                _limit(limits.feature_tpm),
                _limit(limits.basket_rpm),
                _limit(limits.basket_tpm),
                max(0, int(estimate_tokens)),
                1 if Mode.BORROWED in reject_modes else 0,
                1 if Mode.DEGRADED in reject_modes else 0,
            ]
            keys = [self._keys.contract_window("rpm", start), self._keys.contract_window("tpm", start)]
            try:
                reply = await self._runner.run("contract_admit", keys, args)
            except StoreError as exc:
                # Timed out: the script may still count the request; the caller reconciles from the late
                # outcome (None: nothing was written, the window was not the current one).
                exc.late = map_late(exc.late, lambda late_reply: _contract_admission(late_reply, window_seconds))
                raise
            now_ms, server_start = int(reply[1]), int(reply[2])
            self._contract_clock_offset_ms = now_ms - int(time.time() * 1000)
            admission = _contract_admission(reply, window_seconds)
            if admission is not None:
                return admission
            start = server_start  # our guess was another window: retry on the one Redis says is current
        raise StoreError("traffic contract window kept moving between attempts (clock skew?)")

    async def contract_settle(
        self, feature: str, window_start: int, release_tokens: int, actual_tokens: int
    ) -> ContractSettlement:
        settled = await self.contract_settle_many(window_start, {feature: (release_tokens, actual_tokens)})
        return ContractSettlement(settled.applied, settled.feature_tokens.get(feature, 0), settled.basket_tokens)

    async def contract_settle_many(
        self, window_start: int, deltas: Mapping[str, tuple[int, int]]
    ) -> ContractSettlements:
        features = list(deltas)
        args: list[object] = []
        for feature in features:
            release, actual = deltas[feature]
            args += [_field(self._keys, feature), max(0, int(release)), max(0, int(actual))]
        reply = await self._runner.run("contract_settle", [self._keys.contract_window("tpm", window_start)], args)
        if not int(reply[0]):
            return ContractSettlements(False, {}, 0)
        tokens = {feature: int(value) for feature, value in zip(features, reply[2:], strict=True)}
        return ContractSettlements(True, tokens, int(reply[1]))

    async def contract_window(self, window_seconds: int, window_start: int | None = None) -> ContractWindow | None:
        async def read(client: Any) -> tuple[int, Any, Any]:
            start = window_start
            if start is None:
                seconds, _micros = await client.time()
                start = (int(seconds) // window_seconds) * window_seconds
            rpm = await client.hgetall(self._keys.contract_window("rpm", start))
            tpm = await client.hgetall(self._keys.contract_window("tpm", start))
            return start, rpm, tpm

        # Through the runner: the same connection gate, timeout, breaker and error mapping as the scripts.
        start, rpm, tpm = await self._runner.call("reading traffic contract counters", read)
        return _window_from_hashes(start, rpm, tpm)


class MemoryContractStore:
    """Contract counters in process memory: the policy's :class:`ContractLedger` under one lock.

    Fields are escaped exactly as in Redis, so :meth:`contract_window` reads the same on both backends.
    """

    _clock: Callable[[], float]
    _lock: threading.Lock
    _keys: KeySpace
    _contract_ledger: ContractLedger

    def _init_contracts(self) -> None:
        self._contract_ledger = ContractLedger()

    def _contract_now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def contract_admit(
        self,
        feature: str,
        limits: ContractLimits,
        estimate_tokens: int,
        *,
        window_seconds: int,
        ttl_seconds: int,
        reject_modes: Collection[Mode] = (),
    ) -> ContractAdmission:
        field_name = _field(self._keys, feature)
        with self._lock:
            return self._contract_ledger.admit(
                now_ms=self._contract_now_ms(),
                window_seconds=window_seconds,
                ttl_seconds=ttl_seconds,
                field_name=field_name,
                limits=limits,
                estimate_tokens=estimate_tokens,
                reject_modes=reject_modes,
            )

    async def contract_settle(
        self, feature: str, window_start: int, release_tokens: int, actual_tokens: int
    ) -> ContractSettlement:
        settled = await self.contract_settle_many(window_start, {feature: (release_tokens, actual_tokens)})
        return ContractSettlement(settled.applied, settled.feature_tokens.get(feature, 0), settled.basket_tokens)

    async def contract_settle_many(
        self, window_start: int, deltas: Mapping[str, tuple[int, int]]
    ) -> ContractSettlements:
        fields = {feature: _field(self._keys, feature) for feature in deltas}
        with self._lock:
            settled = self._contract_ledger.settle_many(
                now_ms=self._contract_now_ms(),
                window_start=window_start,
                deltas={fields[feature]: delta for feature, delta in deltas.items()},
            )
        tokens = {feature: settled.feature_tokens[fields[feature]] for feature in deltas} if settled.applied else {}
        return ContractSettlements(settled.applied, tokens, settled.basket_tokens)

    async def contract_window(self, window_seconds: int, window_start: int | None = None) -> ContractWindow | None:
        with self._lock:
            now_ms = self._contract_now_ms()
            start = window_start if window_start is not None else window_start_of(now_ms, window_seconds)
            return self._contract_ledger.window(now_ms=now_ms, window_start=start)
