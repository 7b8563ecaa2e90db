"""Fault tests (``pytest -m faults``): real proxies, real Redis processes, faults injected under load.

Each module starts what its fault needs (its own redis-server, cluster or Sentinel set, since the fault
breaks it) and its proxies with the e2e harness (tests/e2e/harness.py); the ``proxies`` fixture is the
e2e one.
"""

from __future__ import annotations

from tests.e2e.conftest import proxies

__all__ = ["proxies"]
