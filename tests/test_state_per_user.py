"""Labs and locks are per user (issue 51): a user who is not root never adopts, locks on or reads another user's lab
record or run lock; it says so in one line and goes on with its own; ``CHAOSKIT_SHARED_STATE=1`` shares them on
purpose. Run as a second real user (``nobody``, through setpriv) against files root made, as on a shared machine."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, need_root_tool

LAB = {"lab_id": "lab-0000beef", "nodes": 2, "created": 1.0}

LOCK = textwrap.dedent("""
    import sys
    from chaoskit.core.errors import InfraError
    from chaoskit.core.state import state_dir
    from chaoskit.safety.lock import ClusterLock
    try:
        lock = ClusterLock(state_dir(), "lab-0000beef").acquire()
    except InfraError as exc:
        print("refused:", exc)
    else:
        print("held", lock.path)
        lock.release()
""")


@pytest.fixture
def nobody():
    """``(run, home, base)``: ``run(*argv, **env)`` runs chaoskit's Python as ``nobody`` with its own HOME (``home``);
    ``base`` a folder of root's that anyone may pass through (pytest's own is root's alone)."""
    need_root_tool("setpriv")
    user = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="ck-state-user-"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)

    def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT)}
        return subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                               "env", "-i", *(f"{k}={v}" for k, v in {**base, **env}.items()), sys.executable, *argv],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)

    yield run, home, base
    shutil.rmtree(base, ignore_errors=True)


def _plant(folder, owner: int | None = None) -> None:
    """A lab record as root's ``chaoskit lab up`` leaves it, in ``folder`` (made ``owner``'s, 0755)."""
    (folder / "lab").mkdir(parents=True, exist_ok=True)
    (folder / "locks").mkdir(exist_ok=True)
    (folder / "lab" / "process.json").write_text(json.dumps(LAB))
    for sub in (folder, folder / "lab", folder / "locks"):
        sub.chmod(0o755)
        if owner is not None:
            os.chown(sub, owner, owner)


def test_another_users_state_folder_is_not_adopted_and_the_user_goes_on_with_its_own(nobody):
    run, home, base = nobody
    shared = base / "shared"  # root's, readable: /var/lib/chaoskit made before state was kept private
    _plant(shared)
    before = (shared / "lab" / "process.json").read_bytes()
    own = home / ".local" / "state" / "chaoskit"
    status = run("-m", "chaoskit", "lab", "status", CHAOSKIT_STATE_DIR=str(shared))
    assert status.returncode == 0 and "lab-0000beef" not in status.stdout, status.stdout + status.stderr
    assert status.stderr == (f"chaoskit: {shared} belongs to uid 0 (root), not yours: its labs and locks are not "
                             f"yours; using your own {own}\n")
    up = run("-m", "chaoskit", "lab", "up", "--nodes", "2", CHAOSKIT_STATE_DIR=str(shared))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        record = own / "lab" / "process.json"
        assert json.loads(record.read_text())["lab_id"] != LAB["lab_id"]
        assert os.stat(record).st_uid == pwd.getpwnam("nobody").pw_uid
    finally:
        down = run("-m", "chaoskit", "lab", "down", CHAOSKIT_STATE_DIR=str(shared))
    assert down.returncode == 0, down.stdout + down.stderr
    assert list((shared / "locks").iterdir()) == [] and (shared / "lab" / "process.json").read_bytes() == before


def test_roots_lab_and_held_lock_in_the_users_folder_are_ignored_unless_shared_on_purpose(nobody):
    run, home, base = nobody
    state = base / "state"  # the user's own folder, where root (sudo -E) left a lab and holds a run lock
    _plant(state, owner=pwd.getpwnam("nobody").pw_uid)
    os.chown(state / "lab" / "process.json", 0, 0)
    lock = state / "locks" / "lab-0000beef.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"pid %d" % os.getpid())
        print("held", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status = run("-m", "chaoskit", "lab", "status", CHAOSKIT_STATE_DIR=str(state))
        assert status.returncode == 0 and "lab-0000beef" not in status.stdout, status.stdout + status.stderr
        assert status.stderr == (f"chaoskit: the process lab record {state}/lab/process.json belongs to uid 0 (root), "
                                 "not yours: ignored (CHAOSKIT_SHARED_STATE=1 shares it on purpose)\n")
        locked = run("-c", LOCK, CHAOSKIT_STATE_DIR=str(state))
        assert locked.stdout == f"held {state}/locks/lab-0000beef.uid{pwd.getpwnam('nobody').pw_uid}.lock\n", locked.stderr
        assert locked.stderr == (f"chaoskit: the lock of cluster 'lab-0000beef' {lock} belongs to uid 0 (root), not "
                                 "yours: ignored (CHAOSKIT_SHARED_STATE=1 shares it on purpose)\n")
        shared = run("-m", "chaoskit", "lab", "status", CHAOSKIT_STATE_DIR=str(state), CHAOSKIT_SHARED_STATE="1")
        assert "lab-0000beef" in shared.stdout and shared.stderr == "", shared.stdout + shared.stderr
        waited = run("-c", LOCK, CHAOSKIT_STATE_DIR=str(state), CHAOSKIT_SHARED_STATE="1")
        assert waited.stdout == f"refused: cluster 'lab-0000beef' is locked by pid {holder.pid}\n", waited.stderr
    finally:
        holder.communicate("\n", timeout=10)
    assert lock.exists() and os.stat(lock).st_uid == 0  # root's lock: not removed by the user's runs
