"""Shared state of cost attribution: each local deployment's sharing clock and efficiency sums.

The marks that move the clock ride on backpressure's lease operations (:mod:`litellm_ratebalance.store.metering`:
the start with ``lease_acquire``, the end with ``lease_release``, in the same atomic step). This part reads what
they leave: :meth:`CostStore.cost_efficiency` returns a deployment's decayed efficiency sums (``status``). Redis
reads them in ``cost_read.lua`` with its server ``TIME``, the embedded store with its injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from litellm_ratebalance.attribution.sharing import Efficiency
from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.metering import CostMark, MemorySharing, positive_ms

__all__ = ["CostMark", "CostStore", "MemoryCostStore", "RedisCostStore"]


class CostStore(Protocol):
    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None: ...


class RedisCostStore:
    """Cost state over Redis: ``cost_read.lua``, on the deployment's lease hash tag."""

    _runner: ScriptRunner
    _keys: KeySpace

    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None:
        found, gpu_seconds, tokens, _now = await self._runner.run(
            "cost_read", [self._keys.cost_state(deployment_id)], [positive_ms(half_life_ms, "half-life")]
        )
        if not int(found):
            return None
        return Efficiency(float(gpu_seconds), float(tokens))


class MemoryCostStore:
    """Cost state in process memory: the sharing book the embedded lease operations mark, under the store's
    one lock."""

    _clock: Callable[[], float]
    _lock: threading.Lock
    _sharing: MemorySharing

    async def cost_efficiency(self, deployment_id: str, *, half_life_ms: int) -> Efficiency | None:
        with self._lock:  # (efficiency() checks the half-life)
            return self._sharing.efficiency(deployment_id, int(self._clock() * 1000), half_life_ms)
