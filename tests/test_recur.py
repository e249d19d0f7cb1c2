"""Nodes that keep failing (issue 49, item 4): a fault's ``recur`` strikes again whenever the job comes back.

A lemon node (Meta's RSC study) fails again each time a job is restarted onto it, unless something keeps it out:
a health check that drains it, a spare, the stack's own exclusion. What is checked without a job: the scenario's
errors at their line, the plan, what kept a node out (timelines built here), and the summary of a recorded drill
(``tests/data/lemon-node``). End to end once: the shipped ``lemon-node`` on the process lab.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from chaoskit.measure import node_returns
from chaoskit.report.summary import render_result
from tests.conftest import ROOT, need_torch, run_cli
from tests.test_drills import lab_processes

HEAD = """name: lemon
cluster: lab
workload: {launch: reference, steps: 100, step_time: 50ms}
faults:
  - kind: process.kill
    target: {ranks: [1]}
    at: {step: 20}
"""


@pytest.mark.parametrize("tail, line, words", [
    ("    recur: {times: 0}\n", 8, "greater than or equal to 1"),
    ("    recur: {times: 2, every: 3}\n", 8, "every"),
    ("    recur: {after: soon}\n", 8, "soon"),
    ("slo: {returns: -1}\n", 8, "greater than or equal to 0"),
])
def test_a_malformed_recurrence_is_refused_at_its_line(tmp_path, tail, line, words):
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + tail)
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:{line}:" in res.stderr and words in res.stderr, res.stderr


def test_the_plan_says_the_fault_comes_back(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + "    recur: {times: 2, after: 1s}\n")
    res = run_cli("run", "--dry-run", path)
    assert res.code == 0, res.stderr
    assert ("fault f0 process.kill at step 20; again each time the job comes back to its node, 2 times, 1s after its "
            "worker starts") in res.stdout


def _struck(*times_resumed):
    return [{"fault": "f0" if i == 0 else f"f0.r{i}", "node": "n1", "t_fault": t, "t_resumed": r, "recovery_s": None
             if r is None else r - t, "lost_steps": 2} for i, (t, r) in enumerate(times_resumed)]


START = [{"ts": 1.0, "kind": "worker.start", "node": n} for n in ("n0", "n1")]


def test_a_node_drained_by_a_health_check_is_kept_out():
    events = START + [{"ts": 11.0, "kind": "worker.start", "node": "n1"},
                      {"ts": 13.0, "kind": "node.drain", "node": "n1", "who": "slurmctld", "why": "node drained (Xid 79)"},
                      {"ts": 20.0, "kind": "worker.start", "node": "n2"}]
    got = node_returns(events, _struck((10.0, 12.0), (12.0, 25.0)), None)
    assert got["returns"] == 1 and got["each"][0]["fault"] == "f0.r1"
    assert got["kept_out"] == {"at": 25.0, "after_s": 15.0, "by": "slurmctld: node drained (Xid 79)"}


def test_a_spare_that_takes_the_nodes_place_keeps_it_out():
    events = START + [{"ts": 14.0, "kind": "worker.start", "node": "n3"}]
    got = node_returns(events, _struck((10.0, 18.0)), 3)
    assert got["returns"] == 0 and got["kept_out"]["by"] == "the spare n3, which took its place"


def test_a_job_that_comes_back_every_time_is_never_kept_out():
    events = START + [{"ts": t, "kind": "worker.start", "node": "n1"} for t in (11.0, 21.0, 31.0)]
    got = node_returns(events, _struck((10.0, 15.0), (20.0, 25.0)), 1)
    assert got["kept_out"] is None
    assert got["reason"] == ("the job came back to n1 after every failure (1 returns): nothing kept it out; the fault "
                             "stopped after its 1 returns")
    assert node_returns(START, _struck((10.0, None)), None)["reason"] == "training did not resume after the last strike"


def test_the_summary_of_a_recorded_lemon_node():
    r = json.loads((ROOT / "tests" / "data" / "lemon-node" / "result.json").read_text())
    out = io.StringIO()
    render_result(Console(file=out, width=250), r)
    text = out.getvalue()
    assert "n1 kept failing: the job came back 3 times (f0.r1 3.8s, 1 steps; f0.r2 8.8s, 3 steps; f0.r3 4.9s, 3 steps)" in text
    assert "nothing kept it out; the fault stopped after its 3 returns" in text
    assert "│ returns         │        3 │ <= 2 │ FAIL │" in text


@pytest.mark.slow
def test_a_node_that_keeps_failing_on_the_process_lab(tmp_path):
    """rank 1's node killed at step 40 and 2 s after each of the next three worker starts there: three returns,
    each measured as a fault of its own; nothing on the process lab keeps n1 out; the job still finishes."""
    need_torch()
    out = tmp_path / "run"
    res = run_cli("run", ROOT / "scenarios" / "lemon-node.yaml", "--out", out, "--json")
    assert res.code == 0, res.with_logs(out)
    r = res.json
    assert r["verdict"] == "pass" and r["slo"]["returns"] == {"limit": 3, "measured": 3, "pass": True}
    [rec] = r["recurrence"]
    assert rec["returns"] == 3 and [e["fault"] for e in rec["each"]] == ["f0.r1", "f0.r2", "f0.r3"]
    assert rec["kept_out"] is None and "nothing kept it out" in rec["reason"]
    assert [f["fault"] for f in r["per_fault"]] == ["f0", "f0.r1", "f0.r2", "f0.r3"]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    strikes = [e for e in events if e["kind"] == "fault.injected"]
    for strike in strikes[1:]:  # each return came after a worker of the job started on n1 again
        assert any(e["kind"] == "worker.start" and e["node"] == "n1" and e["ts"] < strike["ts"]
                   and e["ts"] > max(s["ts"] for s in strikes if s["ts"] < strike["ts"]) for e in events)
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert len([e for e in journal if e["action"] == "inject"]) == 4
    assert r["final_step"] == 120 and lab_processes(r) == []


def test_a_recorded_spare_kept_the_failing_node_out():
    """tests/data/lemon-node-spare (README beside tests/data/lemon-node): n1's GPU failed with scope node, the spare
    n2 took its place 13.4 s later, and the job never came back to n1: no return, kept out by the spare."""
    from chaoskit.observe.events import read_events

    data = ROOT / "tests" / "data" / "lemon-node-spare"
    r = json.loads((data / "result.json").read_text())
    got = node_returns(read_events(data / "events.jsonl"), r["per_fault"], 2)
    assert got["returns"] == 0 and got["kept_out"]["by"] == "the spare n2, which took its place"
    assert got["kept_out"]["after_s"] == r["recurrence"][0]["kept_out"]["after_s"] == 13.401
    assert r["slo"]["returns"] == {"limit": 0, "measured": 0, "pass": True}
