"""Model-group capacity (summed deployment tpm/rpm) read from the router, cached.

LiteLLM's ``Router.get_model_group_info`` deep-copies and costs ~0.4 ms a call (see LITELLM-NOTES.md), so
we sum ``tpm``/``rpm`` of the group's deployments ourselves (``litellm_params`` first, then
``model_info``, LiteLLM's order) and keep the result for ``refresh_seconds``, or until the proxy
replaces its Router. The cache is bounded: unknown model names a client sends cannot grow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Capacity", "CapacityCache"]

_MAX_ENTRIES = 1024


@dataclass(frozen=True, slots=True)
class Capacity:
    rpm: int | None
    tpm: int | None
    deployments: int

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
    deployments = router.get_model_list(model_name=model_group) or []
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
    return Capacity(rpm_total if rpm_seen else None, tpm_total if tpm_seen else None, len(deployments))


class CapacityCache:
    """``get(router, model_group)`` with a time-to-live; keyed by router identity so a replaced Router
    is re-read at once."""

    __slots__ = ("_clock", "_entries", "_ttl")

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: dict[tuple[int, str], tuple[float, Capacity]] = {}

    def get(self, router: Any, model_group: str) -> Capacity:
        key = (id(router), model_group)
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        capacity = read_capacity(router, model_group)
        if len(self._entries) >= _MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (now + self._ttl, capacity)
        return capacity
