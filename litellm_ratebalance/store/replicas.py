"""Replica health: each proxy replica reports how its store calls go, and ``status`` shows every replica.

Two operations:

* :meth:`ReplicaStore.report_replica` stores one replica's :class:`ReplicaHealth` (replacing its last one)
  and forgets replicas that have not reported within ``keep_ms``, in one atomic step
  (``replica_report.lua``);
* :meth:`ReplicaStore.replica_health` reads the reports of the live replicas.

The report is what tells a slow Redis from a busy proxy: the longest event-loop stall (time during which no
reply could be read), the slowest store call, and the store errors by cause, each over the last interval.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.keys import KeySpace, escape_name

__all__ = ["MemoryReplicaStore", "RedisReplicaStore", "ReplicaHealth", "ReplicaStore"]


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    """One replica's store health over its last reporting interval."""

    replica: str
    """Who reports: ``host:pid`` of the proxy process."""
    interval_seconds: float
    """The interval the figures cover."""
    store_calls: int
    """Store calls made in the interval."""
    store_call_max_seconds: float
    """The slowest of them, as this process saw it (a busy event loop makes calls look slow too)."""
    loop_lag_max_seconds: float
    """The longest stall of the event loop: time during which no reply could be read."""
    store_errors: Mapping[str, int] = field(default_factory=dict)
    """Failed store calls in the interval by cause (``timeout``, ``connection``, ``pool``, ``busy``,
    ``breaker``, ``error``); causes with none are left out."""
    reported_ms: int = 0
    """Store time of the report (set by the store)."""

    def to_json(self) -> str:
        body = asdict(self)
        body.pop("reported_ms")
        body["store_errors"] = dict(self.store_errors)
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, reported_ms: int) -> ReplicaHealth:
        body = json.loads(text)
        return cls(
            replica=str(body["replica"]),
            interval_seconds=float(body["interval_seconds"]),
            store_calls=int(body["store_calls"]),
            store_call_max_seconds=float(body["store_call_max_seconds"]),
            loop_lag_max_seconds=float(body["loop_lag_max_seconds"]),
            store_errors={str(k): int(v) for k, v in dict(body.get("store_errors") or {}).items()},
            reported_ms=reported_ms,
        )


class ReplicaStore(Protocol):
    async def report_replica(self, health: ReplicaHealth, *, keep_ms: int) -> int:
        """Store ``health`` as its replica's latest report and forget replicas silent for ``keep_ms``; return
        the number of replicas alive."""

    async def replica_health(self) -> list[ReplicaHealth]:
        """The latest report of every live replica, by replica name."""


class RedisReplicaStore:
    """Replica reports over Redis: ``replica_report.lua`` on two keys of one hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def report_replica(self, health: ReplicaHealth, *, keep_ms: int) -> int:
        _now, alive = await self._runner.run(
            "replica_report", self._keys.replica_keys(), [escape_name(health.replica), health.to_json(), int(keep_ms)]
        )
        return int(alive)

    async def replica_health(self) -> list[ReplicaHealth]:
        seen_key, reports_key = self._keys.replica_keys()

        async def read(client: Any) -> tuple[list[Any], dict[Any, Any]]:
            seen = await client.zrange(seen_key, 0, -1, withscores=True)
            reports = await client.hgetall(reports_key)
            return seen, reports

        seen, reports = await self._runner.call("reading replica reports", read)
        by_id = {_text(k): v for k, v in reports.items()}
        out = [
            ReplicaHealth.from_json(by_id[_text(member)], int(score))
            for member, score in seen
            if _text(member) in by_id
        ]
        return sorted(out, key=lambda health: health.replica)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class MemoryReplicaStore:
    """Replica reports in process memory (one replica: the process itself)."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _replicas: dict[str, ReplicaHealth]

    def _init_replicas(self) -> None:
        self._replicas = {}

    async def report_replica(self, health: ReplicaHealth, *, keep_ms: int) -> int:
        now_ms = int(self._clock() * 1000)
        with self._lock:
            for name in [n for n, h in self._replicas.items() if h.reported_ms <= now_ms - keep_ms]:
                del self._replicas[name]
            self._replicas[health.replica] = ReplicaHealth.from_json(health.to_json(), now_ms)
            return len(self._replicas)

    async def replica_health(self) -> list[ReplicaHealth]:
        with self._lock:
            return sorted(self._replicas.values(), key=lambda health: health.replica)
