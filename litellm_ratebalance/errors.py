"""The package's exceptions.

Hierarchy::

    RateBalanceError                 base of everything this package raises
    ├── ConfigurationError           invalid settings; the message names the key path and the valid range
    └── StoreError                   the shared store (Redis) failed; wraps the redis-py error as __cause__;
                                     ``cause`` (a StoreFault) says why, ``late`` holds a timed-out call

Errors that reach a proxy client (429 / 503) are built by the adapters in ``litellm_ratebalance.proxy``
and are LiteLLM / FastAPI exceptions, not these.
"""

from __future__ import annotations

import asyncio
import re
from enum import Enum
from typing import Any

__all__ = ["ConfigurationError", "RateBalanceError", "StoreError", "StoreFault", "redact", "redact_url"]


class RateBalanceError(Exception):
    """Base class of the package's own errors."""


class ConfigurationError(RateBalanceError, ValueError):
    """A setting is invalid. ``str(err)`` lists every problem as ``key.path: what is wrong``."""


class StoreFault(str, Enum):
    """Why a store operation failed (the ``cause`` label of ``litellm_ratebalance_store_errors_total``)."""

    TIMEOUT = "timeout"
    """Redis did not answer within ``store_timeout_seconds`` while this process was free to read the answer."""
    CONNECTION = "connection"
    """Connecting or talking to Redis failed (refused, reset, authentication, TLS)."""
    POOL = "pool"
    """No free connection within the timeout: this process had every connection busy (Redis may be fine)."""
    BUSY = "busy"
    """This process's event loop was stalled past the wall-clock cap: it could not read the answer in time."""
    BREAKER = "breaker"
    """Not sent: Redis failed less than ``store_retry_after_seconds`` ago."""
    ERROR = "error"
    """Redis answered with an error (a script error, a full Redis refusing writes) or the client failed."""


class StoreError(RateBalanceError):
    """The shared store could not complete an operation (connection lost, timeout, script error).

    ``cause`` says why (:class:`StoreFault`). ``late`` is set when the operation timed out but may still run in
    Redis: a future of its outcome (the operation's result, or an error), resolved when Redis answers or the late
    wait is given up (then cancelled);
    callers whose operation changes counts use it to reconcile (see the store's module docs)."""

    def __init__(self, message: str, *, cause: StoreFault = StoreFault.ERROR, late: asyncio.Future[Any] | None = None):
        super().__init__(message)
        self.cause = cause
        self.late = late


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s'\"]*)@")
_SECRET_PAIRS = re.compile(
    r"(?i)(?P<name>password|passwd|pwd|auth|token|secret)(?P<sep>['\"]?\s*[=:]\s*['\"]?)(?P<value>[^\s&'\",}]+)"
)


def redact_url(url: str) -> str:
    """``url`` with its user info (user name and password) replaced by ``***``: safe to log.

    ``redis://:s3cret@host:6379/2`` -> ``redis://***@host:6379/2``. A URL without credentials is returned
    unchanged.
    """
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}***@", url)


def redact(text: str) -> str:
    """``text`` with credentials masked: URL user info (see :func:`redact_url`) and ``password=...`` style
    pairs (``password``, ``auth``, ``token``, ``secret``). Every message of ours that may include a URL or a
    client error passes through this before it is logged or raised."""
    return _SECRET_PAIRS.sub(lambda m: f"{m['name']}{m['sep']}***", redact_url(text))
