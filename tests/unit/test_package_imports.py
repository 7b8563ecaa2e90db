"""The package's top level: the policy modules load without LiteLLM, and every name that
``litellm_settings.callbacks`` can reference is the callback instance however the package was imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_policy_modules_load_without_litellm() -> None:
    out = _run(
        "import sys\n"
        "import litellm_ratebalance.routing.estimator, litellm_ratebalance.admission.policy\n"
        "import litellm_ratebalance.overload.shedding\n"
        "print('litellm' in sys.modules)"
    )
    assert out == "False"


_CALLBACKS = {
    "backpressure": "BackpressureCallback",
    "cost": "CostCallback",
    "rate_balancer": "RateBalancerCallback",
    "rate_limiter": "PriorityRateLimiter",
    "traffic_contracts": "TrafficContractsCallback",
}


def test_callback_names_are_the_instances_and_no_module_shares_one() -> None:
    """LiteLLM resolves ``litellm_ratebalance.<name>`` as an attribute of the package. No module or subpackage
    may have one of those names (importing it would replace the attribute with the module), and the package
    is a plain module: no module-class swap keeps the two apart."""
    out = _run(
        "import importlib.util, json, types\n"
        "import litellm_ratebalance.overload.config, litellm_ratebalance.overload.signals\n"
        "import litellm_ratebalance as package\n"
        f"names = {sorted(_CALLBACKS)!r}\n"
        "print(json.dumps({\n"
        "    'plain_module': type(package) is types.ModuleType,\n"
        "    'modules': [n for n in names if importlib.util.find_spec('litellm_ratebalance.' + n) is not None],\n"
        "    'types': {n: type(getattr(package, n)).__name__ for n in names},\n"
        "}))"
    )
    assert json.loads(out) == {"plain_module": True, "modules": [], "types": _CALLBACKS}


def test_an_sdk_process_never_loads_the_proxy_server() -> None:
    """Callbacks imported inside an event loop of a process that is not the proxy schedule no start-up
    check, and nothing of ours imports LiteLLM's proxy server (seconds of import and the proxy's globals)."""
    out = _run(
        "import asyncio, sys\n"
        "async def main():\n"
        "    from litellm_ratebalance import RateBalancedRouting, rate_balancer, rate_limiter\n"
        "    from litellm_ratebalance.settings import load_settings\n"
        "    load_settings()\n"
        "    await asyncio.sleep(0.3)\n"
        "    print('litellm.proxy.proxy_server' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    assert out == "False"
