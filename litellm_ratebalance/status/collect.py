"""Reading the shared store into a :class:`StatusReport`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from litellm_ratebalance.contracts.policy import ContractBook
from litellm_ratebalance.errors import StoreError
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.status.config import ConfigDeployment, ProxyConfig, config_deployments, group_capacity
from litellm_ratebalance.status.report import (
    NOT_IN_CONFIG,
    ConcurrencyRange,
    ContractsStatus,
    DeploymentStatus,
    GroupStatus,
    SignalStatus,
    StatusReport,
    contracts_status,
    group_status,
)
from litellm_ratebalance.status.target import RedisTarget

__all__ = ["collect"]

# -- collecting (I/O) -----------------------------------------------------------------------------------


async def _store_time_ms(store: Any) -> int:
    client = getattr(store, "client", None)
    if client is None:
        raise StoreError("the store has no Redis client to read the time from")
    try:
        seconds, micros = await client.time()
    except Exception as exc:
        raise StoreError(f"reading the Redis time failed: {type(exc).__name__}: {exc}") from exc
    return int(seconds) * 1000 + int(micros) // 1000


async def _signal_status(store: Any, deployment_id: str, metrics_url: bool, now_ms: int) -> SignalStatus:
    report = await store.signal_report_read(deployment_id)
    if report is None:
        return SignalStatus(metrics_url, None, (), "", None)
    age = max(0.0, (now_ms - report.reported_ms) / 1000)
    return SignalStatus(metrics_url, report.server, report.problems, report.detail, age)


async def _deployment_statuses(
    store: Any, settings: Settings, model_group: str, deployments: Sequence[ConfigDeployment], now_ms: int
) -> list[DeploymentStatus]:
    from litellm_ratebalance.routing.model_info import read_candidates
    from litellm_ratebalance.routing.snapshot import read_view, view_estimates
    from litellm_ratebalance.routing.types import Candidate

    # One read of the shared statistics (nothing written), as routing_status makes it, but a store fault is an
    # error here (routing_status logs and shows an empty view instead). No balancer is built: the shares are
    # computed from the view read, with nothing in flight, as every replica computes them from the same view.
    routing = settings.ratebalance.routing
    try:
        view = await read_view(store, routing, model_group)
    except Exception as exc:
        raise StoreError(f"reading routing statistics failed: {exc}") from exc
    candidates = read_candidates([d.deployment for d in deployments]) or ()
    # Shares among exactly the configured deployments (what only a serving replica knows is left out): the
    # figures routing_status gives.
    estimates = view_estimates(view, routing, list(candidates))
    backpressure = settings.ratebalance.backpressure
    leases = await asyncio.gather(*(store.concurrency_snapshot(d.deployment_id) for d in deployments))
    efficiency = await _gpu_per_1k(store, settings, [d.deployment_id for d in deployments])
    out: list[DeploymentStatus] = []
    for d, lease in zip(deployments, leases, strict=True):
        estimate = estimates.get(d.deployment_id)
        config = backpressure.for_deployment(d.deployment_id, d.deployment.get("model_info"))
        managed = config.enabled and backpressure.enabled
        signals = (
            await _signal_status(store, d.deployment_id, config.metrics_url is not None, now_ms) if managed else None
        )
        out.append(
            DeploymentStatus(
                deployment_id=d.deployment_id,
                estimated_rate=estimate.mean_rate if estimate is not None else 0.0,
                weight=estimate.share if estimate is not None else None,
                samples=estimate.samples if estimate is not None else 0,
                failures=estimate.failures if estimate is not None else 0,
                routing_mode=estimate.mode if estimate is not None else "unknown",
                in_flight=lease.inflight,
                reserved_tokens=lease.reserved_tokens,
                concurrency_limit=ConcurrencyRange(config.min_limit, config.initial_limit, config.max_limit)
                if managed
                else None,
                gpu_seconds_per_1k_output_tokens=efficiency[d.deployment_id],
                signals=signals,
            )
        )
    # Deployments the store has statistics for that the config does not list (models added through the
    # proxy's database, a config changed since): shown with their figures, but no weight, since the
    # proxy's candidate set for them is unknown here.
    configured = {d.deployment_id for d in deployments}
    extra = sorted(set(view_estimates(view, routing)) - configured)
    if extra:
        seen = view_estimates(view, routing, [Candidate(d) for d in extra])
        extra_leases = await asyncio.gather(*(store.concurrency_snapshot(d) for d in extra))
        extra_efficiency = await _gpu_per_1k(store, settings, extra)
        for deployment_id, lease in zip(extra, extra_leases, strict=True):
            estimate = seen[deployment_id]
            out.append(
                DeploymentStatus(
                    deployment_id=deployment_id,
                    estimated_rate=estimate.mean_rate,
                    weight=None,
                    samples=estimate.samples,
                    failures=estimate.failures,
                    routing_mode=NOT_IN_CONFIG,
                    in_flight=lease.inflight,
                    reserved_tokens=lease.reserved_tokens,
                    concurrency_limit=None,
                    gpu_seconds_per_1k_output_tokens=extra_efficiency[deployment_id],
                )
            )
    return out


async def _gpu_per_1k(store: Any, settings: Settings, deployment_ids: Sequence[str]) -> dict[str, float | None]:
    """GPU-seconds per 1k output tokens of each deployment from the cost state in the store (None: no data)."""
    half_life_ms = int(settings.ratebalance.cost.efficiency_half_life_seconds * 1000)
    sums = await asyncio.gather(*(store.cost_efficiency(d, half_life_ms=half_life_ms) for d in deployment_ids))
    return {d: (None if s is None else s.per_1k_output_tokens()) for d, s in zip(deployment_ids, sums, strict=True)}


async def collect(
    store: Any,
    config: ProxyConfig,
    *,
    target: RedisTarget,
    model_groups: Sequence[str] | None = None,
) -> StatusReport:
    """Read everything status shows from ``store`` (a RedisStore); StoreError on a store fault. ``target``:
    where the store is, for the report (the URL masked)."""
    settings = config.settings
    deployments = config_deployments(config)
    by_group: dict[str, list[ConfigDeployment]] = {}
    for d in deployments:
        by_group.setdefault(d.model_group, []).append(d)
    names = list(model_groups) if model_groups is not None else sorted(by_group)
    await store.ping()
    now_ms = await _store_time_ms(store)
    window_ms = settings.ratebalance.limiter.window_seconds * 1000
    groups: list[GroupStatus] = []
    for name in names:
        members = by_group.get(name, [])
        rpm, tpm = group_capacity(members)
        snapshot = await store.admission_snapshot(name, window_ms)
        groups.append(
            group_status(
                name,
                rpm=rpm,
                tpm=tpm,
                snapshot=snapshot,
                settings=settings,
                now_ms=now_ms,
                deployments=await _deployment_statuses(store, settings, name, members, now_ms),
            )
        )
    contracts_settings = settings.ratebalance.traffic_contracts
    book = ContractBook.from_settings(contracts_settings)
    contracts: ContractsStatus | None = None
    window = await store.contract_window(contracts_settings.window_seconds)
    if book.features or book.basket_rpm is not None or book.basket_tpm is not None or window is not None:
        contracts = contracts_status(book, window, window_seconds=contracts_settings.window_seconds, now_ms=now_ms)
    return StatusReport(
        generated_at_ms=now_ms,
        backend="redis-cluster" if target.cluster else str(getattr(store, "backend", "redis")),
        url=target.masked(),
        source=target.source,
        key_prefix=settings.ratebalance.key_prefix,
        model_groups=tuple(groups),
        contracts=contracts,
        replicas=tuple(await store.replica_health()),
    )
