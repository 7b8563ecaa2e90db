"""The report as ``--json`` data or as the table ``litellm-ratebalance status`` prints (pure)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from litellm_ratebalance.overload.signals import SIGNAL_REPORT_TTL_SECONDS
from litellm_ratebalance.status.report import (
    GPU_COLUMN_NOTE,
    NOT_IN_CONFIG,
    SCHEMA_VERSION,
    ContractLine,
    DeploymentStatus,
    GroupStatus,
    SignalStatus,
    StatusReport,
)

__all__ = ["dumps", "format_table", "report_json"]

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
            "signals": None if d.signals is None else _signals_json(d.signals),
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
        "replicas": [
            {
                "replica": r.replica,
                "reported_ms": r.reported_ms,
                "interval_seconds": r.interval_seconds,
                "store_calls": r.store_calls,
                "store_call_max_seconds": r.store_call_max_seconds,
                "loop_lag_max_seconds": r.loop_lag_max_seconds,
                "store_errors": dict(r.store_errors),
            }
            for r in report.replicas
        ],
    }


def _signals_json(s: SignalStatus) -> dict[str, Any]:
    return {
        "metrics_url": s.metrics_url,
        "server": s.server,
        "problems": list(s.problems),
        "detail": s.detail,
        "age_seconds": _round(s.age_seconds, 1),
    }


def _signal_lines(deployment_id: str, s: SignalStatus) -> list[str]:
    """What a deployment's signals are worth, under the deployments table: one line, and one more per problem."""
    where = f"  signals of {_short_id(deployment_id)}:"
    if not s.metrics_url:
        return [f"{where} no metrics_url (concurrency limit only)"]
    if s.age_seconds is None:
        return [f"{where} no report (no replica scraped its metrics_url in the last {SIGNAL_REPORT_TTL_SECONDS:.0f}s)"]
    server = s.server or "no supported server"
    age = f"reported {s.age_seconds:.0f}s ago"
    if not s.problems:
        return [f"{where} {server}, every signal read ({age})"]
    lines = [f"{where} {server}; PROBLEMS {', '.join(s.problems)} ({age})"]
    lines.extend(f"    {line}" for line in s.detail.splitlines() if line.strip())
    return lines


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
            for d in g.deployments:
                if d.signals is not None:
                    lines.extend(_signal_lines(d.deployment_id, d.signals))
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
    lines.extend(_replica_lines(report))
    return "\n".join(lines) + "\n"


def _replica_lines(report: StatusReport) -> list[str]:
    if not report.replicas:
        return ["", "replicas: none reported in the last 30 s (replicas report every 10 s once they use Redis)"]
    lines = ["", f"replicas: {len(report.replicas)} reporting (store health over each one's last interval)"]
    lines.extend(
        _table(
            ["replica", "age s", "store calls", "slowest s", "loop lag s", "store errors"],
            [
                [
                    r.replica,
                    f"{max(0, report.generated_at_ms - r.reported_ms) / 1000:.0f}",
                    str(r.store_calls),
                    f"{r.store_call_max_seconds:.3f}",
                    f"{r.loop_lag_max_seconds:.3f}",
                    ", ".join(f"{cause} {count}" for cause, count in sorted(r.store_errors.items())) or "none",
                ]
                for r in report.replicas
            ],
        )
    )
    lines.append(
        "  a loop stall as long as the slowest call means the replica was busy, not Redis slow (docs/redis.md)"
    )
    return lines


def dumps(report: StatusReport) -> str:
    """``--json`` text."""
    return json.dumps(report_json(report), indent=2, sort_keys=False) + "\n"
