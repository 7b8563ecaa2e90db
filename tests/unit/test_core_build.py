"""Which build of the routing core runs: the sources or the optional mypyc-compiled modules."""

from __future__ import annotations

import logging
import os

import pytest
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy.routing import RateBalancerCallback
from litellm_ratebalance.proxy.routing import callback as proxy_routing
from litellm_ratebalance.routing import CORE_MODULES, core_build

EXPECT_CORE = "LITELLM_RATEBALANCE_EXPECT_CORE"
"""Set by ``make test-compiled`` to ``compiled``: the suite must then run on the compiled modules."""


@pytest.mark.parametrize(
    ("suffix", "odd_one", "expected"),
    [
        (".py", None, "python"),
        (".cpython-311-x86_64-linux-gnu.so", None, "compiled"),
        (".cp311-win_amd64.pyd", None, "compiled"),
        # one module not compiled is not the compiled core (a stale build beside an edited source)
        (".cpython-311-x86_64-linux-gnu.so", "balancer", "python"),
        (".cpython-311-x86_64-linux-gnu.so", "records", "python"),
    ],
)
def test_core_build_reads_where_every_core_module_came_from(
    monkeypatch: pytest.MonkeyPatch, suffix: str, odd_one: str | None, expected: str
) -> None:
    for module in CORE_MODULES:
        name = module.__name__.rpartition(".")[2]
        monkeypatch.setattr(module, "__file__", f"/x/routing/{name}{'.py' if name == odd_one else suffix}")
    assert core_build() == expected


def test_the_suite_runs_the_build_it_was_started_for() -> None:
    # `make test` runs the sources; `make test-compiled` sets the variable and must run the compiled modules.
    assert core_build() == os.environ.get(EXPECT_CORE, "python")


def test_the_proxy_callback_reports_its_build_on_metrics_and_in_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(proxy_routing, "_core_announced", [])  # as in a fresh process: not announced yet
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance"):
        RateBalancerCallback()
        RateBalancerCallback()  # a second instance (the config read twice) says it once
    build = core_build()
    assert REGISTRY.get_sample_value("litellm_ratebalance_routing_core", {"build": build}) == 1.0
    other = "python" if build == "compiled" else "compiled"
    assert REGISTRY.get_sample_value("litellm_ratebalance_routing_core", {"build": other}) is None
    said = "compiled (mypyc)" if build == "compiled" else "pure Python"
    assert caplog.text.count(f"litellm_ratebalance routing core: {said}") == 1


def test_the_sdk_strategy_reports_its_build_when_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import litellm
    from litellm.router import Router

    from litellm_ratebalance.proxy.routing import RateBalancedRouting
    from litellm_ratebalance.routing import RoutingSettings
    from litellm_ratebalance.store import MemoryStore

    monkeypatch.setattr(proxy_routing, "_core_announced", [])
    monkeypatch.setattr(litellm, "callbacks", [])
    router = Router(model_list=[{"model_name": "g", "litellm_params": {"model": "openai/a", "api_key": "sk-x"}}])
    with caplog.at_level(logging.INFO, logger="litellm_ratebalance"):
        strategy = RateBalancedRouting(router, RoutingSettings(), store=MemoryStore()).install()
    strategy.uninstall()
    said = "compiled (mypyc)" if core_build() == "compiled" else "pure Python"
    assert caplog.text.count(f"litellm_ratebalance routing core: {said}") == 1
    assert REGISTRY.get_sample_value("litellm_ratebalance_routing_core", {"build": core_build()}) == 1.0
