"""Each lab's job runs as a lab account of its own (issue 48, item 0): one lab's job cannot reach another's folders.

Every lab used to run its job as one account, ``chaoskit-lab``: the job of lab A could then read and write lab B's
in-process channel (``RUN.job/inproc``), its checkpoints and its state, all that account's. Now a lab (a run on the
process or netns lab, a Ray lab) holds one of ``chaoskit-lab``, ``chaoskit-lab-1`` ... while it lives (an ``flock``
on its claim, let go by the kernel when its holder dies), and an account that processes still run as is not handed
out. Real accounts (``useradd``), real processes (``setpriv``), real folders made as the runner makes a job's
(:func:`chaoskit.core.files.make_folder_for`), real network namespaces; nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from chaoskit.audit import _controller_leftovers
from chaoskit.backends.process import ProcessBackend, ProcessSpec
from chaoskit.core.accounts import JOB_GROUP, LAB_ACCOUNT, claim_lab_account, job_group, lab_account_names, setpriv_argv
from chaoskit.core.files import make_folder_for
from tests.conftest import ROOT, SYSTEM_PYTHON, need, need_root_tool, run_cli, wait_until


@pytest.fixture
def root_tools():
    need(os.geteuid() == 0, "root (the lab accounts)")
    need_root_tool("useradd")
    need_root_tool("setpriv")


@pytest.fixture
def two_claims(root_tools):
    """Two labs' accounts, held for the test (as two labs up at once hold them)."""
    a, b = claim_lab_account(), claim_lab_account()
    try:
        yield a, b
    finally:
        a.release()
        b.release()


@pytest.fixture
def job_group_folder(root_tools):
    """A folder of root's that the lab accounts' group may pass through (0710), as the tests' own folders are."""
    base = Path(tempfile.mkdtemp(prefix="ck-lab-accounts-"))
    os.chown(base, 0, job_group())
    base.chmod(0o710)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(account, code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run by the system Python as ``account`` (its own groups, as a lab's job runs)."""
    return subprocess.run([*setpriv_argv(account), SYSTEM_PYTHON, "-c", code, *args], capture_output=True, text=True,
                          timeout=30, cwd="/")


TRY = """
import os, sys
folder = sys.argv[1]
for what, act in (("list", lambda: os.listdir(folder)),
                  ("read", lambda: open(os.path.join(folder, "order.json")).read()),
                  ("plant", lambda: open(os.path.join(folder, "planted"), "x").write("x")),
                  ("checkpoint", lambda: open(os.path.join(os.path.dirname(folder), "checkpoints", "step-25.pt"), "rb").read())):
    try:
        act()
        print(what, "ok")
    except OSError as exc:
        print(what, type(exc).__name__)
"""


def test_two_labs_at_once_hold_two_accounts_and_one_cannot_reach_the_others_channel(two_claims, job_group_folder):
    a, b = two_claims
    assert a.account.name != b.account.name and {a.account.name, b.account.name} <= set(lab_account_names())
    gid = job_group()
    assert gid in a.account.groups and gid in b.account.groups  # both pass through the group's 0710 folders
    # lab B's job folder as the runner makes it beside B's run folder: its channel and checkpoints, B's account's
    job = make_folder_for(job_group_folder / "b-run.job", b.account.uid, b.account.gid, dirs=("checkpoints", "inproc"))
    for rel in ("inproc/order.json", "checkpoints/step-25.pt"):
        (job / rel).write_text("{}")
        os.chown(job / rel, b.account.uid, b.account.gid)
    mine = _as(b.account, TRY, str(job / "inproc"))
    assert mine.stdout.split() == ["list", "ok", "read", "ok", "plant", "ok", "checkpoint", "ok"], mine.stderr
    (job / "inproc" / "planted").unlink()
    other = _as(a.account, TRY, str(job / "inproc"))  # lab A's job, as A's account
    assert other.stdout.split() == ["list", "PermissionError", "read", "PermissionError", "plant", "PermissionError",
                                    "checkpoint", "PermissionError"], other.stderr
    assert not (job / "inproc" / "planted").exists()


def test_a_held_account_is_never_handed_out_again_until_released(two_claims):
    a, b = two_claims
    c = claim_lab_account()
    try:
        assert c.account.name not in (a.account.name, b.account.name)
    finally:
        c.release()
    name = a.account.name
    a.release()
    again = claim_lab_account(name)  # free once let go
    try:
        assert again.account.name == name
    finally:
        again.release()


def test_an_account_that_processes_still_run_as_is_not_handed_out_and_audit_names_them(root_tools):
    """A job's leftover (or a Ray lab's nodes) keeps its account: the next lab gets another; ``chaoskit audit``
    and ``chaoskit lab down`` name processes that run as a lab account no run or lab holds."""
    first = claim_lab_account()
    name = first.account.name
    left = subprocess.Popen([*setpriv_argv(first.account), "sleep", "60"], cwd="/")
    try:
        assert wait_until(lambda: os.stat(f"/proc/{left.pid}").st_uid == first.account.uid, 10)  # setpriv dropped
        first.release()  # its run ended (or died), its job's process did not
        nxt = claim_lab_account()
        try:
            assert nxt.account.name != name
        finally:
            nxt.release()
        found = [x for x in _controller_leftovers(set()) if x.kind == "account"]
        assert any(name in x.what and f"pid {left.pid}" in x.what for x in found), found
        down = run_cli("lab", "down").stdout  # lab down says so too
        assert any(line.startswith(f"lab account {name}:") and str(left.pid) in line for line in down.splitlines()), down
    finally:
        left.kill()
        left.wait()
    assert not [x for x in _controller_leftovers(set()) if x.kind == "account" and name in x.what]


def test_two_process_lab_runs_at_once_get_two_accounts_and_give_them_back(root_tools):
    """What the process lab's backend gives the runner: a job account of the run's own (and its nodes' processes
    are root's or that account's, no other lab's); the account is free again after the run's teardown."""
    need_root_tool("ip")
    backend = ProcessBackend()
    one = backend.open(ProcessSpec(nodes=1), ROOT)
    try:
        two = backend.open(ProcessSpec(nodes=1), ROOT)
        try:
            assert one.job_account.name != two.job_account.name
            assert one.job_account.name.startswith(LAB_ACCOUNT) and two.job_account.name.startswith(LAB_ACCOUNT)
            assert one.inventory.nodes[0].conn.uids == {0, one.job_account.uid}
        finally:
            two.teardown()
        back = claim_lab_account(two.job_account.name)
        back.release()
    finally:
        one.teardown()


def test_the_accounts_are_in_the_job_group(root_tools):
    claim = claim_lab_account()
    try:
        groups = subprocess.run(["id", "-nG", claim.account.name], capture_output=True, text=True).stdout.split()
        assert JOB_GROUP in groups
    finally:
        claim.release()


def test_the_slurm_labs_plan_says_its_job_runs_as_a_lab_account(root_tools):
    """The Slurm lab's generated batch script is submitted as a lab account of the run's own (Slurm runs a job as its
    submitter; the lab's slurm.conf and munge socket are in a folder of that account's group): its plan says so, and
    no why for a root job. The drill itself (tests/test_slurm.py's kill-rank) checks whom its processes ran as."""
    from tests.conftest import SCENARIOS

    plan = run_cli("run", SCENARIOS / "slurm-kill-rank.yaml", "--dry-run", "--json").json
    assert plan["cluster"]["job_user"].startswith(f"{LAB_ACCOUNT} or the first free of"), plan["cluster"]
    assert "job_user_why" not in plan["cluster"], plan["cluster"]
    assert plan["cluster"]["slurm"]["conf"].startswith("/run/chaoskit-slurm/"), plan["cluster"]
