"""Re-export a backend-agnostic behavioural suite (tests/store/test_*_store.py) so it runs on the cluster.

A suite's tests are module-level functions taking the ``store`` fixture. Copied into a module under
tests/cluster/, they are collected there, so ``store`` resolves to tests/cluster/conftest.py's cluster
store, while each function keeps its own module's helpers (its globals). Tests that do not take
``store`` (e.g. memory-only clock tests) are left out: they would only repeat themselves.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["store_tests"]


def store_tests(module_name: str) -> dict[str, Callable[..., Any]]:
    """The ``test_*`` functions of ``module_name`` that take ``store``; ``{}`` when the module does not
    exist (yet). An import error inside an existing module is raised, not hidden."""
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return {}
    module = importlib.import_module(module_name)
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith("test") and inspect.isfunction(value) and "store" in inspect.signature(value).parameters
    }
