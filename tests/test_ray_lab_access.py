"""Who may use the Ray lab: another local user can neither join it nor run code on its nodes, its nodes are
not root, and nothing of it lies under a guessable name in a world-writable folder.

``chaoskit lab up --kind ray`` as root, then a second local user (one of this module's own) tries what
anyone on the machine could: ``ray start --address=127.0.0.1:PORT`` and ``ray.init(address=...)`` with a task
pinned to a lab node. Both are refused for want of the lab's token.

The lab's account must be able to run chaoskit's Python (else the lab's nodes stay root, and say why); where
that Python lives under a folder closed to other users (a pyenv in /root, as on CI's machine), the test opens
that folder for search (o+x, no listing) while it runs and closes it again at the end, rather than letting the
lab fall back to root. chaoskit asks the mode bits (core.accounts.unreachable_by), so an ACL would not do.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, need, need_root_tool, run_cli, lab_fixture, short_form

LAB_ACCOUNT = "chaoskit-lab"
OTHER_USER = "ckraypeer"
"""Another user of the machine, made for this module (not conftest's job user, which other sessions delete)."""


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _closed_folders(uids: list[int]) -> list[Path]:
    """Folders on the way to chaoskit's Python, its packages and Ray that the accounts ``uids`` may not search."""
    spec = importlib.util.find_spec("ray")
    paths = [Path(sys.executable), Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"]),
             Path(_ray_cli()), *(Path(p) for p in spec.submodule_search_locations)]
    closed: list[Path] = []
    for path in paths:
        target = Path(os.path.realpath(path))
        for folder in [*reversed(target.parents), target]:
            st = os.stat(folder)
            if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH and st.st_uid not in uids \
                    and folder not in closed:
                closed.append(folder)
    return closed


@pytest.fixture(scope="module")
def other_user():
    need_root_tool("useradd")
    subprocess.run(["userdel", "--remove", "--force", OTHER_USER], capture_output=True)
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", OTHER_USER], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        yield pwd.getpwnam(OTHER_USER)
    finally:
        _end_processes_of(pwd.getpwnam(OTHER_USER).pw_uid)
        subprocess.run(["userdel", "--remove", "--force", OTHER_USER], capture_output=True)


@pytest.fixture(scope="module")
def accounts(other_user):
    """(the lab's account, the other user): both able to run chaoskit's Python and Ray, nothing more."""
    need(importlib.util.find_spec("ray") is not None, "ray (pip install 'chaoskit[ray]')")
    job_user = other_user
    try:
        lab = pwd.getpwnam(LAB_ACCOUNT)
    except KeyError:  # what chaoskit itself makes (chaoskit.core.accounts.lab_account)
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                        "/usr/sbin/nologin", "--user-group", LAB_ACCOUNT], check=True, capture_output=True)
        lab = pwd.getpwnam(LAB_ACCOUNT)
    uids = [lab.pw_uid, job_user.pw_uid]
    opened: list[tuple[Path, int]] = []
    try:
        for folder in _closed_folders(uids):
            mode = stat.S_IMODE(os.stat(folder).st_mode)
            os.chmod(folder, mode | stat.S_IXOTH)
            opened.append((folder, mode))
        yield lab, job_user
    finally:
        for folder, mode in opened:
            os.chmod(folder, mode)


@lab_fixture(scope="module")
def ray_lab(accounts, tmp_path_factory):
    """``chaoskit lab up --kind ray --nodes 2`` as root (its state in a folder of this module's); down at the end."""
    from chaoskit.lab.ray import RayLab

    state = pytest.MonkeyPatch()
    state.setenv("CHAOSKIT_STATE_DIR", str(tmp_path_factory.mktemp("ray-access-state")))
    before = set(os.listdir(tempfile.gettempdir()))
    up = run_cli("lab", "up", "--kind", "ray", "--nodes", "2")
    ray_lab = RayLab.load()
    try:
        assert up.code == 0 and ray_lab is not None, up.stdout + up.stderr
        yield ray_lab, up.stdout, sorted(set(os.listdir(tempfile.gettempdir())) - before)
    finally:
        run_cli("lab", "down")
        state.undo()


def _as_user(user: pwd.struct_passwd, argv: list[str]) -> subprocess.Popen[str]:
    """``argv`` as ``user`` (its ids, no other group), with its own home and no Ray settings of root's. Ray's client
    tries the GCS once a second, 20 times by default, each refused alike for want of the token: the user's own
    setting (anyone may set it) makes it 5 tries, so that the refusal, the last try's error, comes in ~5 s, not 20."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": user.pw_dir, "USER": user.pw_name,
           "TMPDIR": user.pw_dir, "RAY_USAGE_STATS_ENABLED": "0", "RAY_gcs_server_port_wait_time_s": "5"}
    return subprocess.Popen(argv, env=env, cwd=user.pw_dir, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _end_processes_of(uid: int) -> None:
    """SIGKILL every process of ``uid`` (the test's own user: what a join that should have failed left running)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


PINNED_TASK = """
import os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(num_cpus=0, resources={"chaoskit_node_n0": 0.001})
def who():
    return os.getuid()
print("RAN AS UID", ray.get(who.remote(), timeout=60), flush=True)
"""


def test_another_user_cannot_join_the_ray_lab_or_run_tasks_on_it(ray_lab, accounts):
    lab, _, _ = ray_lab
    _, other = accounts
    own_temp = Path(other.pw_dir) / "r"
    join = _as_user(other, [_ray_cli(), "start", f"--address={lab.address}", "--num-cpus=1", "--disable-usage-stats",
                            "--node-ip-address=127.0.0.1", f"--temp-dir={own_temp}"])
    task = _as_user(other, [sys.executable, "-c", PINNED_TASK, lab.address])
    try:
        joined, ran = join.communicate(timeout=180)[0], task.communicate(timeout=180)[0]
    finally:
        for p in (join, task):
            if p.poll() is None:
                p.kill()
        _end_processes_of(other.pw_uid)
        shutil.rmtree(own_temp, ignore_errors=True)
    assert join.returncode != 0 and re.search(r"Authentication|InvalidAuthToken|Unauthenticated", joined), joined[-2000:]
    assert "RAN AS UID" not in ran, ran[-2000:]
    assert task.returncode != 0 and re.search(r"Authentication|InvalidAuthToken|Unauthenticated", ran), ran[-2000:]
    token = getattr(lab, "token_file", None)
    assert token is not None
    peek = _as_user(other, ["cat", token])
    said = peek.communicate(timeout=30)[0]
    assert peek.returncode != 0 and "Permission denied" in said, said  # the token file is closed to them


def test_a_run_whose_folder_the_labs_account_cannot_reach_is_refused(ray_lab, accounts, tmp_path, monkeypatch):
    """The Ray lab's nodes run as its account and write the job's checkpoints, so the job cannot fall back to root:
    a run whose --out that account cannot reach (a folder of root's, 0700) is refused before anything starts. On this
    module's lab (``chaoskit run`` takes the lab ``lab up`` left), the lab as it was before, no job of the run's."""
    from chaoskit.lab.ray import RayLab

    lab, _, _ = ray_lab
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(lab.lab.state.parent.parent))  # the module's state: its lab's record
    scenario = short_form(SCENARIOS / "ray-kill-worker.yaml", tmp_path, ("nodes: 3}", "nodes: 2}"))
    shut = Path(tempfile.mkdtemp(prefix="ck-ray-closed-"))  # 0700, root's
    try:
        closed = run_cli("run", scenario, "--out", shut / "closed", "--json")
        assert closed.code == 3, closed.stdout + closed.stderr
        assert f"this ray cluster's nodes run as {lab.account.name} and write" in closed.stderr, closed.stderr
        assert "so the job cannot run as root instead; the job was not started" in closed.stderr
        assert not (shut / "closed" / "events.jsonl").exists()
    finally:
        shutil.rmtree(shut, ignore_errors=True)
    again = RayLab.load()  # the lab left as it was: the run neither started nor stopped one
    assert again is not None and again.address == lab.address and lab.alive_nodes() == {"n0": True, "n1": True}


def test_the_ray_labs_nodes_are_not_root(ray_lab, accounts):
    from chaoskit.lab.ray import HEAD_NODE, scope_pids

    lab, said, _ = ray_lab
    account = pwd.getpwnam(lab.account.name)  # the lab account this lab holds (another may hold chaoskit-lab)
    pids = scope_pids({lab.lab.scope(n) for n in [HEAD_NODE, *lab.lab.node_names()]})
    assert pids
    ps = subprocess.run(["ps", "-o", "user:32=,comm=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    rows = [line.split(None, 1) for line in ps.stdout.splitlines()]
    assert {"raylet", "gcs_server"} <= {comm.strip() for _, comm in rows}
    assert {user for user, _ in rows} == {account.pw_name}, ps.stdout
    assert f"its nodes run as {account.pw_name}" in said


def test_nothing_of_the_ray_lab_lies_under_a_guessable_name(ray_lab, accounts):
    lab, _, made = ray_lab
    account = pwd.getpwnam(lab.account.name)  # the lab account this lab holds (another may hold chaoskit-lab)
    lab_id = lab.lab.lab_id
    for shared in {tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"}:
        if os.path.isdir(shared):
            assert [n for n in os.listdir(shared) if lab_id in n or n.startswith("ckray-")] == [], shared
    folder = Path(lab.temp_dir).parent
    assert [folder.name] == [n for n in made if n.startswith("chaoskit-ray-")]  # one folder, a random name
    for path, mode in ((folder, 0o700), (Path(lab.token_file), 0o600)):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.pw_uid, mode), path
    token = Path(lab.token_file).read_text().strip()
    assert len(token) >= 32
    from chaoskit.lab.ray import HEAD_NODE, scope_pids

    pids = scope_pids({lab.lab.scope(n) for n in [HEAD_NODE, *lab.lab.node_names()]})
    for pid in pids:  # a command line is anyone's to read: neither the lab's id nor its token on one
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except FileNotFoundError:
            continue
        decoded = [base64.b64decode(a.split("=", 1)[1] + "==").decode(errors="replace")
                   for a in args if a.startswith("--config_list=")]
        for text in (*args, *decoded):
            assert lab_id not in text and token not in text, (pid, text[:300])
