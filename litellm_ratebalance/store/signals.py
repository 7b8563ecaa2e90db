"""Shared state of backpressure's server signals: each deployment's last signal report (which server answers
its metrics endpoint, and the problems of its signals), written by the replicas that scrape it and read by
``status``. Redis writes it with ``signal_report.lua`` (its server ``TIME``) and reads it with ``HGETALL``;
the embedded store keeps it in memory with its injected clock. A report lapses after its time-to-live unless
a replica renews it, so a deployment nobody scrapes any more shows none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.keys import KeySpace

__all__ = ["MemorySignalStore", "RedisSignalStore", "SignalReport", "SignalStore"]

MAX_DETAIL_CHARS = 4000
"""A report's detail is cut to this length (it is a few sentences; the bound keeps a key small)."""


@dataclass(frozen=True, slots=True)
class SignalReport:
    server: str | None
    """The server answering (``vllm``, ``tgi``, ``sglang``), ``None`` when none is recognised."""
    problems: tuple[str, ...]
    """Problem codes (``overload.servers.Problem`` values); empty when the signals are all there."""
    detail: str
    reported_ms: int
    """When it was written, store clock (ms)."""


class SignalStore(Protocol):
    async def signal_report(
        self, deployment_id: str, *, server: str | None, problems: Sequence[str], detail: str, ttl_ms: int
    ) -> None:
        """Record the deployment's signal report (replacing the last one) for ``ttl_ms``."""

    async def signal_report_read(self, deployment_id: str) -> SignalReport | None:
        """The deployment's last signal report, ``None`` when there is none (or it lapsed)."""


def _args(server: str | None, problems: Sequence[str], detail: str, ttl_ms: int) -> tuple[str, str, str, int]:
    ttl = int(ttl_ms)
    if ttl <= 0:
        raise ValueError(f"the report's time-to-live must be positive (got {ttl_ms} ms)")
    for code in problems:
        if not code or "," in code:
            raise ValueError(f"problem codes are non-empty and have no comma (got {code!r})")
    return server or "", ",".join(problems), detail[:MAX_DETAIL_CHARS], ttl


class RedisSignalStore:
    """Signal reports over Redis: one hash per deployment, on its lease hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def signal_report(
        self, deployment_id: str, *, server: str | None, problems: Sequence[str], detail: str, ttl_ms: int
    ) -> None:
        args = list(_args(server, problems, detail, ttl_ms))
        await self._runner.run("signal_report", [self._keys.signal_report(deployment_id)], args)

    async def signal_report_read(self, deployment_id: str) -> SignalReport | None:
        key = self._keys.signal_report(deployment_id)

        async def read(client: Any) -> dict[Any, Any]:
            return dict(await client.hgetall(key))

        raw = {_text(k): _text(v) for k, v in (await self._runner.call("reading a signal report", read)).items()}
        if "at" not in raw:
            return None
        problems = raw.get("problems", "")
        return SignalReport(
            raw.get("server") or None,
            tuple(problems.split(",")) if problems else (),
            raw.get("detail", ""),
            int(raw["at"]),
        )


class MemorySignalStore:
    """Signal reports in process memory, under the store's one lock, expiring on its clock."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _signal_reports: dict[str, tuple[SignalReport, int]]

    def _init_signals(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
        self._signal_reports = {}

    async def signal_report(
        self, deployment_id: str, *, server: str | None, problems: Sequence[str], detail: str, ttl_ms: int
    ) -> None:
        name, codes, text, ttl = _args(server, problems, detail, ttl_ms)
        with self._lock:
            now = int(self._clock() * 1000)
            report = SignalReport(name or None, tuple(codes.split(",")) if codes else (), text, now)
            self._signal_reports[deployment_id] = (report, now + ttl)

    async def signal_report_read(self, deployment_id: str) -> SignalReport | None:
        with self._lock:
            entry = self._signal_reports.get(deployment_id)
            if entry is None:
                return None
            if entry[1] <= int(self._clock() * 1000):
                del self._signal_reports[deployment_id]
                return None
            return entry[0]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
