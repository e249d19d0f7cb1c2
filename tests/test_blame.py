"""Blame (issue 50, item 3): whom the recovery stack itself named as the failed rank or node, against the truth.

Each source is read from real lines: recorded run folders (tests/data/cascade, false-restart, rode-through), the
recorded logs of NVRx's rank monitors, its in-process Wrapper and torchft (their test modules replay them), and
scontrol's and torch elastic's own formats. The verdicts of the session's game day (tests/drill_fixtures.py: a
killed rank of a job without chaoskit, a SIGSTOPped rank) are read from its result.json: no drill of its own.
"""

from __future__ import annotations

import io
import json
import shutil
import textwrap

import pytest
from rich.console import Console

from chaoskit.blame import blame, blame_line, stack_namings, truth_of
from chaoskit.core.result import RunResult
from chaoskit.observe.events import EventBus, make_event, read_events
from chaoskit.workloads.root_cause import RootCause
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

DATA = ROOT / "tests" / "data"
pytest_plugins = ["tests.drill_fixtures"]


def _recorded(name: str) -> tuple[dict, list[dict]]:
    folder = DATA / name
    return json.loads((folder / "result.json").read_text()), read_events(folder / "events.jsonl")


def _fault(node: str, target: str, t_fault: float, **more) -> dict:
    return {"fault": "f0", "kind": "process.kill", "node": node, "targets": [target], "t_fault": t_fault, **more}


# -- torchrun: the agent's failure line, its pid mapped to the rank ----------------------------------------------


def test_torchrun_named_each_killed_rank_of_a_cascade_by_its_pid():
    """A recorded cascade: rank 1 killed, rank 2 at the first detection after it. The agent's line for rank 1 comes
    after rank 2's fault too: it is the first fault's, not a wrong blame of the second."""
    result, events = _recorded("cascade")
    first, second = blame(events, result["per_fault"])
    assert first["verdict"] == second["verdict"] == "right"
    assert first["blamed"]["by"] == "torchrun agent" and (first["blamed"]["rank"], first["blamed"]["node"]) == (1, "n1")
    assert first["blamed"]["words"] == "failed (exitcode: -9) local_rank: 0 (pid: 24519)"
    assert first["blamed"]["via"] == "pid 24519 was rank 1"
    assert (second["blamed"]["rank"], second["blamed"]["node"]) == (2, "n2") and second["truth"] == {"rank": 2, "node": "n2"}
    assert blame_line(first) == ("torchrun agent named rank 1 on n1 (right): failed (exitcode: -9) local_rank: 0 "
                                 "(pid: 24519)")


def test_torchrun_blames_the_rank_whose_collective_timed_out_not_the_one_that_paused():
    """The recorded false restart: rank 1 paused 6 s, rank 0's all-reduce timed out at 3 s and exited 1; the agent
    names rank 0, the victim."""
    result, events = _recorded("false-restart")
    [b] = blame(events, result["per_fault"])
    assert b["verdict"] == "wrong" and b["truth"] == {"rank": 1, "node": "n1"}
    assert (b["blamed"]["rank"], b["blamed"]["node"], b["blamed"]["words"]) == (
        0, "n0", "failed (exitcode: 1) local_rank: 0 (pid: 5286)")
    assert b["note"] == "rank 0 on n0 was not faulted"
    # a collective error in a survivor is chaoskit's reading (the SDK), not the stack's naming
    assert [n["by"] for n in stack_namings(events)] == ["torchrun agent"]


def test_a_peers_agent_reporting_first_is_wrong_and_the_note_names_the_killed_rank_after_it():
    """The recorded kill of rank 1 (tests/data/goodput/kill-rank), with n1's failure line read after n0's (the two
    agents report their own workers independently: the order is a race)."""
    result, events = _recorded("goodput/kill-rank")
    raced = [{**e, "ts": e["ts"] + 0.8} if e["kind"] == "worker.exit" and e["node"] == "n1" else e for e in events]
    [b] = blame(raced, result["per_fault"])
    assert b["verdict"] == "wrong" and b["blamed"]["rank"] == 0
    assert b["note"] == "rank 0 on n0 was not faulted; then torchrun agent named rank 1 on n1, 0.08s later"
    [b] = blame(events, result["per_fault"])
    assert b["verdict"] == "right" and "note" not in b


def test_a_drill_the_stack_rode_through_blames_nobody():
    result, events = _recorded("rode-through")
    [b] = blame(events, result["per_fault"])
    assert b == {"blamed": None, "truth": {"rank": 1, "node": "n1"}, "verdict": "none"}
    assert blame_line(b) == "no stack named the failed rank or node (none); chaoskit faulted rank 1 on n1"


def test_torchruns_root_cause_block_is_the_naming_of_last_resort():
    """The agent's block when it gives up (torch elastic's _MSG_FORMAT_TEMPLATE), read by RootCause, with no
    failure line on the timeline."""
    rc = RootCause()
    block = """\
    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-01_12:00:00
      host      : n1
      rank      : 1 (local_rank: 0)
      exitcode  : 1 (pid: 4242)
      error_file: <N/A>
      traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
    ============================================================"""
    for line in textwrap.dedent(block).splitlines():
        rc.feed("n1", line)
    [b] = blame([], [_fault("n1", "n1/rank1", 100.0)], root_cause=rc)
    assert b["verdict"] == "right" and b["blamed"]["by"] == "torchrun root cause"
    assert b["blamed"]["words"].startswith("Root Cause (first observed failure): rank: 1 (local_rank: 0), exitcode: 1")
    assert "after_s" not in b["blamed"]


# -- NVRx: the rank monitors and the in-process Wrapper ----------------------------------------------------------


def test_nvrxs_rank_monitor_of_the_blocked_peer_timed_out_first():
    """ft_launcher's real output, rank 1 SIGSTOPped: both ranks' monitors miss heartbeats 27 ms apart, rank 0's
    first (it was blocked in the all-reduce with rank 1)."""
    from tests.test_nvrx_model import T_FAULT, _recorded_timeline

    events = _recorded_timeline()
    [b] = blame(events, [_fault("n0", "n0/rank1", T_FAULT)])
    assert b["verdict"] == "wrong" and b["blamed"]["by"] == "NVRx rank monitor" and b["blamed"]["rank"] == 0
    words = b["blamed"]["words"]
    assert words == "[RankMonServer:0] Did not get subsequent heartbeat. Waited 5.00 seconds."
    log = (ROOT / "tests" / "data" / "nvrx" / "hang-rank1.log").read_text()
    assert "[RankMonServer12733@vm:0] Did not get subsequent heartbeat. Waited 5.00 seconds." in log
    monitors = [n for n in stack_namings(events) if n["by"] == "NVRx rank monitor"]
    assert [n["parties"][0]["rank"] for n in monitors] == [0, 1]


def test_nvrxs_wrapper_names_the_rank_that_raised():
    from tests.test_nvrx_inprocess import recorded

    events, t_fault = recorded("raise")
    [b] = blame(events, [_fault("n0", "n0/rank1", t_fault)])
    assert b["verdict"] == "right" and b["blamed"]["by"] == "NVRx in-process Wrapper" and b["blamed"]["rank"] == 1
    assert b["blamed"]["words"] == "rank=1 fn_ex: RuntimeError('CUDA error: an illegal memory access was encountered')"


def test_nvrxs_wrapper_interrupts_every_rank_for_a_hang_and_so_names_both():
    from tests.test_nvrx_inprocess import recorded

    events, t_fault = recorded("hang")
    [b] = blame(events, [_fault("n0", "n0/rank1", t_fault)])
    assert b["verdict"] == "wrong" and b["blamed"]["ranks"] == [0, 1] and b["blamed"]["rank"] is None
    assert b["blamed"]["words"] == "rank=1 term_ex: RankShouldRestart('Interruption.SOFT_TIMEOUT on ranks={0, 1}')"
    assert b["note"] == "rank 0 on n0 was not faulted; it named rank 1 on n0 too"


# -- torchft: the lighthouse's quorum change and the group that left ----------------------------------------------


def test_torchfts_lighthouse_dropped_the_killed_group_from_its_quorum():
    """torchft's real output, group 1's worker killed: its torchrun agent reports the exit at once; the lighthouse's
    quorum 3 is the one group 1 did not reconfigure for."""
    from tests.test_torchft_model import T_FAULT, _recorded_timeline

    events = _recorded_timeline()
    truth = _fault("n1", "n1/rank0", T_FAULT)
    namings = stack_namings(events)
    lighthouse = [n for n in namings if n["by"] == "torchft lighthouse"]
    assert [(n["words"], n["parties"], n["via"]) for n in lighthouse] == [
        ("Detected quorum change, bumping quorum_id to 3", [{"rank": None, "node": "n1"}],
         "quorum 3: n0 reconfigured for it, n1 did not")]  # quorum 4, group 1's return, drops nobody
    [b] = blame(events, [truth])
    assert b["verdict"] == "right" and b["blamed"]["by"] == "torchrun agent" and b["blamed"]["local_rank"] == 0
    # without its group's torchrun line, the lighthouse is the stack's word
    [b] = blame([e for e in events if e["kind"] != "worker.exit"], [truth])
    assert b["verdict"] == "right" and b["blamed"]["by"] == "torchft lighthouse" and b["blamed"]["node"] == "n1"
    assert 4.5 < b["blamed"]["after_s"] < 5.5


# -- Slurm and Ray: nodes -----------------------------------------------------------------------------------------


class _Scontrol:
    """slurmctld as SlurmProbe asks it: ``scontrol -o show node`` lines, one poll after another."""

    def __init__(self, *polls: list[str]) -> None:
        from chaoskit.cluster.slurm import parse_show

        self.polls = [{f["NodeName"]: f for f in map(parse_show, lines)} for lines in polls]

    def nodes(self) -> dict:
        return self.polls.pop(0)

    def jobs(self, wanted) -> list:
        return []


def test_slurm_names_the_node_it_set_down_with_its_reason():
    from chaoskit.observe.slurm import SlurmProbe

    bus = EventBus()
    probe = SlurmProbe(bus, _Scontrol(
        ["NodeName=n0 Arch=x86_64 State=ALLOCATED NodeAddr=10.77.1.1", "NodeName=n1 Arch=x86_64 State=ALLOCATED NodeAddr=10.77.1.2"],
        ["NodeName=n0 Arch=x86_64 State=ALLOCATED NodeAddr=10.77.1.1",
         "NodeName=n1 Arch=x86_64 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-01T00:00:00] "
         "NodeAddr=10.77.1.2"]))
    probe.poll()
    t_fault = bus.snapshot()[-1]["ts"] if bus.snapshot() else 0.0
    probe.poll()
    [b] = blame(bus.snapshot(), [_fault("n1", "n1", t_fault - 1, kind="power.off")])
    assert b["verdict"] == "right" and b["blamed"]["by"] == "slurmctld" and b["blamed"]["node"] == "n1"
    assert b["blamed"]["words"] == ("NodeName=n1 State=DOWN+NOT_RESPONDING Reason=Not responding "
                                    "[slurm@2026-01-01T00:00:00]")
    assert b["truth"] == {"rank": None, "node": "n1"}
    [b] = blame(bus.snapshot(), [_fault("n0", "n0/rank0", t_fault - 1)])
    assert b["verdict"] == "wrong" and b["note"] == "node n1 was not faulted"


def test_ray_names_the_node_its_gcs_marked_dead(monkeypatch):
    """Blame read from Ray's node state. Mocked: Ray's GCS node table (two answers of ray.util.state's shape), so
    that a unit test needs no Ray cluster; the probe against a real Ray lab, a node declared DEAD, is
    test_ray_transport.py::test_power_off_kills_the_node_and_ray_declares_it_dead."""
    from chaoskit.cluster.transports.ray import node_resource
    from chaoskit.observe import ray_nodes

    tables = [[{"NodeID": "a1", "Alive": True, "Resources": {node_resource("n1"): 1.0}}],
              [{"NodeID": "a1", "Alive": False, "Resources": {},
                "DeathReasonMessage": "health check failed due to missing too many heartbeats"}]]
    monkeypatch.setattr(ray_nodes, "node_table", lambda address, token_file=None: tables.pop(0))
    bus = EventBus()
    probe = ray_nodes.RayNodeProbe(bus, "127.0.0.1:6379", ["n0", "n1"])
    probe.poll()
    probe.poll()
    [dead] = bus.snapshot()
    [b] = blame([dead], [_fault("n1", "n1", dead["ts"] - 1, kind="power.off")])
    assert b["verdict"] == "right" and b["blamed"] == {
        "rank": None, "node": "n1", "by": "Ray GCS", "words": "node DEAD: health check failed due to missing too many heartbeats",
        "after_s": 1.0}


# -- judging ------------------------------------------------------------------------------------------------------


def test_the_truth_is_the_injections_target():
    pids = [make_event("worker.start", 1.0, node="n2", rank=3, pid=77)]
    assert truth_of({"node": "n1", "targets": ["n1/rank1"]}) == [{"rank": 1, "node": "n1"}]
    assert truth_of({"node": "n1", "targets": ["n1"]}) == [{"rank": None, "node": "n1"}]
    assert truth_of({"node": "n1", "targets": ["n1:/ckpt/step-20"]}) == [{"rank": None, "node": "n1"}]
    assert truth_of({"node": "n2", "targets": ["n2/pid77"]}, pids) == [{"rank": 3, "node": "n2"}]
    assert truth_of({"node": "n1", "targets": ["n1/rank1:gpu0"]}) == [{"rank": 1, "node": "n1"}]


def test_a_rank_named_on_a_faulted_node_is_right_for_a_node_fault_and_a_namesake_on_another_node_is_not():
    """torchft's groups each have a rank 0: rank and node must both agree where both sides give them."""
    exit_on = lambda node: [make_event("worker.exit", 11.0, node=node, source="torchrun", who="torchrun agent",
                                       exitcode=-9, local_rank=0, pid=5),
                            make_event("worker.start", 1.0, node=node, rank=0, pid=5)]
    assert blame(exit_on("n1"), [_fault("n1", "n1", 10.0, kind="power.off")])[0]["verdict"] == "right"
    assert blame(exit_on("n0"), [_fault("n1", "n1/rank0", 10.0)])[0]["verdict"] == "wrong"
    # before the fault, or after training resumed: not this fault's naming
    assert blame(exit_on("n1"), [_fault("n1", "n1/rank0", 12.0)])[0]["verdict"] == "none"
    assert blame(exit_on("n1"), [_fault("n1", "n1/rank0", 5.0, t_resumed=9.0)])[0]["verdict"] == "none"


# -- where it shows: result.json, the summary, the report, the scorecard -----------------------------------------


def test_result_json_keeps_blame_per_fault_and_for_the_headline():
    from chaoskit.blame import attach_blame

    result, events = _recorded("cascade")
    result.update(attach_blame(result["per_fault"], events, result["per_fault"][0]))
    text = RunResult.model_validate(result).text()
    again = json.loads(text)
    assert again["blame"]["verdict"] == "right" and again["blame"]["blamed"]["via"] == "pid 24519 was rank 1"
    assert [f["blame"]["blamed"]["rank"] for f in again["per_fault"]] == [1, 2]
    assert RunResult.model_validate(again).per_fault[1].blame.truth.node == "n2"


def test_the_summary_and_the_report_say_whom_the_stack_blamed(tmp_path):
    from chaoskit.blame import attach_blame
    from chaoskit.report.html import write_run_report
    from chaoskit.report.summary import render_result

    result, events = _recorded("false-restart")
    result.update(attach_blame(result["per_fault"], events, result["per_fault"][0]))
    out = io.StringIO()
    render_result(Console(file=out, width=300, no_color=True), result)
    assert ("blame: torchrun agent named rank 0 on n0 (wrong): failed (exitcode: 1) local_rank: 0 (pid: 5286) "
            "[rank 0 on n0 was not faulted]") in out.getvalue()
    # the report of a result from before blame was kept reads it from the timeline
    folder = tmp_path / "run"
    shutil.copytree(DATA / "cascade", folder)
    page = write_run_report(folder).read_text()
    assert ('blame (f1): <span class="ok">torchrun agent named rank 2 on n2 (right): failed (exitcode: -9) '
            'local_rank: 0 (pid: 24518)</span>') in page


def test_a_scorecard_cell_carries_the_blame_verdict(tmp_path):
    """A game day of the recorded false restart (torchrun, 3 s collective timeout, rank 1 paused 6 s) read as a
    scorecard cell: the blame from its timeline, on the page and in the cell."""
    from chaoskit.report.scorecard import render_scorecard_html
    from chaoskit.scorecard import cells_from_gameday

    gameday = tmp_path / "gameday"
    shutil.copytree(DATA / "false-restart", gameday / "01-pause")
    result = json.loads((gameday / "01-pause" / "result.json").read_text())
    (gameday / "gameday.json").write_text(json.dumps({"scenarios": [
        {"scenario": "pause-false-restart", "dir": "01-pause", "status": "fail", "verdict": "fail",
         "phases": result["phases"], "checks": result["checks"]}]}))
    [cell] = cells_from_gameday([("torchrun", "pause", DATA / "false-restart" / "scenario.yaml", None)], gameday)
    assert cell["verdict"] == "false restart"
    assert cell["blame"] == {"verdict": "wrong", "line": (
        "torchrun agent named rank 0 on n0 (wrong): failed (exitcode: 1) local_rank: 0 (pid: 5286) "
        "[rank 0 on n0 was not faulted]")}
    page = render_scorecard_html({"stacks": ["torchrun"], "faults": ["pause"], "cells": [cell], "duration_s": 1})
    assert '<div class="blame wrong"><b>blame: wrong</b> · torchrun agent named rank 0 on n0' in page


# -- the session's game day: real drills ------------------------------------------------------------------------


def test_the_drilled_stacks_blame_in_result_json(recorded_gameday):
    """kill-uninstrumented (rank 1 SIGKILLed, a job that never imports chaoskit): torchrun's agent names it, its pid
    known from the job's own start line, unless the agent of a peer that aborted on the broken collective reports
    its own worker first (a race: the note then names the killed rank after it); hang-rank (rank 2 SIGSTOPped past
    the collective timeout): an agent names a rank whose all-reduce timed out, never the stopped one."""
    killed = recorded_gameday.result("kill-uninstrumented")
    b = killed["blame"]
    assert b["truth"] == {"rank": 1, "node": "n1"} and killed["per_fault"][0]["blame"] == b
    assert b["blamed"]["by"] == "torchrun agent" and b["blamed"]["words"].startswith("failed (exitcode: ")
    assert (b["verdict"] == "right" and b["blamed"]["rank"] == 1 and "(exitcode: -9)" in b["blamed"]["words"]
            or b["verdict"] == "wrong" and "then torchrun agent named rank 1 on n1" in b["note"]), b
    hung = recorded_gameday.result("hang-rank")
    truth = hung["blame"]["truth"]
    assert hung["faults"][0]["targets"] == [f"{truth['node']}/rank{truth['rank']}"]
    assert hung["blame"]["verdict"] == "wrong" and hung["blame"]["blamed"]["rank"] != truth["rank"], hung["blame"]
