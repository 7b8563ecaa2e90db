"""The traffic-contract PR's example flow, step by step: first on the pure ledger with explicit times,
then on both store backends (the store decides the window by its own clock).

Contract: smart-window rpm 2 / tpm 5000 (``ai`` and ``memories`` count as smart-window), ``s2s`` and
``s2s-android`` their own features (rpm 10 / tpm 20000, never the binding limit here), basket rpm 4 /
tpm 10000. Every request estimates 1000 tokens before the call and is reconciled to its actual usage
after it, except the last one of the window, which is still in flight when the window rolls over.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from litellm_ratebalance.contracts.policy import (
    ContractBook,
    ContractLedger,
    Mode,
    resolve_feature,
)
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import MemoryStore, RedisStore

N, B, D = Mode.NORMAL, Mode.BORROWED, Mode.DEGRADED
WINDOW = 60
TTL = 120
T0 = 1789057680  # the PR's bucket: mlpa:traffic_contract:rpm:1789057680

CONTRACTS = parse_settings(
    {
        "ratebalance": {
            "traffic_contracts": {
                "window_seconds": WINDOW,
                "counter_ttl_seconds": TTL,
                "basket": {"rpm": 4, "tpm": 10000},
                "features": {
                    "smart-window": {"rpm": 2, "tpm": 5000, "aliases": ["ai", "memories"]},
                    "s2s": {"rpm": 10, "tpm": 20000},
                    "s2s-android": {"rpm": 10, "tpm": 20000},
                },
            }
        }
    }
).ratebalance.traffic_contracts
BOOK = ContractBook.from_settings(CONTRACTS)


@dataclass(frozen=True)
class Step:
    at: int
    """Seconds after T0."""
    name: str
    """What the request calls its feature (key metadata)."""
    feature: str
    rpm_mode: Mode
    tpm_mode: Mode
    actual: int | None
    """Tokens the call used (reconciled after it); None = still in flight."""
    why: str


ESTIMATE = 1000
STEPS = [
    Step(1, "ai", "smart-window", N, N, 2000, "sw 1/2 req, 1000/5000 tok; basket 1/4"),
    Step(5, "memories", "smart-window", N, N, 2500, "sw 2/2 req, 2000+1000/5000 tok"),
    Step(10, "ai", "smart-window", B, B, 1500, "sw 3 > 2 req and 4500+1000 > 5000 tok; basket has room"),
    Step(20, "s2s", "s2s", N, N, 3000, "basket 4/4 req, 6000+1000/10000 tok"),
    Step(30, "s2s-android", "s2s-android", D, N, 800, "basket 5 > 4 req; 9000+1000 = 10000 tok fits exactly"),
    Step(40, "ai", "smart-window", D, D, None, "basket 6 > 4 req and 9800+1000 > 10000 tok"),
    Step(45, "no-such-feature", "unassigned", D, D, 100, "unassigned has no contract but counts to the basket"),
]


def test_features_resolve_through_aliases() -> None:
    resolved = [resolve_feature(BOOK, key_feature=step.name).feature for step in STEPS]
    assert resolved == [step.feature for step in STEPS]


def test_example_flow_on_the_pure_ledger() -> None:
    ledger = ContractLedger()
    in_flight = None
    for step in STEPS:
        now_ms = (T0 + step.at) * 1000
        admission = ledger.admit(
            now_ms=now_ms,
            window_seconds=WINDOW,
            ttl_seconds=TTL,
            field_name=step.feature,
            limits=BOOK.limits(step.feature),
            estimate_tokens=ESTIMATE,
        )
        assert admission.window_start == T0
        assert (admission.rpm_mode, admission.tpm_mode) == (step.rpm_mode, step.tpm_mode), step.why
        if step.actual is None:
            in_flight = step
        else:
            ledger.settle(
                now_ms=now_ms + 500,
                window_start=T0,
                field_name=step.feature,
                release_tokens=ESTIMATE,
                actual_tokens=step.actual,
            )
    window = ledger.window(now_ms=(T0 + 59) * 1000, window_start=T0)
    assert window is not None
    assert window.requests == {"smart-window": 4, "s2s": 1, "s2s-android": 1, "unassigned": 1, "__basket__": 7}
    assert window.tokens["__basket__"] == 2000 + 2500 + 1500 + 3000 + 800 + 100
    assert window.in_flight["__basket__"] == ESTIMATE  # step 6 has not reported back yet

    # The next minute writes to a new window: every counter starts from zero.
    rolled = ledger.admit(
        now_ms=(T0 + 61) * 1000,
        window_seconds=WINDOW,
        ttl_seconds=TTL,
        field_name="smart-window",
        limits=BOOK.limits("smart-window"),
        estimate_tokens=ESTIMATE,
    )
    assert rolled.window_start == T0 + 60
    assert (rolled.rpm_mode, rolled.tpm_mode) == (N, N)
    assert (rolled.feature_requests, rolled.basket_requests, rolled.basket_tokens) == (1, 1, ESTIMATE)

    # The request still in flight reports back late: its usage lands in the window it was counted in.
    assert in_flight is not None
    late = ledger.settle(
        now_ms=(T0 + 62) * 1000,
        window_start=T0,
        field_name=in_flight.feature,
        release_tokens=ESTIMATE,
        actual_tokens=700,
    )
    assert late.applied and late.basket_tokens == 2000 + 2500 + 1500 + 3000 + 800 + 100 + 700
    assert ledger.window(now_ms=(T0 + 62) * 1000, window_start=T0 + 60).tokens == {}  # type: ignore[union-attr]

    # The old window stays readable until start + ttl, then its counters are gone.
    assert ledger.window(now_ms=(T0 + TTL - 1) * 1000, window_start=T0) is not None
    assert ledger.window(now_ms=(T0 + TTL) * 1000, window_start=T0) is None
    gone = ledger.settle(now_ms=(T0 + TTL) * 1000, window_start=T0, field_name="s2s", release_tokens=0, actual_tokens=5)
    assert not gone.applied


def test_window_keys_follow_the_pr_layout() -> None:
    from litellm_ratebalance.store import KeySpace

    keys = KeySpace("mlpa")
    assert keys.contract_window("rpm", T0) == "mlpa:traffic_contract:rpm:{1789057680}"
    assert keys.contract_window("tpm", T0 + 60) == "mlpa:traffic_contract:tpm:{1789057740}"


@pytest.mark.redis
async def test_example_flow_on_the_store(store: MemoryStore | RedisStore) -> None:
    # The store's clock picks the window, so use 2 s windows and start early in one.
    window, ttl = 2, 4
    left = window - (time.time() % window)
    if left < 1.5:
        await asyncio.sleep(left + 0.05)
    starts = set()
    for step in STEPS:
        admission = await store.contract_admit(
            step.feature, BOOK.limits(step.feature), ESTIMATE, window_seconds=window, ttl_seconds=ttl
        )
        starts.add(admission.window_start)
        assert (admission.rpm_mode, admission.tpm_mode) == (step.rpm_mode, step.tpm_mode), step.why
        if step.actual is not None:
            settled = await store.contract_settle(step.feature, admission.window_start, ESTIMATE, step.actual)
            assert settled.applied
    assert len(starts) == 1
    (start,) = starts
    counters = await store.contract_window(window, start)
    assert counters is not None
    assert counters.requests == {"smart-window": 4, "s2s": 1, "s2s-android": 1, "unassigned": 1, "__basket__": 7}
    assert counters.tokens["__basket__"] == 9900 and counters.in_flight["__basket__"] == ESTIMATE

    await asyncio.sleep(max(0.0, start + window - time.time()) + 0.05)
    rolled = await store.contract_admit(
        "smart-window", BOOK.limits("smart-window"), ESTIMATE, window_seconds=window, ttl_seconds=ttl
    )
    assert rolled.window_start >= start + window
    assert (rolled.rpm_mode, rolled.tpm_mode, rolled.basket_requests) == (N, N, 1)
    late = await store.contract_settle("smart-window", start, ESTIMATE, 700)
    assert late.applied and late.basket_tokens == 9900 + 700
