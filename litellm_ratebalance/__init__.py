"""litellm-ratebalance: priority admission, rate-balanced routing, traffic contracts and backpressure
for the LiteLLM proxy.

Config users reference the ready instances in ``litellm_settings.callbacks``::

    callbacks: ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.rate_balancer",
                "litellm_ratebalance.traffic_contracts", "litellm_ratebalance.backpressure"]

SDK users build the classes themselves and may hand in settings, a store or a router with
:func:`configure`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from litellm_ratebalance.errors import ConfigurationError, RateBalanceError, StoreError
from litellm_ratebalance.proxy.backpressure import BackpressureCallback, backpressure
from litellm_ratebalance.proxy.contracts import TrafficContractsCallback, traffic_contracts
from litellm_ratebalance.proxy.limiter import PriorityRateLimiter, rate_limiter
from litellm_ratebalance.proxy.routing import RateBalancedRouting, RateBalancerCallback, rate_balancer
from litellm_ratebalance.proxy.runtime import configure
from litellm_ratebalance.routing import RateBalancer, RoutingSettings
from litellm_ratebalance.settings import Settings, parse_settings

try:
    __version__ = version("litellm-ratebalance")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
    "BackpressureCallback",
    "ConfigurationError",
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
    "parse_settings",
    "rate_balancer",
    "rate_limiter",
    "traffic_contracts",
]
