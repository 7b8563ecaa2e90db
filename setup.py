"""Build hook for an optional compiled build of the routing core; pure Python unless asked for.

``LITELLM_RATEBALANCE_COMPILE=1 pip install --no-build-isolation .`` (with ``mypy`` and a C compiler
installed) compiles the routing policy modules with mypyc: the same code, about half the time per routing
decision (``bench/bench_routing_decision.py`` prints which build it ran). Everything else stays Python, and
without the variable the package is pure Python. Everything but this choice is declared in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import setup

# The routing core (litellm_ratebalance.routing.CORE_MODULE_NAMES says the same): compiled together, so calls
# between these modules are native calls.
COMPILED_MODULES = [
    *(
        f"litellm_ratebalance/routing/{name}.py"
        for name in (
            "records",
            "estimator",
            "capacity",
            "fits",
            "types",
            "inflight",
            "window",
            "view",
            "evidence",
            "changes",
            "shares",
            "live",
            "selection",
            "snapshot",
            "balancer",
        )
    ),
]

ext_modules = []
if os.environ.get("LITELLM_RATEBALANCE_COMPILE") == "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(COMPILED_MODULES)

setup(ext_modules=ext_modules)
