"""Backpressure's Prometheus series (on the proxy's ``/metrics``; names get the package prefix there).

Gauges per deployment (limit, in flight, queue depth, utilisation per signal, learned output), counters of
refusals and drops, the queue-wait histogram (the hook-latency histogram all parts share is
:func:`litellm_ratebalance.metrics.hook_latency`). Each function looks its family up in
:mod:`litellm_ratebalance.metrics` (created once, on first use).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from litellm_ratebalance import metrics

__all__ = [
    "count_drop",
    "count_overflow",
    "count_preemptions",
    "count_refusal",
    "observe_queue_wait",
    "set_gauges",
    "set_signal_health",
]

_QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def set_gauges(
    deployment_id: str,
    *,
    limit: int,
    inflight: int,
    queue_depth: int,
    signals: Mapping[str, float] | None = None,
    output_estimate: float | None = None,
    prompt_scale: float | None = None,
) -> None:
    """The deployment's gauges; ``signals`` / ``output_estimate`` / ``prompt_scale`` only when given (the
    maintenance step)."""
    metrics.gauge("backpressure_concurrency_limit", "Adaptive concurrency limit per deployment", ["deployment"]).labels(
        deployment_id
    ).set(limit)
    metrics.gauge("backpressure_inflight", "Requests in flight per deployment (all replicas)", ["deployment"]).labels(
        deployment_id
    ).set(inflight)
    metrics.gauge("backpressure_queue_depth", "Requests waiting in this process's queue", ["deployment"]).labels(
        deployment_id
    ).set(queue_depth)
    if signals is not None:
        gauge = metrics.gauge(
            "backpressure_utilization", "Backpressure signals per deployment (1.0 = full)", ["deployment", "signal"]
        )
        for name, value in signals.items():
            gauge.labels(deployment_id, name).set(value)
    if output_estimate is not None:
        metrics.gauge(
            "backpressure_output_estimate_tokens",
            "Learned output tokens a request reserves in the deployment's KV cache (at most its max_tokens)",
            ["deployment"],
        ).labels(deployment_id).set(output_estimate)
    if prompt_scale is not None:
        metrics.gauge(
            "backpressure_prompt_scale",
            "Server prompt tokens per prompt token LiteLLM counts, learned per deployment (reservations scale by it)",
            ["deployment"],
        ).labels(deployment_id).set(prompt_scale)


def set_signal_health(
    deployment_id: str,
    *,
    server: str | None,
    servers: Sequence[str],
    problems: Collection[str],
    known_problems: Sequence[str],
    kv_capacity_tokens: int | None,
) -> None:
    """What the deployment's signals are worth: 1 for the server answering and each problem that holds, 0 for
    the others (every known value is set, so a cleared problem reads 0), and its KV-cache capacity in use."""
    kinds = metrics.gauge(
        "backpressure_server",
        "Server answering the deployment's metrics endpoint (1 for the one recognised)",
        ["deployment", "server"],
    )
    for name in servers:
        kinds.labels(deployment_id, name).set(1 if name == server else 0)
    gauge = metrics.gauge(
        "backpressure_signal_problem",
        "Problems of a deployment's server signals (1 while it holds): unreachable, unrecognised, server_mismatch, "
        "no_kv_usage, no_kv_capacity, no_queue, out_of_range",
        ["deployment", "problem"],
    )
    for name in known_problems:
        gauge.labels(deployment_id, name).set(1 if name in problems else 0)
    if kv_capacity_tokens is not None:
        metrics.gauge(
            "backpressure_kv_capacity_tokens",
            "KV-cache capacity of the deployment in tokens (kv_cache_tokens, else what its server exports)",
            ["deployment"],
        ).labels(deployment_id).set(kv_capacity_tokens)


def count_overflow(deployment_id: str) -> None:
    metrics.counter(
        "backpressure_server_overflows",
        "Requests the inference server failed for want of GPU / KV-cache memory (an overflow backpressure did "
        "not prevent)",
        ["deployment"],
    ).labels(deployment_id).inc()


def count_preemptions(deployment_id: str, count: float) -> None:
    metrics.counter(
        "backpressure_server_preemptions",
        "Requests the inference server preempted (vLLM) or retracted (SGLang) for want of KV cache",
        ["deployment"],
    ).labels(deployment_id).inc(count)


def count_refusal(model_group: str, tier: str, reason: str) -> None:
    metrics.counter(
        "backpressure_refusals",
        "Requests refused by backpressure, by model group, priority tier and reason",
        ["model_group", "tier", "reason"],
    ).labels(model_group, tier, reason).inc()


def count_drop(deployment_id: str) -> None:
    metrics.counter(
        "backpressure_drops", "Requests that failed on the server side (limit backs off)", ["deployment"]
    ).labels(deployment_id).inc()


def observe_queue_wait(deployment_id: str, seconds: float) -> None:
    metrics.histogram(
        "backpressure_queue_wait_seconds",
        "Time requests waited in a deployment's backpressure queue",
        ["deployment"],
        buckets=_QUEUE_WAIT_BUCKETS,
    ).labels(deployment_id).observe(seconds)
