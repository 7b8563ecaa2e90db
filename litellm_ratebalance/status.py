"""``litellm-ratebalance status``: what the shared store says right now, as a table or as JSON.

Two halves:

* **Pure** (no I/O, no clock): the report dataclasses, :func:`group_status` / :func:`contracts_status`
  (figures from store snapshots, settings and an explicit store time), :func:`report_json` and
  :func:`format_table`, :func:`mask_url`.
* **I/O**: :func:`load_proxy_config` (config.yaml), :func:`config_deployments` (deployment ids by
  LiteLLM's own rule: ``model_info.id``, else the hash ``litellm.Router`` derives from the params, so they
  match what the proxy records), :func:`resolve_redis` (where the proxy's Redis is),
  :func:`locate_sentinel_master` (the current master of a Sentinel set, asked of its sentinels),
  :func:`collect` (reads the store).

JSON output (``--json``), schema 1; keys are stable, new keys may be added::

    {"schema": 1,
     "generated_at_ms": <store clock (Redis TIME), ms>,
     "store": {"backend": "redis"|"redis-cluster", "url": <password masked; a cluster's further startup nodes
               appended as ,host:port>, "source": <where the URL came from>,
               "key_prefix": str},
     "model_groups": [{
         "model_group": str, "rpm": int|null, "tpm": int|null,     # summed deployment limits
         "window_seconds": int,
         "window": {"start_ms": int|null, "end_ms": int|null, "live": bool, "reset_seconds": int|null},
         "requests": int, "tokens": int,                           # live window (reservations included)
         "saturation": float, "saturation_threshold": float,
         "mode": "unlimited"|"lenient"|"strict",
         "priorities": [{"priority": str ("default" = shared pool), "requests": int, "tokens": int,
                         "weight": float, "reserved_requests": float|null, "reserved_tokens": float|null}],
         "deployments": [{"deployment_id": str, "estimated_rate": float (tokens/s, window mean),
                          "weight": float|null (routing choice probability), "samples": float,
                          "failures": float (both recency-weighted when routing weighs by age),
                          "routing_mode": str, "in_flight": int|null, "reserved_tokens": int|null,
                          "concurrency_limit": {"min": int, "initial": int, "max": int}|null,
                          "gpu_seconds_per_1k_output_tokens": float|null}]}],
     "contracts": null | {
         "window_seconds": int, "window_start": int (s), "reset_seconds": int,
         "features": [{"feature": str, "requests": int, "rpm_limit": int|null, "tokens": int,
                       "tpm_limit": int|null, "rpm_mode": str, "tpm_mode": str}],
         "basket": {same keys, "feature": "__basket__"}}}

Contract modes are those the *next* request would get (one request, one token): ``normal``,
``borrowed`` (over its feature's contract) or ``degraded`` (the basket is full). Backpressure's adaptive
concurrency limit lives in each replica (gauge ``litellm_ratebalance_backpressure_concurrency_limit``);
the store holds the in-flight leases of all replicas, so status shows in flight and the configured range.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple
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
from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.store.admission import AdmissionSnapshot
from litellm_ratebalance.store.contracts import ContractWindow
from litellm_ratebalance.store.keys import escape_name

__all__ = [
    "ContractLine",
    "ContractsStatus",
    "DeploymentStatus",
    "GroupStatus",
    "PoolStatus",
    "ProxyConfig",
    "RedisTarget",
    "SentinelSet",
    "StatusReport",
    "collect",
    "format_table",
    "group_status",
    "load_proxy_config",
    "locate_sentinel_master",
    "mask_url",
    "report_json",
    "resolve_redis",
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


# -- output ---------------------------------------------------------------------------------------------


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None:
        return None
    return round(value, digits) if math.isfinite(value) else None


def report_json(report: StatusReport) -> dict[str, Any]:
    """The ``--json`` document (schema in the module docstring)."""

    def deployment(d: DeploymentStatus) -> dict[str, Any]:
        limit = d.concurrency_limit
        return {
            "deployment_id": d.deployment_id,
            "estimated_rate": _round(d.estimated_rate),
            "weight": _round(d.weight),
            "samples": _round(float(d.samples), 2),
            "failures": _round(float(d.failures), 2),
            "routing_mode": d.routing_mode,
            "in_flight": d.in_flight,
            "reserved_tokens": d.reserved_tokens,
            "concurrency_limit": None
            if limit is None
            else {"min": limit.min, "initial": limit.initial, "max": limit.max},
            "gpu_seconds_per_1k_output_tokens": _round(d.gpu_seconds_per_1k_output_tokens),
        }

    def group(g: GroupStatus) -> dict[str, Any]:
        return {
            "model_group": g.model_group,
            "rpm": g.rpm,
            "tpm": g.tpm,
            "window_seconds": g.window_seconds,
            "window": {
                "start_ms": g.window_start_ms,
                "end_ms": g.window_end_ms,
                "live": g.window_live,
                "reset_seconds": g.reset_seconds,
            },
            "requests": g.requests,
            "tokens": g.tokens,
            "saturation": _round(g.saturation),
            "saturation_threshold": g.saturation_threshold,
            "mode": g.mode,
            "priorities": [
                {
                    "priority": p.priority,
                    "requests": p.requests,
                    "tokens": p.tokens,
                    "weight": _round(p.weight),
                    "reserved_requests": _round(p.reserved_requests, 2),
                    "reserved_tokens": _round(p.reserved_tokens, 2),
                }
                for p in g.priorities
            ],
            "deployments": [deployment(d) for d in g.deployments],
        }

    def line(c: ContractLine) -> dict[str, Any]:
        return {
            "feature": c.feature,
            "requests": c.requests,
            "rpm_limit": c.rpm_limit,
            "tokens": c.tokens,
            "tpm_limit": c.tpm_limit,
            "rpm_mode": c.rpm_mode,
            "tpm_mode": c.tpm_mode,
        }

    contracts = report.contracts
    return {
        "schema": SCHEMA_VERSION,
        "generated_at_ms": report.generated_at_ms,
        "store": {
            "backend": report.backend,
            "url": report.url,
            "source": report.source,
            "key_prefix": report.key_prefix,
        },
        "model_groups": [group(g) for g in report.model_groups],
        "contracts": None
        if contracts is None
        else {
            "window_seconds": contracts.window_seconds,
            "window_start": contracts.window_start,
            "reset_seconds": contracts.reset_seconds,
            "features": [line(c) for c in contracts.features],
            "basket": line(contracts.basket),
        },
    }


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Aligned plain-text columns: the first column left-aligned, the others right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def render(cells: Sequence[str]) -> str:
        out = [cells[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)
        ]
        return (indent + "  ".join(out)).rstrip()

    return [render(headers)] + [render(row) for row in rows]


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or digits == 0:
        return f"{round(value):d}"
    return f"{value:.{digits}f}"


def _count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _short_id(deployment_id: str, width: int = 24) -> str:
    """LiteLLM's derived ids are 64 hex digits: the table shows a prefix (``--json`` has the full id)."""
    return deployment_id if len(deployment_id) <= width else deployment_id[: width - 1] + "~"


def _utc(epoch_seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_seconds))


def _used_of(used: int, limit: float | None) -> str:
    return f"{used}" if limit is None else f"{used}/{_num(limit)}"


def format_table(report: StatusReport) -> str:
    """The plain-text report: one block per model group, then the contracts."""
    lines = [f"store: {report.backend} {report.url} ({report.source}), key prefix {report.key_prefix!r}"]
    if not report.model_groups:
        lines.append("no model groups (check --model and the config's model_list)")
    for g in report.model_groups:
        lines.append("")
        limits = f"rpm {_num(g.rpm)}, tpm {_num(g.tpm)}"
        if g.window_live:
            window = f"window resets in {g.reset_seconds}s"
        else:
            window = f"no live window ({g.window_seconds}s windows start with the next request)"
        lines.append(f"model group {g.model_group}: {limits}; {window}")
        lines.append(
            f"  saturation {g.saturation:.1%} (threshold {g.saturation_threshold:.0%}, mode {g.mode}); "
            f"requests {_used_of(g.requests, g.rpm)}, tokens {_used_of(g.tokens, g.tpm)}"
        )
        lines.extend(
            _table(
                ["priority", "weight", "requests", "reserved rpm", "tokens", "reserved tpm"],
                [
                    [
                        p.priority,
                        f"{p.weight:.2f}",
                        str(p.requests),
                        _num(p.reserved_requests),
                        str(p.tokens),
                        _num(p.reserved_tokens),
                    ]
                    for p in g.priorities
                ],
            )
        )
        if g.deployments:
            modes = sorted({d.routing_mode for d in g.deployments if d.routing_mode != NOT_IN_CONFIG})
            lines.append(f"  routing mode {', '.join(modes) or '-'}; in flight = leases of all replicas")
            lines.extend(
                _table(
                    [
                        "deployment",
                        "est. rate tok/s",
                        "weight",
                        "samples",
                        "failures",
                        "in flight",
                        "conc. limit",
                        "GPU-s/1k tok",
                    ],
                    [
                        [
                            _short_id(d.deployment_id),
                            _num(d.estimated_rate, 1),
                            _num(d.weight, 3),
                            _count(d.samples),
                            _count(d.failures),
                            _num(d.in_flight),
                            "-"
                            if d.concurrency_limit is None
                            else f"{d.concurrency_limit.min}..{d.concurrency_limit.max}"
                            f" (start {d.concurrency_limit.initial})",
                            _num(d.gpu_seconds_per_1k_output_tokens, 3),
                        ]
                        for d in g.deployments
                    ],
                )
            )
            lines.append(f"  {GPU_COLUMN_NOTE}")
    contracts = report.contracts
    if contracts is not None:
        lines.append("")
        lines.append(
            f"traffic contracts: window {contracts.window_seconds}s from {_utc(contracts.window_start)}, "
            f"resets in {contracts.reset_seconds}s"
        )
        lines.extend(
            _table(
                ["feature", "requests", "rpm", "rpm mode", "tokens", "tpm", "tpm mode"],
                [
                    [
                        c.feature,
                        str(c.requests),
                        _num(c.rpm_limit),
                        c.rpm_mode,
                        str(c.tokens),
                        _num(c.tpm_limit),
                        c.tpm_mode,
                    ]
                    for c in (*contracts.features, contracts.basket)
                ],
            )
        )
    return "\n".join(lines) + "\n"


# -- config (I/O) ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The parts of a LiteLLM config.yaml status reads."""

    path: Path
    model_list: list[dict[str, Any]]
    litellm_settings: dict[str, Any]
    router_settings: dict[str, Any]
    general_settings: dict[str, Any]
    settings: Settings


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: must be a mapping (got {type(value).__name__})")
    return value


def load_proxy_config(path: Path) -> ProxyConfig:
    """Read config.yaml and validate our settings (ConfigurationError on a bad file or setting)."""
    import yaml

    from litellm_ratebalance.settings import parse_settings

    try:
        raw = yaml.safe_load(path.read_text("utf-8")) or {}
    except OSError as exc:
        raise ConfigurationError(f"cannot read the config: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"the config is not valid YAML: {exc}") from None
    config = _mapping(raw, "the config file")
    litellm_settings = _mapping(config.get("litellm_settings"), "litellm_settings")
    general = _mapping(config.get("general_settings"), "general_settings")
    model_list = config.get("model_list") or []
    if not isinstance(model_list, list) or not all(isinstance(m, dict) for m in model_list):
        raise ConfigurationError("model_list: must be a list of mappings")
    ours = dict(litellm_settings)
    if general.get("token_rate_limit_type") is not None:
        ours["token_rate_limit_type"] = general["token_rate_limit_type"]
    return ProxyConfig(
        path=path,
        model_list=model_list,
        litellm_settings=litellm_settings,
        router_settings=_mapping(config.get("router_settings"), "router_settings"),
        general_settings=general,
        settings=parse_settings(ours),
    )


@dataclass(frozen=True, slots=True)
class ConfigDeployment:
    model_group: str
    deployment_id: str
    deployment: dict[str, Any]
    """The deployment dict as the Router holds it (``model_name``, ``litellm_params``, ``model_info``)."""


def config_deployments(config: ProxyConfig) -> list[ConfigDeployment]:
    """Deployments of ``model_list`` with the ids the proxy's Router gives them.

    The Router itself builds them (no network), so an id without ``model_info.id`` is LiteLLM's hash of
    the params, ``os.environ/`` values resolved from this environment: run status where the proxy's
    environment variables are set, or give deployments an explicit ``model_info.id``.
    """
    if not config.model_list:
        return []
    from litellm.router import Router

    try:
        router = Router(model_list=copy.deepcopy(config.model_list))
        deployments = router.get_model_list() or []
    except Exception as exc:
        raise ConfigurationError(f"model_list: LiteLLM's Router refused it: {exc}") from None
    out: list[ConfigDeployment] = []
    for deployment in deployments:
        info = deployment.get("model_info") or {}
        name = deployment.get("model_name")
        if isinstance(name, str) and info.get("id") is not None:
            out.append(ConfigDeployment(name, str(info["id"]), dict(deployment)))
    return out


def _positive_int(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def group_capacity(deployments: Sequence[ConfigDeployment]) -> tuple[int | None, int | None]:
    """Summed rpm / tpm of a group's deployments (``litellm_params`` first, then ``model_info``), as the
    limiter reads them; None where no deployment sets one."""
    rpm: int | None = None
    tpm: int | None = None
    for d in deployments:
        params = d.deployment.get("litellm_params") or {}
        info = d.deployment.get("model_info") or {}
        one_rpm = _positive_int(params.get("rpm", info.get("rpm")))
        one_tpm = _positive_int(params.get("tpm", info.get("tpm")))
        if one_rpm is not None:
            rpm = (rpm or 0) + one_rpm
        if one_tpm is not None:
            tpm = (tpm or 0) + one_tpm
    return rpm, tpm


def _resolve_env(value: object) -> object:
    """LiteLLM's ``os.environ/NAME`` indirection (from this process's environment)."""
    if isinstance(value, str) and value.startswith("os.environ/"):
        return os.environ.get(value.removeprefix("os.environ/"))
    return value


def _url_from_parts(
    host: object, port: object, password: object, username: object = None, ssl: object = None, db: object = None
) -> str | None:
    host, port, password, username = (_resolve_env(v) for v in (host, port, password, username))
    if not host:
        return None
    scheme = "rediss" if str(_resolve_env(ssl)).lower() in ("true", "1") else "redis"
    auth = ""
    if password:
        auth = f"{quote(str(username or ''), safe='')}:{quote(str(password), safe='')}@"
    path = f"/{db}" if db not in (None, "") else ""
    return f"{scheme}://{auth}{host}:{port or 6379}{path}"


@dataclass(frozen=True, slots=True)
class SentinelSet:
    """A Sentinel-managed Redis as LiteLLM's client reaches it: the sentinels to ask, the service name, and the
    credentials of the data nodes and of the sentinels (LiteLLM connects to the sentinels with the data
    nodes' connection settings, the password replaced by ``sentinel_password``)."""

    nodes: tuple[tuple[str, int], ...]
    service_name: str
    password: str | None = field(default=None, repr=False)
    username: str | None = None
    ssl: bool = False
    db: int | None = None
    sentinel_password: str | None = field(default=None, repr=False)


class RedisTarget(NamedTuple):
    """Where the proxy's Redis is, as :func:`resolve_redis` finds it."""

    url: str | None
    """A plain Redis: its URL. A Redis Cluster: the URL of one startup node, which carries the auth and TLS of
    every node. A Sentinel set: the current master's, once :func:`locate_sentinel_master` asked (None before).
    None otherwise: nothing this command can read (``source`` says why)."""
    source: str
    """Where it came from (a config key or variable), or why there is nothing to read."""
    cluster: bool = False
    """``url`` is a node of a Redis Cluster."""
    other_nodes: tuple[tuple[str, int], ...] = ()
    """A Redis Cluster's further startup nodes (host, port), besides ``url``'s."""
    sentinel: bool = False
    """The proxy's Redis is a Sentinel set (``sentinel_set``): its master is found by asking the sentinels."""
    sentinel_set: SentinelSet | None = None

    def masked(self) -> str:
        """``url`` with its password masked (:func:`mask_url`), a cluster's other startup nodes appended as
        ``,host:port``; empty without a URL."""
        if self.url is None:
            return ""
        return ",".join([mask_url(self.url), *(f"{host}:{port}" for host, port in self.other_nodes)])


def _cluster_nodes(value: object, where: str) -> tuple[tuple[str, int], ...]:
    """Startup nodes as LiteLLM takes them (``[{"host": ..., "port": ...}, ...]``, or that list as JSON text,
    as in ``REDIS_CLUSTER_NODES``); ConfigurationError naming ``where`` when they are not that."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not valid JSON ({exc})") from None
    expected = 'a list of {"host": str, "port": 1..65535} mappings'
    if not isinstance(value, list):
        raise ConfigurationError(f"{where}: must be {expected} (got {type(value).__name__})")
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(value):
        host = item.get("host") if isinstance(item, dict) else None
        port = item.get("port", 6379) if isinstance(item, dict) else None
        try:
            number = int(port) if isinstance(port, (int, str)) and not isinstance(port, bool) else None
        except ValueError:
            number = None
        if not isinstance(host, str) or not host or number is None or not 1 <= number <= 65535:
            raise ConfigurationError(f'{where}[{i}]: must be {{"host": str, "port": 1..65535}} (got {item!r})')
        nodes.append((host, number))
    return tuple(nodes)


def _cluster_target(
    nodes: tuple[tuple[str, int], ...], source: str, password: object, username: object, ssl: object
) -> RedisTarget:
    host, port = nodes[0]
    url = _url_from_parts(host, port, password, username, ssl)
    assert url is not None  # (a node always has a host)
    return RedisTarget(url, source, cluster=True, other_nodes=nodes[1:])


def _sentinel_nodes(value: object, where: str) -> tuple[tuple[str, int], ...]:
    """Sentinel nodes as LiteLLM takes them (``[[host, port], ...]``, or that list as JSON text, as in
    ``REDIS_SENTINEL_NODES``); ConfigurationError naming ``where`` when they are not that."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, list) or not value:
        raise ConfigurationError(f"{where}: must be a non-empty list of [host, port 1..65535] pairs (got {value!r})")
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(value):
        pair = list(item) if isinstance(item, (list, tuple)) else []
        host, port = (pair[0], pair[1]) if len(pair) == 2 else (None, None)
        try:
            number = int(port) if isinstance(port, (int, str)) and not isinstance(port, bool) else None
        except ValueError:
            number = None
        if not isinstance(host, str) or not host or number is None or not 1 <= number <= 65535:
            raise ConfigurationError(f"{where}[{i}]: must be a [host, port 1..65535] pair (got {item!r})")
        nodes.append((host, number))
    return tuple(nodes)


def _truthy(value: object) -> bool:
    return str(_resolve_env(value)).lower() in ("true", "1")


def _sentinel_target(params: Mapping[str, Any], password: object, username: object, ssl: object) -> RedisTarget:
    env = os.environ.get
    if params.get("sentinel_nodes"):
        where = "litellm_settings.cache_params.sentinel_nodes"
        nodes = _sentinel_nodes(_resolve_env(params["sentinel_nodes"]), where)
    else:
        where = "REDIS_SENTINEL_NODES"
        nodes = _sentinel_nodes(env(where), where)
    service = _resolve_env(params.get("service_name")) or env("REDIS_SERVICE_NAME")
    if not isinstance(service, str) or not service:
        # (LiteLLM builds its Sentinel client only with both; without a service name it is not a Sentinel client)
        raise ConfigurationError(
            f"litellm_settings.cache_params.service_name: required with {where} (or REDIS_SERVICE_NAME): the "
            "Sentinel service whose master the proxy uses"
        )
    db = _resolve_env(params.get("db"))
    spec = SentinelSet(
        nodes=nodes,
        service_name=service,
        password=str(_resolve_env(password)) if password else None,
        username=str(_resolve_env(username)) if username else None,
        ssl=_truthy(ssl),
        db=int(db) if isinstance(db, (int, str)) and str(db).isdigit() else None,
        sentinel_password=str(_resolve_env(params.get("sentinel_password")) or env("REDIS_SENTINEL_PASSWORD") or "")
        or None,
    )
    return RedisTarget(None, f"{where}, service {service!r}", sentinel=True, sentinel_set=spec)


async def locate_sentinel_master(target: RedisTarget, timeout: float) -> RedisTarget:
    """``target`` (a Sentinel set from :func:`resolve_redis`) with ``url`` set to its current master, as the
    sentinels name it (the first that answers and reports a healthy master, as redis-py's Sentinel client
    picks). StoreError when none does within ``timeout`` per sentinel."""
    from redis.asyncio.sentinel import Sentinel
    from redis.exceptions import RedisError

    spec = target.sentinel_set
    if spec is None:
        raise ValueError("not a Sentinel target")
    sentinel_kwargs: dict[str, Any] = {
        "password": spec.sentinel_password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    if spec.username:
        sentinel_kwargs["username"] = spec.username
    if spec.ssl:
        sentinel_kwargs["ssl"] = True
    sentinel = Sentinel(list(spec.nodes), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    nodes = ", ".join(f"{host}:{port}" for host, port in spec.nodes)
    try:
        host, port = await asyncio.wait_for(
            sentinel.discover_master(spec.service_name), timeout * (len(spec.nodes) + 1)
        )
    except (RedisError, OSError, asyncio.TimeoutError) as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise StoreError(f"no sentinel ({nodes}) named a master for service {spec.service_name!r}: {detail}") from exc
    finally:
        for client in sentinel.sentinels:
            with contextlib.suppress(Exception):  # (closing a connection that never opened)
                await client.aclose()
    url = _url_from_parts(host, port, spec.password, spec.username, "true" if spec.ssl else None, spec.db)
    assert url is not None  # (a master always has a host)
    return target._replace(url=url, source=f"{target.source}: master {host}:{port} per the sentinels")


def resolve_redis(config: ProxyConfig, override: str | None = None, *, override_cluster: bool = False) -> RedisTarget:
    """Where the proxy's Redis is (:class:`RedisTarget`), in the proxy's order; a target without a URL (and
    the reason) when the proxy would run on the embedded store; for a Sentinel set, a target whose master
    :func:`locate_sentinel_master` finds (this function does no I/O).

    Order: ``--redis-url`` (one node of a Redis Cluster with ``override_cluster``); ``ratebalance.redis_url``;
    the proxy's cache (``litellm_settings.cache`` with ``cache_params`` of type redis: its startup nodes, or
    ``REDIS_CLUSTER_NODES``, make it a Redis Cluster, as in LiteLLM; else its Sentinel nodes, or
    ``REDIS_SENTINEL_NODES``, with ``service_name`` (or ``REDIS_SERVICE_NAME``); else its URL or host,
    LiteLLM's ``REDIS_*`` variables when it names no host); the router's (``router_settings.redis_url`` /
    ``redis_host``, a Redis Cluster when ``REDIS_CLUSTER_NODES`` is set). ConfigurationError on startup or
    sentinel nodes that are not a list of host and port, and on sentinel nodes without a service name.
    """
    if override:
        return RedisTarget(override, "--redis-url", cluster=override_cluster)
    if config.settings.ratebalance.redis_url:
        return RedisTarget(config.settings.ratebalance.redis_url, "ratebalance.redis_url")
    env_nodes = os.environ.get("REDIS_CLUSTER_NODES")
    params = _mapping(config.litellm_settings.get("cache_params"), "litellm_settings.cache_params")
    if config.litellm_settings.get("cache") and params.get("type") == "redis":
        env = os.environ.get
        password = params.get("password") or env("REDIS_PASSWORD")
        username = params.get("username") or env("REDIS_USERNAME")
        ssl = params.get("ssl") if params.get("ssl") is not None else env("REDIS_SSL")
        startup = _resolve_env(params.get("redis_startup_nodes") or params.get("startup_nodes"))
        if startup:
            where = "litellm_settings.cache_params.redis_startup_nodes"
            return _cluster_target(_cluster_nodes(startup, where), where, password, username, ssl)
        if env_nodes:
            return _cluster_target(
                _cluster_nodes(env_nodes, "REDIS_CLUSTER_NODES"), "REDIS_CLUSTER_NODES", password, username, ssl
            )
        if params.get("sentinel_nodes") or env("REDIS_SENTINEL_NODES"):
            return _sentinel_target(params, password, username, ssl)
        url = _resolve_env(params.get("url") or params.get("redis_url"))
        if isinstance(url, str) and url:
            return RedisTarget(url, "litellm_settings.cache_params")
        url = _url_from_parts(
            params.get("host"), params.get("port"), params.get("password"), params.get("username"), params.get("ssl")
        )
        if url:
            return RedisTarget(url, "litellm_settings.cache_params")
        if os.environ.get("REDIS_URL"):
            return RedisTarget(os.environ["REDIS_URL"], "REDIS_URL")
        url = _url_from_parts(
            env("REDIS_HOST"), env("REDIS_PORT"), env("REDIS_PASSWORD"), env("REDIS_USERNAME"), env("REDIS_SSL")
        )
        if url:
            return RedisTarget(url, "REDIS_HOST/REDIS_PORT")
    router = config.router_settings
    url = _resolve_env(router.get("redis_url"))
    source = "router_settings.redis_url"
    if not (isinstance(url, str) and url):
        url = _url_from_parts(router.get("redis_host"), router.get("redis_port"), router.get("redis_password"))
        source = "router_settings.redis_host"
    if isinstance(url, str) and url:
        if env_nodes:
            # LiteLLM's Router makes its Redis a cluster of these nodes (with the router's password).
            nodes = _cluster_nodes(env_nodes, "REDIS_CLUSTER_NODES")
            return _cluster_target(nodes, "REDIS_CLUSTER_NODES", router.get("redis_password"), None, None)
        return RedisTarget(url, source)
    return RedisTarget(
        None, "the config names no Redis (no ratebalance.redis_url, cache_params or router_settings.redis_*)"
    )


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


async def _deployment_statuses(
    store: Any, settings: Settings, model_group: str, deployments: Sequence[ConfigDeployment]
) -> list[DeploymentStatus]:
    from litellm_ratebalance.proxy.routing import deployment_candidates
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
    candidates = deployment_candidates([d.deployment for d in deployments]) or ()
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
                if config.enabled and backpressure.enabled
                else None,
                gpu_seconds_per_1k_output_tokens=efficiency[d.deployment_id],
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
                deployments=await _deployment_statuses(store, settings, name, members),
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
    )


def dumps(report: StatusReport) -> str:
    """``--json`` text."""
    return json.dumps(report_json(report), indent=2, sort_keys=False) + "\n"
