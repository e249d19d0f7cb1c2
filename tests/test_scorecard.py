"""``chaoskit scorecard``: the rows of a folder on every stack, one cell per (stack, fault), never blank.

The end-to-end test is a small scorecard run as a user would: the CLI in-process, the nvrx stack x 2 faults
(SIGKILL, and the live hang: rank 1's training thread held from inside the process while its other threads run on)
from examples/scorecard/, real ft_launcher jobs on the process lab. It is also the live NVRx drill: the hang is
noticed within the heartbeat timeout + 1 s. The SIGSTOP hang under NVRx is scenarios/nvrx-hang-rank.yaml.

The torchrun column is not drilled here (issue 52: each story drilled once): its kill cell is kill-rank
(tests/test_drills.py), its live-hang cell, a survivor's all-reduce timing out at the collective timeout, is
tests/test_inproc_drills.py::test_live_hang_keeps_the_rank_heartbeating_and_peers_detect_it_at_the_collective_timeout;
cards of several stacks side by side are read from recorded scorecards (tests/data/scorecard-pause and
scorecard-slow-save, four stacks: tests/test_no_restart.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from chaoskit.report.scorecard import render_scorecard_html, scorecard_metrics
from chaoskit.scorecard import CannotRun, _bound, adapt_row, cells_from_gameday, stack_timeouts
from chaoskit.stacks.registry import by_column
from tests.conftest import ROOT, need, need_torch, run_cli

ROWS = ROOT / "examples" / "scorecard"


def test_every_stack_adapts_every_row_or_says_why_not():
    for row in sorted(ROWS.glob("*.yaml")):
        for stack in ("torchrun", "nvrx", "torchft", "ray", "slurm"):
            try:
                doc = adapt_row(row, stack)
            except CannotRun as exc:
                assert str(exc), (row, stack)
                continue
            assert doc["name"] == f"{row.stem}--{stack}"
    hang = adapt_row(ROWS / "hang.yaml", "nvrx")
    assert hang["workload"]["recovery"] == "nvrx" and hang["workload"]["nvrx"]["heartbeat_timeout"] == "5s"
    ray = adapt_row(ROWS / "kill.yaml", "ray")
    assert ray["workload"]["launch"] == "ray-train"
    assert ray["faults"][0]["target"] == {"nodes": ["n1"], "process": "RayTrainWorker"}
    with pytest.raises(CannotRun, match="no NIC of their own"):
        adapt_row(ROWS / "nic-down.yaml", "ray")
    # GEMINI pairs each rank with a peer (an odd world is refused at the job's start): the 3-node cascade gets 4
    assert adapt_row(ROWS / "cascade.yaml", "lm-resiliency")["cluster"]["nodes"] == 4
    assert adapt_row(ROWS / "kill.yaml", "lm-resiliency")["cluster"]["nodes"] == 2
    # the job's collective timeout is the row's (train.py --collective-timeout), and its cell says so
    hang = adapt_row(ROWS / "hang.yaml", "lm-resiliency")
    assert "10" in hang["workload"]["command"] and stack_timeouts("lm-resiliency", hang, {})[0]["collective timeout"] == "10s"


def test_timeouts_behind_a_cell_and_a_warning_for_defaults_that_take_minutes():
    timeouts, warnings = stack_timeouts("nvrx", {"workload": {"recovery": "nvrx", "nvrx": {"heartbeat_timeout": "45m"}}}, {})
    assert timeouts["NVRx heartbeat timeout"] == "2700s" and timeouts["collective timeout"].startswith("30s")
    assert any("45 min" in w for w in warnings)
    timeouts, warnings = stack_timeouts("torchrun", {"workload": {"collective_timeout": "30m"}}, {})
    assert timeouts["collective timeout"] == "1800s" and warnings == ["collective timeout 1800s: a hang is noticed only after 30 min"]
    timeouts, warnings = stack_timeouts("slurm", {"workload": {}}, {"cluster": {"slurm": {"slurmd_timeout": 300}}})
    assert timeouts["SlurmdTimeout"] == "300s" and any("SlurmdTimeout" in w for w in warnings)


def test_each_timeout_reads_as_the_drill_ran_it():
    """Issue 50: a row that sets one NVRx setting (check_interval) ran with chaoskit's 5 s heartbeat timeout, the
    validated workload's default, not NVRx's own 45 min; the cell says the drill's numbers and warns of nothing."""
    doc = {"workload": {"recovery": "nvrx", "nvrx": {"check_interval": "1s"}}}
    timeouts, warnings = stack_timeouts("nvrx", doc, {})
    assert timeouts["NVRx heartbeat timeout"] == "5s" and timeouts["NVRx check interval"] == "1s"
    assert timeouts["NVRx initial heartbeat timeout"] == "60s" and not warnings
    # a detection at the heartbeat timeout is bound to the drill's number too
    assert _bound(5.4, "NVRx rank monitor on n0/rank1", doc) == ", at its heartbeat timeout (5s)"
    # the in-process Wrapper's, from its validated defaults
    timeouts, _ = stack_timeouts("nvrx-inprocess", {"workload": {"recovery": "nvrx-inprocess"}}, {})
    assert timeouts["NVRx in-process soft timeout"] == "5s" and timeouts["NVRx in-process hard timeout"] == "60s"


def test_the_nvrx_inprocess_column_says_it_is_deprecated_upstream():
    from chaoskit.report.scorecard import render_scorecard_html

    card = {"stacks": ["torchrun", "nvrx-inprocess"], "faults": [], "cells": [], "repeat": 1, "duration_s": 0,
            "stack_notes": {"nvrx-inprocess": by_column()["nvrx-inprocess"].scorecard_note}}
    assert "NVRx 0.6 deprecated in-process restart" in card["stack_notes"]["nvrx-inprocess"]
    assert "deprecated upstream" in render_scorecard_html(card)
    assert by_column()["torchrun"].scorecard_note is None


def test_a_pair_that_cannot_run_and_a_drill_that_never_noticed_are_cells_not_blanks(tmp_path):
    scen = tmp_path / "hang--torchrun.yaml"
    scen.write_text(yaml.safe_dump({"name": "hang--torchrun", "workload": {"collective_timeout": "60s"}}))
    run = tmp_path / "gameday" / "01-hang--torchrun"
    run.mkdir(parents=True)
    (tmp_path / "gameday" / "gameday.json").write_text(json.dumps({"scenarios": [
        {"scenario": "hang--torchrun", "dir": run.name, "verdict": "fail", "status": "fail",
         "phases": {"detection_s": None, "recovery_s": None, "lost_steps": None}}]}))
    (run / "result.json").write_text(json.dumps({"faults": [{"t_fault": 100.0}], "ended_at": "1970-01-01T00:02:40Z",
                                                 "phases": {"detection_s": None}}))
    cells = cells_from_gameday([("torchrun", "hang", scen, None), ("ray", "nic-down", None, "cannot run here: no NIC")],
                               tmp_path / "gameday")
    assert cells[0]["verdict"] == "not detected" and cells[0]["why"].startswith("not detected within 60s")
    assert cells[0]["timeouts"]["collective timeout"] == "60s"
    assert cells[1]["verdict"] == "cannot run" and cells[1]["why"] == "cannot run here: no NIC"
    card = {"stacks": ["torchrun", "ray"], "faults": ["hang", "nic-down"], "cells": cells, "duration_s": 1}
    page = render_scorecard_html(card)
    assert "NOT DETECTED" in page and "cannot run here: no NIC" in page and "<script" not in page
    text = scorecard_metrics(card).decode()
    assert 'chaoskit_scorecard_cell{fault="nic-down",stack="ray",verdict="cannot run"} 1.0' in text
    assert "chaoskit_scorecard_detection_seconds{" not in text  # not measured: no sample, never zero


def test_a_drill_that_failed_before_its_fault_is_an_error_cell_with_its_own_line(monkeypatch):
    """The full scorecard's cascade x lm-resiliency drill (tests/data/scorecard-error-before-fault): GEMINI refused the
    odd world at the job's start, every agent exited 1, no fault injected. It showed as "cannot run", which is the
    plan's word for a pair that cannot run here; a drill that was started and failed is an error: exit 1, the run's
    own error line in the cell. The CLI's table is fed the card read from the recording (the adapter now gives that
    row an even world, so the drill cannot fail so again here): what is replaced is the drill, not the reading."""
    from chaoskit.cli import scorecard_cmd

    rec = ROOT / "tests" / "data" / "scorecard-error-before-fault"
    [cell] = cells_from_gameday([("lm-resiliency", "cascade", rec / "scenarios" / "cascade--lm-resiliency.yaml", None)],
                                rec / "gameday")
    assert cell["verdict"] == "error", cell
    assert cell["why"].startswith("failed before its fault: the training job ended before steady state (agent exit "
                                  "codes {'n0': 1, 'n1': 1, 'n2': 1}): FileNotFoundError"), cell["why"]
    assert "cannot run" not in cell["why"] and cell["dir"].endswith("02-cascade--lm-resiliency")
    assert cell["timeouts"]["collective timeout"] == "30s (chaoskit's default; torch's own is 30 min, NCCL's watchdog 10 min)"
    card = {"stacks": ["lm-resiliency"], "faults": ["cascade"], "cells": [cell], "duration_s": 1}
    page = render_scorecard_html(card)
    assert '<div class="verdict">ERROR</div>' in page and "failed before its fault: the training job ended" in page
    assert "CANNOT RUN" not in page and "1 error" in page
    assert 'chaoskit_scorecard_cell{fault="cascade",stack="lm-resiliency",verdict="error"} 1.0' in scorecard_metrics(card).decode()
    monkeypatch.setattr(scorecard_cmd, "run_scorecard", lambda *args, **kwargs: card)
    r = run_cli("scorecard", ROWS, "--stacks", "lm-resiliency")
    assert r.code == 1, r
    assert "cascade x lm-resiliency error         detect - recover - lost -  failed before its fault:" in r.stdout, r.stdout
    assert "cannot run" not in r.stdout


def test_on_a_plain_install_what_is_missing_is_named_before_any_drill(tmp_path, monkeypatch):
    """Issue 50: on a plain install (no extras) the scorecard ran every drill, then died writing metrics.prom
    (ModuleNotFoundError: prometheus_client). Uninstalling packages under the suite is not possible, so what is
    mocked is the two lookups that find them (torch's, prometheus_client's)."""
    import importlib.util

    import chaoskit.scorecard as sc

    real = importlib.util.find_spec
    monkeypatch.setattr(sc.importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real(name, *a))
    monkeypatch.setattr(sc, "torch_available", lambda: False)
    r = run_cli("scorecard", ROWS, "--stacks", "torchrun", "--out", tmp_path / "sc")
    assert r.code == 3 and "PyTorch is not installed; no drill was run" in r.stderr and "chaoskit[workload]" in r.stderr
    assert not (tmp_path / "sc" / "gameday").exists()
    # with torch but without prometheus_client: said before the drills, and the card says why no metrics.prom
    monkeypatch.setattr(sc, "torch_available", lambda: True)
    notes = sc._missing_before_drills([tmp_path / "row.yaml"], None)
    assert notes == ["metrics.prom not written: it needs prometheus_client (pip install 'chaoskit[prometheus]')"]


def test_an_interrupted_scorecard_says_which_drills_did_not_run(tmp_path):
    """SIGTERM during the game day: the drill it stopped and those after it are errors that say so, not "not
    detected: the fault was not injected" (as an interrupted full scorecard showed its 50 unrun cells)."""
    scens = []
    for name in ("kill--torchrun", "kill--nvrx"):
        scens.append(tmp_path / f"{name}.yaml")
        scens[-1].write_text(yaml.safe_dump({"name": name, "workload": {}}))
    (tmp_path / "gameday").mkdir()
    (tmp_path / "gameday" / "gameday.json").write_text(json.dumps({"interrupted": True, "scenarios": [
        {"scenario": "kill--torchrun", "dir": "01-kill--torchrun", "status": "interrupted", "verdict": None},
        {"scenario": "kill--nvrx", "dir": "02-kill--nvrx", "status": None, "verdict": None}]}))
    cells = cells_from_gameday([("torchrun", "kill", scens[0], None), ("nvrx", "kill", scens[1], None)],
                               tmp_path / "gameday")
    assert [(c["verdict"], c["why"]) for c in cells] == [
        ("error", "interrupted by Ctrl-C or SIGTERM during the drill"), ("error", "not run: the game day ended before it")]


def test_unknown_stack_is_bad_input(tmp_path):
    r = run_cli("scorecard", ROWS, "--stacks", "torchrun,kubeflow", "--out", tmp_path / "sc")
    assert r.code == 2 and "unknown stack kubeflow" in r.stderr
    assert not (tmp_path / "sc").exists()
    typo = run_cli("scorecard", ROWS, "--stacks", "torchrun,nvxr", "--out", tmp_path / "sc")
    assert typo.code == 2 and "unknown stack nvxr (did you mean 'nvrx'?)" in typo.stderr


@pytest.mark.slow
def test_a_small_scorecard_end_to_end(tmp_path):
    need_torch()
    import importlib.util

    need(importlib.util.find_spec("nvidia_resiliency_ext") is not None, "nvidia-resiliency-ext (chaoskit[frameworks])")
    rows = tmp_path / "rows"
    rows.mkdir()
    for name in ("kill.yaml", "live-hang.yaml"):
        shutil.copy(ROWS / name, rows / name)
    out = tmp_path / "card"
    r = run_cli("scorecard", rows, "--stacks", "nvrx", "--out", out, "--json")
    assert r.code == 0, r.stderr[-3000:]
    card = json.loads((out / "scorecard.json").read_text())
    assert card == r.json
    cells = {(c["stack"], c["fault"]): c for c in card["cells"]}
    assert set(cells) == {("nvrx", f) for f in ("kill", "live-hang")}
    assert all(c["verdict"] and c["why"] for c in card["cells"])
    nvrx = cells[("nvrx", "live-hang")]
    assert nvrx["detection_s"] is not None and nvrx["detection_s"] <= 5.0 + 1.0, nvrx
    assert nvrx["detected_by"].startswith("NVRx rank monitor") and nvrx["timeouts"]["NVRx heartbeat timeout"] == "5s"
    assert "at its heartbeat timeout (5s)" in nvrx["why"]
    kill = cells[("nvrx", "kill")]
    assert kill["verdict"] == "pass" and kill["detection_s"] < 5.0 and kill["lost_steps"] is not None, kill
    page = (out / "index.html").read_text()
    assert "NVRx heartbeat timeout: 5s" in page and "<script" not in page
    metrics = (out / "metrics.prom").read_text()
    assert 'chaoskit_scorecard_detection_seconds{fault="live-hang",stack="nvrx"}' in metrics
    assert json.loads((out / "gameday" / "gameday.json").read_text())["scorecard"]["cells"] == card["cells"]
