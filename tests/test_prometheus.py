"""Drill results in the site's monitoring: the OpenMetrics export, Pushgateway pushes, the Grafana dashboard.

The run folders are test_report.py's (timelines shaped like a real kill drill's, measured by chaoskit's own
``measure_fault``); the Prometheus and Pushgateway are real (tests/prometheus_fixtures.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from chaoskit.report.metrics import METRICS
from tests.conftest import ROOT, run_cli, wait_until
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


# -- stop conditions and probes from the site's Prometheus ----------------------------------


class _Cond:
    def __init__(self, prometheus: str, query: str, above=None, below=None, for_: float = 0.0) -> None:
        self.prometheus, self.query, self.above, self.below, self.for_ = prometheus, query, above, below, for_


class _Rule:
    def __init__(self, url: str, query: str, when=None, above=None, event: str = "detect") -> None:
        self.url, self.query, self.when, self.above, self.event = url, query, when, above, event


def test_query_value_says_why_there_is_no_number(monitoring) -> None:  # noqa: F811
    from chaoskit.observe.prometheus import QueryError, query_value

    monitoring.push("qv", "chaoskit_test_qv{n=\"a\"} 1\nchaoskit_test_qv{n=\"b\"} 2\n")
    monitoring.wait_value("max(chaoskit_test_qv)", lambda v: v == 2.0)
    assert query_value(monitoring.prometheus, "max(chaoskit_test_qv)") == 2.0
    assert query_value(monitoring.prometheus, "scalar(max(chaoskit_test_qv)) * 2") == 4.0
    for query, why in (("chaoskit_test_qv", "2 series"), ("chaoskit_no_such_series", "no sample"),
                       ("max(", "HTTP 400")):
        with pytest.raises(QueryError, match=re.escape(why)):
            query_value(monitoring.prometheus, query)


def test_stop_watcher_fires_once_the_condition_held_for_its_time(monitoring) -> None:  # noqa: F811
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.prometheus import StopWatcher

    query = 'max(chaoskit_test_alert{job="sw"})'
    monitoring.push("sw", "chaoskit_test_alert 0\n")
    monitoring.wait_value(query, lambda v: v == 0.0)
    bus = EventBus()
    watcher = StopWatcher(bus, [_Cond(monitoring.prometheus, query, below=-1), _Cond(monitoring.prometheus, query, above=0.5, for_=2.0)],
                          poll_s=0.2)
    assert watcher.preflight() == ([], [])
    watcher.start()
    try:
        t_push = monitoring.push("sw", "chaoskit_test_alert 3\n")
        assert wait_until(lambda: watcher.fired is not None, 30)
    finally:
        watcher.stop()
    fired = watcher.fired
    assert fired["condition"] == 1 and fired["value"] == 3.0 and fired["above"] == 0.5
    assert fired["ts"] - t_push >= 2.0  # held for its `for` first
    (event,) = [e for e in bus.snapshot() if e["kind"] == "safety.stop"]
    assert event["condition"] == 1 and event["value"] == 3.0 and query in event["why"]
    # now that it holds, a preflight says so; a query with no number is another list
    bad = StopWatcher(EventBus(), [_Cond(monitoring.prometheus, query, above=0.5), _Cond(monitoring.prometheus, "chaoskit_none", above=1)])
    unanswered, holding = bad.preflight()
    assert len(unanswered) == 1 and "safety.stop_when.1" in unanswered[0] and "no sample" in unanswered[0]
    assert len(holding) == 1 and "safety.stop_when.0 already holds" in holding[0] and "value 3" in holding[0]


def test_a_probe_turns_a_pushed_rise_into_one_event_at_the_right_time(monitoring) -> None:  # noqa: F811
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.prometheus import POLL_S, PrometheusProbe

    query = 'max(chaoskit_test_xid_errors{job="pp"})'
    monitoring.push("pp", "chaoskit_test_xid_errors 0\n")
    monitoring.wait_value(query, lambda v: v == 0.0)
    bus = EventBus()
    probe = PrometheusProbe(bus, [_Rule(monitoring.prometheus, query, when="rises"),
                                  _Rule(monitoring.prometheus, query, above=4, event="gpu.xid")])
    probe.start()
    try:
        assert wait_until(lambda: probe.last[0] == 0.0, 10)  # it saw the value before the rise
        t_push = monitoring.push("pp", "chaoskit_test_xid_errors 2\n")
        _, t_visible = monitoring.wait_value(query, lambda v: v == 2.0)
        assert wait_until(lambda: any(e["kind"] == "detect" for e in bus.snapshot()), 10)
        time.sleep(3 * POLL_S)  # it stays at 2: no second event
        monitoring.push("pp", "chaoskit_test_xid_errors 5\n")
        assert wait_until(lambda: any(e["kind"] == "gpu.xid" for e in bus.snapshot()), 15)
    finally:
        probe.stop()
    detects = [e for e in bus.snapshot() if e["kind"] == "detect"]
    assert len(detects) == 2  # the rise to 2, then the rise to 5
    first = detects[0]
    # Prometheus held the new value from t_visible on (within one scrape after the push); the probe saw it at its next
    # evaluation: at most one poll interval (plus the query's round trip) after that
    assert t_push <= first["ts"] <= t_visible + POLL_S + 0.5, (t_push, first["ts"], t_visible)
    assert first["source"] == "prometheus" and first["value"] == 2.0 and "rose from 0 to 2" in first["why"]
    (xid,) = [e for e in bus.snapshot() if e["kind"] == "gpu.xid"]
    assert xid["value"] == 5.0 and "above 4" in xid["why"]


STOP_SCENARIO = """\
name: {name}
workload: {{launch: reference, steps: 3000, step_time: 50ms, checkpoint_every: 25, collective_timeout: 90s}}
faults:
  - kind: process.hang
    target: {{ranks: [1]}}
    duration: 3m
    at: {{step: 20}}
probes:
  prometheus:
    - {{url: "{prom}", query: 'max(chaoskit_test_xid_errors{{job="{job}"}})', when: rises}}
safety:
  abort_after: 5m
  stop_when:
    - {{prometheus: "{prom}", query: '{stop_query}', above: 0.5, for: 1s}}
"""


def _stop_scenario(tmp_path: Path, monitoring, job: str, stop_query: str) -> Path:  # noqa: F811
    path = tmp_path / f"{job}.yaml"
    path.write_text(STOP_SCENARIO.format(name=job, prom=monitoring.prometheus, job=job, stop_query=stop_query))
    return path


def test_a_stop_query_without_a_number_is_refused_before_anything_is_injected(tmp_path: Path, monitoring) -> None:  # noqa: F811
    scenario = _stop_scenario(tmp_path, monitoring, "noquery", 'max(chaoskit_test_never_pushed{job="noquery"})')
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 3, res.stderr
    assert "safety.stop_when.0" in res.stderr and "no sample" in res.stderr and "nothing was injected" in res.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["verdict"] == "error" and result["faults"] == []
    assert "injected" not in (tmp_path / "run" / "journal.jsonl").read_text()
    assert not (tmp_path / "run" / "logs").exists() or not any((tmp_path / "run" / "logs").iterdir())  # no job started


def test_a_stop_condition_that_already_holds_is_exit_4_before_anything_is_injected(tmp_path: Path, monitoring) -> None:  # noqa: F811
    monitoring.push("holds", "chaoskit_test_alert 1\n")
    monitoring.wait_value('max(chaoskit_test_alert{job="holds"})', lambda v: v == 1.0)
    scenario = _stop_scenario(tmp_path, monitoring, "holds", 'max(chaoskit_test_alert{job="holds"})')
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 4, res.stderr
    assert res.json["verdict"] == "aborted" and res.json["faults"] == []
    assert any("already holds before anything was injected" in n for n in res.json["notes"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stop_condition_firing_mid_drill_reverts_and_exits_4_and_a_probe_detected_the_fault(tmp_path: Path, monitoring) -> None:  # noqa: F811
    """One drill for both: rank 1 hangs (a lasting fault, 3 minutes); the site's Xid counter rises (the probe's
    detection), then the site's alert goes over its threshold (the stop condition): everything is reverted, exit 4."""
    import threading

    from tests.conftest import need_torch

    need_torch()
    job = "stopdrill"
    xid, alert = f'max(chaoskit_test_xid_errors{{job="{job}"}})', f'max(chaoskit_test_alert{{job="{job}"}})'
    monitoring.push(job, "chaoskit_test_xid_errors 0\nchaoskit_test_alert 0\n")
    monitoring.wait_value(alert, lambda v: v == 0.0)
    scenario = _stop_scenario(tmp_path, monitoring, job, alert)
    run_dir = tmp_path / "run"
    marks: dict[str, float] = {}

    def events() -> list[dict]:
        path = run_dir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def site() -> None:  # what the site's monitoring does meanwhile
        if not wait_until(lambda: any(e["kind"] == "fault.injected" for e in events()), 180):
            return
        time.sleep(1.0)
        marks["xid_pushed"] = monitoring.push(job, "chaoskit_test_xid_errors 1\nchaoskit_test_alert 0\n")
        marks["xid_visible"] = monitoring.wait_value(xid, lambda v: v == 1.0)[1]
        if wait_until(lambda: any(e["kind"] == "detect" and e.get("source") == "prometheus" for e in events()), 30):
            marks["alert_pushed"] = monitoring.push(job, "chaoskit_test_xid_errors 1\nchaoskit_test_alert 2\n")

    helper = threading.Thread(target=site, daemon=True)
    helper.start()
    res = run_cli("--debug", "run", scenario, "--out", run_dir, "--json")
    helper.join(timeout=60)
    assert res.code == 4, res.stderr[-3000:]
    assert set(marks) == {"xid_pushed", "xid_visible", "alert_pushed"}, marks
    result = res.json
    assert result["verdict"] == "aborted"
    # the report names the condition and the value
    stop = result["stop_condition"]
    assert stop["condition"] == 0 and stop["value"] == 2.0 and stop["query"] == alert and stop["above"] == 0.5
    assert stop["ts"] - marks["alert_pushed"] >= 1.0  # held for its `for: 1s`
    named = [n for n in result["notes"] if "safety.stop_when.0 fired" in n]
    assert named and alert in named[0] and "value 2" in named[0]
    assert "safety.stop_when.0 fired" in (run_dir / "report.html").read_text()
    # on the timeline; the hang reverted then, long before its 3 minutes, and verified
    timeline = events()
    (stopped,) = [e for e in timeline if e["kind"] == "safety.stop"]
    (injected,) = [e for e in timeline if e["kind"] == "fault.injected"]
    (reverted,) = [e for e in timeline if e["kind"] == "fault.reverted"]
    assert stopped["ts"] <= reverted["ts"] < injected["ts"] + 60
    assert result["checks"]["faults_reverted"]["pass"] is True
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    assert [r["verified"] for r in journal if r.get("action") == "reverted" and str(r.get("fault_id")).startswith("f0")] == [True]
    # the probe's detection is the drill's: the site noticed the fault, at the time Prometheus could show it
    from chaoskit.observe.prometheus import POLL_S

    detect = next(e for e in timeline if e["kind"] == "detect" and e.get("source") == "prometheus")
    assert marks["xid_pushed"] <= detect["ts"] <= marks["xid_visible"] + POLL_S + 0.5
    phases = result["per_fault"][0]
    assert phases["detected_by"].startswith("prometheus on 127.0.0.1:") and "rose from 0 to 1" in phases["detected_by"]
    assert phases["detection_s"] == pytest.approx(detect["ts"] - injected["ts"], abs=0.01)


def test_the_grafana_dashboards_queries_run_on_prometheus(tmp_path: Path, monitoring) -> None:  # noqa: F811
    """Every query of examples/grafana/chaoskit-dashboard.json is valid PromQL and, once a game day was pushed,
    finds its series (the variables as 'All')."""
    import urllib.parse
    import urllib.request

    from tests.test_dashboard import dashboard, exprs

    ok = synth_run(tmp_path / "gd" / "01-dash-kill", "dash-kill")
    synth_gameday(tmp_path / "gd", [record_for(1, ok)])
    assert run_cli("export", tmp_path / "gd", "--push", monitoring.pushgateway).code == 0
    monitoring.wait_value('max(chaoskit_recovery_seconds{scenario="dash-kill"})', lambda v: True)
    monitoring.wait_value('count(chaoskit_gameday_end_timestamp_seconds)', lambda v: True)
    for where, expr in exprs(dashboard()):
        if where.startswith("variable"):
            continue  # label_values() is Grafana's, not PromQL
        promql = expr.replace("$scenario", ".*").replace("$cluster", ".*")
        url = f"{monitoring.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success" and doc["data"]["result"], (where, promql, doc)


@pytest.mark.parametrize("snippet, message", [
    ('safety: {stop_when: [{prometheus: "ftp://127.0.0.1/", query: up, above: 1}]}', "the scheme must be http or https"),
    ('safety: {stop_when: [{prometheus: "http:///x", query: up, above: 1}]}', "no host"),
    ('safety: {stop_when: [{prometheus: "http://a:b@127.0.0.1:9090", query: up, above: 1}]}', "no user or password"),
    ('safety: {stop_when: [{prometheus: "http://127.0.0.1:9090", query: up}]}', "give one of 'above: X' or 'below: X'"),
    ('safety: {stop_when: [{prometheus: "http://127.0.0.1:9090", query: up, above: 1, below: 0}]}', "give one of"),
    ('safety: {stop_when: [{prometheus: "http://127.0.0.1:9090", query: "  ", above: 1}]}', "the query is empty"),
    ('safety: {stop_when: [{prometheus: "http://127.0.0.1:9090", query: up, above: 1, for: 1y}]}', "invalid duration"),
    ('probes: {prometheus: [{url: "http://127.0.0.1:9090", query: up}]}', "give one of 'when: rises' or 'above: X'"),
    ('probes: {prometheus: [{url: "http://127.0.0.1:9090", query: up, when: falls}]}', "rises"),
    ('probes: {prometheus: [{url: "http://127.0.0.1:9090", query: up, when: rises, event: boom}]}', "unknown event kind 'boom'"),
    ('probes: {prometheus: [{url: "127.0.0.1:9090", query: up, when: rises}]}', "the scheme must be http or https"),
])
def test_prometheus_keys_are_checked_at_their_line(tmp_path: Path, snippet: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nfaults:\n  - kind: process.kill\n    target: {ranks: [1]}\n    at: {step: 10}\n" + snippet + "\n")
    res = run_cli("validate", path)
    assert res.code == 2 and message in res.stderr, res.stderr
    assert res.stderr.startswith(f"{path}:6:")


def test_a_repeated_drill_exports_its_medians(tmp_path: Path) -> None:
    from chaoskit.repeat import _sample, summarize_samples

    out = tmp_path / "repeat"
    samples = []
    for i, step_time in enumerate((0.05, 0.08, 0.2), 1):  # three samples whose recoveries differ
        result = synth_run(out / f"sample-0{i}", step_time=step_time)
        samples.append(_sample(out / f"sample-0{i}", result, 0))
    summary = summarize_samples("kill-rank", "kill-rank.yaml", 3, samples, {}, started=0.0)
    (out / "result.json").write_text(json.dumps(summary))
    recoveries = sorted(s["phases"]["recovery_s"] for s in samples)
    assert recoveries[0] < recoveries[2]
    samples_out = _samples(run_cli("export", out).stdout)
    assert samples_out["chaoskit_recovery_seconds"] == {
        '{cluster="lab-test",fault_kind="process.kill",scenario="kill-rank"}': pytest.approx(recoveries[1])}
