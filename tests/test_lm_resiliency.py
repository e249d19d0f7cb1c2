"""``recovery: lm-resiliency`` (issue 50, item 2): lm-resiliency 0.2.0's torchrun backend, GEMINI's in-memory
checkpoint in the job, and the agent as the manager lm-resiliency does not ship (docs/recovery-stacks.md,
"lm-resiliency"). The drill runs the shipped scenario on the process lab: a real torchrun agent, two real worker
processes over gloo, rank 1 SIGKILLed; nothing is mocked. It needs lm-resiliency in the job's Python:
``make test`` installs it into ``.venv/lmr`` (not into the venv: the Makefile says why) and the drill puts that
folder on the job's ``PYTHONPATH``; ``pip install 'chaoskit[lm-resiliency]'`` does as well. Without either the drill
is skipped, saying so, and fails in CI."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT, need, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

SCENARIO = ROOT / "examples" / "frameworks" / "lm-resiliency-kill-rank.yaml"
LMR = ROOT / ".venv" / "lmr"
"""Where ``make test`` installs lm-resiliency for this drill."""


def test_the_plan_runs_each_agent_with_the_lm_resiliency_backend_and_a_node_identity_of_its_own(tmp_path):
    res = run_cli("run", SCENARIO, "--dry-run", "--out", tmp_path / "run")
    assert res.code == 0, res.stderr
    agent = next(line for line in res.stdout.splitlines() if "chaoskit.stacks.lm_resiliency_agent" in line)
    assert "--rdzv-backend lm_resiliency" in agent and "--nnodes 1:1" in agent
    assert "lm_resiliency_restart_context_path=" in agent and "lm_resiliency_join_timeout_ms=120000" in agent
    assert "LM_RESILIENCY_MACHINE_ID_PATH=" in res.stdout


def test_it_is_refused_for_a_job_chaoskit_writes(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.read_text().replace("launch: command", "launch: reference"))
    res = run_cli("validate", path)
    assert res.code == 2 and "recovery: lm-resiliency is only used with launch: command" in res.stderr, res.stderr


@pytest.mark.slow
def test_a_killed_rank_comes_back_from_gemini_in_a_generation_the_agent_published(tmp_path, monkeypatch):
    if importlib.util.find_spec("lm_resiliency") is None and (LMR / "lm_resiliency").is_dir():
        monkeypatch.setenv("PYTHONPATH", str(LMR))  # the job's agents and workers inherit it
    else:
        need(importlib.util.find_spec("lm_resiliency") is not None,
             "lm-resiliency (make test installs it into .venv/lmr; or pip install 'chaoskit[lm-resiliency]')")
    res = run_cli("run", SCENARIO, "--out", tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res.code == 0 and result["verdict"] == "pass", res.stdout + res.stderr
    phases = result["phases"]
    # the survivor's flush of its shard and of rank 1's replica came back: at most the step in flight is redone
    assert phases["restored_from"] == "load line" and phases["last_step_before"] - phases["restored_step"] <= 1
    assert phases["reallocation_from"] == "log line"  # GEMINI's pairing line: the new world's ranks started
    assert result["blame"]["verdict"] == "right" and result["blame"]["blamed"]["by"] == "torchrun agent"
    job_log = (tmp_path / "run" / "logs" / "n0.log").read_text(errors="replace")
    assert "[lm-resiliency manager] published generation 1 checkpoint_step" in job_log
    assert "Loaded exact checkpoint at manager-selected step" in job_log


def test_its_scorecard_column_runs_the_rows_fault_on_the_example_job_at_the_rows_pace():
    import yaml

    from chaoskit.stacks.api import CannotRun
    from chaoskit.stacks.registry import by_column

    column, rows = by_column()["lm-resiliency"], ROOT / "examples" / "scorecard"
    doc = column.adapt_row(yaml.safe_load((rows / "hang.yaml").read_text()), rows)
    w = doc["workload"]
    assert (w["launch"], w["recovery"], w["steps"]) == ("command", "lm-resiliency", 120)
    assert w["command"][0] == str(ROOT / "examples" / "frameworks" / "lm-resiliency" / "train.py")
    assert w["command"][1:] == ["--steps", "120", "--step-time", "0.05", "--collective-timeout", "10"]
    assert doc["faults"][0]["target"] == {"ranks": [1]} and "lm-resiliency" in doc["probes"]["presets"]
    with pytest.raises(CannotRun, match="no lm-resiliency training job"):
        column.adapt_row(yaml.safe_load((rows / "kill.yaml").read_text()), ROOT / "tests")
