"""Drills that must not restart the job (issue 49, item 2): ``expect: {restart: false}``.

The faults are disturbances a healthy stack rides through; a restart, a worker exit, a new rendezvous or a
detection by the stack after the first fault is a false restart: the drill fails, with its cost. What is
checked without a job: the scenario's errors at their line, and the verdict on two recorded drills (one that rode
through a 4 s pause, one whose 3 s collective timeout restarted a job paused 6 s; ``tests/data/rode-through``
says how each was recorded). End to end once: the shipped ``pause-rides-through`` on the process lab.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from chaoskit.measure import false_restart
from chaoskit.observe.events import read_events
from chaoskit.report.summary import render_result
from tests.conftest import ROOT, need_torch, run_cli
from tests.test_drills import lab_processes

DATA = ROOT / "tests" / "data"

HEAD = """name: no-restart
cluster: lab
workload: {launch: reference, steps: 100, step_time: 50ms}
faults:
  - kind: inproc.hang
    target: {ranks: [1]}
    duration: 2s
    at: {step: 20}
"""


@pytest.mark.parametrize("tail, line, words", [
    ("expect: {window: 10s}\n", 9, "'window' is how long a drill with restart: false watches"),
    ("expect: {restart: no-thanks}\n", 9, "valid boolean"),
    ("expect: {restart: false, grace: 1s}\n", 9, "grace"),
])
def test_a_malformed_expectation_is_refused_at_its_line(tmp_path, tail, line, words):
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + tail)
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:{line}:" in res.stderr and words in res.stderr, res.stderr


def test_a_no_restart_drill_on_a_job_it_does_not_wait_for_needs_a_window(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(HEAD.replace("step_time: 50ms}", "step_time: 50ms, wait: recovered}") + "expect: {restart: false}\n")
    res = run_cli("validate", path)
    assert res.code == 2 and "give expect.window" in res.stderr, res.stderr
    path.write_text(HEAD.replace("step_time: 50ms}", "step_time: 50ms, wait: recovered}")
                    + "expect: {restart: false, window: 15s}\n")
    assert run_cli("validate", path).code == 0


def _recorded(name: str) -> tuple[dict, list[dict]]:
    return json.loads((DATA / name / "result.json").read_text()), read_events(DATA / name / "events.jsonl")


def test_a_pause_shorter_than_the_collective_timeout_is_ridden_through():
    r, events = _recorded("rode-through")
    assert false_restart(events, r["faults"][0]["t_fault"]) is None
    assert r["verdict"] == "pass" and r["checks"]["no_restart"] == {"pass": True}
    out = io.StringIO()
    render_result(Console(file=out, width=200), r)
    assert "rode through pause-rides-through's disturbance: no worker exit, restart, new rendezvous or detection" in out.getvalue()
    assert "not observed" not in out.getvalue()  # no phase table of a recovery that was never needed


def test_a_stack_that_restarts_a_slow_job_is_a_false_restart_with_its_cost():
    r, events = _recorded("false-restart")
    t_fault = r["faults"][0]["t_fault"]
    found = false_restart(events, t_fault)
    assert found["event"] == "detect" and found["node"] == "n0" and found["who"] == "sdk"
    assert 3.0 <= found["after_s"] < 6.0  # the 3 s collective timeout, within the 6 s pause
    check = r["checks"]["no_restart"]
    assert r["verdict"] == "fail" and check["pass"] is False
    assert check["false_restart"]["recovery_s"] == r["phases"]["recovery_s"] > 0
    assert check["false_restart"]["lost_steps"] == r["phases"]["lost_steps"] > 0
    assert check["reason"].startswith("a false restart: sdk noticed (collective error) on n0/rank0 3.00s after the first fault")
    out = io.StringIO()
    render_result(Console(file=out, width=300), r)
    assert "check failed: no_restart: a false restart" in out.getvalue()


def test_what_counts_as_a_false_restart():
    """A clean exit at the job's end, chaoskit's own events, an injected line and the baseline's restarts do not;
    a worker started past the baseline's restart count does."""
    base = [{"ts": 1.0, "kind": "worker.start", "node": "n0", "restart_count": 2}]
    quiet = [{"ts": 11.0, "kind": "worker.exit", "node": "n0", "exitcode": 0},
             {"ts": 11.0, "kind": "fault.reverted", "node": "n1", "source": "chaoskit"},
             {"ts": 11.5, "kind": "gpu.xid", "node": "n1", "injected": True},
             {"ts": 12.0, "kind": "worker.start", "node": "n1", "restart_count": 2},
             {"ts": 12.5, "kind": "ckpt.save.failed", "node": "n1"}]
    assert false_restart(base + quiet, 10.0) is None
    restarted = base + quiet + [{"ts": 13.0, "kind": "worker.start", "node": "n1", "rank": 1, "restart_count": 3}]
    found = false_restart(restarted, 10.0)
    assert found["what"] == "workers started again (restart 3) on n1/rank1" and found["after_s"] == 3.0


@pytest.mark.slow
def test_a_pause_rides_through_on_the_process_lab(tmp_path):
    need_torch()
    out = tmp_path / "run"
    res = run_cli("run", ROOT / "scenarios" / "pause-rides-through.yaml", "--out", out, "--json")
    assert res.code == 0, res.with_logs(out)
    r = res.json
    assert r["verdict"] == "pass" and r["checks"]["no_restart"] == {"pass": True}, res.with_logs(out)
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert not [e for e in journal if e["action"] == "lease.kill"]  # the paused rank was never killed
    assert [e.get("verified") for e in journal if e["action"] == "reverted"] == [True]
    assert r["final_step"] == 120 and lab_processes(r) == []


def test_the_scorecard_says_which_stack_rode_through_a_pause_and_what_a_false_restart_cost():
    """The recorded scorecard of the pause row (tests/data/scorecard-pause/README.md): a cell per stack, from each
    drill's own no_restart check."""
    from chaoskit.report.scorecard import render_scorecard_html
    from chaoskit.scorecard import cells_from_gameday

    card_dir = DATA / "scorecard-pause"
    stacks = ("torchrun", "nvrx", "nvrx-inprocess", "torchft")
    planned = [(s, "pause", card_dir / "scenarios" / f"pause--{s}.yaml", None) for s in stacks]
    cells = {c["stack"]: c for c in cells_from_gameday(planned, card_dir / "gameday")}
    assert {s: cells[s]["verdict"] for s in stacks} == {
        "torchrun": "rode through", "nvrx": "false restart", "nvrx-inprocess": "false restart", "torchft": "rode through"}
    nvrx = cells["nvrx"]["why"]
    assert nvrx.startswith("NVRx rank monitor noticed (no heartbeat within the rank heartbeat timeout) on n0/rank0 5.4s "
                           "after the disturbance, at its heartbeat timeout (5s); it cost 9.5s of recovery, 5 steps lost"), nvrx
    assert cells["torchrun"]["why"] == "no worker exit, restart, new rendezvous or detection by the stack"
    page = render_scorecard_html({"stacks": list(stacks), "faults": ["pause"], "cells": list(cells.values()), "duration_s": 1})
    assert "RODE THROUGH" in page and "FALSE RESTART" in page


def test_a_checkpoint_save_slower_than_nvrxs_heartbeat_timeout_is_a_false_restart():
    """The issue's own row: NVRx ft_launcher with a 5 s rank heartbeat timeout beside a checkpoint save that takes
    8 s (tests/data/scorecard-slow-save/README.md): torchrun rides through, NVRx restarts the job."""
    from chaoskit.measure import measure_checkpoint_io
    from chaoskit.scorecard import cells_from_gameday

    card_dir = DATA / "scorecard-slow-save"
    stacks = ("torchrun", "nvrx", "nvrx-inprocess", "torchft")
    planned = [(s, "slow-save", card_dir / "scenarios" / f"slow-save--{s}.yaml", None) for s in stacks]
    cells = {c["stack"]: c for c in cells_from_gameday(planned, card_dir / "gameday")}
    assert {s: cells[s]["verdict"] for s in stacks} == {
        "torchrun": "rode through", "nvrx": "false restart", "nvrx-inprocess": "false restart", "torchft": "rode through"}
    assert "at its heartbeat timeout (5s)" in cells["nvrx"]["why"]
    # the saves the slow storage overlapped took 8 s at the median (one was in progress when the mount took effect)
    run = card_dir / "gameday" / "01-slow-save--torchrun"
    events = read_events(run / "events.jsonl")
    t_fault = json.loads((run / "result.json").read_text())["faults"][0]["t_fault"]
    t_revert = next(e["ts"] for e in events if e["kind"] == "fault.reverted")
    io_ = measure_checkpoint_io(events, t_fault, t_revert, ["n0"])
    assert io_["save"]["during"]["count"] == 2 and io_["save"]["during"]["median_s"] >= 8.0
    assert io_["save"]["before"]["max_s"] < 0.1 and io_["save"]["after"]["max_s"] < 0.1


def test_the_summary_gives_the_checkpoint_saves_before_during_and_after_slow_storage():
    r = json.loads((DATA / "scorecard-slow-save" / "gameday" / "01-slow-save--torchrun" / "result.json").read_text())
    out = io.StringIO()
    render_result(Console(file=out, width=250), r)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("checkpoint ")]
    assert lines == ["checkpoint saves on n0 (median): before 5.01s, while the storage was harmed 6.00s (x1.2), after 1 ms"]
