"""Shared state: one Store protocol, a Redis backend and an embedded backend."""

from __future__ import annotations

from litellm_ratebalance.store.base import Store
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.memory import MemoryStore
from litellm_ratebalance.store.redis import RedisStore

__all__ = ["KeySpace", "MemoryStore", "RedisStore", "Store"]
