"""Embedded backend of the store (see :mod:`litellm_ratebalance.store.base`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from litellm_ratebalance.store.admission import MemoryAdmissionStore
from litellm_ratebalance.store.concurrency import MemoryConcurrencyStore
from litellm_ratebalance.store.contracts import MemoryContractStore
from litellm_ratebalance.store.cost import MemoryCostStore
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.peers import MemoryPeerStore
from litellm_ratebalance.store.replicas import MemoryReplicaStore
from litellm_ratebalance.store.routing import MemoryRoutingStore
from litellm_ratebalance.store.signals import MemorySignalStore

__all__ = ["MemoryStore"]


class MemoryStore(
    MemoryAdmissionStore,
    MemoryRoutingStore,
    MemoryContractStore,
    MemoryConcurrencyStore,
    MemoryCostStore,
    MemoryReplicaStore,
    MemorySignalStore,
    MemoryPeerStore,
):
    """The store in this process's memory: one proxy process, same semantics as Redis.

    ``clock`` returns seconds since the epoch (``time.time`` by default); tests pass a fake one.
    """

    backend = "memory"

    def __init__(self, keys: KeySpace | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.keys = keys or KeySpace()
        self._keys = self.keys
        self._clock = clock
        self._lock = threading.Lock()
        self._init_admission()
        self._init_routing()
        self._init_contracts()
        self._init_concurrency()
        self._init_replicas()
        self._init_signals()
        self._init_peers()

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
