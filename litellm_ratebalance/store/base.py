"""The Store protocol: the only way the package reaches shared state.

A store is one of two backends with the same behaviour:

* :class:`~litellm_ratebalance.store.redis.RedisStore`: shared by every proxy replica; each operation is
  one packaged Lua script (one round trip, atomic, Redis server ``TIME`` as the clock, keys of one
  operation on one cluster slot);
* :class:`~litellm_ratebalance.store.memory.MemoryStore`: embedded, for a proxy without Redis (one
  process; limits are then per process).

The protocol is the union of one protocol per product part; each part's operations, typed results and
both implementations live in that part's module (``admission``, ``routing``, ``contracts``,
``concurrency``, ``cost``, ``replicas``, ``signals``, ``peers``). Every method raises
:class:`~litellm_ratebalance.errors.StoreError` on a backend fault and nothing else; what to do then (fail
open / closed) is the caller's decision.
"""

from __future__ import annotations

from typing import Protocol

from litellm_ratebalance.store.admission import AdmissionStore
from litellm_ratebalance.store.concurrency import ConcurrencyStore
from litellm_ratebalance.store.contracts import ContractStore
from litellm_ratebalance.store.cost import CostStore
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.peers import PeerStore
from litellm_ratebalance.store.replicas import ReplicaStore
from litellm_ratebalance.store.routing import RoutingStore
from litellm_ratebalance.store.signals import SignalStore

__all__ = ["Store"]


class Store(
    AdmissionStore,
    RoutingStore,
    ContractStore,
    ConcurrencyStore,
    CostStore,
    ReplicaStore,
    SignalStore,
    PeerStore,
    Protocol,
):
    backend: str
    """``"redis"`` or ``"memory"``."""

    keys: KeySpace

    async def ping(self) -> None:
        """Raise StoreError if the backend cannot be reached."""

    async def aclose(self) -> None:
        """Release connections the store owns (not those it was handed)."""
