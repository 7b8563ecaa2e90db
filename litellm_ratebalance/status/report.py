"""The report: its dataclasses (pure data) and the figures computed from store snapshots, settings and an
explicit store time (no I/O, no clock)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from litellm_ratebalance.admission.policy import (
    DEFAULT_POOL,
    normalised_weights,
    pool_field,
    reset_seconds,
    saturation,
)
from litellm_ratebalance.contracts.config import BASKET_FIELD
from litellm_ratebalance.contracts.policy import ContractBook, Mode, classify, seconds_to_window_end
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.store.admission import AdmissionSnapshot
from litellm_ratebalance.store.contracts import ContractWindow
from litellm_ratebalance.store.keys import escape_name
from litellm_ratebalance.store.replicas import ReplicaHealth

__all__ = [
    "ConcurrencyRange",
    "ContractLine",
    "ContractsStatus",
    "DeploymentStatus",
    "GroupStatus",
    "PoolStatus",
    "SignalStatus",
    "StatusReport",
    "contracts_status",
    "group_status",
    "mask_url",
]

SCHEMA_VERSION = 1
DEFAULT_POOL_LABEL = "default"
NOT_IN_CONFIG = "not in config"
"""``routing_mode`` of a deployment the store has statistics for but the config does not list."""
GPU_COLUMN_NOTE = (
    "GPU-s/1k tok: attributed GPU-seconds per 1000 output tokens, recent requests of all replicas ('-': none metered)"
)
"""Under the deployments table: what the cost column is and what ``-`` means there (docs/cost.md)."""


# -- the report (pure data) -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolStatus:
    priority: str
    """A configured priority, or ``default`` (the shared pool)."""
    requests: int
    tokens: int
    weight: float
    """Share of the model capacity this pool is capped at in strict mode."""
    reserved_requests: float | None
    """weight x model rpm (None: no rpm, or no priority_reservation, so nothing is divided)."""
    reserved_tokens: float | None


@dataclass(frozen=True, slots=True)
class ConcurrencyRange:
    min: int
    initial: int
    max: int


@dataclass(frozen=True, slots=True)
class SignalStatus:
    """What a backpressure deployment's server signals are worth, as the replicas scraping it last reported."""

    metrics_url: bool
    """The deployment has a ``metrics_url`` (without one it runs on its concurrency limit alone)."""
    server: str | None
    """The server answering (``vllm``, ``tgi``, ``sglang``); ``None``: not recognised, or no report."""
    problems: tuple[str, ...]
    """Problem codes (docs/backpressure.md); empty when every signal is read."""
    detail: str
    """One line per problem: ``<code>: <what is wrong and what to do>``."""
    age_seconds: float | None
    """Age of the report (store clock); ``None``: no replica reported within the report's lifetime."""


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    deployment_id: str
    estimated_rate: float
    """Mean effective token rate (tokens/s) of the routing window's samples."""
    weight: float | None
    """Routing choice probability among the group's deployments (None: routing statistics unread)."""
    samples: float
    """Samples in the routing window as the balancer counts them (recency-weighted when the routing
    settings weight samples by age, so not always whole)."""
    failures: float
    routing_mode: str
    in_flight: int | None
    """Leases alive in the store, all replicas (None: not read)."""
    reserved_tokens: int | None
    concurrency_limit: ConcurrencyRange | None
    """Configured backpressure range (None: deployment not managed by backpressure)."""
    gpu_seconds_per_1k_output_tokens: float | None = None
    """Attributed GPU-seconds per 1000 output tokens of its recent requests (the cost state's decayed sums;
    None: no request was metered on it within the state's lifetime, or it is not behind backpressure)."""
    signals: SignalStatus | None = None
    """Its server signals (None: not managed by backpressure)."""


@dataclass(frozen=True, slots=True)
class GroupStatus:
    model_group: str
    rpm: int | None
    tpm: int | None
    window_seconds: int
    window_start_ms: int | None
    window_end_ms: int | None
    window_live: bool
    reset_seconds: int | None
    requests: int
    tokens: int
    saturation: float
    saturation_threshold: float
    mode: Literal["unlimited", "lenient", "strict"]
    priorities: tuple[PoolStatus, ...]
    deployments: tuple[DeploymentStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class ContractLine:
    feature: str
    requests: int
    rpm_limit: int | None
    tokens: int
    """Recorded plus in flight."""
    tpm_limit: int | None
    rpm_mode: str
    tpm_mode: str


@dataclass(frozen=True, slots=True)
class ContractsStatus:
    window_seconds: int
    window_start: int
    reset_seconds: int
    features: tuple[ContractLine, ...]
    basket: ContractLine


@dataclass(frozen=True, slots=True)
class StatusReport:
    generated_at_ms: int
    backend: str
    url: str
    """Masked."""
    source: str
    key_prefix: str
    model_groups: tuple[GroupStatus, ...]
    contracts: ContractsStatus | None
    replicas: tuple[ReplicaHealth, ...] = ()
    """The latest store-health report of each live proxy replica (by name)."""


# -- pure figures ---------------------------------------------------------------------------------------


def group_status(
    model_group: str,
    *,
    rpm: int | None,
    tpm: int | None,
    snapshot: AdmissionSnapshot | None,
    settings: Settings,
    now_ms: int,
    deployments: Sequence[DeploymentStatus] = (),
) -> GroupStatus:
    """A model group's admission figures from its window snapshot at store time ``now_ms``.

    An ended window counts as empty: the next request starts a new one with every counter at zero.
    """
    window_ms = settings.ratebalance.limiter.window_seconds * 1000
    live = snapshot is not None and now_ms < snapshot.window_end_ms
    pools_raw: Mapping[str, tuple[int, int]] = snapshot.pools if snapshot is not None and live else {}
    requests = snapshot.requests if snapshot is not None and live else 0
    tokens = snapshot.tokens if snapshot is not None and live else 0
    reservations = settings.reservation_values()
    prs = settings.priority_reservation_settings
    weights = normalised_weights(reservations, rpm, tpm)
    divided = bool(weights)
    pools: list[PoolStatus] = []

    def pool(label: str, field_name: str, weight: float) -> PoolStatus:
        used_requests, used_tokens = pools_raw.get(field_name, (0, 0))
        return PoolStatus(
            priority=label,
            requests=used_requests,
            tokens=used_tokens,
            weight=weight,
            reserved_requests=weight * rpm if divided and rpm is not None else None,
            reserved_tokens=weight * tpm if divided and tpm is not None else None,
        )

    known_fields = {DEFAULT_POOL}
    for name, weight in weights.items():
        field_name = pool_field(name, escape_name(name))
        known_fields.add(field_name)
        pools.append(pool(name, field_name, weight))
    pools.append(pool(DEFAULT_POOL_LABEL, DEFAULT_POOL, prs.default_priority))
    for field_name in sorted(set(pools_raw) - known_fields):
        # Counted under a priority that is no longer configured (the config changed within the window).
        pools.append(pool(f"{field_name} (unconfigured)", field_name, 0.0))
    value = saturation(requests, tokens, rpm, tpm)
    mode: Literal["unlimited", "lenient", "strict"]
    if rpm is None and tpm is None:
        mode = "unlimited"
    elif divided and value >= prs.saturation_threshold:
        mode = "strict"
    else:
        mode = "lenient"
    return GroupStatus(
        model_group=model_group,
        rpm=rpm,
        tpm=tpm,
        window_seconds=window_ms // 1000,
        window_start_ms=snapshot.window_start_ms if snapshot is not None else None,
        window_end_ms=snapshot.window_end_ms if snapshot is not None else None,
        window_live=live,
        reset_seconds=reset_seconds(now_ms, snapshot.window_end_ms) if snapshot is not None and live else None,
        requests=requests,
        tokens=tokens,
        saturation=value,
        saturation_threshold=prs.saturation_threshold,
        mode=mode,
        priorities=tuple(pools),
        deployments=tuple(deployments),
    )


def _contract_line(
    name: str, field_name: str, window: ContractWindow | None, limits: tuple[int | None, int | None], book: ContractBook
) -> ContractLine:
    def used(kind: str, name_of_field: str) -> int:
        if window is None:
            return 0
        if kind == "rpm":
            return int(window.requests.get(name_of_field, 0))
        return int(window.tokens.get(name_of_field, 0)) + int(window.in_flight.get(name_of_field, 0))

    basket = field_name == BASKET_FIELD
    requests, tokens = used("rpm", field_name), used("tpm", field_name)
    basket_requests, basket_tokens = used("rpm", BASKET_FIELD), used("tpm", BASKET_FIELD)
    rpm_limit, tpm_limit = limits
    rpm_mode = classify(requests, basket_requests, 1, None if basket else rpm_limit, book.basket_rpm)
    tpm_mode = classify(tokens, basket_tokens, 1, None if basket else tpm_limit, book.basket_tpm)
    return ContractLine(name, requests, rpm_limit, tokens, tpm_limit, Mode(rpm_mode).label, Mode(tpm_mode).label)


def contracts_status(
    book: ContractBook, window: ContractWindow | None, *, window_seconds: int, now_ms: int
) -> ContractsStatus:
    """Usage and next-request modes of every counted feature and the basket in the current window."""
    start = window.window_start if window is not None else (now_ms // 1000 // window_seconds) * window_seconds
    lines = tuple(
        _contract_line(name, escape_name(name), window, book.features.get(name, (None, None)), book)
        for name in book.counted_features
    )
    basket = _contract_line(BASKET_FIELD, BASKET_FIELD, window, (book.basket_rpm, book.basket_tpm), book)
    return ContractsStatus(window_seconds, start, seconds_to_window_end(now_ms, start, window_seconds), lines, basket)


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (user names and hosts kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(parts.username or '', safe='')}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
