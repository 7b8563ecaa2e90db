"""The package's exceptions.

Hierarchy::

    RateBalanceError                 base of everything this package raises
    ├── ConfigurationError           invalid settings; the message names the key path and the valid range
    └── StoreError                   the shared store (Redis) failed; wraps the redis-py error as __cause__

Errors that reach a proxy client (429 / 503) are built by the adapters in ``litellm_ratebalance.proxy``
and are LiteLLM / FastAPI exceptions, not these.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "RateBalanceError", "StoreError"]


class RateBalanceError(Exception):
    """Base class of the package's own errors."""


class ConfigurationError(RateBalanceError, ValueError):
    """A setting is invalid. ``str(err)`` lists every problem as ``key.path: what is wrong``."""


class StoreError(RateBalanceError):
    """The shared store could not complete an operation (connection lost, timeout, script error)."""
