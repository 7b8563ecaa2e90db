"""Helpers of the admission store suites (embedded, Redis, Redis Cluster)."""

from __future__ import annotations

from litellm_ratebalance.admission.estimate import SettleBatch
from litellm_ratebalance.store.admission import AdmissionStore


async def settle(
    store: AdmissionStore, model_group: str, pool: str, window_start_ms: int, token_delta: int, request_delta: int = 0
) -> None:
    """Correct one reservation, sent on its own (as the limiter's flush timer does)."""
    batch = SettleBatch()
    batch.add(window_start_ms, pool, token_delta, request_delta)
    await store.flush(model_group, batch)


async def learn(store: AdmissionStore, model_group: str, *samples: int, quantile: float | None = None) -> None:
    """Teach the output estimate ``samples``, sent on their own."""
    batch = SettleBatch()
    for sample in samples:
        batch.learn(sample)
    await store.flush(model_group, batch, quantile=quantile)
