"""Prometheus metrics of the package, on the default registry that LiteLLM's ``/metrics`` serves.

Every metric name starts with ``litellm_ratebalance_``. Metrics are created on first use and shared by
every instance in the process (creating one twice returns the first), so importing a callback twice, or
a test creating many limiters, never raises "Duplicated timeseries".

Label values come from configuration (model groups, configured priorities, features, deployment ids) or
from small fixed sets (reasons, modes); never from raw client input, so cardinality stays bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

__all__ = ["counter", "gauge", "histogram", "hook_latency"]

_lock = threading.Lock()
_metrics: dict[str, Any] = {}

HOOK_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _get_or_create(kind: type[Any], name: str, documentation: str, labels: Sequence[str], **kwargs: Any) -> Any:
    full = f"litellm_ratebalance_{name}"
    with _lock:
        existing = _metrics.get(full)
        if existing is not None:
            return existing
        try:
            metric = kind(full, documentation, list(labels), registry=REGISTRY, **kwargs)
        except ValueError:
            # Registered by another copy of this module (e.g. a re-imported config file module).
            metric = REGISTRY._names_to_collectors[full if kind is not Counter else full + "_total"]
        _metrics[full] = metric
        return metric


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    """A counter named ``litellm_ratebalance_<name>`` (Prometheus appends ``_total``)."""
    return _get_or_create(Counter, name, documentation, labels)  # type: ignore[no-any-return]


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
    return _get_or_create(Gauge, name, documentation, labels)  # type: ignore[no-any-return]


def histogram(
    name: str, documentation: str, labels: Sequence[str] = (), buckets: Sequence[float] = HOOK_LATENCY_BUCKETS
) -> Histogram:
    return _get_or_create(Histogram, name, documentation, labels, buckets=tuple(buckets))  # type: ignore[no-any-return]


def hook_latency() -> Histogram:
    """``hook_latency_seconds{component,hook}``: the time every part's hooks take, one family for all."""
    return histogram("hook_latency_seconds", "Time spent in our hooks", ["component", "hook"])
