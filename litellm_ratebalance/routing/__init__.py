"""Rate-balanced routing: send each request where it is most likely to get a good token rate.

The core, independent of LiteLLM (each module says what it owns):

* :mod:`~litellm_ratebalance.routing.estimator`: the pure algorithm (aggregates -> SLA -> shares), with
  :mod:`~litellm_ratebalance.routing.fits` (rate against load, latency against size) and
  :mod:`~litellm_ratebalance.routing.capacity` (a deployment's slots, judged per token);
* :mod:`~litellm_ratebalance.routing.view` and :mod:`~litellm_ratebalance.routing.window`: a model group's
  shared view (buckets, sync, clock offset) and the windows derived from it;
* :mod:`~litellm_ratebalance.routing.shares`: the shares of a candidate set from a view;
  :mod:`~litellm_ratebalance.routing.snapshot`: the same read from the store alone (``status``);
* :mod:`~litellm_ratebalance.routing.evidence`, :mod:`~litellm_ratebalance.routing.live`,
  :mod:`~litellm_ratebalance.routing.changes`: what this replica's requests in flight show, and change
  detection; :mod:`~litellm_ratebalance.routing.inflight`: the in-flight book;
* :mod:`~litellm_ratebalance.routing.selection`: the pickers;
* :mod:`~litellm_ratebalance.routing.balancer`: :class:`RateBalancer`, the facade over them;
* :mod:`~litellm_ratebalance.routing.config`: :class:`RoutingSettings`.

The record types the store shares with routing live in :mod:`litellm_ratebalance.routing.records`; the
LiteLLM adapters (the ``rate_balancer`` callback, :class:`RateBalancedRouting`) in
:mod:`litellm_ratebalance.proxy.routing`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from litellm_ratebalance._lazy import serve

if TYPE_CHECKING:
    from litellm_ratebalance.routing.balancer import RateBalancer
    from litellm_ratebalance.routing.config import RoutingSettings
    from litellm_ratebalance.routing.records import RateAggregate, RateLimitObservation
    from litellm_ratebalance.routing.snapshot import routing_status
    from litellm_ratebalance.routing.types import Candidate, DeploymentEstimate

__all__ = [
    "CORE_MODULES",
    "Candidate",
    "DeploymentEstimate",
    "RateAggregate",
    "RateBalancer",
    "RateLimitObservation",
    "RoutingSettings",
    "core_build",
    "routing_status",
]

_NAMES = {
    "Candidate": f"{__name__}.types",
    "DeploymentEstimate": f"{__name__}.types",
    "RateAggregate": f"{__name__}.records",
    "RateBalancer": f"{__name__}.balancer",
    "RateLimitObservation": f"{__name__}.records",
    "RoutingSettings": f"{__name__}.config",
    "routing_status": f"{__name__}.snapshot",
}
"""Public names, served from their module on first use."""

CORE_MODULE_NAMES = (
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
"""The modules of the routing core: the ones setup.py compiles with mypyc."""


def __getattr__(name: str) -> Any:
    if name == "CORE_MODULES":
        # The modules themselves (imported here), for core_build and its tests.
        return tuple(importlib.import_module(f"{__name__}.{module}") for module in CORE_MODULE_NAMES)
    return serve(globals(), _NAMES, __name__, name)


_EXTENSION_SUFFIXES = frozenset({".so", ".pyd"})


def core_build() -> Literal["compiled", "python"]:
    """Which build of the routing core this process runs: ``"compiled"`` when every module of
    :data:`CORE_MODULE_NAMES` was loaded from the optional mypyc-compiled extension modules (README, "Optional
    compiled routing core"), else ``"python"``, the sources (a stale build beside edited sources included)."""
    modules: tuple[ModuleType, ...] = __getattr__("CORE_MODULES")
    files = (getattr(module, "__file__", None) or "" for module in modules)
    compiled = all(Path(file).suffix in _EXTENSION_SUFFIXES for file in files)
    return "compiled" if compiled else "python"
