"""Every callback of ours, listed alone, refuses an invalid setting at start-up: the real ``litellm`` proxy
exits with status 78 before serving, and its output names the key path and what is valid.

One row per callback of ``litellm_settings.callbacks``, each with a value out of range and a misspelt key in
its own section (both must be reported: the check lists every problem at once, so each is refused on its
own too). Two more rows: a setting of *another* component than the one listed (the whole settings tree is
checked, whichever of our callbacks is configured), and a bad ``model_info.backpressure`` block with the
backpressure callback alone. A proxy that goes live and keeps serving fails the row within seconds, not at
the wait's timeout.

The limiter-alone and balancer ``model_info`` rows with a single bad value are in
tests/e2e/test_bad_requests_e2e.py; the message of every setting is checked in tests/unit/test_bad_config.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from litellm_ratebalance.proxy.runtime import EXIT_CONFIG
from tests.e2e.harness import LiteLLMProxy, litellm_binary, mock_deployment

pytestmark = pytest.mark.e2e

EXIT_TIMEOUT_S = 120.0
"""Upper bound on a refusing proxy's start-up (an import of litellm[proxy] on 2 busy cores takes seconds)."""
SERVING_GRACE_S = 5.0
"""How long a proxy may stay live before the row fails: the check runs as soon as the Router exists, which
is before uvicorn serves, so a proxy that answers its liveness probe for this long has accepted its config."""


@dataclass(frozen=True)
class Row:
    callback: str
    """The one entry of ``litellm_settings.callbacks``."""
    ratebalance: dict[str, Any]
    """``litellm_settings.ratebalance``."""
    expected: tuple[str, ...]
    """Lines (or their beginnings) the refusal must contain."""
    header: str = "litellm_ratebalance: refusing to start, invalid configuration:"
    model_info: dict[str, Any] | None = None
    """Extra ``model_info`` keys of the one deployment (id ``gpu1``, model_name ``m``)."""


BAD = "litellm_settings.ratebalance"
UNKNOWN = "unknown setting; valid keys here:"

ROWS: dict[str, Row] = {
    "rate_limiter": Row(
        "litellm_ratebalance.rate_limiter",
        {"limiter": {"window_seconds": 0, "window_secs": 60}},
        (f"{BAD}.limiter.window_seconds: must be between 1 and 3600 (got 0)", f"{BAD}.limiter.window_secs: {UNKNOWN}"),
    ),
    "rate_balancer": Row(
        "litellm_ratebalance.rate_balancer",
        {"routing": {"greediness": 1.5, "greedyness": 0.5}},
        (f"{BAD}.routing.greediness: must be between 0.0 and 1.0 (got 1.5)", f"{BAD}.routing.greedyness: {UNKNOWN}"),
    ),
    "traffic_contracts": Row(
        "litellm_ratebalance.traffic_contracts",
        {"traffic_contracts": {"window_seconds": -5, "windw_seconds": 60}},
        (
            f"{BAD}.traffic_contracts.window_seconds: must be between 1 and 3600 (got -5)",
            f"{BAD}.traffic_contracts.windw_seconds: {UNKNOWN}",
        ),
    ),
    "backpressure": Row(
        "litellm_ratebalance.backpressure",
        {"backpressure": {"shed_threshold": 1.5, "shed_treshold": 0.5}},
        (
            f"{BAD}.backpressure.shed_threshold: must be between 0.0 and 1.0 (got 1.5)",
            f"{BAD}.backpressure.shed_treshold: {UNKNOWN}",
        ),
    ),
    "cost": Row(
        "litellm_ratebalance.cost",
        {"cost": {"gpus": 0, "gpu_hour_price": 2.5}},
        (
            f"{BAD}.cost.gpus: must be more than 0.0 and at most 100000.0 (got 0)",
            f"{BAD}.cost.gpu_hour_price: {UNKNOWN}",
        ),
    ),
    "traffic_contracts-with-a-bad-backpressure-setting": Row(
        "litellm_ratebalance.traffic_contracts",
        {"backpressure": {"hard_threshold": 2}},
        (f"{BAD}.backpressure.hard_threshold: must be between 0.0 and 1.0 (got 2)",),
    ),
    "backpressure-with-a-bad-model_info-block": Row(
        "litellm_ratebalance.backpressure",
        {},
        (
            "deployment gpu1 (model_name m): model_info.backpressure.max_limt: unknown setting; valid keys here:",
            "deployment gpu1 (model_name m): model_info.backpressure.queue_max_depth: must be between 1 and 100000 "
            "(got 0)",
        ),
        header="litellm_ratebalance: refusing to start, invalid model_info:",
        model_info={"backpressure": {"max_limt": 3, "queue_max_depth": 0}},
    ),
}


def _config(row: Row) -> dict[str, Any]:
    deployment = mock_deployment("m", model_id="gpu1")
    deployment["model_info"].update(row.model_info or {})
    return {
        "model_list": [deployment],
        "litellm_settings": {"callbacks": [row.callback], "ratebalance": row.ratebalance},
    }


def _exit_status(proxy: LiteLLMProxy) -> int | None:
    """Launch ``proxy`` and wait for it to exit: its status, or ``None`` if it went live and kept serving."""
    proxy.launch()
    process = proxy._process
    assert process is not None
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    live_since: float | None = None
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            status = process.poll()
            if status is not None:
                return status
            if live_since is None:
                try:
                    if client.get(proxy.url("/health/liveliness")).status_code == 200:
                        live_since = time.monotonic()
                except httpx.HTTPError:
                    pass
            elif time.monotonic() - live_since > SERVING_GRACE_S:
                return None
            time.sleep(0.1)
    raise AssertionError(f"{proxy.name} neither exited nor went live in {EXIT_TIMEOUT_S:.0f}s:\n{proxy.log_tail()}")


@pytest.mark.parametrize("name", list(ROWS))
def test_an_invalid_setting_stops_the_proxy_whichever_callback_is_listed(name: str) -> None:
    if litellm_binary() is None:
        pytest.skip("the litellm proxy executable is not installed (pip install 'litellm[proxy]')")
    row = ROWS[name]
    proxy = LiteLLMProxy(_config(row), name=f"startup-{name}"[:40])
    try:
        status = _exit_status(proxy)
        log = proxy.log_text()
    finally:
        proxy.cleanup()
    assert status is not None, f"the proxy accepted the invalid config and served:\n{log[-3000:]}"
    assert status == EXIT_CONFIG == 78, log[-3000:]
    refusal = log.split(row.header, 1)
    assert len(refusal) == 2, f"no {row.header!r} in the output:\n{log[-3000:]}"
    lines = [line.strip() for line in refusal[1].splitlines()]
    for expected in row.expected:
        assert any(line.startswith(expected) for line in lines), f"{expected!r} not in:\n{refusal[1][:3000]}"
