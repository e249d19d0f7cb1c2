"""The node side opens only what it checked, and every reply the controller reads is bounded (issue 31).

The node's agent runs here as the SSH transport starts it (``python3 -I`` reading the program on stdin); a second,
unprivileged local user (made with ``useradd``, removed at the end) plants what a job's user could plant inside
the log roots: a FIFO, a link to a FIFO outside them, a link to a character device (``/dev/zero`` standing in for
``/dev/watchdog``, whose open and close can arm a reboot), and a process with a 100 KB command line. The agent
refuses each file with its reason without opening it (a follow of a FIFO used to block its thread for good),
keeps following a regular file, and ships command lines cut to CMDLINE_MAX. The controller's channel drops a
reply that never ends instead of buffering it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import need, need_root_tool, wait_until
from tests.test_bounded_input import _LocalAgent

USER = "ckplant31"


def _sh(*argv: str, check: bool = True):
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()}")
    return res


@pytest.fixture(scope="module")
def planter():
    need_root_tool("useradd")
    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    _sh("userdel", "--remove", "--force", USER, check=False)
    _sh("useradd", "--create-home", "--shell", "/bin/sh", USER)
    try:
        yield Path(pwd.getpwnam(USER).pw_dir)
    finally:
        _sh("userdel", "--remove", "--force", USER, check=False)


def _as_user(*argv: str) -> None:
    _sh("runuser", "-u", USER, "--", *argv)


def test_the_follower_refuses_fifos_devices_and_links_to_them_without_opening_and_follows_on(planter):
    root = planter / "logs"
    _as_user("mkdir", str(root))
    outside = planter / "outside"
    _as_user("mkdir", str(outside))
    _as_user("mkfifo", str(root / "fifo.log"))
    _as_user("mkfifo", str(outside / "fifo"))
    _as_user("ln", "-s", str(outside / "fifo"), str(root / "to-fifo.log"))
    _as_user("ln", "-s", "/dev/zero", str(root / "device.log"))
    _as_user("sh", "-c", f"echo 'step 7' > {root / 'n1.log'}")
    agent = _LocalAgent()
    try:
        cases = {1: (root / "fifo.log", None, "a FIFO"), 2: (root / "to-fifo.log", [str(root)], "outside the site policy's log roots"),
                 3: (root / "to-fifo.log", None, "a FIFO"), 4: (root / "device.log", None, "a character device")}
        for rid, (path, roots, _) in cases.items():
            agent.send({"id": rid, "op": "follow", "path": str(path), **({"roots": roots} if roots else {})})
        assert wait_until(lambda: all(any(r.get("id") == rid and "error" in r for r in agent.replies) for rid in cases), 10), \
            agent.replies  # a FIFO opened would block the stream for good: no answer
        for rid, (path, _, says) in cases.items():
            [reply] = [r for r in agent.replies if r.get("id") == rid]
            assert says in reply["error"], (rid, reply)
        # nothing holds the FIFO open: a writer that does not block finds no reader
        with pytest.raises(OSError):
            os.open(root / "fifo.log", os.O_WRONLY | os.O_NONBLOCK)
        agent.send({"id": 9, "op": "follow", "path": str(root / "n1.log"), "roots": [str(root)]})
        assert wait_until(lambda: agent.lines() == ["step 7"], 10), agent.replies  # the agent follows on
    finally:
        agent.close()


def test_procs_ships_command_lines_cut_to_cmdline_max(planter):
    from chaoskit.nodeside.agent import CMDLINE_MAX

    token = f"ck31-{os.getpid()}"
    long_arg = "x" * 100_000
    proc = subprocess.Popen(["runuser", "-u", USER, "--", "env", f"CHAOSKIT_SCOPE={token}", "/usr/bin/python3", "-c",
                             "import time; time.sleep(60)", long_arg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    agent = _LocalAgent()
    try:
        def answered():
            agent.send({"id": 5, "op": "procs", "scope": {"env": token}})
            time.sleep(0.2)
            return [r for r in agent.replies if r.get("id") == 5 and r.get("procs")]
        assert wait_until(answered, 10), agent.replies
        [reply] = answered()[-1:]
        [sleeper] = [p for p in reply["procs"] if "time.sleep(60)" in p["cmdline"]]
        assert len(sleeper["cmdline"].encode()) <= CMDLINE_MAX < len(long_arg)
    finally:
        os.killpg(proc.pid, 9)  # runuser and the user's process under it
        proc.wait()
        agent.close()


def test_the_controllers_channel_drops_a_reply_that_never_ends():
    """64 MiB with no newline used to stay in the channel's buffer with the channel open."""
    from chaoskit.cluster.transports.channel import MAX_REPLY_BYTES, AgentChannel

    ours, theirs = socket.socketpair()
    try:
        chan = AgentChannel(ours, "n1")
        chunk = b"x" * (1 << 20)
        for _ in range((MAX_REPLY_BYTES >> 20) + 2):
            chan._feed(chunk)
            if chan.dead:
                break
        assert chan.dead and "without a line end" in chan.reason and len(chan._buf) == 0
    finally:
        theirs.close()


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])


def test_the_ballasts_stored_pid_is_signalled_only_with_its_start_time(planter, tmp_path):
    """mem.oom's restore SIGKILLs the ballast named in its ``started`` file: a pid that names another process now (the
    other user's, started after the ballast ended) keeps running; the ballast itself, start time matching, is ended."""
    import json
    import sys

    from chaoskit.faults.memory import MEMORY_TOOL

    def restore_with(pid: int, start: int) -> None:
        state_dir = tmp_path / f"state-{pid}"
        state_dir.mkdir(mode=0o700)
        (state_dir / "ballast").mkdir(mode=0o700)
        (state_dir / "ballast" / "started").write_text(f"{time.time():f} {pid} {start}\n")
        state = state_dir / "f0.json"
        state.write_text(json.dumps({"version": "v2", "cgroup": str(state_dir / "no-cgroup"), "mount": "/nonexistent",
                                     "ballast": str(state_dir / "ballast"), "original": {}, "oom_score_adj": {}}))
        res = subprocess.run([sys.executable, "-I", "-c", MEMORY_TOOL, "restore", str(state)], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert not state.exists()

    theirs = subprocess.Popen(["runuser", "-u", USER, "--", "sleep", "60"], start_new_session=True)
    ballast = subprocess.Popen(["sleep", "60"])
    try:
        assert wait_until(lambda: _sh("pgrep", "-u", USER, "-x", "sleep", check=False).stdout.strip(), 10)
        victim = int(_sh("pgrep", "-u", USER, "-x", "sleep").stdout.split()[0])
        restore_with(victim, _start_time(victim) - 1)  # the ballast's start time, not this process's
        assert os.path.exists(f"/proc/{victim}") and _start_time(victim) is not None
        restore_with(ballast.pid, _start_time(ballast.pid))
        assert ballast.wait(timeout=10) == -9
    finally:
        os.killpg(theirs.pid, 9)
        theirs.wait()
        if ballast.poll() is None:
            ballast.kill()
            ballast.wait()


# -- the run folder (issue 31, 5) -------------------------------------------------------------------------


def test_a_run_folder_name_taken_by_another_user_gets_a_random_suffix_and_theirs_is_never_written(planter, tmp_path):
    from chaoskit.core.errors import ScenarioError
    from chaoskit.core.files import make_run_dir, open_append

    reports = tmp_path / "reports"
    reports.mkdir()
    theirs = planter / "collect"
    _as_user("mkdir", str(theirs))
    default = reports / "20261202T060000Z-drill"
    os.symlink(theirs, default)  # planted at the name a run would take (the name is predictable)
    made = make_run_dir(default, 0o750, default=True)
    assert made != default and made.name.startswith(default.name + "-") and made.is_dir() and not made.is_symlink()
    assert os.lstat(made).st_uid == os.geteuid() and os.listdir(theirs) == []
    for out in (default, theirs):  # --out naming a link, or another user's folder: refused, nothing written
        with pytest.raises(ScenarioError, match="a link|belongs to uid"):
            make_run_dir(out, 0o750, default=False)
    assert os.listdir(theirs) == []
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ScenarioError, match="can be written by anyone"):
        make_run_dir(shared / "run", 0o750, default=False)
    os.chmod(shared, 0o1777)  # sticky: nobody can rename what is ours
    assert make_run_dir(shared / "run", 0o750, default=False).is_dir()
    # a file of the run is never written through a link at its name
    os.symlink(planter / ".profile", made / "events.jsonl")
    with pytest.raises(OSError):
        open_append(made / "events.jsonl")


class _Lines:
    """What a :class:`FileLogProbe` hands its lines to (the runner's regex probe), kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def feed(self, node: str, line: str, *rest) -> None:
        self.lines.append(line)


def test_the_controller_reads_a_jobs_files_only_when_regular_and_never_through_its_users_links(planter, tmp_path):
    """On the controller too (a Slurm job's output, the SDK's events in the job user's own folder): the job's user
    plants a FIFO, a link to a device, a link to a file only root may read and a folder link; each is refused with
    its reason, never opened (a FIFO would block the follower for good), and nothing of root's file is read.
    A regular file of theirs is followed; a copy (the SDK's events kept with the run) never goes through a link."""
    from chaoskit.core.files import NotRegularFile, copy_regular, open_regular
    from chaoskit.observe.probes import FileLogProbe

    own = planter / "job"
    _as_user("mkdir", str(own))
    secret = tmp_path / "secret"
    secret.write_text("root-only line\n")
    secret.chmod(0o600)
    _as_user("mkfifo", str(own / "fifo.log"))
    _as_user("ln", "-s", "/dev/zero", str(own / "device.log"))
    _as_user("ln", "-s", str(secret), str(own / "secret.log"))
    _as_user("ln", "-s", str(tmp_path), str(own / "elsewhere"))
    _as_user("sh", "-c", f"echo 'step 3' > {own / 'out.log'}")
    cases = {"fifo.log": "is a FIFO", "device.log": f"is a link of uid {pwd.getpwnam(USER).pw_uid}'s",
             "secret.log": "is a link of uid", "elsewhere/secret": "elsewhere is a link of uid"}
    for name, says in cases.items():
        with pytest.raises(NotRegularFile, match=says):
            open_regular(own / name)
    followers = {name: FileLogProbe(_Lines(), "n0", own / name, interval=0.02) for name in [*cases, "out.log"]}
    for f in followers.values():
        f.start()
    try:
        assert wait_until(lambda: followers["out.log"].probe.lines == ["step 3"], 10), followers["out.log"].probe.lines
        assert wait_until(lambda: all(followers[n].errors for n in cases), 10), {n: f.errors for n, f in followers.items()}
        for name, says in cases.items():
            assert says in followers[name].errors[0] and followers[name].probe.lines == [], (name, followers[name].errors)
    finally:
        started = time.monotonic()
        for f in followers.values():
            f.stop()
        assert time.monotonic() - started < 5 and not any(f.is_alive() for f in followers.values())  # none blocked
    kept = tmp_path / "kept"
    assert not copy_regular(own / "secret.log", kept) and not kept.exists()
    assert copy_regular(own / "out.log", kept) and kept.read_text() == "step 3\n"
