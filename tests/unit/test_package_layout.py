"""The layout: one adapter package per part over a shared base, parts wired through the runtime's registry.

Read from the source (every import, at the top of a module or inside a function):

* a part's adapter package (``proxy/<part>/``) imports no other part's adapter: parts find each other through
  :class:`~litellm_ratebalance.proxy.runtime.Registry`;
* the shared base (``proxy/*.py``) imports no part, except the registry's default lease meter (cost's);
* nothing outside ``proxy/`` imports an adapter or the runtime (``status``, attribution and the pure policy
  read through the store and pure modules only; ``status`` and the simulator may use the LiteLLM glue,
  ``proxy/_litellm.py``, to read a model list as the proxy's Router does);
* no module looks another up in ``sys.modules``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "litellm_ratebalance"
PARTS = ("admission", "backpressure", "contracts", "cost", "routing")
BASE_MAY_IMPORT = {("runtime.py", "litellm_ratebalance.proxy.cost.meter")}
"""(base module, part module) pairs allowed: the registry builds cost's meter as the default lease meter."""


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; ``from x import y`` counts as ``x`` and ``x.y``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _part_of(module: str) -> str | None:
    prefix = "litellm_ratebalance.proxy."
    if not module.startswith(prefix):
        return None
    first = module[len(prefix) :].split(".")[0]
    return first if first in PARTS else None


def test_every_part_has_an_adapter_package_with_an_entry_module() -> None:
    for part in PARTS:
        assert (PACKAGE / "proxy" / part / "__init__.py").is_file(), part
        assert (PACKAGE / "proxy" / part / "callback.py").is_file(), part
    flat = sorted(p.name for p in (PACKAGE / "proxy").glob("*.py"))
    assert flat == [
        "__init__.py",
        "_litellm.py",
        "replica_report.py",
        "request_state.py",
        "runtime.py",
        "store_metrics.py",
        "tokens.py",
    ]


def test_no_part_imports_another_parts_adapter() -> None:
    crossings = []
    for part in PARTS:
        for path in sorted((PACKAGE / "proxy" / part).rglob("*.py")):
            for module in _imports(path):
                other = _part_of(module)
                if other is not None and other != part:
                    crossings.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert crossings == []


def test_the_shared_base_imports_no_part_but_the_default_lease_meter() -> None:
    found = []
    for path in sorted((PACKAGE / "proxy").glob("*.py")):
        for module in _imports(path):
            allowed = any(path.name == base and module.startswith(part) for base, part in BASE_MAY_IMPORT)
            if _part_of(module) is not None and not allowed:
                found.append(f"{path.name} imports {module}")
    assert found == []


def test_nothing_outside_the_adapters_imports_one() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "proxy" or (relative.name == "__init__.py" and len(relative.parts) == 1):
            continue  # the adapters themselves; the package's __init__ serves the callback instances lazily
        for module in _imports(path):
            glue = module == "litellm_ratebalance.proxy" or module.startswith("litellm_ratebalance.proxy._litellm")
            if module.startswith("litellm_ratebalance.proxy") and not glue:
                found.append(f"{relative} imports {module}")
    assert found == [], "status, attribution and the pure policy read through the store and pure modules only"


def test_no_module_is_looked_up_in_sys_modules() -> None:
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "sys.modules" in p.read_text("utf-8")]
    assert found == []
