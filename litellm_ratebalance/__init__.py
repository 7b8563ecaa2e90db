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

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

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

_PROXY_NAMES = {
    "BackpressureCallback": "backpressure",
    "CostCallback": "cost",
    "cost": "cost",
    "backpressure": "backpressure",
    "TrafficContractsCallback": "contracts",
    "traffic_contracts": "contracts",
    "PriorityRateLimiter": "admission",
    "rate_limiter": "admission",
    "RateBalancedRouting": "routing",
    "RateBalancerCallback": "routing",
    "rate_balancer": "routing",
    "configure": "runtime",
}
"""Names served from ``litellm_ratebalance.proxy.<module>`` on first use: those modules import LiteLLM (seconds),
which the policy modules (``litellm_ratebalance.routing.estimator`` and the like) do not need. Each callback
instance is created when its name is first looked up, as LiteLLM does for ``litellm_settings.callbacks``
(it imports ``litellm_ratebalance`` and reads the attribute after the last dot). No subpackage shares one of
these names, so an import of a subpackage never replaces an instance (the backpressure policy modules live in
``litellm_ratebalance.overload``)."""


def __getattr__(name: str) -> Any:
    if name == "RateBalancer":
        # The routing core, loaded on first use as well (a process that only reads settings never needs it).
        value = importlib.import_module("litellm_ratebalance.routing.balancer").RateBalancer
        globals()[name] = value
        return value
    module = _PROXY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"litellm_ratebalance.proxy.{module}"), name)
    globals()[name] = value  # looked up once
    return value


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
