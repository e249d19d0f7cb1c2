"""Faults triggered by events, and cascades (issue 49, item 1).

A fault's ``at: {event: KIND, ...}`` fires on the run's timeline; ``at: {during: {fault: ID, phase: P}}`` strikes
while another fault's recovery is in a phase. What is checked without a job: the scenario's errors at their line,
the dry-run plan, which events a trigger counts (a timeline built here, each event as the bus carries it), and the
incident's measure. End to end on the process lab, twice: a cascade (a second rank killed as soon as the agents
noticed the first), and a trigger that never fires (the drill ends, says which event it waited for and how long,
and the lasting fault before it is reverted).
"""

from __future__ import annotations

import json
import re

import pytest

from chaoskit.faults.api import Trigger
from chaoskit.measure import incident
from chaoskit.triggers import TriggerWatch
from tests.conftest import ROOT, need_torch, run_cli, short_form
from tests.test_drills import lab_processes

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

IDS = {"f0": "f0", "first": "f0", "f1": "f1"}

HEAD = """name: triggers
cluster: lab
workload: {launch: reference, steps: 200, step_time: 50ms, checkpoint_every: 25, collective_timeout: 30s}
faults:
  - id: first
    kind: process.kill
    target: {ranks: [1]}
    at: {step: 60}
"""


def _scenario(tmp_path, second: str, head: str = HEAD):
    path = tmp_path / "s.yaml"
    path.write_text(head + second)
    return path


@pytest.mark.parametrize("second, field, words", [
    ("  - kind: process.kill\n    target: {ranks: [2]}\n    at: {during: {fault: frist, phase: reallocation}}\n",
     "faults.1.at.during.fault", "no fault of this scenario is named 'frist'; name an earlier fault (first)"),
    ("  - kind: process.kill\n    target: {ranks: [2]}\n    at: {during: {fault: f1, phase: detection}}\n",
     "faults.1.at.during.fault", "'f1' is this fault or a later one"),
    ("  - kind: process.kill\n    id: first\n    target: {ranks: [2]}\n    at: {step: 80}\n",
     "faults.1.id", "'first' is already faults.0's id"),
    ("  - kind: process.kill\n    target: {ranks: [2]}\n    at: {event: rendezvous.done, node: n9}\n",
     "faults.1.at.node", "node 'n9' is not in the inventory"),
    ("  - kind: process.kill\n    target: {ranks: [2]}\n    at: {event: rendezvous.done, fault: later}\n",
     "faults.1.at.fault", "no fault of this scenario is named 'later'"),
])
def test_a_trigger_naming_what_is_not_there_is_refused_at_its_line(tmp_path, second, field, words):
    path = _scenario(tmp_path, second)
    res = run_cli("validate", path)
    assert res.code == 2, res.stdout + res.stderr
    line = len(HEAD.splitlines()) + next(i for i, text in enumerate(second.splitlines(), 1)
                                         if field.rsplit(".", 1)[-1] + ":" in text)
    assert re.search(rf"{re.escape(str(path))}:{line}:\d+: {re.escape(field)}: .*{re.escape(words)}", res.stderr), res.stderr


@pytest.mark.parametrize("at, words", [
    ("{event: rendezvous.dne}", "unknown event kind 'rendezvous.dne' (did you mean 'rendezvous.done'?)"),
    ("{step: 80, node: n1}", "'node' narrows an event trigger: give 'event' with it"),
    ("{event: step, during: {fault: first, phase: detection}}", "give 'event' or 'during', not both"),
    ("{during: {fault: first, phase: healing}}", "detection"),
    ("{after: 5s, within: 10s}", "'within' bounds the wait of an event trigger"),
    ("{event: rendezvous.done, nth: 0}", "greater than or equal to 1"),
])
def test_a_malformed_trigger_is_refused_at_its_line(tmp_path, at, words):
    path = _scenario(tmp_path, f"  - kind: process.kill\n    target: {{ranks: [2]}}\n    at: {at}\n")
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:{len(HEAD.splitlines()) + 3}:" in res.stderr, res.stderr
    assert words in res.stderr, res.stderr


def test_the_dry_run_plan_says_when_each_triggered_fault_strikes(tmp_path):
    path = _scenario(tmp_path, "  - kind: process.kill\n    target: {ranks: [2]}\n"
                               "    at: {event: worker.start, restart_count: 1, node: n2, nth: 2, after: 1s}\n"
                               "  - kind: process.kill\n    target: {ranks: [0]}\n"
                               "    at: {during: {fault: first, phase: checkpoint_load}}\n")
    res = run_cli("run", "--dry-run", path)
    assert res.code == 0, res.stdout + res.stderr
    assert "fault f1 process.kill at the 2nd worker.start (node n2, restart_count 1+), then 1s" in res.stdout
    assert "fault f2 process.kill at first's checkpoint load (a cascade)" in res.stdout


def _ev(ts, kind, **fields):
    return {"ts": ts, "kind": kind, **fields}


TIMELINE = [  # a kill at 100 and torchrun's restart, as the bus carries it (node n1's rank 1 killed)
    _ev(90.0, "rendezvous.done", node="n0", rank=0),
    _ev(99.0, "step", node="n0", rank=0, step=60),
    _ev(100.0, "fault.injected", node="n1", fault="f0.0"),
    _ev(100.02, "detect", node="n0", rank=0, why="collective error"),
    _ev(100.06, "worker.exit", node="n1", exitcode=-9),
    _ev(102.4, "worker.start", node="n0", rank=0, restart_count=1),
    _ev(102.41, "worker.start", node="n2", rank=2, restart_count=1),
    _ev(105.0, "rendezvous.done", node="n0", rank=0),
    _ev(105.01, "rendezvous.done", node="n2", rank=2),
    _ev(106.0, "ckpt.load.start", node="n2", rank=2, step=50),
    _ev(106.2, "ckpt.load.end", node="n2", rank=2, step=50),
]


def _fires(trigger: Trigger, since: float = 95.0, ref_t: float | None = 100.0, events=TIMELINE):
    watch = TriggerWatch(trigger, IDS, since, ref_t)
    for n in range(1, len(events) + 1):  # fed as the bus grows: the first publish that brings it fires it
        fired = watch.feed(events[:n])
        if fired is not None:
            assert n == events.index(fired) + 1
            return fired
    return None


@pytest.mark.parametrize("at, fired_at", [
    ({"event": "rendezvous.done"}, 105.0),  # the one at 90 was before the previous fault
    ({"event": "rendezvous.done", "nth": 2}, 105.01),
    ({"event": "rendezvous.done", "node": "n2"}, 105.01),
    ({"event": "rendezvous.done", "rank": 2}, 105.01),
    ({"event": "rendezvous.done", "nth": 3}, None),
    ({"event": "worker.start", "restart_count": 1, "node": "n2"}, 102.41),
    ({"event": "worker.start", "restart_count": 2}, None),
    ({"event": "ckpt.load.start", "step": 40}, 106.0),  # the event's step is at least the filter's
    ({"event": "ckpt.load.start", "step": 51}, None),
    ({"event": "fault.injected", "fault": "first"}, 100.0),  # f0.0: an injection of f0
    ({"event": "fault.injected", "fault": "f1"}, None),
    ({"during": {"fault": "first", "phase": "detection"}}, 100.0),
    ({"during": {"fault": "first", "phase": "reallocation"}}, 100.02),
    ({"during": {"fault": "first", "phase": "checkpoint_load"}}, 106.0),
])
def test_which_event_fires_a_trigger(at, fired_at):
    fired = _fires(Trigger(**at))
    assert (fired["ts"] if fired else None) == fired_at


def test_a_cascade_counts_only_what_came_after_its_fault():
    """An injected Xid line is the fault itself, never its detection; a load before the fault is not its."""
    events = [_ev(99.0, "ckpt.load.start", node="n0"), _ev(100.0, "fault.injected", node="n1", fault="f0"),
              _ev(100.01, "gpu.xid", node="n1", injected=True), _ev(101.0, "node.drain", node="n1")]
    assert _fires(Trigger(during={"fault": "f0", "phase": "reallocation"}), events=events)["kind"] == "node.drain"
    assert _fires(Trigger(during={"fault": "f0", "phase": "checkpoint_load"}), events=events) is None


def _measure(fault, t_fault, t_resumed, lost, last_before=60):
    return {"fault": fault, "t_fault": t_fault, "t_resumed": t_resumed, "detection_s": 0.02, "lost_steps": lost,
            "last_step_before": last_before}


def test_a_cascade_is_one_incident_whose_work_is_lost_once():
    """The second kill came while the first's recovery was on (before training resumed): the steps since the
    checkpoint were lost already, so they count once; the incident runs to the first step after the last one."""
    got = incident([_measure("f0", 100.0, 107.0, 10), _measure("f1", 100.04, 107.0, 11)])
    assert got["during_recovery"] == ["f1"] and got["lost_steps"] == 10
    assert got["recovery_s"] == 7.0 and got["detection_s"] == 0.02


def test_a_second_fault_after_training_resumed_adds_its_own_lost_work():
    got = incident([_measure("f0", 100.0, 107.0, 10), _measure("f1", 110.0, 118.0, 7, last_before=57)])
    assert got["during_recovery"] == [] and got["lost_steps"] == 17 and got["recovery_s"] == 18.0


def test_an_incident_whose_job_never_resumed_says_so():
    got = incident([_measure("f0", 100.0, None, 10), _measure("f1", 100.5, None, None)])
    assert got["recovery_s"] is None and "did not resume" in got["reason"]


RECORDED = ROOT / "tests" / "data" / "cascade"  # the shipped cascade, recorded (its README says how)


def test_the_recorded_cascade_replays_to_the_event_that_fired_it():
    """The run's timeline, fed to the trigger in the order the bus published it, fires on the event the run
    recorded as its trigger: what the drill measured is what the trigger does."""
    from chaoskit.observe.events import read_events

    r = json.loads((RECORDED / "result.json").read_text())
    first, second = r["per_fault"]
    events = read_events(RECORDED / "events.jsonl")
    trigger = Trigger(during={"fault": "first-kill", "phase": "reallocation"})
    fired = _fires(trigger, since=first["t_fault"], ref_t=first["t_fault"], events=events)
    assert fired is not None and fired["ts"] == second["trigger"]["ts"] and fired["kind"] == second["trigger"]["event"]


def test_the_summary_and_the_report_show_the_incident_and_each_fault(tmp_path):
    import io
    import shutil

    from rich.console import Console

    from chaoskit.report.summary import render_result

    out = io.StringIO()
    render_result(Console(file=out, width=200), json.loads((RECORDED / "result.json").read_text()))
    text = out.getvalue()
    assert ("incident of 2 faults (f1 struck during the previous recovery): recovery 6.940s from the first fault to "
            "the first step after the last recovery; lost work 10 steps") in text
    assert "f1 process.kill on n2/rank2: detection 0.02s, reallocation 2.34s" in text
    assert "fired at first-kill's reallocation (a cascade) by detect on n0 rank 0: in effect 19 ms after the event" in text
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    assert run_cli("report", run).code == 0
    html = (run / "report.html").read_text()
    assert "incident of 2 faults" in html and "f1 process.kill +0.04s" in html  # both faults on one timeline


@pytest.mark.slow
def test_a_rank_killed_while_the_agents_regroup_after_a_first_kill(tmp_path):
    """The shipped cascade: rank 2 killed at the agents' detection of rank 1's kill. One incident: both kills on
    the timeline, each with its own phases, the second with its trigger's event and latency; the job resumes
    once and finishes."""
    need_torch()
    out = tmp_path / "run"
    # the shipped cascade in a short form (issue 52): the first kill at step 35, 10 steps after the checkpoint of
    # step 25 as the shipped step 60 is after step 50's, and 100 steps, not 200; the second kill strikes the agents'
    # regrouping after it whatever the step
    scenario = short_form(ROOT / "scenarios" / "cascade-kill-during-rendezvous.yaml", tmp_path,
                          ("steps: 200", "steps: 100"), ("at: {step: 60}", "at: {step: 35}"))
    res = run_cli("run", scenario, "--out", out, "--json")
    assert res.code == 0, res.with_logs(out)
    r = res.json
    assert r["verdict"] == "pass" and r["checks"]["triggered"] == {"pass": True}, res.with_logs(out)
    first, second = r["per_fault"]
    assert [first["targets"], second["targets"]] == [["n1/rank1"], ["n2/rank2"]]
    trigger = second["trigger"]
    assert trigger["at"] == "first-kill's reallocation (a cascade)"
    assert trigger["event"] in ("detect", "worker.exit") and trigger["ts"] > first["t_fault"]
    assert trigger["latency_s"] >= 0 and second["t_fault"] >= trigger["ts"]
    assert first["t_detect"] <= second["t_fault"] < first["t_resumed"]  # it struck during the first's recovery
    inc = r["incident"]
    assert inc["faults"] == ["f0", "f1"] and inc["during_recovery"] == ["f1"]
    assert inc["recovery_s"] >= max(first["recovery_s"], second["recovery_s"])
    assert inc["lost_steps"] == first["lost_steps"] and 0 < inc["lost_steps"] <= 25
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert {e["fault"] for e in events if e["kind"] == "fault.injected"} == {"f0", "f1"}
    restarts = {e.get("restart_count") for e in events if e["kind"] == "worker.start"}
    # the agents regrouped once, around both losses; or, where the trigger found rank 2 between worlds (the agents
    # had stopped the old workers and not yet started the new: a race of the two nodes), the kill struck the new
    # world's rank 2 as it started, the run says so, and the agents regrouped once more
    between = [n for n in r["notes"] if "between worlds" in n]
    assert restarts == ({0, 1, 2} if between else {0, 1}), (restarts, r["notes"])
    assert r["final_step"] == 100 and lab_processes(r) == []


NEVER = """name: never-fires
cluster: lab
workload: {launch: reference, steps: 100000, step_time: 50ms, checkpoint_every: 25, collective_timeout: 30s}
faults:
  - kind: process.hang
    target: {ranks: [1]}
    duration: 2m
    at: {step: 20}
  - kind: process.kill
    target: {ranks: [0]}
    at: {event: ckpt.load.start, within: 3s}
safety: {abort_after: 3m}
"""


@pytest.mark.slow
def test_a_trigger_that_never_fires_ends_the_drill_and_leaves_nothing(tmp_path):
    """Rank 1 frozen (process.hang: SIGSTOP, 2 minutes); the kill waits for a checkpoint load that a stopped rank never brings
    (its peers wait 30 s in the all-reduce). After 3 s the drill ends: it fails, says what it waited for and how
    long, the stop is reverted (SIGCONT) long before its 2 minutes, and the kill never happened."""
    need_torch()
    path = tmp_path / "never.yaml"
    path.write_text(NEVER)
    out = tmp_path / "run"
    res = run_cli("run", path, "--out", out, "--json")
    assert res.code == 1, res.with_logs(out)
    r = res.json
    assert r["verdict"] == "fail"
    reason = r["checks"]["triggered"]["reason"]
    assert re.fullmatch(r"faults\.1 \(process\.kill, at the 1st ckpt\.load\.start\) never fired: the 1st "
                        r"ckpt\.load\.start did not come within 3s \(faults\.1\.at\.within\); it waited \d+\.\ds, "
                        r"and it and the faults after it were not injected", reason), reason
    assert [f["kind"] for f in r["faults"]] == ["process.hang"]
    assert r["checks"]["faults_reverted"] == {"pass": True}
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in journal if e["action"] == "inject"] == ["process.hang"]
    assert [e.get("verified") for e in journal if e["action"] == "reverted"] == [True]
    assert lab_processes(r) == []
