"""The store's health as every adapter reports it: faults by cause, late replies, call durations, loop lag.

A store call can fail because Redis is slow or gone, or because this process was too busy to read a reply in
time; these series tell the two apart (see docs/redis.md, "Timeouts, the breaker and a busy proxy").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from litellm_ratebalance import metrics
from litellm_ratebalance.errors import StoreFault

__all__ = ["late_replies", "observe_loop_lag", "store_call_observer", "store_errors"]

STORE_CALL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def store_errors() -> Counter:
    """Store operations that failed, by component, fail mode and cause (a :class:`StoreFault` value:
    ``timeout``, ``connection``, ``pool``, ``busy``, ``breaker``, ``error``)."""
    return metrics.counter(
        "store_errors",
        "Store (Redis) operations that failed, by component, fail mode and cause",
        ["component", "mode", "cause"],
    )


def late_replies() -> Counter:
    """Store calls that timed out, by what came of them later: ``answered`` (Redis ran them; what they changed
    was reconciled) or ``lost`` (no answer within the late wait; the damage is bounded per part)."""
    return metrics.counter(
        "store_late_replies",
        "Timed-out store calls by their late outcome (answered and reconciled, or lost)",
        ["component", "outcome"],
    )


def store_call_observer() -> Callable[[StoreFault | None, float], None]:
    """An observer for the store's script runner: each call's duration (reply read included, so a busy event
    loop shows here too) by outcome, ``ok`` or the fault's cause."""
    calls = metrics.histogram(
        "store_call_seconds",
        "Duration of store (Redis) calls as this process saw them, by outcome (ok or the fault's cause)",
        ["outcome"],
        buckets=STORE_CALL_BUCKETS,
    )
    ok = calls.labels("ok")

    def observe(fault: StoreFault | None, seconds: float) -> None:
        (ok if fault is None else calls.labels(fault.value)).observe(seconds)

    return observe


def observe_loop_lag(read_max_lag: Callable[[], float]) -> None:
    """Serve ``event_loop_lag_seconds``: the longest stall of the proxy's event loop since the last scrape (a
    stall is time during which no reply, Redis's or a client's, could be read), from ``read_max_lag``, which
    resets its maximum when read."""
    lag: Any = metrics.gauge(
        "event_loop_lag_seconds",
        "Longest stall of the proxy's event loop since the last scrape (time no reply could be read)",
    )
    lag.set_function(read_max_lag)
