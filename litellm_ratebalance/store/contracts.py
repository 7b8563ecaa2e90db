"""Contract store operations (placeholder: filled in by the contracts work).

Contract: a Protocol of atomic operations, a Redis implementation (one packaged Lua script per
operation) and an in-memory implementation with the same semantics. Both are mixed into
:class:`~litellm_ratebalance.store.redis.RedisStore` / :class:`~litellm_ratebalance.store.memory.MemoryStore`.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ContractStore", "MemoryContractStore", "RedisContractStore"]


class ContractStore(Protocol):
    """Operations of this part (none yet)."""


class RedisContractStore:
    """Redis implementation (uses ``self._runner`` and ``self._keys``)."""


class MemoryContractStore:
    """In-memory implementation (uses ``self._clock`` and ``self._lock``)."""

    def _init_contracts(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
