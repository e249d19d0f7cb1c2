"""Shared test helpers: run the CLI in-process, find tools, keep state private.

Tests that need a tool (root, torch, ip, sshd, chromium, docker) skip with a
message outside CI; with ``CI`` set a missing tool fails the test instead.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
IN_CI = bool(os.environ.get("CI"))


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)

    def with_logs(self, run_dir: Path, lines: int = 25) -> str:
        """The output, then the last ``lines`` of each node's job log in ``run_dir/logs``: what a failed drill's
        assertion shows, so a CI failure names what the job printed (a worker's last traceback, an abort) after
        its run folder is gone."""
        parts = [self.stdout + self.stderr]
        for log in sorted(Path(run_dir, "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)


def run_cli(*args: str) -> CliResult:
    """Run ``chaoskit ARGS`` in this process; return exit code, stdout, stderr."""
    from chaoskit.cli import main
    from chaoskit.cli.main import CliEnv

    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in args], CliEnv(stdout=out, stderr=err))
    return CliResult(code, out.getvalue(), err.getvalue())


def short_form(scenario: Path, folder: Path, *edits: tuple[str, str]) -> Path:
    """A shipped scenario in a short form (fewer steps, an earlier fault; issue 52), written in ``folder`` under its
    own name: each ``(old, new)`` replaces text that occurs exactly once in it, so that a shipped file that changes
    fails here rather than being drilled in its long form unnoticed."""
    text = scenario.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{scenario.name}: {old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    path = Path(folder) / scenario.name
    path.write_text(text)
    return path


def need(condition: bool, what: str) -> None:
    """Skip outside CI when ``condition`` is false; fail in CI (a skip there hides a missing install)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI but missing: {what}")
    pytest.skip(f"missing: {what}")


def need_torch() -> None:
    import importlib.util

    need(importlib.util.find_spec("torch") is not None, "torch (pip install 'chaoskit[workload]')")


def need_root_tool(tool: str) -> None:
    need(os.geteuid() == 0, "root")
    need(shutil.which(tool) is not None, f"{tool} (apt-get install ...)")


JOB_USER = "ckjobuser"
"""The user jobs run as when their author's batch script is submitted (never root): made here with ``useradd``."""


@pytest.fixture(scope="session")
def job_user():
    """A user of its own for the jobs an author submits (``launch: sbatch`` runs as the script's user), made
    with ``useradd`` and removed at the end: ``pwd`` entry."""
    import pwd
    import subprocess

    need_root_tool("useradd")
    subprocess.run(["userdel", "--remove", "--force", JOB_USER], capture_output=True)
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", JOB_USER], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        yield pwd.getpwnam(JOB_USER)
    finally:
        subprocess.run(["userdel", "--remove", "--force", JOB_USER], capture_output=True)


SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python any user can run (this one may live in root's home): what a job of the job user's runs."""


@pytest.fixture
def job_user_folders(job_user):
    """``(base, own)``: ``base`` a folder of root's that anyone may pass through (a run folder and its job's own
    folder go there), ``own`` a folder in it of the job user's (its batch script, its output)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ck-job-user-"))
    base.chmod(0o755)
    own = base / "own"
    own.mkdir(mode=0o755)
    os.chown(own, job_user.pw_uid, job_user.pw_gid)
    try:
        yield base, own
    finally:
        shutil.rmtree(base, ignore_errors=True)


def proc_state(pid: int) -> str | None:
    """One-letter state of a process (R, S, T when stopped, Z), ``None`` once it is gone."""
    from chaoskit.cluster.transports.local import proc_info

    info = proc_info(pid)
    return info.state if info else None


def wait_state(pid: int, predicate, timeout: float = 5.0) -> bool:
    """Poll until ``predicate(proc_state(pid))`` holds; ``False`` after ``timeout``."""
    import time

    end = time.time() + timeout
    while time.time() < end:
        if predicate(proc_state(pid)):
            return True
        time.sleep(0.02)
    return False


def wait_exec(proc, timeout: float = 10.0) -> None:
    """Wait until a fresh ``Popen`` child has finished its ``exec``: its ``/proc`` entry shows its own command
    line and a readable environment.

    ``Popen`` returns once the exec has begun (the close-on-exec pipe it reads closes early in the kernel's
    exec), and for a moment after that the child's command line and environment still read empty: a
    scan of ``/proc`` then does not see the ``CHAOSKIT_SCOPE`` or ``RANK`` the test gave it (a probe
    that scanned there missed the worker). Waiting for the pid alone does not close that window.
    """
    import time

    want = "\0".join(str(a) for a in proc.args) + "\0" if isinstance(proc.args, (list, tuple)) else None
    end = time.time() + timeout
    while time.time() < end:
        try:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            cmdline, environ = "", b""
        if environ and cmdline and (want is None or cmdline == want):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited ({proc.returncode}) before it was seen running")
        time.sleep(0.01)
    raise AssertionError(f"{proc.args!r} did not finish its exec within {timeout}s")


@pytest.fixture()
def listener():
    """A loopback TCP port nobody answers on: what connects to it waits in the backlog (:func:`anyone_connected` tells)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


def anyone_connected(sock) -> bool:
    """Whether anything connected to a :func:`listener` socket since the last look."""
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _torch_temp_folders() -> set[str]:
    """What torch makes in the temp folder when a job forgets to say where: ``torchinductor_<user>`` (a guessable
    name) and torchrun's ``torchelastic_*`` log folders. chaoskit's jobs, and the jobs its tests start themselves,
    keep both in their own run folders."""
    tmp = Path(tempfile.gettempdir())
    return {p.name for pattern in ("torchinductor_*", "torchelastic_*") for p in tmp.glob(pattern)}


_TORCH_TEMP_BEFORE = _torch_temp_folders()


def pytest_sessionfinish(session, exitstatus) -> None:
    """The whole run fails when a drill left torch's folders in /tmp: root's job wrote under a guessable name in a
    world-writable folder (another user could have made it first, or made it a link). Folders that were there
    before the run are not the run's. It fails too when a fixture that started a job or a lab is not declared a
    lab fixture (the fast tier would start it), and when a thread that is not a daemon outlives the tests:
    pytest would wait on it after its summary, for good if it waits on what has ended. A lane's findings
    (:data:`LANES`) go to the run that started it, which says them and fails."""
    import threading

    config = session.config
    found: list[str] = []
    if not hasattr(config, "workerinput"):  # the machine's /tmp once, by the run that started the lanes
        new = sorted(_torch_temp_folders() - _TORCH_TEMP_BEFORE)
        if new:
            found.append(f"the run left torch's folders in {tempfile.gettempdir()}: {', '.join(new)} "
                         "(a job started without TORCHINDUCTOR_CACHE_DIR or torchrun's --log-dir)")
    if _undeclared:
        found.append("fixtures that start a job or a lab, not declared with @lab_fixture (the tests that use them "
                     "would run in the fast tier):\n  "
                     + "\n  ".join(f"{k}: starts {v}" for k, v in sorted(_undeclared.items())))
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        found.append("threads that are not daemons outlived the tests (pytest would wait on them): "
                     + ", ".join(f"{t.name} ({getattr(t.run, '__qualname__', '?')})" for t in left))
    if hasattr(config, "workerinput"):
        config.workeroutput["chaoskit_found"] = found
        return
    found += _LANE_FOUND
    for what in found:
        sys.stderr.write(f"\nFAILED: {what}\n")
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    folder = _JOB_FOLDERS.get("session")
    if folder is not None and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(folder, ignore_errors=True)
    elif folder is not None:
        sys.stderr.write(f"\nthe session's temporary folders are kept in {folder}\n")


# -- two lanes (issue 52 item 7) -----------------------------------------------------------------------------------
# `make test` runs the suite on two pytest-xdist workers (`-n 2 --lanes`). The drills' lane runs every test that
# starts a job or a lab, and every test that reads or changes what the machine shares, one at a time in file order
# as a plain run does: users and groups, network namespaces, mounts, cgroups, /dev/kmsg, /tmp's names, other
# processes, a lab, an audit. Beside it a second lane runs the fast tests of the modules that say they touch none of
# that (``pytestmark = pytest.mark.beside``). A module says so by hand; one that does not stays in the drills' lane,
# which costs time and never a flake. A test of the second lane that starts a tool that changes what the machine
# shares (:data:`_SHARED_TOOLS`) fails, saying so. Each worker has its own temporary and state folders; the
# second lane starts no lab, so labs, ports and namespaces stay the drills' lane's alone. Nor may it use root's
# node state folder (a LocalTransport without its own ``state_dir``), which every audit of a process lab reads.
# Nor does it write where a test of the drills' lane looks for what chaoskit wrote (test_fuzz_inputs: the project
# tree, the home folder, new names in /tmp and /dev/shm): the report's screenshots and browser, a mkdtemp in /tmp,
# a framework's caches keep those modules in the drills' lane.

LANES = ("drills", "beside")
_SHARED_TOOLS = {"useradd", "userdel", "usermod", "groupadd", "groupdel", "mount", "umount", "nft", "tc", "docker",
                 "scontrol", "sbatch", "slurmd", "slurmctld", "sshd", "ray"}
"""What a test of the second lane may not start (nor ``ip netns``): each changes what the whole machine shares."""
_LANE_FOUND: list[str] = []
_lane: dict[str, Any] = {}


def pytest_addoption(parser) -> None:
    parser.addoption("--lanes", action="store_true",
                     help="with -n 2 (pytest-xdist): the drills in one worker, the fast tests of modules marked "
                          "beside in the other (tests/conftest.py)")


def _lane_of(item) -> str:
    return "beside" if item.get_closest_marker("slow") is None and item.get_closest_marker("beside") else "drills"


def _lanes_file(basetemp: Path) -> Path:
    return Path(basetemp) / "lanes.json"


def _write_lanes(config, items) -> None:
    """A worker's collection, each test with its lane, where the run that schedules them reads it: the folder
    above the worker's own temporary folder (xdist gives each worker ``<run's folder>/gwN``). Both workers
    collect the same tests; each writes the whole map (a new file, then renamed over)."""
    target = _lanes_file(Path(config.option.basetemp).parent)
    part = target.with_name(f".lanes-{config.workerinput['workerid']}.json")
    part.write_text(json.dumps({item.nodeid: _lane_of(item) for item in items}))
    part.replace(target)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--lanes``: xdist's scheduling by scope, each lane one scope, so each worker takes one lane whole and runs
    it in collection order."""
    if not config.getoption("lanes"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "map" not in _lane:
                _lane["map"] = json.loads(_lanes_file(config._tmp_path_factory.getbasetemp()).read_text())
            return _lane["map"].get(nodeid, "drills")

    return Lanes(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A lane ended: what its run found at its end (:func:`pytest_sessionfinish`) is said and fails the run."""
    _LANE_FOUND.extend(f"[{node.gateway.id}] {what}" for what in getattr(node, "workeroutput", {}).get(
        "chaoskit_found", ()))


# -- the drills' jobs run as the lab's account (issue 48) ---------------------------------------------------------
# A job chaoskit starts as root runs as a lab account only where that account reaches its folder (beside the run
# folder); pytest's temporary folders are root's 0700, so a drill with --out in one kept root. As root, the
# session's temporary folders are root's and the lab accounts' group's (chaoskit.core.accounts.JOB_GROUP), mode
# 0710: the account passes through, no other user does, nobody but root writes. They are a folder of this
# session's own (pytest resets its shared /tmp/pytest-of-root to 0700 whenever a session starts: another session
# would close the way in the middle of a drill), removed at the end when every test passed.

_JOB_FOLDERS: dict[str, Any] = {}


def _open_to_job_group(path: Path) -> None:
    gid = _JOB_FOLDERS.get("gid")
    if gid is not None:
        os.chown(path, 0, gid, follow_symlinks=False)
        os.chmod(path, 0o710)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    _ctrl_c_is_ctrl_c()
    if os.geteuid() != 0:
        return
    from chaoskit.core.accounts import job_group

    try:
        _JOB_FOLDERS["gid"] = job_group()
    except Exception as exc:  # noqa: BLE001 - no groupadd here: the drills' jobs keep root, as they say
        sys.stderr.write(f"the session's folders stay 0700 (no lab accounts' group: {exc})\n")
        return
    if config.option.basetemp:  # the operator's own --basetemp: its folders are opened, the folders above are theirs
        return
    _drop_old_sessions()
    session = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX))
    (session / "session.pid").write_text(str(os.getpid()))
    _open_to_job_group(session)
    _JOB_FOLDERS["session"] = session
    config.option.basetemp = str(session / "pytest")


def _ctrl_c_is_ctrl_c() -> None:
    """The suite drills Ctrl-C (a run's own and the teardown's), in this process and in the runs it starts. A suite
    started in the background of a script (``make test &``, ``nohup``) inherits SIGINT ignored, which Python keeps
    and every child inherits across exec: their Ctrl-C would do nothing and the drills would run to their
    ``abort_after``. So Ctrl-C here is Python's own again, and the children start with it at its default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


SESSION_PREFIX = "chaoskit-tests-"
KEEP_SESSIONS = 3
"""How many folders of ended sessions that failed are kept for a look (pytest keeps 3 of its own too)."""


def _drop_old_sessions() -> None:
    """Remove the folders of ended sessions (their pid gone) but the newest :data:`KEEP_SESSIONS`: a session that
    failed keeps its folder, and sessions run on. Only root's own folders of that name, never a link."""
    ended = []
    for folder in Path(tempfile.gettempdir()).glob(SESSION_PREFIX + "*"):
        try:
            st = os.lstat(folder)
            pid = int((folder / "session.pid").read_text())
        except (OSError, ValueError):
            continue
        if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != 0 or os.path.exists(f"/proc/{pid}"):
            continue
        ended.append((st.st_mtime, folder))
    for _, folder in sorted(ended, reverse=True)[KEEP_SESSIONS:]:
        shutil.rmtree(folder, ignore_errors=True)


def _opened(fn):
    def wrapped(self, *args, **kwargs):
        path = fn(self, *args, **kwargs)
        _open_to_job_group(path)
        return path
    return wrapped


pytest.TempPathFactory.getbasetemp = _opened(pytest.TempPathFactory.getbasetemp)
pytest.TempPathFactory.mktemp = _opened(pytest.TempPathFactory.mktemp)


@pytest.fixture(autouse=True)
def _private_state(tmp_path_factory, monkeypatch):
    """Each test gets its own chaoskit state dir (locks, leases, labs), root's alone (0700)."""
    state = tmp_path_factory.mktemp("state")
    state.chmod(0o700)
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(state))
    yield state


@pytest.fixture
def python() -> str:
    return sys.executable


@contextmanager
def connected(inventory):
    """Every node of ``inventory`` connected (agents started) for the block, closed after it."""
    from chaoskit.cluster.transports.ssh_many import connect_all

    connect_all([n.conn for n in inventory.nodes])
    try:
        yield inventory
    finally:
        for n in inventory.nodes:
            n.conn.close()


@contextmanager
def fault_context(inventory, tmp_path, ttl: float = 2.0):
    """A RunContext over ``inventory``: a journal and leases with a short TTL, closed after the block."""
    import time

    from chaoskit.runner import RunContext
    from chaoskit.safety.journal import Journal
    from chaoskit.safety.lease import LeaseManager

    journal = Journal(tmp_path / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", f"run-{os.getpid()}-{time.time_ns() % 10**9}", ttl=ttl)
    try:
        yield RunContext(inventory, journal, leases)
    finally:
        leases.close()
        journal.close()


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds; its last value after ``timeout``."""
    import time

    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# -- the fast tier cannot drift (issue 52) ---------------------------------------------------------------------
# A test that starts a training job or a lab is slow, by what it does: every process this Python starts is looked
# at, and one that is a torchrun agent or worker, NVRx's ft_launcher, torchft's lighthouse, a Ray node,
# slurmctld/slurmd or a lab node's sshd, or a docker lab brought up, counts.
# - A fixture that starts one is a lab fixture (:func:`lab_fixture`): every test that uses it is marked slow when
#   the tests are collected. One that starts one without being declared so fails the run at its end, naming it.
# - A test whose own body starts one without the ``slow`` mark fails, saying so.
# So ``-m "not slow"`` never starts a job or a lab, and no test can drift out of the slow tier unnoticed.

_HEAVY_ARGV = ("torch.distributed.run", "fault_tolerance.launcher", "torchft_lighthouse", "bin/ray start",
               "bin/slurmctld", "bin/slurmd", "sshd -f", "chaoskit.workloads.ddp_train")
_heavy: list[str] = []
_lab_fixtures: set[Any] = set()
_undeclared: dict[str, str] = {}


def lab_fixture(*args, **kwargs):
    """``pytest.fixture`` for a fixture that starts a lab or a training job: every test that uses it is slow."""
    def wrap(fn):
        _lab_fixtures.add(fn)
        return pytest.fixture(*args, **kwargs)(fn)
    return wrap


def _uses_a_lab_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(getattr(d, "func", None) in _lab_fixtures for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is None and _uses_a_lab_fixture(item):
            item.add_marker(pytest.mark.slow)
    if config.getoption("lanes") and hasattr(config, "workerinput"):
        _write_lanes(config, items)


def _popen_watch() -> None:
    import subprocess

    init = subprocess.Popen.__init__

    def watched(self, args, *a, **kw):
        text = args if isinstance(args, (str, bytes)) else " ".join(map(str, args))
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        for pattern in _HEAVY_ARGV:
            if pattern in text:
                _heavy.append(pattern)
                break
        if _lane.get("current") == "beside":
            words = text.split()
            tool = os.path.basename(words[0]) if words else ""
            if tool in _SHARED_TOOLS or (tool == "ip" and "netns" in words):
                _lane.setdefault("shared", []).append(repr(text[:120]))
        return init(self, args, *a, **kw)

    subprocess.Popen.__init__ = watched
    from chaoskit.nodeside import nodefs

    default_state_dir = nodefs.default_state_dir

    def watched_state_dir():
        if _lane.get("current") == "beside":
            _lane.setdefault("shared", []).append("root's node state folder (a LocalTransport without its state_dir)")
        return default_state_dir()

    nodefs.default_state_dir = watched_state_dir
    try:
        from chaoskit.lab.docker import DockerLab
    except Exception:  # noqa: BLE001 - the docker SDK missing: no docker lab to bring up either
        return
    up = DockerLab.up.__func__

    def watched_up(cls, *a, **kw):
        _heavy.append("a docker lab")
        return up(cls, *a, **kw)

    DockerLab.up = classmethod(watched_up)


_popen_watch()


_heavy_fixtures: dict[Any, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = len(_heavy)
    yield
    if len(_heavy) > before and fixturedef.func not in _lab_fixtures:
        _heavy_fixtures.setdefault(fixturedef.func, _heavy[before])


def pytest_runtest_teardown(item):
    """An unmarked test that uses a fixture another test's setup found starting a job or a lab."""
    if item.get_closest_marker("slow") is not None:
        return
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        for d in defs:
            if getattr(d, "func", None) in _heavy_fixtures:
                _undeclared.setdefault(f"{name} ({d.baseid or 'conftest'}), used by {item.nodeid}",
                                       _heavy_fixtures[d.func])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when not in ("setup", "call") or item.get_closest_marker("slow") is not None or not report.passed:
        return
    shared = _lane.pop("shared", None)
    if shared:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} runs beside the drills (its module is marked beside) but uses "
                           f"{shared[0]}, which the machine shares: take the mark off its module, or give the test "
                           "a folder of its own")
        return
    started = _heavy[getattr(item, "_heavy_start", len(_heavy)):]
    if started:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} starts {started[0]} but is not marked slow: a test that starts a training "
                           "job or a lab is slow (@pytest.mark.slow; a fixture that starts one: @lab_fixture)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._heavy_start = len(_heavy)
    _lane["current"] = _lane_of(item)
    _lane.pop("shared", None)

