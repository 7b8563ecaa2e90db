"""Shared state of cost attribution: each local deployment's sharing clock and efficiency sums.

Three operations, each one atomic step (one Redis round trip), on the deployment's hash tag (its
backpressure leases, which they read to count the requests in flight, and its cost state):

* :meth:`CostStore.cost_start` marks a request's start (after its lease was taken) and returns the integral;
* :meth:`CostStore.cost_end` marks its end (after its lease was released) and returns its GPU-seconds,
  which it also adds to the deployment's decayed efficiency sums with its output tokens;
* :meth:`CostStore.cost_efficiency` reads those sums, decayed to now (``status``).

Both backends apply :func:`litellm_ratebalance.attribution.sharing.advance`; Redis in ``cost_mark.lua`` with its
server ``TIME``, the embedded store in Python with its injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from litellm_ratebalance.attribution.sharing import Efficiency, Mark, SharingClock, advance, decayed, gpu_share
from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.concurrency import _MemoryLeases
from litellm_ratebalance.store.keys import KeySpace

__all__ = ["CostMark", "CostStore", "MemoryCostStore", "RedisCostStore"]


@dataclass(frozen=True, slots=True)
class CostMark:
    mark: Mark
    """The integral after this mark, with its epoch (keep a start's to end the request)."""
    share: float | None
    """End marks: the request's GPU-seconds (``None`` when its start belongs to another epoch). Starts: ``None``."""
    now_ms: int


class CostStore(Protocol):
    async def cost_start(self, deployment_id: str, *, half_life_ms: int, ttl_ms: int) -> CostMark: ...

    async def cost_end(
        self, deployment_id: str, start: Mark, *, gpus: float, output_tokens: int, half_life_ms: int, ttl_ms: int
    ) -> CostMark: ...

    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None: ...


def _positive(value: int, what: str) -> int:
    if value < 1:
        raise ValueError(f"{what} must be at least 1 ms (got {value})")
    return int(value)


class RedisCostStore:
    """Cost state over Redis: ``cost_mark.lua`` and ``cost_read.lua``, on the deployment's lease hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    def _cost_keys(self, deployment_id: str) -> list[str]:
        return [f"{self._keys.concurrency_tag(deployment_id)}:leases", self._keys.cost_state(deployment_id)]

    async def _mark(self, deployment_id: str, args: list[object]) -> CostMark:
        epoch, integral, share, now = await self._runner.run("cost_mark", self._cost_keys(deployment_id), args)
        text = share.decode() if isinstance(share, bytes) else str(share)
        return CostMark(Mark(int(epoch), float(integral)), float(text) if text else None, int(now))

    async def cost_start(self, deployment_id: str, *, half_life_ms: int, ttl_ms: int) -> CostMark:
        return await self._mark(
            deployment_id,
            ["start", "", "", "", "", _positive(half_life_ms, "half-life"), _positive(ttl_ms, "ttl")],
        )

    async def cost_end(
        self, deployment_id: str, start: Mark, *, gpus: float, output_tokens: int, half_life_ms: int, ttl_ms: int
    ) -> CostMark:
        return await self._mark(
            deployment_id,
            [
                "end",
                int(start.epoch_ms),
                repr(float(start.integral)),
                repr(float(gpus)),
                max(0, int(output_tokens)),
                _positive(half_life_ms, "half-life"),
                _positive(ttl_ms, "ttl"),
            ],
        )

    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None:
        found, gpu_seconds, tokens, _now = await self._runner.run(
            "cost_read", [self._keys.cost_state(deployment_id)], [_positive(half_life_ms, "half-life")]
        )
        if not int(found):
            return None
        return Efficiency(float(gpu_seconds), float(tokens))


@dataclass(slots=True)
class _MemoryCost:
    clock: SharingClock
    touched_ms: int
    efficiency_at_ms: int | None = None
    gpu_seconds: float = 0.0
    output_tokens: float = 0.0


class MemoryCostStore:
    """Cost state in process memory: same semantics, under the store's one lock."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _concurrency_leases: dict[str, _MemoryLeases]
    _cost_state: dict[str, _MemoryCost]

    def _init_cost(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
        self._cost_state = {}

    def _cost_advance(self, deployment_id: str, now_ms: int, ttl_ms: int) -> _MemoryCost:
        leases = self._concurrency_leases.get(deployment_id)
        inflight = 0 if leases is None else sum(1 for expiry, _ in leases.leases.values() if expiry > now_ms)
        state = self._cost_state.get(deployment_id)
        if state is not None and now_ms - state.touched_ms >= ttl_ms:
            state = None  # expired, as the Redis hash would have: a new epoch
        if state is None:
            state = self._cost_state[deployment_id] = _MemoryCost(advance(None, now_ms, inflight), now_ms)
        else:
            state.clock = advance(state.clock, now_ms, inflight)
            state.touched_ms = now_ms
        # Bounded memory: forget deployments idle past the ttl (Redis keys expire likewise).
        for stale in [d for d, s in self._cost_state.items() if now_ms - s.touched_ms >= ttl_ms]:
            del self._cost_state[stale]
        return state

    async def cost_start(self, deployment_id: str, *, half_life_ms: int, ttl_ms: int) -> CostMark:
        _positive(half_life_ms, "half-life")
        ttl = _positive(ttl_ms, "ttl")
        with self._lock:
            now = int(self._clock() * 1000)
            clock = self._cost_advance(deployment_id, now, ttl).clock
            return CostMark(Mark(clock.epoch_ms, clock.integral), None, now)

    async def cost_end(
        self, deployment_id: str, start: Mark, *, gpus: float, output_tokens: int, half_life_ms: int, ttl_ms: int
    ) -> CostMark:
        half_life = _positive(half_life_ms, "half-life")
        ttl = _positive(ttl_ms, "ttl")
        with self._lock:
            now = int(self._clock() * 1000)
            state = self._cost_advance(deployment_id, now, ttl)
            end = Mark(state.clock.epoch_ms, state.clock.integral)
            share = gpu_share(start, end, gpus)
            if share is not None:
                since = state.efficiency_at_ms if state.efficiency_at_ms is not None else now
                elapsed = max(0, now - since) / 1000.0
                state.gpu_seconds = decayed(state.gpu_seconds, elapsed, half_life / 1000.0) + share
                state.output_tokens = decayed(state.output_tokens, elapsed, half_life / 1000.0) + max(
                    0, int(output_tokens)
                )
                state.efficiency_at_ms = max(now, since)
            return CostMark(end, share, now)

    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None:
        half_life = _positive(half_life_ms, "half-life")
        with self._lock:
            now = int(self._clock() * 1000)
            state = self._cost_state.get(deployment_id)
            if state is None or state.efficiency_at_ms is None:
                return None
            elapsed = max(0, now - state.efficiency_at_ms) / 1000.0
            return Efficiency(
                decayed(state.gpu_seconds, elapsed, half_life / 1000.0),
                decayed(state.output_tokens, elapsed, half_life / 1000.0),
            )
