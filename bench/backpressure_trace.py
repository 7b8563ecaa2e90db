"""``bench/bench_backpressure.py --replicas N --trace FILE``: where each top-tier request's time goes.

The proxies append the backpressure trace (``litellm_ratebalance/proxy/backpressure/trace.py``) to ``FILE``;
the bench sends every request with its own call id (``<mode>-<index>``, the index in the overload sequence,
so a top-tier request has the same index in the ``learned`` (all tiers) and ``top_alone`` runs), and appends
one ``client`` line per request (wall-clock send and end, status, output tokens) and, after the analysis, one
``top_request`` line per top-tier request: its time split into

* ``to_hook``: client send -> our deployment hook (the proxy's own work: auth, routing, our filter);
* ``queue``: hook -> lease taken (our wait queue; 0 when admitted at once);
* ``server``: lease -> lease given back (the inference server: its own queue, prefill, decode);
* ``after``: lease given back -> the client has the answer,

and the deployment's state when it arrived at the hook and when its lease was taken: the concurrency limit,
and per tier the leases of **all** replicas (rebuilt from every replica's ``lease`` / ``release`` lines) with
the tokens they reserved, the scraped KV-cache usage, what refused it first and what the queue head waited for.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ClientRecord", "analyse", "finish_trace", "read_events", "start_trace"]


@dataclass(frozen=True)
class ClientRecord:
    mode: str
    index: int
    tier: str
    call: str
    sent: float
    """Wall-clock seconds."""
    ended: float
    status: int
    tokens: int
    counted: bool
    """Arrived after the warm-up (the requests the bench's figures count)."""

    def line(self) -> dict[str, Any]:
        return {"ev": "client", **self.__dict__}


def start_trace(name: str) -> Path:
    """The trace file ``name``, absolute (the proxies run in their own directories), emptied."""
    path = Path(name).resolve()
    path.write_text("")
    return path


def finish_trace(
    path: Path, clients: Sequence[ClientRecord], deployments: dict[str, str], top: str, step_seconds: float
) -> list[str]:
    """Analyse the trace at ``path`` (:func:`analyse`), append the client and ``top_request`` lines to it and
    return the report's lines."""
    lines, records = analyse(clients, read_events(path), deployments, top, step_seconds)
    with path.open("a") as out:
        for record in [c.line() for c in clients] + records:
            out.write(json.dumps(record) + "\n")
    return lines


def read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for text in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class _Lease:
    tier: str
    cost: int
    start: float
    end: float


def _leases(events: Iterable[dict[str, Any]], deployment: str) -> list[_Lease]:
    opened: dict[str, _Lease] = {}
    for e in events:
        if e.get("dep") != deployment:
            continue
        if e["ev"] == "lease":
            opened[e["lease"]] = _Lease(e["tier"], int(e["cost"]), e["t"], math.inf)
        elif e["ev"] == "release" and e["lease"] in opened:
            opened[e["lease"]].end = e["t"]
    return list(opened.values())


def _held(leases: Sequence[_Lease], t: float) -> dict[str, list[int]]:
    """Per tier: leases alive at ``t`` (all replicas) and the tokens they reserved."""
    out: dict[str, list[int]] = {}
    for lease in leases:
        if lease.start <= t < lease.end:
            cell = out.setdefault(lease.tier, [0, 0])
            cell[0] += 1
            cell[1] += lease.cost
    return out


def _p95(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def _view(e: dict[str, Any] | None) -> dict[str, Any]:
    if e is None:
        return {}
    keys = ("limit", "inflight", "reserved", "kv", "top_reserve", "top_inflight", "queue")
    return {k: e.get(k) for k in keys}


def analyse(
    clients: Sequence[ClientRecord],
    events: Sequence[dict[str, Any]],
    deployments: dict[str, str],
    top: str,
    step_seconds: float,
) -> tuple[list[str], list[dict[str, Any]]]:
    """The report lines and one ``top_request`` record per counted top-tier request served. ``deployments``:
    mode -> the deployment its requests went to; ``top``: the top tier's name in the proxies' trace."""
    by_call: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("call"):
            by_call.setdefault(e["call"], []).append(e)
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    for mode, deployment in deployments.items():
        leases = _leases(events, deployment)
        mine = [c for c in clients if c.mode == mode and c.counted and c.status == 200 and c.tier == "high"]
        for c in mine:
            trail = sorted(by_call.get(c.call, []), key=lambda e: e["t"])
            arrive = next((e for e in trail if e["ev"] == "arrive"), None)
            lease = next((e for e in trail if e["ev"] == "lease"), None)
            release = next((e for e in trail if e["ev"] == "release"), None)
            if arrive is None or lease is None or release is None:
                continue
            heads = Counter(
                "admitted" if e["admitted"] else f"{e['signal']}{' (higher waiting)' if e['higher_waiting'] else ''}"
                for e in trail
                if e["ev"] == "head"
            )
            first = "admitted" if arrive["admitted"] else f"{arrive['signal']}:{arrive['reason']}"
            if arrive["admitted"] and lease["how"] == "queue":
                first = "behind_queued"  # admitted, but others of its tier were already waiting
            records.append(
                {
                    "ev": "top_request",
                    "mode": mode,
                    "index": c.index,
                    "tokens": c.tokens,
                    "beyond_decode": (c.ended - c.sent) - c.tokens * step_seconds,
                    "to_hook": arrive["t"] - c.sent,
                    "queue": lease["t"] - arrive["t"],
                    "server": release["t"] - lease["t"],
                    "server_beyond_decode": release["t"] - lease["t"] - c.tokens * step_seconds,
                    "after": c.ended - release["t"],
                    "how": lease["how"],
                    "first": first,
                    "heads": dict(heads),
                    "store_refused": sum(1 for e in trail if e["ev"] == "store_refused"),
                    "at_arrive": {**_view(arrive), "held": _held(leases, arrive["t"])},
                    "at_lease": {**_view(lease), "held": _held(leases, lease["t"])},
                }
            )
        low = [x for x in leases if x.tier != top and math.isfinite(x.end)]
        span = [x for x in leases if math.isfinite(x.end)]
        busy = sum(x.end - x.start for x in span)
        low_tokens = sum((x.end - x.start) * x.cost for x in low)
        all_tokens = sum((x.end - x.start) * x.cost for x in span)
        lines.append(
            f"{mode}: leases {len(span)} ({len(low)} below the top tier, holding "
            f"{sum(x.end - x.start for x in low):.1f} of {busy:.1f} lease-seconds, "
            f"{low_tokens:.0f} of {all_tokens:.0f} token-seconds reserved)"
        )
    for mode in deployments:
        rows = [r for r in records if r["mode"] == mode]
        if not rows:
            lines.append(f"{mode}: no traced top-tier request")
            continue

        def stat(key: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [r[key] for r in rows]
            return f"{statistics.fmean(values):.2f}/{_p95(values):.2f}"

        queued = [r for r in rows if r["queue"] > 0.05]
        lines.append(
            f"{mode}: {len(rows)} top-tier requests; mean/p95 s: beyond decode {stat('beyond_decode')}, to hook "
            f"{stat('to_hook')}, our queue {stat('queue')}, server beyond decode {stat('server_beyond_decode')}, "
            f"after {stat('after')}; waited > 50 ms in our queue: {len(queued)}"
        )
        lines.append(f"  first verdict at the hook: {dict(Counter(r['first'] for r in rows))}")
        heads: Counter[str] = Counter()
        for r in queued:
            heads.update(r["heads"])
        lines.append(f"  queue-head verdicts while they waited (tries): {dict(heads)}")
        if queued:
            at = [r["at_arrive"] for r in queued]
            low_n = statistics.fmean(sum(v[0] for t, v in a["held"].items() if t != top) for a in at)
            low_tok = statistics.fmean(sum(v[1] for t, v in a["held"].items() if t != top) for a in at)
            top_n = statistics.fmean(a["held"].get(top, [0, 0])[0] for a in at)
            top_tok = statistics.fmean(a["held"].get(top, [0, 0])[1] for a in at)
            kv = [a["kv"] for a in at if a["kv"] is not None]
            lines.append(
                f"  at the arrival of those that waited (means): limit {statistics.fmean(a['limit'] for a in at):.1f}, "
                f"top tier {top_n:.1f} leases / {top_tok:.0f} tokens, lower tiers {low_n:.1f} leases / "
                f"{low_tok:.0f} tokens, scraped KV {statistics.fmean(kv) if kv else math.nan:.2f}, our queue "
                f"{statistics.fmean(a['queue'] for a in at):.1f}"
            )
    pairs = {}
    for r in records:
        pairs.setdefault(r["index"], {})[r["mode"]] = r
    both = [p for p in pairs.values() if len(p) == len(deployments)]
    modes = list(deployments)
    if len(modes) == 2 and both:
        a, b = modes
        worse = sorted(both, key=lambda p: p[a]["beyond_decode"] - p[b]["beyond_decode"], reverse=True)
        lines.append(f"same request, {a} against {b}: the 8 with the largest extra time beyond decode")
        for p in worse[:8]:
            x, y = p[a], p[b]
            lines.append(
                f"  #{x['index']}: beyond decode {x['beyond_decode']:.2f}s vs {y['beyond_decode']:.2f}s; queue "
                f"{x['queue']:.2f} vs {y['queue']:.2f}; server {x['server_beyond_decode']:.2f} vs "
                f"{y['server_beyond_decode']:.2f}; first {x['first']} vs {y['first']}; held at arrival "
                f"{x['at_arrive']['held']} vs {y['at_arrive']['held']}; limit {x['at_arrive']['limit']} vs "
                f"{y['at_arrive']['limit']}"
            )
    return lines, records
