"""The Grafana dashboard only queries metrics (and labels) that the package defines.

Definitions are read from the source (every ``metrics.counter|gauge|histogram("<name>", doc, [labels])``
call under ``litellm_ratebalance/``, and the same calls inside ``litellm_ratebalance/metrics.py``), so renaming
a metric or a label without updating ``litellm_ratebalance/dashboards/litellm-ratebalance.json`` fails here.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "litellm_ratebalance" / "dashboards" / "litellm-ratebalance.json"
PREFIX = "litellm_ratebalance_"

_SERIES = re.compile(r"\b(litellm_ratebalance_[a-z0-9_]+)\s*(\{[^}]*\})?")
_SELECTOR_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|on|ignoring)\s*\(([^)]*)\)")
_KINDS = ("counter", "gauge", "histogram")


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = "text"`` and ``NAME = ("a", "b")`` assignments (metric names, label tuples)."""
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return constants


def _value(node: ast.expr, constants: dict[str, object]) -> object:
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


@functools.cache
def defined_series() -> dict[str, set[str]]:
    """Prometheus series name -> label names, for every ``metrics.counter|gauge|histogram(name, doc, labels)``
    call in the package source (names and labels as literals or module-level constants)."""
    series: dict[str, set[str]] = {}
    for path in sorted((ROOT / "litellm_ratebalance").rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        constants = _module_constants(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                # metrics.counter(...) and the like anywhere in the package
                kind = node.func.attr if node.func.value.id == "metrics" else None
            elif isinstance(node.func, ast.Name) and path.name == "metrics.py":
                kind = node.func.id  # a family defined in litellm_ratebalance/metrics.py itself
            else:
                kind = None
            if kind not in _KINDS:
                continue
            name = _value(node.args[0], constants)
            assert isinstance(name, str), f"{path}:{node.lineno}: metric name not resolvable from the source"
            labels_node = node.args[2] if len(node.args) > 2 else None
            labels_node = next((k.value for k in node.keywords if k.arg == "labels"), labels_node)
            labels = _value(labels_node, constants) if labels_node is not None else ()
            assert isinstance(labels, list | tuple), f"{path}:{node.lineno}: labels not resolvable from the source"
            label_set = {str(label) for label in labels}
            full = PREFIX + name
            if kind == "counter":
                series[full + "_total"] = label_set
            elif kind == "gauge":
                series[full] = label_set
            else:
                for suffix in ("_bucket", "_count", "_sum"):
                    series[full + suffix] = label_set | ({"le"} if suffix == "_bucket" else set())
    return series


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text("utf-8"))  # type: ignore[no-any-return]


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, and the template variables' queries."""
    doc = dashboard()
    out = [(panel["title"], target["expr"]) for panel in doc["panels"] for target in panel.get("targets", [])]
    for variable in doc["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            out.append((f"variable {variable['name']}", query["query"]))
    return out


def test_source_scan_finds_the_known_definitions() -> None:
    series = defined_series()
    assert series["litellm_ratebalance_admission_decisions_total"] == {"model_group", "priority", "result", "reason"}
    assert series["litellm_ratebalance_hook_latency_seconds_bucket"] == {"component", "hook", "le"}
    assert series["litellm_ratebalance_backpressure_refusals_total"] == {"model_group", "tier", "reason"}
    assert series["litellm_ratebalance_store_errors_total"] == {"component", "mode", "cause"}
    # Defined through module constants (name and label tuple), not literals in the call.
    assert series["litellm_ratebalance_routing_choices_total"] == {"model_group", "deployment"}
    assert series["litellm_ratebalance_gpu_seconds_total"] == {"deployment", "priority", "team", "feature"}
    assert series["litellm_ratebalance_cost_usd_total"] == {"priority", "team", "feature", "source"}


def _used() -> list[tuple[str, str, str, set[str]]]:
    """(panel, query, series, selector labels) for each series a query uses."""
    used = []
    for title, expr in queries():
        for match in _SERIES.finditer(expr):
            selector = match.group(2) or ""
            used.append((title, expr, match.group(1), set(_SELECTOR_LABEL.findall(selector))))
    return used


@pytest.mark.parametrize("series", sorted({u[2] for u in _used()}))
def test_every_series_the_dashboard_uses_is_defined(series: str) -> None:
    defined = defined_series()
    assert series in defined, f"dashboard queries {series}, which no metrics.* call defines"


def test_selector_and_grouping_labels_are_labels_of_the_series() -> None:
    defined = defined_series()
    problems = []
    for title, _expr, series, selector_labels in _used():
        if series not in defined:
            continue  # reported by the test above
        for label in sorted(selector_labels - defined[series]):
            problems.append(f"{title}: {series} has no label {label!r}")
    for title, expr in queries():
        names = [m.group(1) for m in _SERIES.finditer(expr) if m.group(1) in defined]
        if not names:
            continue
        available = set().union(*(defined[n] for n in names))
        for group in _GROUPING.findall(expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                if label not in available:
                    problems.append(f"{title}: groups by {label!r}, not a label of {names}")
    assert not problems, "\n".join(problems)


def test_dashboard_shape() -> None:
    doc = dashboard()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    titles = []
    ids = []
    for panel in doc["panels"]:
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        titles.append(panel["title"])
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and refs, panel["title"]
    assert len(ids) == len(set(ids))
    for needed in (
        "Admissions by priority",
        "Rejections by priority and reason",
        "Saturation per model group",
        "Routing share per deployment",
        "Routing weight per deployment",
        "Contract usage vs limit",
        "Requests by contract mode",
        "Backpressure refusals by reason",
        "Concurrency limit vs in flight",
        "Store errors",
        "Hook latency p50 / p99",
        "Cost by team",
        "Reserved vs actual tokens",
    ):
        assert any(title.startswith(needed) for title in titles), needed
    assert all(t.count("[$__rate_interval]") == t.count("rate(") for _, t in queries()), "rate windows"
