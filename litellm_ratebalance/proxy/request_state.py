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
    # (Several hooks of every component call this on every request: plain dicts are checked with type()
    # first, an ABC isinstance costs more than the look-up itself.)
    if not (type(container) is dict or isinstance(container, Mapping)):
        return None
    entry = _entry_in(container, key)
    if entry is not None:
        return entry
    params = container.get("litellm_params")
    if type(params) is dict or isinstance(params, Mapping):
        return _entry_in(params, key)
    return None


def _entry_in(container: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    for name in _METADATA_NAMES:
        metadata = container.get(name)
        if type(metadata) is dict or isinstance(metadata, Mapping):
            entry = metadata.get(key)
            if isinstance(entry, dict):
                return entry
    return None


def stored_headers(entry: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A copy of the response headers an entry carries (``entry["headers"]``), or ``None``."""
    headers = entry.get("headers") if entry is not None else None
    return dict(headers) if isinstance(headers, dict) else None
