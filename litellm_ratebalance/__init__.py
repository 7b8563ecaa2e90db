"""litellm-ratebalance: priority admission, rate-balanced routing, traffic contracts and backpressure
for the LiteLLM proxy.

Config users reference the ready instances in ``litellm_settings.callbacks``::

    callbacks: ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.rate_balancer",
                "litellm_ratebalance.traffic_contracts", "litellm_ratebalance.backpressure",
                "litellm_ratebalance.cost"]

SDK users build the classes themselves and may hand in settings, a store or a router with
:func:`configure`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from litellm_ratebalance._lazy import serve
from litellm_ratebalance.errors import ConfigurationError, RateBalanceError, StoreError
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.settings import Settings, parse_settings

if TYPE_CHECKING:
    from litellm_ratebalance.proxy.admission import PriorityRateLimiter, rate_limiter
    from litellm_ratebalance.proxy.backpressure import BackpressureCallback, backpressure
    from litellm_ratebalance.proxy.contracts import TrafficContractsCallback, traffic_contracts
    from litellm_ratebalance.proxy.cost import CostCallback, cost
    from litellm_ratebalance.proxy.routing import RateBalancedRouting, RateBalancerCallback, rate_balancer
    from litellm_ratebalance.proxy.runtime import configure
    from litellm_ratebalance.routing.balancer import RateBalancer

_LAZY_NAMES = {
    "BackpressureCallback": "litellm_ratebalance.proxy.backpressure",
    "backpressure": "litellm_ratebalance.proxy.backpressure",
    "CostCallback": "litellm_ratebalance.proxy.cost",
    "cost": "litellm_ratebalance.proxy.cost",
    "TrafficContractsCallback": "litellm_ratebalance.proxy.contracts",
    "traffic_contracts": "litellm_ratebalance.proxy.contracts",
    "PriorityRateLimiter": "litellm_ratebalance.proxy.admission",
    "rate_limiter": "litellm_ratebalance.proxy.admission",
    "RateBalancedRouting": "litellm_ratebalance.proxy.routing",
    "RateBalancerCallback": "litellm_ratebalance.proxy.routing",
    "rate_balancer": "litellm_ratebalance.proxy.routing",
    "configure": "litellm_ratebalance.proxy.runtime",
    "RateBalancer": "litellm_ratebalance.routing.balancer",
}
"""Names served from their module on first use: the adapters under ``litellm_ratebalance.proxy`` import LiteLLM
(seconds), and the routing core is not needed by a process that only reads settings; the policy modules
(``litellm_ratebalance.routing.estimator`` and the like) need neither. Each callback instance is created when
its name is first looked up, as LiteLLM does for ``litellm_settings.callbacks`` (it imports
``litellm_ratebalance`` and reads the attribute after the last dot). No subpackage shares one of these names,
so an import of a subpackage never replaces an instance (the backpressure policy modules live in
``litellm_ratebalance.overload``, cost's in ``litellm_ratebalance.attribution``)."""


def __getattr__(name: str) -> Any:
    return serve(globals(), _LAZY_NAMES, __name__, name)


try:
    __version__ = version("litellm-ratebalance")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
    "BackpressureCallback",
    "ConfigurationError",
    "CostCallback",
    "PriorityRateLimiter",
    "RateBalanceError",
    "RateBalancedRouting",
    "RateBalancer",
    "RateBalancerCallback",
    "RoutingSettings",
    "Settings",
    "StoreError",
    "TrafficContractsCallback",
    "__version__",
    "backpressure",
    "configure",
    "cost",
    "parse_settings",
    "rate_balancer",
    "rate_limiter",
    "traffic_contracts",
]
