"""Rate-balanced routing: send each request where it is most likely to get a good token rate.

* :mod:`~litellm_ratebalance.routing.estimator`: the pure algorithm (aggregates -> SLA -> shares);
* :mod:`~litellm_ratebalance.routing.balancer`: :class:`RateBalancer`, the core with its local view and
  write-behind of samples, independent of LiteLLM;
* :mod:`~litellm_ratebalance.routing.config`: :class:`RoutingSettings`.

The LiteLLM adapters (the ``rate_balancer`` callback, :class:`RateBalancedRouting`) live in
:mod:`litellm_ratebalance.proxy.routing`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from litellm_ratebalance.routing import balancer, estimator
from litellm_ratebalance.routing.balancer import Candidate, DeploymentEstimate, RateBalancer, routing_status
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.estimator import RateAggregate, RateLimitObservation

__all__ = [
    "Candidate",
    "DeploymentEstimate",
    "RateAggregate",
    "RateBalancer",
    "RateLimitObservation",
    "RoutingSettings",
    "core_build",
    "routing_status",
]

_EXTENSION_SUFFIXES = frozenset({".so", ".pyd"})


def core_build() -> Literal["compiled", "python"]:
    """Which build of the routing core this process runs: ``"compiled"`` when both of its modules (the
    estimator and the balancer) were loaded from the optional mypyc-compiled extension modules (README,
    "Optional compiled routing core"), else ``"python"``, the sources."""
    modules = (estimator, balancer)
    compiled = all(Path(getattr(module, "__file__", None) or "").suffix in _EXTENSION_SUFFIXES for module in modules)
    return "compiled" if compiled else "python"
