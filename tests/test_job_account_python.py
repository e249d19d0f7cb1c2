"""The Python ``make`` builds the venv from is one the lab's job account can run (issue 48, item 0).

As root, a lab's job runs as ``chaoskit-lab``; where that account cannot run the job's Python (a pyenv under
``/root``, mode 0700, as on this project's machines) the job keeps root and the run says why. So the Makefile
makes the venv from the system's ``/usr/bin/python3`` (3.10+ with venv), not from whatever ``python3`` is first
on ``PATH``, and these tests show the account really runs what ``make`` made, and that CI's own venv is one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from chaoskit.core.accounts import lab_account, python_paths, setpriv_argv, unreachable_by
from tests.conftest import ROOT, need, need_root_tool


@pytest.fixture
def open_folder():
    """A folder of root's that others may pass through (pytest's own temporary folders are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="ck-venv-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_venv_make_builds_runs_as_the_labs_account(open_folder):
    need_root_tool("setpriv")
    need(shutil.which("make") is not None, "make (apt-get install make)")
    venv = open_folder / "venv"
    plan = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), f"VENV={venv}", f"{venv}/bin/python"],
                          capture_output=True, text=True, timeout=60)
    interpreter, *rest = plan.stdout.split()
    assert plan.returncode == 0 and rest == ["-m", "venv", str(venv)], plan.stdout + plan.stderr
    # what make runs, without pip (ensurepip costs seconds; `make test` itself shows it works)
    made = subprocess.run([interpreter, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    account = lab_account()
    python = venv / "bin" / "python"
    assert unreachable_by(account, [python]) is None, os.path.realpath(python)
    ran = subprocess.run([*setpriv_argv(account), str(python), "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(venv)


def test_the_suites_own_python_is_one_the_labs_account_can_run():
    """CI builds its venv with ``make``: a venv whose Python the account cannot reach would quietly keep every
    lab job root. Outside CI an older venv (``python3 -m venv`` from a pyenv in /root) is only reported."""
    need(os.geteuid() == 0, "root (the lab's account)")
    problem = unreachable_by(lab_account(), python_paths())
    need(problem is None, f"a venv chaoskit-lab can run (rebuild it with make: {problem})")
