"""A job chaoskit starts as root is no way in for another local user (issue 48, finding 1).

The red team's attack: torchrun's c10d rendezvous store listens on 127.0.0.1 at a port anyone reads off the
agents' command lines, takes connections with no login, and torch unpickles what is written under
``torch.rendezvous.<run id>``: root's agent ran the payload. Here a second, unprivileged user (``nobody``)
looks for the drilled job's store exactly that way, while a real kill-rank drill runs on the process lab, and
connects to it: nothing answers, because the job's nodes share a network namespace of their own. The job
runs as the lab's account (``chaoskit-lab``), not root, once that account can reach the job's Python (this
machine's lives under ``/root``, closed to others: the test opens the folders on the way for its length, and a
second test shows the run saying why it kept root when it cannot).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from chaoskit.cluster.transports.local import read_proc
from chaoskit.core.accounts import LAB_ACCOUNT, lab_account, python_paths, unreachable_by
from chaoskit.core.errors import InfraError
from chaoskit.lab.process import ProcessLab
from tests.conftest import SCENARIOS, need, need_root_tool, need_torch, run_cli, short_form, wait_until

NOBODY = 65534


def _connect_as_nobody(port: int) -> subprocess.CompletedProcess:
    """A second user's TCP connection to 127.0.0.1:``port`` (what the red team's pickle needs first)."""
    probe = ("import socket,sys\ns=socket.socket(); s.settimeout(3)\n"
             "try:\n s.connect(('127.0.0.1', int(sys.argv[1]))); print('connected')\n"
             "except OSError as e:\n print('refused', e)\n")
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3",
                           "-c", probe, str(port)], capture_output=True, text=True, timeout=30)


@pytest.fixture
def python_open_to_others():
    """The folders on the way to this Python (and chaoskit) made searchable by others for the test's length
    (``/root`` is 0700 here), restored after: a site installs chaoskit where its job account can read it."""
    changed: list[tuple[Path, int]] = []
    for path in python_paths():
        target = Path(os.path.realpath(path))
        for part in [*reversed(target.parents), target]:
            mode = stat.S_IMODE(os.stat(part).st_mode)
            if os.path.isdir(part) and not mode & stat.S_IXOTH:
                changed.append((part, mode))
                os.chmod(part, mode | stat.S_IXOTH)
    try:
        yield
    finally:
        for part, mode in reversed(changed):
            os.chmod(part, mode)


def _job_agents(run_id_hint: str) -> list:
    return [p for p in read_proc() if "torch.distributed.run" in p.cmdline and run_id_hint in p.cmdline]


def _short_kill_rank(folder: Path) -> Path:
    """kill-rank in a short form, written in ``folder``: rank 1 of two SIGKILLed at step 30 (after the checkpoint of
    step 25) of 50, not of three at 60 of 200 (issue 52). Whom the job runs as and where it listens depend neither on
    its length nor on a third node; kill-rank's own length is drilled by tests/test_drills.py."""
    return short_form(SCENARIOS / "kill-rank.yaml", folder, ("steps: 200", "steps: 50"), ("at: {step: 60}", "at: {step: 30}"),
                      ("cluster: lab ", "cluster: {kind: process, nodes: 2} "))


@pytest.fixture
def open_folder():
    """A folder of root's that others may pass through (pytest's own temporary folders are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="ck-isolation-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_second_user_cannot_reach_the_drilled_jobs_store_and_the_job_is_not_root(open_folder, python_open_to_others):
    need_torch()
    need(os.geteuid() == 0, "root (the job's own namespace and account)")
    need_root_tool("setpriv")
    out = open_folder / "kill-rank"  # the job's folder goes beside the run folder: its account passes through
    res: dict = {}
    scenario = _short_kill_rank(open_folder)
    run = threading.Thread(target=lambda: res.update(r=run_cli("run", scenario, "--out", out, "--json")))
    run.start()
    try:
        deadline = time.time() + 60
        agents = []
        while time.time() < deadline and not agents:
            agents = _job_agents(str(out) + ".job")
            time.sleep(0.2)
        assert agents, "the drill's torchrun agents never showed up"
        port = int(re.search(r"--rdzv-endpoint 127\.0\.0\.1:(\d+)", agents[0].cmdline).group(1))
        users = {os.stat(f"/proc/{p.pid}").st_uid for p in agents}
        attempt = _connect_as_nobody(port)
    finally:
        run.join(timeout=300)
    result = res["r"].json
    assert result["verdict"] == "pass", res["r"].stdout[-2000:]
    assert attempt.stdout.startswith("refused"), (port, attempt.stdout, attempt.stderr)
    job_user = result["cluster"]["job_user"]  # the run's own lab account (another lab may hold chaoskit-lab)
    assert job_user.startswith(LAB_ACCOUNT) and users == {pwd.getpwnam(job_user).pw_uid}, (job_user, users)
    assert result["cluster"]["job_process_users"] == [job_user]
    assert "private network namespace" in result["cluster"]["job_isolation"]
    assert not [line for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith(result["cluster"]["netns"])], "the job's namespace outlived the run"


@pytest.mark.slow
def test_a_job_the_account_cannot_run_stays_root_in_its_namespace_and_the_run_says_why(tmp_path):
    """``--out`` in a folder closed to others (pytest's own is 0700): the account could not reach the job's
    folder, so the job keeps root, still in its own namespace, and result.json and the notes say why."""
    need_torch()
    need(os.geteuid() == 0, "root (the job's own namespace and account)")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    account = lab_account()
    assert unreachable_by(account, [closed]) is not None
    res = run_cli("run", _short_kill_rank(tmp_path), "--out", closed / "run", "--json")
    result = res.json
    assert result["verdict"] == "pass", res.stdout[-2000:]
    assert result["cluster"]["job_user"] == "root"
    assert "cannot run the job" in result["cluster"]["job_user_why"]
    assert any(n.startswith("the job ran as root:") for n in result["notes"]), result["notes"]
    assert "private network namespace" in result["cluster"]["job_isolation"]


def test_unreachable_by_names_the_first_closed_folder(open_folder):
    need(os.geteuid() == 0, "root (the lab's account)")
    account = lab_account()
    inner = open_folder / "a" / "b"
    inner.mkdir(parents=True)
    (open_folder / "a").chmod(0o700)
    problem = unreachable_by(account, [inner])
    assert problem is not None and str(open_folder / "a") in problem and "0700" in problem
    (open_folder / "a").chmod(0o755)
    assert unreachable_by(account, [inner]) is None


def _sleeper(env_scope: str, *prefix: str) -> subprocess.Popen:
    """``sleep 60`` carrying ``env_scope``, returned once it has exec'd ``sleep`` (through ``prefix``, if any):
    a process still in setpriv or between fork and exec would be absent from a node's list for that reason alone."""
    env = {**os.environ, "CHAOSKIT_SCOPE": env_scope}
    proc = subprocess.Popen([*prefix, "sleep", "60"], env=env, stdin=subprocess.DEVNULL)

    def execd() -> bool:
        try:
            return (Path(f"/proc/{proc.pid}/cmdline").read_bytes() == b"sleep\x0060\x00"
                    and b"CHAOSKIT_SCOPE=" + env_scope.encode() in Path(f"/proc/{proc.pid}/environ").read_bytes())
        except OSError:
            return False

    assert wait_until(execd, 10, interval=0.01), f"{proc.args} did not exec sleep"
    return proc


def test_a_lab_nodes_processes_are_the_labs_users_and_younger_than_the_lab():
    """Finding 11: a lab node's processes were any process carrying ``CHAOSKIT_SCOPE=<lab>.n0`` (the lab id is in
    world-readable names): another user's process was listed, and signalled, as n0's. Now the token, a user of
    the lab's (chaoskit's, its job account) and a start after the lab's birth are all needed."""
    need(os.geteuid() == 0, "root (a second user's process)")
    need_root_tool("setpriv")
    older = _sleeper("lab-0ddba11.n0")
    time.sleep(1.5)
    lab = ProcessLab("lab-0ddba11", 2, created=time.time())
    others = _sleeper("lab-0ddba11.n0", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    ours = _sleeper("lab-0ddba11.n0")
    try:
        n0 = lab.inventory()["n0"].conn
        listed = {p.pid for p in n0.processes()}
        assert ours.pid in listed and others.pid not in listed and older.pid not in listed
        assert {pid for _, pid, _ in lab.processes()} == {ours.pid}
        for stranger in (others, older):
            with pytest.raises(InfraError, match="not a process of"):
                n0.signal(stranger.pid, signal.SIGKILL)
            assert stranger.poll() is None
        assert lab.kill_all(grace=1) == 1 and others.poll() is None and older.poll() is None
    finally:
        for p in (older, others, ours):
            p.kill()
            p.wait()


def test_the_plan_says_whom_the_job_runs_as_and_where():
    need(os.geteuid() == 0, "root (the lab's account)")
    res = run_cli("run", SCENARIOS / "kill-rank.yaml", "--dry-run", "--json")
    plan = res.json
    assert plan["cluster"]["job_user"].startswith(LAB_ACCOUNT) and "private network namespace" in plan["cluster"]["job_isolation"]
    assert all(" setpriv --reuid=chaoskit-lab " in cmd and cmd.startswith("ip netns exec ") for cmd in plan["job"].values())
    text = run_cli("run", SCENARIOS / "kill-rank.yaml", "--dry-run").stdout
    assert f"the job runs as {LAB_ACCOUNT}" in text
