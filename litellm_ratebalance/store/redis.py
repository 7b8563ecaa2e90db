"""Redis backend of the store (see :mod:`litellm_ratebalance.store.base`)."""

from __future__ import annotations

from typing import Any

from litellm_ratebalance.store._scripts import DEFAULT_MAX_IN_FLIGHT, CallObserver, CallTally, ScriptRunner
from litellm_ratebalance.store.admission import RedisAdmissionStore
from litellm_ratebalance.store.concurrency import RedisConcurrencyStore
from litellm_ratebalance.store.contracts import RedisContractStore
from litellm_ratebalance.store.cost import RedisCostStore
from litellm_ratebalance.store.keys import KeySpace
from litellm_ratebalance.store.peers import RedisPeerStore
from litellm_ratebalance.store.replicas import RedisReplicaStore
from litellm_ratebalance.store.routing import RedisRoutingStore
from litellm_ratebalance.store.signals import RedisSignalStore

__all__ = ["RedisStore"]


class RedisStore(
    RedisAdmissionStore,
    RedisRoutingStore,
    RedisContractStore,
    RedisConcurrencyStore,
    RedisCostStore,
    RedisReplicaStore,
    RedisSignalStore,
    RedisPeerStore,
):
    """The store over a ``redis.asyncio`` client (``Redis`` or ``RedisCluster``).

    ``client`` is the client or a callable returning the current one (LiteLLM may replace its cached
    client). ``owns_client``: close the client in :meth:`aclose` (True when we created it from a URL).
    ``timeout_seconds`` bounds each operation (waiting for a connection included) in the time this process
    was free to read the reply, ``cooldown_seconds`` is the circuit breaker's pause after a fault of Redis,
    and ``max_connections`` caps the operations in flight at once (further ones wait for a slot; the
    client's own pool size caps it too, per node for a cluster); see :class:`ScriptRunner`. ``observer`` is
    told of each call's outcome and duration (metrics).
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
        max_connections: int = DEFAULT_MAX_IN_FLIGHT,
        observer: CallObserver | None = None,
    ) -> None:
        self.keys = keys or KeySpace()
        self._keys = self.keys
        self._runner = ScriptRunner(
            client,
            timeout_seconds=timeout_seconds,
            cooldown_seconds=cooldown_seconds,
            max_in_flight=max_connections,
            observer=observer,
        )
        self._owns_client = owns_client
        self._init_admission()

    @property
    def client(self) -> Any:
        return self._runner.client

    def take_loop_lag(self, reader: str) -> float:
        """The longest stall of this process's event loop since ``reader`` last asked (0 before the first
        store call): time during which no reply could be read (see :mod:`.loop_clock`)."""
        return self._runner.take_loop_lag(reader)

    def take_tally(self) -> CallTally:
        """The store calls since the last take: count, slowest, faults by cause."""
        return self._runner.take_tally()

    async def ping(self) -> None:
        """Raise StoreError unless Redis answers (sent even while the circuit breaker is open)."""
        await self._runner.call("redis ping", lambda client: client.ping(), probe=True)

    async def aclose(self) -> None:
        if self._owns_client:
            close = getattr(self._runner.client, "aclose", None) or self._runner.client.close
            await close()
