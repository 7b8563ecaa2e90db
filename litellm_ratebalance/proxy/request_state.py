"""Per-request state our callbacks leave in LiteLLM's request metadata, and the one way to find it again.

The pre-call hook stores an entry (a dict under a component-specific key) in the request's metadata; the
response-headers hook, the success/failure logging events and the failure hook read it back. LiteLLM
hands those hooks the metadata in different places (``metadata`` or ``litellm_metadata`` of the request
data, or the same under ``litellm_params`` in logging kwargs), so every component looks it up here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["find_entry", "stored_headers"]

_METADATA_NAMES = ("metadata", "litellm_metadata")


def find_entry(container: Mapping[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The dict stored under ``key`` in whichever metadata of ``container`` (request data or logging
    kwargs) carries it; ``None`` when there is none or it is not a dict (a client cannot forge a dict
    that a later hook would trust: only our own pre-call hook writes one)."""
    if not isinstance(container, Mapping):
        return None
    candidates: list[Any] = [container.get(name) for name in _METADATA_NAMES]
    params = container.get("litellm_params")
    if isinstance(params, Mapping):
        candidates.extend(params.get(name) for name in _METADATA_NAMES)
    for metadata in candidates:
        if isinstance(metadata, Mapping):
            entry = metadata.get(key)
            if isinstance(entry, dict):
                return entry
    return None


def stored_headers(entry: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A copy of the response headers an entry carries (``entry["headers"]``), or ``None``."""
    headers = entry.get("headers") if entry is not None else None
    return dict(headers) if isinstance(headers, dict) else None
