"""Concurrency store operations (placeholder: filled in by the concurrency work).

Contract: a Protocol of atomic operations, a Redis implementation (one packaged Lua script per
operation) and an in-memory implementation with the same semantics. Both are mixed into
:class:`~litellm_ratebalance.store.redis.RedisStore` / :class:`~litellm_ratebalance.store.memory.MemoryStore`.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ConcurrencyStore", "MemoryConcurrencyStore", "RedisConcurrencyStore"]


class ConcurrencyStore(Protocol):
    """Operations of this part (none yet)."""


class RedisConcurrencyStore:
    """Redis implementation (uses ``self._runner`` and ``self._keys``)."""


class MemoryConcurrencyStore:
    """In-memory implementation (uses ``self._clock`` and ``self._lock``)."""

    def _init_concurrency(self) -> None:
        """Create this part's in-memory state; called by ``MemoryStore.__init__``."""
