"""A newcomer's own script under ``launch: command``: found next to the scenario, refused by ``validate`` when
missing, and, when it dies before steady state, the run's error line says why (its exception), not "see logs"."""

from __future__ import annotations

import json
import textwrap

import pytest

from chaoskit.workloads.root_cause import RootCause
from tests.conftest import need_torch, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

SCENARIO = """\
name: own-script
cluster: {{kind: process, nodes: 2}}
workload:
  launch: command
  command: [{script}, --steps, "40"]
  steps: 40
  max_restarts: {restarts}
steady_state: {{steps: 3, timeout: 2m}}
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 20}}
safety: {{abort_after: 3m}}
"""

# A script that works without torch's process group: the point is where torchrun finds it, and what it prints.
STEPPING = textwrap.dedent("""\
    import json, os, sys, time
    from chaoskit import probe
    probe.worker_start()
    for step in range(1, 41):
        time.sleep(0.05)
        probe.step(step)
""")

DIES_ON_IMPORT = textwrap.dedent("""\
    import sys
    from chaoskit import probe  # its steps, once it trains (it never does)
    def load():
        raise ImportError("Using the `Trainer` with `PyTorch` requires `accelerate>=1.1.0`: run `pip install accelerate`")
    load()
""")


def _write(folder, script_name, body, restarts=0):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / script_name).write_text(body)
    (folder / "scenario.yaml").write_text(SCENARIO.format(script=script_name, restarts=restarts))
    return folder / "scenario.yaml"


def test_validate_refuses_a_missing_relative_script_at_its_line(tmp_path):
    scenario = _write(tmp_path / "s", "train.py", "")
    (tmp_path / "s" / "train.py").unlink()
    res = run_cli("validate", scenario)
    assert res.code == 2
    lines = [l for l in (res.stdout + res.stderr).splitlines() if l.strip()]
    assert len(lines) == 1, lines
    # the line and column of the script in `command: [train.py, ...]`
    assert lines[0].startswith(f"{scenario}:5:13: workload.command: no script {tmp_path / 's' / 'train.py'}"), lines


def test_validate_accepts_the_script_next_to_the_scenario_from_another_folder(tmp_path, monkeypatch):
    _write(tmp_path / "s", "train.py", STEPPING)
    monkeypatch.chdir(tmp_path)  # not the scenario's folder: the script is still found next to the scenario
    res = run_cli("validate", "s/scenario.yaml")
    assert res.code == 0, res.stdout + res.stderr
    plan = run_cli("run", "s/scenario.yaml", "--dry-run", "--json")
    assert plan.code == 0, plan.stdout + plan.stderr
    assert all(f"{tmp_path / 's' / 'train.py'} --steps 40" in cmd for cmd in plan.json["job"].values()), plan.json["job"]


def test_a_torchrun_option_first_is_not_taken_for_a_script(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "scenario.yaml").write_text(SCENARIO.format(script="-m", restarts=0).replace(
        '[-m, --steps, "40"]', '[-m, chaoskit.workloads.ddp_train, --steps, "40"]'))
    res = run_cli("validate", folder / "scenario.yaml")
    assert res.code == 0, res.stdout + res.stderr


def test_the_root_cause_reads_torchruns_block_and_the_last_exception():
    rc = RootCause()
    assert rc.summary() is None
    worker = ["Traceback (most recent call last):", '  File "/x/train.py", line 4, in <module>', "    load()",
              "\x1b[31mImportError: requires accelerate>=1.1.0\x1b[0m"]
    for line in worker:
        rc.feed("n1", f"[default0]:{line}")  # torchrun --tee's prefix on a worker's line
    agent = """\
    Traceback (most recent call last):
      File "/venv/bin/torchrun", line 8, in <module>
    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    /x/train.py FAILED
    ------------------------------------------------------------
    Failures:
      <NO_OTHER_FAILURES>
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-01_12:00:00
      host      : n1
      rank      : 1 (local_rank: 0)
      exitcode  : 1 (pid: 4242)
      error_file: <N/A>
      traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
    ============================================================"""
    for line in textwrap.dedent(agent).splitlines():
        rc.feed("n1", line)
    assert rc.summary() == ("torchrun's root cause: rank 1 on n1 exited 1; ImportError: requires accelerate>=1.1.0 "
                            "(in n1's output)")
    missing = RootCause()
    missing.feed("n0", "/venv/bin/python: can't open file '/run/train.py': [Errno 2] No such file or directory")
    assert "can't open file '/run/train.py'" in missing.summary()


@pytest.mark.slow
def test_a_job_that_dies_on_import_fails_with_its_exception_in_the_error_line(tmp_path):
    """A real process lab and torchrun: the workers die on import; the run's one error line quotes it."""
    need_torch()
    scenario = _write(tmp_path / "s", "train.py", DIES_ON_IMPORT)
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 3, res.stdout[-2000:] + res.stderr[-2000:]
    error = [l for l in res.stderr.splitlines() if "the training job ended before steady state" in l]
    assert len(error) == 1, res.stderr[-3000:]
    assert "ImportError: Using the `Trainer` with `PyTorch` requires `accelerate>=1.1.0`" in error[0], error[0]
    assert "torchrun's root cause: rank " in error[0] and "exited 1" in error[0], error[0]


OWN_LENGTH = """\
name: own-length
cluster: {{kind: process, nodes: 2}}
workload:
  launch: command
  command: [train.py]
  max_restarts: 1
steady_state: {{steps: 3, timeout: 2m}}
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 5}}
safety: {{abort_after: 3m}}
"""

# Its own length (30 steps, not the reference job's 400), resuming from the last step its rank 0 wrote; it ends
# with the exit code it is given. Its ranks never talk to each other, so rank 0 runs on after rank 1 is killed:
# its 25 steps left (5 s) must outlast rank 1's agent opening a new rendezvous round and rank 0's agent seeing it.
# Were rank 0 done first, its agent would exit 0 and rank 1's wait alone for a round no one joins (at 50 ms a
# step, 1 s after the kill, a loaded CI machine once lost that race: the drill aborted at abort_after).
ENDS_WITH = textwrap.dedent("""\
    import os, sys, time
    from pathlib import Path
    from chaoskit import probe
    mark = Path(os.environ["CHAOSKIT_CKPT_DIR"]) / "step"
    start = int(mark.read_text()) if mark.exists() else 0
    probe.worker_start()
    if start:
        with probe.checkpoint_load(start):
            pass
    for step in range(start + 1, 31):
        time.sleep(0.2)
        probe.step(step)
        if step % 5 == 0 and os.environ["RANK"] == "0":
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text(str(step))
    sys.exit({code})
""")


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_a_users_own_job_finishes_at_its_own_end_not_at_the_reference_jobs_length(tmp_path, code):
    """No ``steps:`` in the scenario: finished means the script ended with exit 0 (a torchrun agent exited 0),
    whatever its length; a script that ends with exit 3 did not finish, and the check says so."""
    need_torch()
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "train.py").write_text(ENDS_WITH.format(code=code))
    (folder / "scenario.yaml").write_text(OWN_LENGTH.format())
    res = run_cli("run", folder / "scenario.yaml", "--out", tmp_path / "run")
    assert "starting the command job (until its script ends)" in res.stdout + res.stderr
    check = json.loads((tmp_path / "run" / "result.json").read_text())["checks"]["training_finished"]
    assert check["final_step"] == 30 and check["expected_step"] is None, check
    if code == 0:
        assert res.code == 0 and check["pass"] and 0 in check["exit_codes"].values(), (check, res.stderr[-2000:])
    else:
        assert res.code == 1 and not check["pass"], (check, res.stderr[-2000:])
        assert "expected the job's script to end with exit 0, no torchrun agent did" in res.stdout + res.stderr, res.stdout[-2000:]
