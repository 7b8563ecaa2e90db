"""Model-group capacity (summed deployment tpm/rpm) read from the router, cached.

LiteLLM's ``Router.get_model_group_info`` deep-copies the group's deployments (~0.4 ms a call), so
we sum ``tpm``/``rpm`` of the group's deployments ourselves (``litellm_params`` first, then
``model_info``, LiteLLM's order) and keep the result for ``refresh_seconds``, or until the proxy
replaces its Router. The cache is bounded: a least-recently-used map of at most ``max_entries`` groups, and
a name that matches no deployment (a client can send any model name) is not cached at all, so a flood of
bogus names leaves it as it was.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from litellm_ratebalance.proxy import _litellm

__all__ = ["DEFAULT_MAX_ENTRIES", "Capacity", "CapacityCache", "read_capacity"]

DEFAULT_MAX_ENTRIES = 1024
"""Model groups cached per limiter (far more than a proxy configures; wildcard routes can match many
requested names, which then share this bound)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    rpm: int | None
    tpm: int | None
    deployments: int
    model_group: str | None = None
    """The router's name of the group that served the lookup (``model_name`` of its deployments): equal to
    the requested name, or a wildcard route such as ``openai/*`` that matched it. Counters keyed by this
    name stay bounded by configuration whatever names clients send."""

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None


def _positive_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def read_capacity(router: Any, model_group: str) -> Capacity:
    """Sum the deployments' limits; a group where no deployment sets a limit has none (``None``)."""
    deployments = _litellm.group_deployments(router, model_group)
    rpm_total = tpm_total = 0
    rpm_seen = tpm_seen = False
    for deployment in deployments:
        params = deployment.get("litellm_params") or {}
        info = deployment.get("model_info") or {}
        rpm = _positive_int(params.get("rpm", info.get("rpm")))
        tpm = _positive_int(params.get("tpm", info.get("tpm")))
        if rpm is not None:
            rpm_total += rpm
            rpm_seen = True
        if tpm is not None:
            tpm_total += tpm
            tpm_seen = True
    names = {d.get("model_name") for d in deployments if isinstance(d.get("model_name"), str)}
    group = model_group if model_group in names or len(names) != 1 else next(iter(names))
    return Capacity(
        rpm_total if rpm_seen else None,
        tpm_total if tpm_seen else None,
        len(deployments),
        group if deployments else None,
    )


class CapacityCache:
    """``get(router, model_group)`` with a time-to-live; keyed by router identity so a replaced Router
    is re-read at once. At most ``max_entries`` entries (least recently used dropped first); names that
    match no deployment are never stored."""

    __slots__ = ("_clock", "_entries", "_max_entries", "_ttl")

    def __init__(
        self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._max_entries = max(1, max_entries)
        self._entries: OrderedDict[tuple[int, str], tuple[float, Capacity]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, router: Any, model_group: str) -> Capacity:
        key = (id(router), model_group)
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            self._entries.move_to_end(key)
            return entry[1]
        capacity = read_capacity(router, model_group)
        if capacity.deployments == 0:
            # An unknown name: the Router refuses the request anyway; caching it would let clients fill the
            # cache (and evict real groups) with made-up names.
            self._entries.pop(key, None)
            return capacity
        self._entries[key] = (now + self._ttl, capacity)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return capacity
