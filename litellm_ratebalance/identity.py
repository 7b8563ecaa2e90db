"""Who is asking: priority (and its trust rules) from LiteLLM's ``UserAPIKeyAuth``; the one copy of the rule
that admission, backpressure, routing's backpressure gate and cost's labels apply. Pure: reads attributes of
the object it is given, imports nothing of LiteLLM.

Trust boundary: priority comes only from admin-set metadata, team first, then key, never from the
request body or headers (a client could write anything there). A value that is not a string, or not a
configured priority, puts the request in the shared default pool, so arbitrary strings never create
counters.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

__all__ = ["metadata_value", "resolve_priority"]


def metadata_value(auth: Any, name: str) -> str | None:
    """``name`` from team metadata, else key metadata, as a string; ``None`` if absent or not a string."""
    for attribute in ("team_metadata", "metadata"):
        metadata = getattr(auth, attribute, None)
        if isinstance(metadata, Mapping):
            value = metadata.get(name)
            if isinstance(value, str) and value:
                return value
            if value is not None:
                # Present but unusable (number, list, empty): the team's word still wins over the key's,
                # and an unusable team value means "no priority", not "ask the key".
                return None
    return None


def resolve_priority(auth: Any, configured: Container[str]) -> str | None:
    """The configured priority of this caller, or ``None`` for the shared default pool."""
    value = metadata_value(auth, "priority")
    return value if value is not None and value in configured else None
