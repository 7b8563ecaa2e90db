"""Each replica's store health, reported to the shared store every few seconds for ``status`` to show.

What a replica reports (:class:`~litellm_ratebalance.store.replicas.ReplicaHealth`): its store calls over the
interval (how many, the slowest, the failures by cause) and the longest stall of its event loop. Together
they say whether store errors come from Redis (timeouts and connection failures while the loop kept up) or
from the replica itself (a loop stalled for as long as its calls took).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from litellm_ratebalance.store.redis import RedisStore
from litellm_ratebalance.store.replicas import ReplicaHealth

__all__ = ["REPORT_INTERVAL_SECONDS", "replica_name", "report_forever", "report_once"]

logger = logging.getLogger("litellm_ratebalance")

REPORT_INTERVAL_SECONDS = 10.0
KEEP_REPORTS = 3
"""A replica silent for this many intervals is dropped from the shared list."""


def replica_name() -> str:
    """``host:pid`` of this proxy process."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def report_once(store: RedisStore, name: str, interval_seconds: float) -> int:
    """Report what the store calls since the last report came to; return the replicas alive."""
    tally = store.take_tally()
    health = ReplicaHealth(
        replica=name,
        interval_seconds=interval_seconds,
        store_calls=tally.calls,
        store_call_max_seconds=round(tally.slowest_seconds, 6),
        loop_lag_max_seconds=round(store.take_loop_lag("report"), 6),
        store_errors=dict(tally.faults),
    )
    return await store.report_replica(health, keep_ms=int(KEEP_REPORTS * interval_seconds * 1000))


async def report_forever(store: RedisStore, interval_seconds: float = REPORT_INTERVAL_SECONDS) -> None:
    """Report every ``interval_seconds`` until cancelled; a failed report is skipped (it counts as a store error
    in the next one)."""
    name = replica_name()
    last = time.monotonic()
    while True:
        await asyncio.sleep(interval_seconds)
        now = time.monotonic()
        try:
            await report_once(store, name, now - last)
        except Exception as exc:
            logger.debug("litellm_ratebalance: replica report failed: %s", exc)
        last = now
