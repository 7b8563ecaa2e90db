"""Rate-balanced routing: send each request where it is most likely to get a good token rate.

* :mod:`~litellm_ratebalance.routing.estimator`: the pure algorithm (aggregates -> SLA -> shares);
* :mod:`~litellm_ratebalance.routing.balancer`: :class:`RateBalancer`, the core with its local view and
  write-behind of samples, independent of LiteLLM;
* :mod:`~litellm_ratebalance.routing.config`: :class:`RoutingSettings`.

The LiteLLM adapters (the ``rate_balancer`` callback, :class:`RateBalancedRouting`) live in
:mod:`litellm_ratebalance.proxy.routing`.
"""

from __future__ import annotations

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
    "routing_status",
]
