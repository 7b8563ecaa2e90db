"""The package's top level: the policy modules load without LiteLLM, and every name that
``litellm_settings.callbacks`` can reference is the callback instance however the package was imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_policy_modules_load_without_litellm() -> None:
    out = _run(
        "import sys\n"
        "import litellm_ratebalance.routing.estimator, litellm_ratebalance.admission.policy\n"
        "import litellm_ratebalance.backpressure.shedding\n"
        "print('litellm' in sys.modules)"
    )
    assert out == "False"


@pytest.mark.parametrize(
    ("name", "class_name"),
    [
        ("backpressure", "BackpressureCallback"),
        ("rate_balancer", "RateBalancerCallback"),
        ("rate_limiter", "PriorityRateLimiter"),
        ("traffic_contracts", "TrafficContractsCallback"),
    ],
)
def test_callback_names_are_the_instances_even_after_a_same_named_subpackage(name: str, class_name: str) -> None:
    """``litellm_ratebalance.backpressure`` is also a subpackage; importing it first must not turn the
    package attribute LiteLLM resolves into that module."""
    out = _run(
        "import litellm_ratebalance.backpressure.config\n"
        "import litellm_ratebalance as package\n"
        f"print(type(getattr(package, {name!r})).__name__)"
    )
    assert out == class_name
