"""The demo's figures: a summary built from the client's records, the deployments' own logs and the
proxies' ``/metrics``; printed as tables, written as JSON and drawn as a PNG.

Metric names read here (all on LiteLLM's ``/metrics``, summed over replicas):
``litellm_ratebalance_admission_decisions_total{model_group,priority,result,reason}``,
``litellm_ratebalance_traffic_contract_requests_total{feature,model_group,rpm_mode,tpm_mode}``,
``litellm_ratebalance_backpressure_refusals_total{model_group,tier,reason}``,
``litellm_ratebalance_store_errors_total{component,mode}``,
``litellm_ratebalance_routing_choices_total{model_group,deployment}``, the gauges
``litellm_ratebalance_routing_weight`` / ``..._routing_estimated_rate{model_group,deployment}`` (per replica:
each replica's own view, they should agree) and, sampled during the run,
``litellm_ratebalance_backpressure_concurrency_limit{deployment}``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from litellm_ratebalance.demo.config import CHAT_DEPLOYMENTS, CHAT_GROUP, LOCAL_DEPLOYMENT, LOCAL_GROUP, QUOTA_GROUP
from litellm_ratebalance.demo.load import Record
from litellm_ratebalance.simulate.mock_openai import ServedRequest

__all__ = ["MetricSample", "Samples", "build_summary", "parse_metrics", "plot_run", "print_summary"]

PREFIX = "litellm_ratebalance_"
OUTCOMES = ("ok", "limited", "shed", "failed")


@dataclass(frozen=True)
class MetricSample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class Samples:
    """Gauges sampled from replica 1's ``/metrics`` during the run (seconds since the run started)."""

    times: list[float]
    concurrency_limit: list[float]
    inflight: list[float]


def parse_metrics(text: str) -> list[MetricSample]:
    """Our samples (``litellm_ratebalance_*``) of one Prometheus text exposition."""
    found: list[MetricSample] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX) and not sample.name.endswith("_created"):
                found.append(MetricSample(sample.name, dict(sample.labels), float(sample.value)))
    return found


def _sum_by(samples: Iterable[MetricSample], name: str, labels: Sequence[str]) -> dict[tuple[str, ...], float]:
    totals: dict[tuple[str, ...], float] = defaultdict(float)
    for sample in samples:
        if sample.name == PREFIX + name:
            totals[tuple(sample.labels.get(label, "") for label in labels)] += sample.value
    return dict(totals)


def _rows_by_priority(records: Iterable[Record], group: str) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for record in records:
        if record.group != group:
            continue
        row = rows.setdefault(record.caller, {"sent": 0, **dict.fromkeys(OUTCOMES, 0)})
        row["sent"] += 1
        row[record.outcome] += 1
    for row in rows.values():
        # Admitted: past our admission layers (the limiter, backpressure), whatever the deployment did then.
        row["admitted"] = row["sent"] - row["limited"] - row["shed"]
    return dict(sorted(rows.items()))


def _deployments(
    records: Sequence[Record], served: Sequence[ServedRequest], duration: float
) -> dict[str, dict[str, Any]]:
    """Per deployment: requests it received (its own log for the mocks: LiteLLM's retries included; the
    client's successes for the inference server), share within its model group, outcomes and rates."""
    table: dict[str, dict[str, Any]] = {}
    chat = [r for r in served if r.deployment in CHAT_DEPLOYMENTS]
    for name in CHAT_DEPLOYMENTS:
        mine = [r for r in chat if r.deployment == name]
        ok = [r for r in mine if r.outcome == "ok"]
        decode = [r.completion_tokens / (r.finished - r.arrival) for r in ok if r.finished > r.arrival]
        table[name] = {
            "group": CHAT_GROUP,
            "requests": len(mine),
            "share": len(mine) / len(chat) if chat else 0.0,
            "ok": len(ok),
            "errors": Counter(r.outcome for r in mine if r.outcome != "ok"),
            "requests_per_s": len(mine) / duration,
            "output_tokens_per_s": sum(r.completion_tokens for r in ok) / duration,
            "mean_request_tokens_per_s": sum(decode) / len(decode) if decode else 0.0,
        }
    local = [r for r in records if r.group == LOCAL_GROUP]
    local_ok = [r for r in local if r.outcome == "ok"]
    reached = [r for r in local if r.outcome in ("ok", "failed")]
    decode = [r.completion_tokens / r.latency for r in local_ok if r.latency > 0]
    table[LOCAL_DEPLOYMENT] = {
        "group": LOCAL_GROUP,
        "requests": len(reached),
        "share": 1.0 if reached else 0.0,
        "ok": len(local_ok),
        "errors": Counter(str(r.status) for r in local if r.outcome == "failed"),
        "requests_per_s": len(reached) / duration,
        "output_tokens_per_s": sum(r.completion_tokens for r in local_ok) / duration,
        "mean_request_tokens_per_s": sum(decode) / len(decode) if decode else 0.0,
    }
    for row in table.values():
        row["errors"] = dict(sorted(row["errors"].items()))
    return table


def build_summary(
    *,
    records: Sequence[Record],
    served: Sequence[ServedRequest],
    server_stats: Mapping[str, Any],
    metrics: Sequence[Sequence[MetricSample]],
    check: Sequence[Record],
    quota_rpm: int,
    duration: float,
    replicas: int,
    window_seconds: int,
) -> dict[str, Any]:
    """Everything the demo reports, as plain data (also written as JSON; the e2e test reads it)."""
    everything = [sample for replica in metrics for sample in replica]
    decisions = _sum_by(everything, "admission_decisions_total", ("model_group", "priority", "result"))
    contract_modes = _sum_by(everything, "traffic_contract_requests_total", ("feature", "rpm_mode", "tpm_mode"))
    refusals = _sum_by(everything, "backpressure_refusals_total", ("tier", "reason"))
    store_errors = _sum_by(everything, "store_errors_total", ("component", "mode"))
    choices = _sum_by(everything, "routing_choices_total", ("model_group", "deployment"))
    deployments = _deployments(records, served, duration)
    for name, row in deployments.items():
        row["balancer_choices"] = int(choices.get((row["group"], name), 0))
        # Gauges are per replica (not summed): each replica's weight and estimate for the deployment.
        for key, metric in (("weight", "routing_weight"), ("estimated_rate", "routing_estimated_rate")):
            row[key] = [
                round(value, 3)
                for replica in metrics
                for (group, deployment), value in _sum_by(replica, metric, ("model_group", "deployment")).items()
                if group == row["group"] and deployment == name
            ]
    modes: dict[str, dict[str, dict[str, int]]] = {}
    for (feature, rpm_mode, tpm_mode), count in sorted(contract_modes.items()):
        entry = modes.setdefault(feature, {"rpm": {}, "tpm": {}})
        entry["rpm"][rpm_mode] = entry["rpm"].get(rpm_mode, 0) + int(count)
        entry["tpm"][tpm_mode] = entry["tpm"].get(tpm_mode, 0) + int(count)
    client_shed = Counter(f"{r.caller}:{r.reason}" for r in records if r.outcome == "shed")
    per_replica = Counter(r.replica for r in check if r.outcome != "limited")
    check_metrics = {
        result: int(sum(v for (model, _, res), v in decisions.items() if model == QUOTA_GROUP and res == result))
        for result in ("admitted", "rejected")
    }
    return {
        "duration_s": duration,
        "replicas": replicas,
        "window_seconds": window_seconds,
        "sent": len(records),
        "priorities": {group: _rows_by_priority(records, group) for group in (CHAT_GROUP, LOCAL_GROUP)},
        "limiter_metrics": {
            f"{priority}:{result}": int(count)
            for (model, priority, result), count in sorted(decisions.items())
            if model == CHAT_GROUP
        },
        "deployments": deployments,
        "inference_server": dict(server_stats),
        "contract_modes": modes,
        "shed_client": dict(sorted(client_shed.items())),
        "shed_metrics": {f"{tier}:{reason}": int(count) for (tier, reason), count in sorted(refusals.items())},
        "store_errors": {f"{component}:{mode}": int(count) for (component, mode), count in store_errors.items()},
        "limit_check": {
            "group": QUOTA_GROUP,
            "limit": quota_rpm,
            "sent": len(check),
            "admitted": sum(1 for r in check if r.outcome != "limited"),
            "refused": sum(1 for r in check if r.outcome == "limited"),
            "admitted_per_replica": [per_replica.get(i, 0) for i in range(replicas)],
            "metrics": check_metrics,
        },
    }


def print_summary(summary: Mapping[str, Any]) -> None:
    replicas = summary["replicas"]
    window = summary["window_seconds"]
    where = "one proxy, embedded store" if replicas == 1 else f"{replicas} proxy replicas sharing one redis-server"
    print(f"\n=== litellm-ratebalance demo: {summary['duration_s']:.0f}s of mixed load, {where} ===")
    print(f"\nPriority admission, model group '{CHAT_GROUP}' (rpm per {window}s window: 3 deployments x 20 = 60)")
    print("and backpressure, model group 'local' (one simulated vLLM server)")
    header = (
        f"{'group':<7}{'priority':<10}{'sent':>6}{'admitted':>10}{'429 limit':>11}{'shed':>6}{'200':>6}{'failed':>8}"
    )
    print(header)
    for group, rows in summary["priorities"].items():
        for priority, row in rows.items():
            print(
                f"{group:<7}{priority:<10}{row['sent']:>6}{row['admitted']:>10}{row['limited']:>11}"
                f"{row['shed']:>6}{row['ok']:>6}{row['failed']:>8}"
            )
    limiter = summary["limiter_metrics"]
    if limiter:
        print("  limiter on /metrics (chat):", ", ".join(f"{key} {value}" for key, value in limiter.items()))
    print("  (failed = the deployment's own error or 429 after LiteLLM's retry)")

    print("\nDeployments (share of the requests each received within its group; measured rates; the balancer's view)")
    print(
        f"{'deployment':<12}{'requests':>9}{'share':>7}{'200':>6}{'req/s':>7}{'out tok/s':>10}{'tok/s/req':>10}"
        f"{'picks':>7}  {'weight':<14}errors"
    )
    for name, row in summary["deployments"].items():
        errors = ", ".join(f"{kind} {count}" for kind, count in row["errors"].items()) or "-"
        weights = "/".join(f"{w:.2f}" for w in row.get("weight", [])) or "-"
        print(
            f"{name:<12}{row['requests']:>9}{row['share']:>7.0%}{row['ok']:>6}{row['requests_per_s']:>7.2f}"
            f"{row['output_tokens_per_s']:>10.1f}{row['mean_request_tokens_per_s']:>10.1f}"
            f"{row.get('balancer_choices', 0):>7}  {weights:<14}{errors}"
        )
    print("  picks: the rate balancer's choices (/metrics, retries included); weight: its current choice")
    print("  probability, per replica (replicas share their statistics through the store)")
    stats = summary["inference_server"]
    if stats:
        print(
            f"  simulated server: {stats.get('completed', 0)} completed, {stats.get('oom_failures', 0)} OOM "
            f"failures, peak {stats.get('peak_running', 0)} running, peak KV cache {stats.get('peak_memory_tokens', 0)}"
        )

    print(f"\nTraffic contracts (requests per mode, from /metrics; {window}s windows)")
    print(f"{'feature':<20}{'RPM normal/borrowed/degraded':>30}{'TPM normal/borrowed/degraded':>30}")
    unknown = 0
    for feature, kinds in summary["contract_modes"].items():
        cells = [
            "/".join(str(kinds[kind].get(mode, 0)) for mode in ("normal", "borrowed", "degraded"))
            for kind in ("rpm", "tpm")
        ]
        unknown += kinds["rpm"].get("unknown", 0)
        print(f"{feature:<20}{cells[0]:>30}{cells[1]:>30}")
    if unknown:
        print(f"  {unknown} requests with mode 'unknown' (the store failed; served per fail_open)")

    print("\nBackpressure shed (refusals by tier and reason)")
    print("  /metrics:", ", ".join(f"{k} {v}" for k, v in summary["shed_metrics"].items()) or "none")
    print("  clients: ", ", ".join(f"{k} {v}" for k, v in summary["shed_client"].items()) or "none")
    if summary["store_errors"]:
        print("  store errors:", summary["store_errors"])

    check = summary["limit_check"]
    held = "yes" if check["admitted"] == check["limit"] else "NO"
    split = " + ".join(str(n) for n in check["admitted_per_replica"])
    print(
        f"\nGlobal limit check: {check['sent']} concurrent requests to '{check['group']}' (rpm {check['limit']} per "
        f"window) over {replicas} replica(s): {check['admitted']} admitted ({split} by replica), "
        f"{check['refused']} refused with 429; /metrics: {check['metrics']['admitted']} admitted. "
        f"Limit held exactly: {held}"
    )


def plot_run(
    records: Sequence[Record], served: Sequence[ServedRequest], samples: Samples, path: Path, duration: float
) -> None:
    """Three panels over the run: the chat deployments' share of requests, admitted/refused per priority,
    and the local server's requests served/shed with backpressure's concurrency limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 2.0
    bins = max(1, math.ceil(duration / width))
    centres = [(i + 0.5) * width for i in range(bins)]

    def counts(times: Iterable[float]) -> list[int]:
        histogram = [0] * bins
        for t in times:
            index = int(t // width)
            if 0 <= index < bins:
                histogram[index] += 1
        return histogram

    def legend(axis: Any) -> None:
        axis.legend(loc="upper left", bbox_to_anchor=(1.07, 1.0), fontsize="small", frameon=False)

    figure, (top, middle, bottom) = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    chat = [r for r in served if r.deployment in CHAT_DEPLOYMENTS]
    totals = counts(r.arrival for r in chat)
    for name in CHAT_DEPLOYMENTS:
        mine = counts(r.arrival for r in chat if r.deployment == name)
        shares = [m / t if t else math.nan for m, t in zip(mine, totals, strict=True)]
        top.plot(centres, shares, label=name, marker=".")
    top.set_ylabel("share of chat requests")
    top.set_ylim(0, 1)
    top.set_title("Rate-balanced routing: each chat deployment's share (chat-flaky: 30% errors, 429s mid-run)")
    legend(top)

    colours = {"prod": "tab:green", "batch": "tab:orange", "default": "tab:blue"}
    for caller, colour in colours.items():
        asked = [r for r in records if r.group == CHAT_GROUP and r.caller == caller]
        admitted = counts(r.sent for r in asked if r.outcome != "limited")
        refused = counts(r.sent for r in asked if r.outcome == "limited")
        middle.plot(centres, admitted, color=colour, label=f"{caller} admitted")
        middle.plot(centres, refused, color=colour, linestyle="--", label=f"{caller} 429")
    middle.set_ylabel(f"chat requests per {width:.0f}s")
    middle.set_title("Priority admission: admitted (solid) and refused with 429 (dashed) per priority")
    legend(middle)

    for caller, colour in colours.items():
        local = [r for r in records if r.group == LOCAL_GROUP and r.caller == caller]
        served_ok = counts(r.sent for r in local if r.outcome == "ok")
        bottom.plot(centres, served_ok, color=colour, label=f"{caller} served")
        shed = counts(r.sent for r in local if r.outcome == "shed")
        bottom.plot(centres, shed, color=colour, linestyle="--", label=f"{caller} shed")
    bottom.set_ylabel(f"local requests per {width:.0f}s")
    bottom.set_xlabel("seconds since the load started")
    bottom.set_title("Backpressure: served (solid) and shed (dashed) per tier; adaptive concurrency limit (black)")
    legend(bottom)
    if samples.times:
        limit_axis = bottom.twinx()
        limit_axis.step(samples.times, samples.concurrency_limit, where="post", color="black", linewidth=1)
        limit_axis.set_ylim(0, max(samples.concurrency_limit) * 1.3)
        limit_axis.set_ylabel("concurrency limit (slots)")
    bottom.set_xlim(0, duration)

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
