"""Drill results in the site's monitoring: the OpenMetrics export, Pushgateway pushes, the Grafana dashboard.

The run folders are test_report.py's (timelines shaped like a real kill drill's, measured by chaoskit's own
``measure_fault``); the Prometheus and Pushgateway are real (tests/prometheus_fixtures.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from chaoskit.report.metrics import METRICS
from tests.conftest import ROOT, run_cli
from tests.prometheus_fixtures import monitoring  # noqa: F401 - a fixture
from tests.test_report import record_for, synth_gameday, synth_run

DRILL_METRICS = ("chaoskit_recovery_seconds", "chaoskit_detection_seconds", "chaoskit_reallocation_seconds",
                 "chaoskit_checkpoint_load_seconds", "chaoskit_lost_steps", "chaoskit_drill_passed")


def _samples(text: str) -> dict[str, dict[str, float]]:
    """metric name -> {label set as written: value}, from an exposition."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.fullmatch(r"([a-z_:]+)(\{[^}]*\})? (\S+)", line)
        assert m, line
        out.setdefault(m.group(1), {})[m.group(2) or ""] = float(m.group(3))
    return out


def _promtool(path: Path) -> subprocess.CompletedProcess:
    with open(path, "rb") as fh:
        return subprocess.run(["promtool", "check", "metrics"], stdin=fh, capture_output=True, text=True, timeout=60)


def test_export_of_a_run_passes_promtool_and_carries_its_phases(tmp_path: Path, monitoring) -> None:  # noqa: F811
    result = synth_run(tmp_path / "run")
    prom = tmp_path / "textfile" / "chaoskit.prom"
    res = run_cli("export", tmp_path / "run", "--openmetrics", prom)
    assert res.code == 0, res.stderr
    lint = _promtool(prom)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = prom.read_text()
    assert text.endswith("# EOF\n")  # OpenMetrics, not the older text format
    samples = _samples(text)
    labels = '{cluster="lab-test",fault_kind="process.kill",scenario="kill-rank"}'
    for name, key in (("chaoskit_recovery_seconds", "recovery_s"), ("chaoskit_detection_seconds", "detection_s"),
                      ("chaoskit_reallocation_seconds", "reallocation_s"),
                      ("chaoskit_checkpoint_load_seconds", "checkpoint_load_s"), ("chaoskit_lost_steps", "lost_steps")):
        assert samples[name] == {labels: pytest.approx(result["phases"][key])}, name
    assert samples["chaoskit_drill_passed"] == {labels: 1.0}
    verdicts = samples["chaoskit_drill_result"]
    assert verdicts[labels.replace(',scenario', ',result="pass",scenario')] == 1.0 and sum(verdicts.values()) == 1.0
    assert set(samples) <= set(METRICS)
    # stdout without --openmetrics: the same exposition
    assert run_cli("export", tmp_path / "run").stdout == text


def test_a_phase_not_observed_is_absent_not_zero(tmp_path: Path) -> None:
    synth_run(tmp_path / "run", recover=False)
    samples = _samples(run_cli("export", tmp_path / "run").stdout)
    assert "chaoskit_recovery_seconds" not in samples and "chaoskit_lost_steps" not in samples
    assert "chaoskit_detection_seconds" in samples
    assert list(samples["chaoskit_drill_passed"].values()) == [0.0]


def test_export_of_a_gameday_carries_plain_and_weighted_coverage(tmp_path: Path, monitoring) -> None:  # noqa: F811
    ok = synth_run(tmp_path / "gd" / "01-kill-rank")
    bad = synth_run(tmp_path / "gd" / "02-hang-rank", "hang-rank", kind="process.hang", recover=False)
    synth_gameday(tmp_path / "gd", [record_for(1, ok), record_for(2, bad)])
    summary = json.loads((tmp_path / "gd" / "gameday.json").read_text())
    prom = tmp_path / "gd.prom"
    assert run_cli("export", tmp_path / "gd", "--openmetrics", prom).code == 0
    assert _promtool(prom).returncode == 0
    samples = _samples(prom.read_text())
    assert samples["chaoskit_coverage_ratio"] == {'{weighted="false"}': pytest.approx(summary["coverage"]["plain"]),
                                                  '{weighted="true"}': pytest.approx(summary["coverage"]["weighted"])}
    assert summary["coverage"]["plain"] > 0
    passed = {re.search(r'scenario="([^"]+)"', k).group(1): v for k, v in samples["chaoskit_drill_passed"].items()}
    assert passed == {"kill-rank": 1.0, "hang-rank": 0.0}
    assert samples["chaoskit_gameday_scenarios"]['{status="failed"}'] == 1.0


def test_promtool_does_lint(tmp_path: Path, monitoring) -> None:  # noqa: F811
    """The check above can fail: promtool refuses a metric without help text."""
    bad = tmp_path / "bad.prom"
    bad.write_text("# TYPE chaoskit_x_seconds gauge\nchaoskit_x_seconds 1\n")
    assert _promtool(bad).returncode != 0


def test_bad_export_input_is_refused(tmp_path: Path) -> None:
    res = run_cli("export", tmp_path)
    assert res.code == 2 and "holds no result.json or gameday.json" in res.stderr
    synth_run(tmp_path / "run")
    for url in ("ftp://127.0.0.1:9091", "http://", "127.0.0.1:9091"):
        res = run_cli("export", tmp_path / "run", "--push", url)
        assert res.code == 2 and "--push URL" in res.stderr, res.stderr


def test_a_push_to_nothing_is_exit_3(tmp_path: Path) -> None:
    import socket

    synth_run(tmp_path / "run")
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        res = run_cli("export", tmp_path / "run", "--push", f"http://127.0.0.1:{s.getsockname()[1]}")
    assert res.code == 3 and "pushing to" in res.stderr


def test_a_pushed_drill_is_queried_back_from_prometheus(tmp_path: Path, monitoring) -> None:  # noqa: F811
    result = synth_run(tmp_path / "run", "push-kill-rank")
    res = run_cli("export", tmp_path / "run", "--push", monitoring.pushgateway)
    assert res.code == 0, res.stderr
    assert "scenario=push-kill-rank, cluster=lab-test" in res.stdout
    sel = '{scenario="push-kill-rank",cluster="lab-test",fault_kind="process.kill",job="chaoskit"}'
    recovery, _ = monitoring.wait_value(f"chaoskit_recovery_seconds{sel}", lambda v: True)
    assert recovery == pytest.approx(result["phases"]["recovery_s"])
    assert monitoring.wait_value(f"chaoskit_drill_passed{sel}", lambda v: True)[0] == 1.0
    # a later drill of the same scenario replaces it in the Pushgateway: now failed
    synth_run(tmp_path / "run2", "push-kill-rank", recover=False)
    assert run_cli("export", tmp_path / "run2", "--push", monitoring.pushgateway).code == 0
    monitoring.wait_value(f"chaoskit_drill_passed{sel}", lambda v: v == 0.0)
    monitoring.wait_value(f'absent(chaoskit_recovery_seconds{sel})', lambda v: v == 1.0)


def test_gameday_push_sends_its_coverage(tmp_path: Path, monitoring) -> None:  # noqa: F811
    """A real game day (of scenarios that cannot start: no drill needed) pushed as it ends."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "a-broken.yaml").write_text("name: broken\nfaults: [\n")
    res = run_cli("gameday", suite, "--out", tmp_path / "reports" / "gd", "--push", monitoring.pushgateway)
    assert res.code == 1, res.stderr
    assert "pushed to" in res.stdout
    monitoring.wait_value('chaoskit_gameday_scenarios{job="chaoskit_gameday",status="errored"}', lambda v: v == 1.0)
    assert monitoring.wait_value('chaoskit_coverage_ratio{job="chaoskit_gameday",weighted="true"}', lambda v: True)[0] == 0.0
    sel = '{job="chaoskit",scenario="a-broken",fault_kind="none"}'
    assert monitoring.wait_value(f'chaoskit_drill_result{sel[:-1]},result="error"}}', lambda v: True)[0] == 1.0
    # a bad URL is refused before anything runs
    res = run_cli("gameday", suite, "--out", tmp_path / "reports" / "gd2", "--push", "file:///tmp/x")
    assert res.code == 2 and not (tmp_path / "reports" / "gd2").exists()
