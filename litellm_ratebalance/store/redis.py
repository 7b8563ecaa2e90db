"""Redis backend of the store (see :mod:`litellm_ratebalance.store.base`)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.store._scripts import ScriptRunner
from litellm_ratebalance.store.admission import RedisAdmissionStore
from litellm_ratebalance.store.concurrency import RedisConcurrencyStore
from litellm_ratebalance.store.contracts import RedisContractStore
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.routing import RedisRoutingStore

__all__ = ["RedisStore"]


class RedisStore(RedisAdmissionStore, RedisRoutingStore, RedisContractStore, RedisConcurrencyStore):
    """The store over a ``redis.asyncio`` client (``Redis`` or ``RedisCluster``).

    ``owns_client``: close the client in :meth:`aclose` (True when we created it from a URL).
    """

    backend = "redis"

    def __init__(
        self,
        client: Any,
        keys: KeySpace | None = None,
        *,
        owns_client: bool = False,
        timeout_seconds: float = 0.5,
        cooldown_seconds: float = 1.0,
    ) -> None:
        self.keys = keys or KeySpace()
        self._keys = self.keys
        self._runner = ScriptRunner(client, timeout_seconds=timeout_seconds, cooldown_seconds=cooldown_seconds)
        self._owns_client = owns_client

    @property
    def client(self) -> Any:
        return self._runner.client

    async def ping(self) -> None:
        try:
            await self._runner.client.ping()
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis ping failed: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        if self._owns_client:
            close = getattr(self._runner.client, "aclose", None) or self._runner.client.close
            await close()
