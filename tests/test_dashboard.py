"""examples/grafana/chaoskit-dashboard.json: an importable Grafana dashboard over the metrics chaoskit exports.

Fast: no Grafana here. Its queries are also run on a real Prometheus in tests/test_prometheus.py.
"""

from __future__ import annotations

import json
import re

import pytest

from chaoskit.report.metrics import METRICS
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

DASHBOARD = ROOT / "examples" / "grafana" / "chaoskit-dashboard.json"

# PromQL's own words: functions and aggregations (followed by "("), and keywords
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "time", "absent", "absent_over_time", "max_over_time", "min_over_time", "avg_over_time", "last_over_time",
    "label_values", "rate", "increase", "delta", "changes", "resets", "clamp_min", "clamp_max", "round", "sort",
    "sort_desc", "timestamp", "vector", "scalar", "quantile_over_time", "count_over_time",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects: its identifiers, less label matchers, by/without lists,
    strings, ranges and PromQL's own words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", r"\1", text)  # Grafana's: its label
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", w)}


def exprs(board: dict) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]
    out += [(f"variable {v['name']}", v["definition"]) for v in board["templating"]["list"] if v["type"] == "query"]
    return out


def test_the_dashboard_is_importable_json() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    assert [i["pluginId"] for i in board["__inputs"]] == ["prometheus"]  # asks for a Prometheus on import
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and ids
    for p in board["panels"]:
        assert p["title"] and p["type"] in ("stat", "table", "timeseries", "state-timeline", "bargauge"), p["title"]
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"] and all(t["refId"] and t["expr"] for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "scenario", "cluster"}


def test_every_query_uses_only_metrics_chaoskit_exports() -> None:
    used: set[str] = set()
    for where, expr in exprs(dashboard()):
        names = metric_names(expr)
        assert names, (where, expr)
        assert names <= set(METRICS), (where, names - set(METRICS))
        used |= names
    # and it shows what the issue asks for: phases per scenario, verdicts, coverage
    assert {"chaoskit_recovery_seconds", "chaoskit_detection_seconds", "chaoskit_reallocation_seconds",
            "chaoskit_checkpoint_load_seconds", "chaoskit_drill_passed", "chaoskit_coverage_ratio"} <= used


def test_the_name_check_bites() -> None:
    assert metric_names('max by (scenario) (chaoskit_recovery_seconds{scenario=~"$s"})') == {"chaoskit_recovery_seconds"}
    assert metric_names("time() - max(chaoskit_drill_end_timestamp_seconds)") == {"chaoskit_drill_end_timestamp_seconds"}
    assert metric_names("sum(chaoskit_recovery_secs) / up") == {"chaoskit_recovery_secs", "up"}
    assert metric_names('label_values(chaoskit_drill_passed{cluster=~"$c"}, scenario)') == {"chaoskit_drill_passed"}
