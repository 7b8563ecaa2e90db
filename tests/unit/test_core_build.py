"""Which build of the routing core runs: the sources or the optional mypyc-compiled modules."""

from __future__ import annotations

import logging
import os

import pytest
from prometheus_client import REGISTRY

from litellm_ratebalance.proxy import routing as proxy_routing
from litellm_ratebalance.proxy.routing import RateBalancerCallback
from litellm_ratebalance.routing import balancer, core_build, estimator

EXPECT_CORE = "LITELLM_RATEBALANCE_EXPECT_CORE"
"""Set by ``make test-compiled`` to ``compiled``: the suite must then run on the compiled modules."""


@pytest.mark.parametrize(
    ("estimator_file", "balancer_file", "expected"),
    [
        ("/x/routing/estimator.py", "/x/routing/balancer.py", "python"),
        (
            "/x/routing/estimator.cpython-311-x86_64-linux-gnu.so",
            "/x/routing/balancer.cpython-311-x86_64-linux-gnu.so",
            "compiled",
        ),
        ("C:/x/routing/estimator.cp311-win_amd64.pyd", "C:/x/routing/balancer.cp311-win_amd64.pyd", "compiled"),
        # one module compiled and the other not is not the compiled core (a stale build beside edited sources)
        ("/x/routing/estimator.cpython-311-x86_64-linux-gnu.so", "/x/routing/balancer.py", "python"),
    ],
)
def test_core_build_reads_where_both_modules_came_from(
    monkeypatch: pytest.MonkeyPatch, estimator_file: str, balancer_file: str, expected: str
) -> None:
    monkeypatch.setattr(estimator, "__file__", estimator_file)
    monkeypatch.setattr(balancer, "__file__", balancer_file)
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
