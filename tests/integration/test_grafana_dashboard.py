"""``docs/grafana/cleat.json`` queries only what cleat exports: every metric an expression
names is one the worker's registry (``runworker --metrics-port``: the process-wide
``REGISTRY``) or the web process's (the same, plus the fleet gauges of ``FLEET_REGISTRY``)
serves, under the sample name Prometheus stores (``_total`` for counters, ``_bucket``,
``_sum``, ``_count`` for histograms), and every label it groups or filters by is one of
those metrics' labels. A metric renamed in the code fails here until the dashboard follows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import schedules.scheduler  # noqa: F401 - registers the scheduler's metrics
import workflows.api.views
import workflows.maintenance
import workflows.worker  # noqa: F401 - registers the worker's metrics
from workflows.api.health import FLEET_REGISTRY, FleetCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "cleat.json"
METRIC = re.compile(r"\bcleat_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported() -> dict[str, set[str]]:
    """Every sample name the two registries serve -> the labels it carries."""
    families: list[Any] = list(REGISTRY.collect())
    fleet = [c for c in FLEET_REGISTRY._collector_to_names if isinstance(c, FleetCollector)]
    assert fleet, "the fleet collector is not registered"
    families += fleet[0].describe()
    labels_of = {}
    for collector in REGISTRY._collector_to_names:
        for name in REGISTRY._collector_to_names[collector]:
            labels_of[name] = set(getattr(collector, "_labelnames", ()))
    names: dict[str, set[str]] = {}
    for family in families:
        labels = set(getattr(family, "_labelnames", ())) or labels_of.get(family.name, set())
        if family.type == "histogram":
            labels = labels | {"le"}
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = labels | labels_of.get(family.name + suffix, set())
    return names


def problems(expr: str, names: dict[str, set[str]]) -> list[str]:
    used = METRIC.findall(expr)
    found = [f"names no cleat metric: {expr}"] if not used else []
    found += [f"{m} is not exported" for m in used if m not in names]
    labels = set().union(*(names.get(m, set()) for m in used)) if used else set()
    wanted = {
        label.strip()
        for group in GROUPING.findall(expr)
        for label in group.split(",")
        if label.strip()
    }
    for matchers in MATCHER.findall(expr):
        wanted |= {m.split("=")[0].strip(" !~") for m in matchers.split(",") if "=" in m}
    found += [f"{expr}: no metric it names has the label {label!r}" for label in wanted - labels]
    return found


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10, "the dashboard lost its panels"
    return exprs


def test_every_expression_names_exported_metrics_and_labels() -> None:
    names = exported()
    assert {"cleat_ready_runs", "cleat_steps_total", "cleat_segment_seconds_bucket"} <= set(names)
    found = [p for expr in expressions() for p in problems(expr, names)]
    assert found == [], found


def test_the_fleet_gauges_and_the_worker_counters_are_on_the_dashboard() -> None:
    used = {m for expr in expressions() for m in METRIC.findall(expr)}
    assert {
        "cleat_ready_runs",
        "cleat_oldest_ready_seconds",
        "cleat_workers",
        "cleat_steps_total",
        "cleat_segments_total",
    } <= used


@pytest.mark.parametrize(
    ("writes", "prefix"), [("appends", ""), ("finalizes", "finalize_"), ("suspends", "suspend_")]
)
def test_each_group_commit_is_on_the_dashboard(writes: str, prefix: str) -> None:
    """The three group commits (steps' events, completions' and waits' finalizes): how they
    were written, their batches' size and wait, mode switches and failed batches."""
    used = {m for expr in expressions() for m in METRIC.findall(expr)}
    name = f"cleat_group_commit_{prefix}"
    wanted = {
        f"cleat_group_commit_{writes}_total",
        f"{name}batch_runs_bucket",
        f"{name}wait_seconds_bucket",
        f"{name}mode_switches_total",
        f"{name}batch_failures_total",
    }
    assert wanted - used == set()


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(cleat_steps[5m]))",  # a counter without its _total
        "sum by (tenant) (cleat_ready_runs)",  # a label the gauge does not have
        'cleat_workers{status="live"}',
        "sum(rate(http_requests_total[5m]))",  # nothing of cleat's
    ],
)
def test_the_check_catches_a_drifted_expression(expr: str) -> None:
    assert problems(expr, exported())
