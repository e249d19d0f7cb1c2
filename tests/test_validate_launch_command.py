"""What ``validate`` holds a scenario to, as a new user writes one (issue 51, items 6 and 7).

A ``launch: command`` job runs until its script ends: ``validate`` does not hold it to the reference job's default
``steps: 400`` (only to a ``steps`` the scenario sets). A ``step`` log rule without a ``(?P<step>...)`` group can
never give a step: ``validate`` refuses it at the rule, file:line:col, with a hint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

COMMAND = """\
name: own-script-late-fault
cluster: {{kind: process, nodes: 2}}
workload:
  launch: command
  command: [train.py]
{steps}faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 500}}
"""


def _command_scenario(folder: Path, steps: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("from chaoskit import probe\nprobe.step(1)\n")  # it reports its steps
    path = folder / "scenario.yaml"
    path.write_text(COMMAND.format(steps=steps))
    return path


def test_a_command_job_without_steps_is_not_held_to_the_reference_jobs_400(tmp_path):
    res = run_cli("validate", _command_scenario(tmp_path / "s"))
    assert res.code == 0, res.stdout + res.stderr
    assert "400" not in res.stdout + res.stderr


def test_a_command_job_that_sets_steps_is_held_to_them(tmp_path):
    path = _command_scenario(tmp_path / "s", steps="  steps: 300\n")
    res = run_cli("validate", path)
    assert res.code == 2
    assert f"{path}:10:16: faults.0.at.step: step 500 is never reached: the job runs 300 steps" in res.stderr


def test_the_reference_job_is_still_held_to_its_default_steps(tmp_path):
    path = tmp_path / "reference.yaml"
    path.write_text("name: late\ncluster: {kind: process, nodes: 2}\nworkload: {launch: reference}\n"
                    "faults:\n  - {kind: process.kill, target: {ranks: [1]}, at: {step: 500}}\n")
    res = run_cli("validate", path)
    assert res.code == 2 and "the job runs 400 steps" in res.stderr


STEP_RULE = """\
name: uninstrumented-steps
cluster: {{kind: process, nodes: 2}}
workload: {{launch: uninstrumented}}
probes:
  sdk: false
  log:
    - match: 'loss='
      event: detect
    - match: {match}
      event: step
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 60}}
"""


def test_a_step_rule_without_a_step_group_is_refused_at_its_line_with_a_hint(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STEP_RULE.format(match=r"'step \d+'"))
    res = run_cli("validate", path)
    assert res.code == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert any(line.startswith(f"{path}:9:14: probes.log.1.match: a step rule needs a group named step "
                               "((?P<step>...))") for line in lines), res.stderr
    # a run refuses it the same way before anything starts: one line, and the hint with what to write
    run = run_cli("run", path, "--out", tmp_path / "run")
    assert run.code == 2, run.stderr
    error, hint = run.stderr.strip().splitlines()
    assert error.startswith(f"error: {path}:9:14: probes.log.1.match: a step rule needs a group named step")
    assert hint == r"hint: capture the step number, e.g. match: 'step (?P<step>\d+)'"
    assert not (tmp_path / "run").exists()


def test_a_step_rule_with_its_step_group_passes(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STEP_RULE.format(match=r"'step (?P<step>\d+)'"))
    res = run_cli("validate", path)
    assert res.code == 0, res.stdout + res.stderr


PLAIN = """\
name: plain-script
cluster: {{kind: process, nodes: 2}}
workload:
  launch: command
  command: [train.py]
{more}faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{{at}}}
"""


def _plain(folder: Path, more: str = "", at: str = "step: 50") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("for step in range(100):\n    print(f'Step {step}', flush=True)\n")
    path = folder / "scenario.yaml"
    path.write_text(PLAIN.format(more=more, at=at))
    return path


def test_a_plain_script_whose_steps_nobody_reads_is_refused_at_the_step_that_can_never_fire(tmp_path):
    """Issue 51, item 5(b): a script that neither uses chaoskit nor has a ``step`` log rule or preset reads its
    steps gives no step event (torchrun's lines carry none): ``at.step`` and steady state never come. ``validate``
    refuses it at the ``at.step`` (else at ``steady_state``) with the reason and a hint; a step rule makes it ok."""
    path = _plain(tmp_path / "a")
    res = run_cli("validate", path)
    assert res.code == 2
    assert f"{path}:9:16: faults.0.at.step: can never fire: no step event can come (train.py does not use chaoskit" in res.stderr
    assert "is never reached; add a probes.log rule for the job's step line" in res.stderr
    path = _plain(tmp_path / "b", more="steady_state: {steps: 3}\n", at="after: 5s")
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:6:15: steady_state: can never fire" in res.stderr
    rule = "probes:\n  log:\n    - {event: step, match: 'Step (?P<step>\\d+)'}\n"
    res = run_cli("validate", _plain(tmp_path / "c", more=rule))
    assert res.code == 0, res.stderr
