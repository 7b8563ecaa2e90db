"""Routing statistics: the shared picture every replica's rate balancer routes from.

One operation, :meth:`RoutingStore.routing_sync`, one atomic step (one Redis round trip): add a replica's
pending samples (already aggregated per deployment) to the model group's *current* time bucket, store its
latest rate-limit headers, and return the buckets the caller asked for plus every deployment's latest
headers. Replicas call it at most once per ``refresh_interval`` per model group, never per request.

Layout contract (both backends):

* time bucket ``i`` of width ``w`` ms covers store time ``[i * w, (i + 1) * w)``; the store clock (Redis
  ``TIME``) decides which bucket a sync writes to, so a sample is stamped with its sync time, at most one
  refresh interval after the request finished;
* a bucket lives ``bucket_ttl_ms`` after its last write, the headers of a model group
  ``limits_ttl_ms`` after their last write; nothing is kept forever;
* the caller names the bucket range ``[first_bucket, last_bucket]`` it wants (it guesses the current one
  from the previous reply's ``now_ms``). When the current bucket is outside the range nothing is written
  (``written`` is False) and the caller retries with a corrected range; a closed bucket never changes.

Redis keys (every one under the model group's hash tag, :meth:`KeySpace.routing_tag`):
``<tag>:b:<width s>:<i>`` per bucket, ``<tag>:limits`` for the headers; fields as ``routing_sync.lua`` says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.routing.records import RateAggregate, RateLimitObservation
from litellm_ratebalance.store._scripts import ScriptRunner, map_late
from litellm_ratebalance.store.keys import KeySpace

__all__ = ["MAX_SYNC_BUCKETS", "MemoryRoutingStore", "RedisRoutingStore", "RoutingSnapshot", "RoutingStore"]

MAX_SYNC_BUCKETS = 1300
"""Most buckets one sync may ask for (the settings cap a window at 1200 buckets)."""


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    """Reply of :meth:`RoutingStore.routing_sync`."""

    now_ms: int
    """Store time of the sync."""
    written: bool
    """False when there were deltas and the current bucket was outside the requested range."""
    first_bucket: int
    last_bucket: int
    buckets: dict[int, dict[str, RateAggregate]] = field(default_factory=dict)
    """Non-empty buckets of the requested range, by index, then by deployment id (after the write)."""
    limits: dict[str, RateLimitObservation] = field(default_factory=dict)
    """Latest rate-limit headers per deployment id (``observed_ms`` in store time)."""


class RoutingStore(Protocol):
    async def routing_sync(
        self,
        model_group: str,
        deltas: Mapping[str, RateAggregate],
        limits: Mapping[str, RateLimitObservation],
        *,
        first_bucket: int,
        last_bucket: int,
        bucket_ms: int,
        bucket_ttl_ms: int,
        limits_ttl_ms: int,
    ) -> RoutingSnapshot:
        """Write ``deltas`` into the current bucket and ``limits``; return buckets first..last and all
        headers of ``model_group`` (see the module docstring)."""
        ...


def _check_range(first_bucket: int, last_bucket: int, bucket_ms: int) -> None:
    if bucket_ms <= 0:
        raise ValueError(f"bucket_ms must be positive, got {bucket_ms}")
    if not 0 <= last_bucket - first_bucket < MAX_SYNC_BUCKETS:
        raise ValueError(f"bucket range must hold 1 to {MAX_SYNC_BUCKETS} buckets, got {first_bucket}..{last_bucket}")


def _bucket_key(keys: KeySpace, model_group: str, bucket_ms: int, index: int) -> str:
    # The width is part of the key: replicas running with different bucket widths never mix buckets.
    return f"{keys.routing_tag(model_group)}:b:{bucket_ms}:{index}"


def _limits_key(keys: KeySpace, model_group: str) -> str:
    return f"{keys.routing_tag(model_group)}:limits"


def _opt(value: float | None) -> str:
    return "-1" if value is None else repr(float(value))


def _delta_args(keys: KeySpace, deltas: Mapping[str, RateAggregate]) -> list[object]:
    out: list[object] = [len(deltas)]
    for deployment_id, agg in deltas.items():
        out.extend(
            (
                keys.field(deployment_id),
                deployment_id,
                agg.count,
                agg.failures,
                repr(float(agg.rate_sum)),
                repr(float(agg.rate_sq_sum)),
                repr(float(agg.ok_latency_sum)),
                agg.tokens,
                repr(float(agg.ttft_sum)),
                agg.ttft_count,
                len(agg.bins),
            )
        )
        for index, count in agg.bins.items():
            out.extend((index, count))
    return out


def _limit_args(keys: KeySpace, limits: Mapping[str, RateLimitObservation]) -> list[object]:
    out: list[object] = [len(limits)]
    for deployment_id, obs in limits.items():
        out.extend(
            (
                keys.field(deployment_id),
                deployment_id,
                _opt(obs.remaining_requests),
                _opt(obs.remaining_tokens),
                _opt(obs.limit_requests),
                _opt(obs.limit_tokens),
                _opt(obs.reset_seconds),
            )
        )
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _fields_by_deployment(flat: list[Any]) -> dict[str, dict[str, str]]:
    """HGETALL reply -> {escaped deployment: {stat: value}}."""
    grouped: dict[str, dict[str, str]] = {}
    for i in range(0, len(flat) - 1, 2):
        name = _text(flat[i])
        prefix, _, stat = name.partition("|")
        grouped.setdefault(prefix, {})[stat] = _text(flat[i + 1])
    return grouped


def _decode_bucket(flat: list[Any]) -> dict[str, RateAggregate]:
    out: dict[str, RateAggregate] = {}
    for values in _fields_by_deployment(flat).values():
        deployment_id = values.get("id")
        if deployment_id is None:
            continue
        out[deployment_id] = RateAggregate(
            count=int(values.get("n", 0)),
            failures=int(values.get("f", 0)),
            rate_sum=float(values.get("s", 0.0)),
            rate_sq_sum=float(values.get("q", 0.0)),
            ok_latency_sum=float(values.get("l", 0.0)),
            tokens=int(values.get("k", 0)),
            ttft_sum=float(values.get("ts", 0.0)),
            ttft_count=int(values.get("tn", 0)),
            bins={int(stat[1:]): int(v) for stat, v in values.items() if stat.startswith("h")},
        )
    return out


def _none_if_negative(value: str | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if number < 0 else number


def _decode_limits(flat: list[Any]) -> dict[str, RateLimitObservation]:
    out: dict[str, RateLimitObservation] = {}
    for values in _fields_by_deployment(flat).values():
        deployment_id = values.get("id")
        if deployment_id is None:
            continue
        out[deployment_id] = RateLimitObservation(
            remaining_requests=_none_if_negative(values.get("rr")),
            remaining_tokens=_none_if_negative(values.get("rt")),
            limit_requests=_none_if_negative(values.get("lr")),
            limit_tokens=_none_if_negative(values.get("lt")),
            reset_seconds=_none_if_negative(values.get("rs")),
            observed_ms=int(float(values.get("at", 0))),
        )
    return out


class RedisRoutingStore:
    """Routing statistics over Redis: ``routing_sync.lua``."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def routing_sync(
        self,
        model_group: str,
        deltas: Mapping[str, RateAggregate],
        limits: Mapping[str, RateLimitObservation],
        *,
        first_bucket: int,
        last_bucket: int,
        bucket_ms: int,
        bucket_ttl_ms: int,
        limits_ttl_ms: int,
    ) -> RoutingSnapshot:
        _check_range(first_bucket, last_bucket, bucket_ms)
        keys = [_limits_key(self._keys, model_group)]
        keys.extend(_bucket_key(self._keys, model_group, bucket_ms, i) for i in range(first_bucket, last_bucket + 1))
        args: list[object] = [
            int(bucket_ms),
            int(first_bucket),
            int(bucket_ttl_ms),
            int(limits_ttl_ms),
            *_delta_args(self._keys, deltas),
            *_limit_args(self._keys, limits),
        ]
        try:
            reply = await self._runner.run("routing_sync", keys, args)
        except StoreError as exc:
            # Timed out: the samples may still be written; the caller decides from the late outcome whether to
            # send them again.
            exc.late = map_late(exc.late, lambda late_reply: _snapshot(late_reply, first_bucket, last_bucket))
            raise
        return _snapshot(reply, first_bucket, last_bucket)


def _snapshot(reply: list[Any], first_bucket: int, last_bucket: int) -> RoutingSnapshot:
    """Decode ``routing_sync``'s reply (see the script's header)."""
    now_ms, written = int(reply[0]), bool(int(reply[1]))
    buckets: dict[int, dict[str, RateAggregate]] = {}
    for offset, flat in enumerate(reply[2:-1]):
        if flat:
            decoded = _decode_bucket(flat)
            if decoded:
                buckets[first_bucket + offset] = decoded
    return RoutingSnapshot(now_ms, written, first_bucket, last_bucket, buckets, _decode_limits(reply[-1]))


@dataclass(slots=True)
class _MemoryRoutingGroup:
    buckets: dict[tuple[int, int], tuple[int, dict[str, RateAggregate]]] = field(default_factory=dict)
    """(width ms, index) -> (expires at ms, aggregates by deployment)."""
    limits: dict[str, RateLimitObservation] = field(default_factory=dict)
    limits_expire_ms: int = 0


class MemoryRoutingStore:
    """Routing statistics in process memory: same semantics, one lock, the store's injectable clock."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _routing: dict[str, _MemoryRoutingGroup]

    def _init_routing(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
        self._routing = {}

    async def routing_sync(
        self,
        model_group: str,
        deltas: Mapping[str, RateAggregate],
        limits: Mapping[str, RateLimitObservation],
        *,
        first_bucket: int,
        last_bucket: int,
        bucket_ms: int,
        bucket_ttl_ms: int,
        limits_ttl_ms: int,
    ) -> RoutingSnapshot:
        _check_range(first_bucket, last_bucket, bucket_ms)
        with self._lock:
            now = int(self._clock() * 1000)
            group = self._routing.setdefault(model_group, _MemoryRoutingGroup())
            self._expire_routing(group, now)
            current = now // bucket_ms
            written = True
            if deltas:
                written = first_bucket <= current <= last_bucket
                if written:
                    _, aggregates = group.buckets.get((bucket_ms, current), (0, {}))
                    for deployment_id, delta in deltas.items():
                        aggregates.setdefault(deployment_id, RateAggregate()).merge(delta)
                    group.buckets[(bucket_ms, current)] = (now + bucket_ttl_ms, aggregates)
            if limits:
                for deployment_id, obs in limits.items():
                    group.limits[deployment_id] = RateLimitObservation(
                        obs.remaining_requests,
                        obs.remaining_tokens,
                        obs.limit_requests,
                        obs.limit_tokens,
                        obs.reset_seconds,
                        now,
                    )
                group.limits_expire_ms = now + limits_ttl_ms
            buckets: dict[int, dict[str, RateAggregate]] = {}
            for index in range(first_bucket, last_bucket + 1):
                entry = group.buckets.get((bucket_ms, index))
                if entry is not None and entry[1]:
                    buckets[index] = {d: agg.copy() for d, agg in entry[1].items()}
            return RoutingSnapshot(now, written, first_bucket, last_bucket, buckets, dict(group.limits))

    @staticmethod
    def _expire_routing(group: _MemoryRoutingGroup, now_ms: int) -> None:
        for key in [k for k, (expires, _) in group.buckets.items() if expires <= now_ms]:
            del group.buckets[key]
        if group.limits and group.limits_expire_ms <= now_ms:
            group.limits.clear()
