"""The runtime dependencies are what the package imports: every third-party module imported under
``litellm_ratebalance/`` comes from a declared runtime dependency (or, imported lazily where only an extra's
feature needs it, from that extra), and every runtime dependency is imported somewhere. Test-only libraries
(numpy, scipy, fakeredis, hypothesis) stay in the ``test`` extra.

Read from the installed distribution's metadata (``make install`` reinstalls when pyproject.toml changes)
and from the import statements of the source.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from importlib.metadata import packages_distributions, requires
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "litellm_ratebalance"

OPTIONAL_IMPORTS = {
    "fastapi": ("proxy", "litellm"),  # HTTPException for the 429s: only inside the proxy (litellm[proxy] has it)
    "pynvml": ("gpu", "nvidia-ml-py"),  # backpressure's NVML probe, only where GPU signals are configured
    "matplotlib": ("dev", "matplotlib"),  # the demo's plot (`make demo`, from a checkout)
}
"""Third-party modules imported lazily, inside the function that needs them: the extra that provides them and
the distribution in it that does."""
TEST_ONLY = {"numpy", "scipy", "fakeredis", "hypothesis", "pytest", "pytest-asyncio"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the package's files that import it (absolute imports only)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("__future__", "litellm_ratebalance"):
                    found[top].add(path.relative_to(PACKAGE_DIR).as_posix())
    return found


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """Normalised runtime dependencies, and the dependencies of each extra, from the installed metadata."""
    runtime: set[str] = set()
    extras: dict[str, set[str]] = defaultdict(set)
    for line in requires("litellm-ratebalance") or []:
        name = _normalise(re.match(r"[A-Za-z0-9_.-]+", line).group(0))  # type: ignore[union-attr]
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", line)
        if extra:
            extras[extra.group(1)].add(name)
        else:
            runtime.add(name)
    return runtime, extras


def test_runtime_dependencies_are_exactly_what_the_package_imports() -> None:
    runtime, _ = _declared()
    distributions = packages_distributions()
    imported_from: dict[str, set[str]] = defaultdict(set)  # distribution -> modules
    undeclared: dict[str, set[str]] = {}
    for module, files in _third_party_imports().items():
        if module in OPTIONAL_IMPORTS:
            continue
        owners = {_normalise(d) for d in distributions.get(module, [module])}
        for owner in owners:
            imported_from[owner].add(module)
        if not owners & runtime:
            undeclared[module] = files
    assert undeclared == {}, "imported at run time but not a runtime dependency"
    unused = sorted(runtime - set(imported_from))
    assert unused == [], "runtime dependencies the package never imports (move them to an extra)"


def test_lazily_imported_modules_come_from_their_extra_and_test_libraries_stay_out_of_the_runtime() -> None:
    runtime, extras = _declared()
    imports = _third_party_imports()
    for module, (extra, distribution) in OPTIONAL_IMPORTS.items():
        assert module in imports, f"{module} is no longer imported: drop it from OPTIONAL_IMPORTS"
        assert distribution in extras[extra], f"{module}: {distribution} is not in the {extra} extra"
    assert extras["test"] >= TEST_ONLY
    assert not runtime & TEST_ONLY
    assert "litellm-ratebalance" in extras["dev"]  # dev = the test extra + tools
