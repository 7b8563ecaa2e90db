"""litellm-ratebalance: priority admission, rate-balanced routing, traffic contracts and backpressure
for the LiteLLM proxy.

Config users reference the ready instances in ``litellm_settings.callbacks``::

    callbacks: ["litellm_ratebalance.rate_limiter", "litellm_ratebalance.rate_balancer",
                "litellm_ratebalance.traffic_contracts", "litellm_ratebalance.backpressure"]

SDK users build the classes themselves and may hand in settings, a store or a router with
:func:`configure`.
"""

from __future__ import annotations

import importlib
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from litellm_ratebalance.errors import ConfigurationError, RateBalanceError, StoreError
from litellm_ratebalance.routing import RateBalancer, RoutingSettings
from litellm_ratebalance.settings import Settings, parse_settings

if TYPE_CHECKING:
    from litellm_ratebalance.proxy.backpressure import BackpressureCallback, backpressure
    from litellm_ratebalance.proxy.contracts import TrafficContractsCallback, traffic_contracts
    from litellm_ratebalance.proxy.limiter import PriorityRateLimiter, rate_limiter
    from litellm_ratebalance.proxy.routing import RateBalancedRouting, RateBalancerCallback, rate_balancer
    from litellm_ratebalance.proxy.runtime import configure

_PROXY_NAMES = {
    "BackpressureCallback": "backpressure",
    "backpressure": "backpressure",
    "TrafficContractsCallback": "contracts",
    "traffic_contracts": "contracts",
    "PriorityRateLimiter": "limiter",
    "rate_limiter": "limiter",
    "RateBalancedRouting": "routing",
    "RateBalancerCallback": "routing",
    "rate_balancer": "routing",
    "configure": "runtime",
}
"""Names served from ``litellm_ratebalance.proxy.<module>`` on first use: those modules import LiteLLM (seconds),
which the policy modules (``litellm_ratebalance.routing.estimator`` and the like) do not need. Each callback
instance is created when its name is first looked up, as LiteLLM does for ``litellm_settings.callbacks``."""


def __getattr__(name: str) -> Any:
    module = _PROXY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"litellm_ratebalance.proxy.{module}"), name)
    globals()[name] = value  # looked up once
    return value


class _Package(types.ModuleType):
    """This package's module type: its ``backpressure`` attribute is the callback instance (what
    ``litellm_settings.callbacks: ["litellm_ratebalance.backpressure"]`` names), even though a subpackage of
    that name exists. Importing the subpackage sets the parent's attribute to it; that assignment is kept
    aside here instead, and ``litellm_ratebalance.backpressure.<module>`` imports work as usual (they go
    through ``sys.modules``)."""

    @property
    def backpressure(self) -> Any:
        # (the subpackage itself may stand here: imported by this package's own imports, before its type was set)
        value = globals().get("backpressure")
        return __getattr__("backpressure") if value is None or isinstance(value, types.ModuleType) else value

    @backpressure.setter
    def backpressure(self, value: Any) -> None:
        if not isinstance(value, types.ModuleType):
            globals()["backpressure"] = value  # (read back by the getter; __getattr__ stores here too)


sys.modules[__name__].__class__ = _Package


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
