"""Names a package serves on first use (PEP 562 module ``__getattr__``), so that importing the package, or
one of its modules, does not import what those names live in."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["serve"]


def serve(namespace: MutableMapping[str, Any], table: Mapping[str, str], package: str, name: str) -> Any:
    """``name`` from the module ``table`` maps it to, kept in the package's ``namespace`` (looked up once);
    ``AttributeError`` for a name the table does not have, as for any missing attribute of ``package``."""
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
