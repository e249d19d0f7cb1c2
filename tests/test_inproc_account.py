"""The in-process channel of a job that runs as the lab's account, not root (issue 48, item 0).

Root's state folder (``/run/chaoskit``, 0700) is closed to ``chaoskit-lab``, so a job that runs as that account
gets its own channel folder, ``RUN.job/inproc``: the account's, 0700, in the job's own folder. There the job reads
its orders and writes its answers; nobody but root and the account may write, so a pid-keyed name is no way in
for another local user. Root's helper (:mod:`chaoskit.nodeside.inproc_tool`) treats the folder as the account's:
it walks to it from ``/`` following no link, refuses it when anyone else may write in it, reaches every name from
its descriptor, reads an answer only as a regular file of the account's with one link (bounded), and makes an order
under a random name renamed over the old one. Here the account plants what it could (links, a FIFO, a link for
the folder itself, a folder others may write), root plants what only root could (a hard link), and a second user
tries to plant orders and answers. The drill of a job that runs as the account (scenarios/inproc-hang.yaml, its end
in the job's channel) is tests/test_inproc_drills.py's live hang (one drill of that scenario, issue 52).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from chaoskit.core.accounts import lab_account, setpriv_argv, unreachable_by
from chaoskit.core.files import make_folder_for
from chaoskit.faults.inproc import HELPER, InprocHangFault, job_channel
from tests.conftest import ROOT, SYSTEM_PYTHON, need, need_root_tool

NOBODY = 65534
SECRET = "root-only-9f1c"


@pytest.fixture
def account():
    need_root_tool("setpriv")
    return lab_account()


@pytest.fixture
def channel(account):
    """``(base, folder)``: ``base`` a folder of root's others may pass through; ``folder`` the job's channel in
    ``base/run.job``, made as the runner makes it (the job's folder and its ``inproc``, given to the account)."""
    base = Path(tempfile.mkdtemp(prefix="ck-inproc-account-"))
    base.chmod(0o755)
    try:
        make_folder_for(base / "run.job", account.uid, account.gid, dirs=("inproc",))
        yield base, base / "run.job" / "inproc"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(uid: int, gid: int, code: str, *args: str, env: dict | None = None, wait: bool = True):
    """``code`` run by the system's Python as ``uid``/``gid`` (no other groups)."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", SYSTEM_PYTHON, "-c", code, *args]
    if not wait:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", HELPER, *args], capture_output=True, text=True, timeout=60)


def _answer(*args: str) -> dict:
    res = _helper(*args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


WATCHER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from chaoskit.sdk import inproc
inproc.start(sys.argv[2])
print("watching", flush=True)
time.sleep(60)
"""


def test_a_job_that_runs_as_the_account_takes_its_order_and_answers_in_its_own_channel(account, channel):
    base, folder = channel
    need(unreachable_by(account, [Path(SYSTEM_PYTHON), ROOT / "chaoskit"]) is None,
         f"a checkout {account.name} can read ({ROOT})")
    job = _as(account.uid, account.gid, WATCHER, str(ROOT), str(folder), env={"PATH": "/usr/bin:/bin"}, wait=False)
    try:
        assert job.stdout.readline().strip() == "watching", job.stderr.read()
        order = json.dumps({"v": 1, "id": "f0.0", "kind": "inproc.gil", "pid": job.pid, "params": {"duration": 0.2}})
        answer = _answer("order", str(folder), str(job.pid), order, "f0.0", "10", "30")
        assert answer["status"] in ("fired", "ended") and answer["id"] == "f0.0", answer
        st = os.stat(folder / f"order-{job.pid}.json")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)  # root's order, readable in the account's folder
        assert os.stat(folder / f"status-{job.pid}.json").st_uid == account.uid  # the account's answer
        start = Path(f"/proc/{job.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19].decode()
        assert _answer("end", str(folder), str(job.pid), start, "f0.0", "3")["killed"] is False
        assert job.poll() is None and sorted(os.listdir(folder)) == []
    finally:
        job.kill()
        job.wait(timeout=10)


PLANT = """
import os, sys
folder, pid = sys.argv[1], sys.argv[2]
for name in ("order-%s.json" % pid, "status-%s.json" % pid, ".order-%s.x.tmp" % pid):
    try:
        with open(os.path.join(folder, name), "x") as fh:
            fh.write('{"id": "f0.0", "status": "fired"}')
        print("planted", name)
    except OSError as exc:
        print("refused", name, exc.strerror)
try:
    print("read", open(os.path.join(folder, "order-%s.json" % pid)).read())
except OSError as exc:
    print("refused read", exc.strerror)
"""


def test_another_user_can_neither_plant_nor_read_orders_or_answers(account, channel):
    base, folder = channel
    pid = os.getpid()
    assert _answer("order", str(folder), str(pid), '{"v": 1}') == {"ok": True}
    res = _as(NOBODY, NOBODY, PLANT, str(folder), str(pid))
    assert "planted" not in res.stdout and res.stdout.count("refused") == 4, res.stdout + res.stderr
    assert sorted(os.listdir(folder)) == [f"order-{pid}.json"]
    # the account itself may answer there (that is what it is for)
    res = _as(account.uid, account.gid, PLANT, str(folder), str(pid))
    assert f"planted status-{pid}.json" in res.stdout, res.stdout + res.stderr


LINK = """
import os, sys
os.symlink(sys.argv[1], sys.argv[2])
"""


def test_roots_helper_follows_no_link_of_the_accounts_nor_reads_a_file_that_is_not_its_answer(account, channel, tmp_path):
    base, folder = channel
    pid = os.getpid()
    secret = base / "secret.json"  # root's, 0600: what a link or a hard link of the account's would reach
    secret.write_text(json.dumps({"id": "f0.0", "status": "fired", "detail": {"secret": SECRET}}))
    secret.chmod(0o600)
    target = base / "target"
    target.write_text("root's own\n")

    def wait() -> subprocess.CompletedProcess:
        return _helper("wait", str(folder), str(pid), "f0.0", "0.5", "fired,ended")

    # an answer that is a link to root's file: not followed
    assert _as(account.uid, account.gid, LINK, str(secret), str(folder / f"status-{pid}.json")).returncode == 0
    res = wait()
    assert json.loads(res.stdout)["status"] == "timeout" and SECRET not in res.stdout
    # an order's name made a link to root's file: replaced, its target untouched
    assert _as(account.uid, account.gid, LINK, str(target), str(folder / f"order-{pid}.json")).returncode == 0
    assert _answer("order", str(folder), str(pid), '{"v": 1}') == {"ok": True}
    assert target.read_text() == "root's own\n" and not (folder / f"order-{pid}.json").is_symlink()
    # a FIFO for an answer: not waited on
    fifo = _as(account.uid, account.gid, "import os, sys; os.mkfifo(sys.argv[1], 0o600)", str(folder / f"status-{pid}.json"))
    assert fifo.returncode == 0, fifo.stderr
    t0 = time.monotonic()
    assert json.loads(wait().stdout)["status"] == "timeout" and time.monotonic() - t0 < 10
    os.unlink(folder / f"status-{pid}.json")
    # a hard link to root's file (what fs.protected_hardlinks keeps the account from making; root makes it here)
    os.link(secret, folder / f"status-{pid}.json")
    res = wait()
    assert json.loads(res.stdout)["status"] == "timeout" and SECRET not in res.stdout
    os.unlink(folder / f"status-{pid}.json")
    # root's own order, renamed by the account to be its answer: not the account's file, no answer
    os.rename(folder / f"order-{pid}.json", folder / f"status-{pid}.json")
    assert json.loads(wait().stdout)["status"] == "timeout"


SWAP = """
import os, sys
os.rename(sys.argv[1], sys.argv[1] + ".old")
os.symlink(sys.argv[2], sys.argv[1])
"""


def test_a_channel_folder_the_account_made_a_link_or_opened_to_others_is_refused(account, channel):
    base, folder = channel
    pid = os.getpid()
    rootdir = base / "roots"
    rootdir.mkdir(mode=0o700)
    res = _as(account.uid, account.gid, SWAP, str(folder), str(rootdir))
    assert res.returncode == 0, res.stderr
    refused = _helper("order", str(folder), str(pid), '{"v": 1}')
    assert refused.returncode != 0 and "a link is never followed" in refused.stderr
    assert os.listdir(rootdir) == []
    os.unlink(folder)
    os.rename(str(folder) + ".old", folder)
    assert _as(account.uid, account.gid, "import os, sys; os.chmod(sys.argv[1], 0o777)", str(folder)).returncode == 0
    refused = _helper("order", str(folder), str(pid), '{"v": 1}')
    assert refused.returncode != 0 and "others than its owner may write" in refused.stderr
    assert os.listdir(folder) == []


def test_rollback_takes_a_jobs_own_channel_folder_and_no_other():
    from types import SimpleNamespace

    node = SimpleNamespace(conn=SimpleNamespace(state_dir="/run/chaoskit"), ssh=None)
    fault = InprocHangFault(InprocHangFault.Spec(kind="inproc.hang", duration=5), "f0")
    for folder in ("/run/chaoskit/inproc", "/srv/reports/20260101T000000Z-inproc-hang.job/inproc"):
        armed = fault.revert_argv(sys.executable, folder, 4242, 987654, "f0.0")
        assert InprocHangFault.journaled_revert(armed, node) == armed
    for folder in ("/tmp/inproc", "/srv/r.job/../../etc/inproc", "srv/r.job/inproc", "/srv/r.job/inproc/",
                   "/srv/r.job/x/inproc", "/srv/r\n.job/inproc", "/srv/r.job/./inproc"):
        assert not job_channel(folder), folder
        with pytest.raises(ValueError):
            InprocHangFault.journaled_revert(fault.revert_argv(sys.executable, folder, 4242, 987654, "f0.0"), node)
