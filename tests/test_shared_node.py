"""A node shared with a hostile local user: chaoskit's node-side files stay in folders it made.

The user ``ckhostile1`` (made here with ``useradd``, removed at the end) gets there first. Before
any drill it makes, world-writable, every folder older chaoskit wrote to (``/tmp/chaoskit-root``,
the SSH user's work folder; ``/tmp/chaoskit``, the docker transport's; ``/tmp/chaoskit-ray``,
``/tmp/chaoskit-oom-*``, ``/tmp/chaoskit-slow-*``, ``/tmp/chaoskit-crashloop-*``) and fills them
with what would turn root's writes against the system: symlinks at the names chaoskit wrote
(the watchdog script, the lease folders, a temp name, a ballast), a ``released`` file where a
lease would be, and a ``subprocess.py`` that records being imported (a script's folder and the
current folder come first on ``sys.path``). Its links point into a bait folder of its home; any
file appearing there, or any change to its folders, is root having been turned.

Then: a state folder someone else made (or a link, or one others can write) is refused with a
clear error and nothing is written there; ``network.link_down`` over SSH on the netns lab, armed,
injected and reverted, and again with the controller SIGKILLed (the watchdog reverts), keeps every
file in chaoskit's own folder; the fault helpers refuse a state file outside it; a lease on the local
transport runs its watchdog with ``python3 -I`` from a folder the hostile user controls.
"""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import need, need_root_tool, wait_until

pytest_plugins = ["tests.netns_fixtures"]

HOSTILE = "ckhostile1"
HOME = Path(f"/home/{HOSTILE}")
BAIT = HOME / "bait"
OLD_FOLDERS = ["/tmp/chaoskit-root", "/tmp/chaoskit", "/tmp/chaoskit-ray", "/tmp/chaoskit-oom-planted",
               "/tmp/chaoskit-slow-planted", "/tmp/chaoskit-crashloop-planted"]
"""The node-side folders chaoskit used before it had a state folder of its own."""
PLANTED: list[str] = []
"""Those the hostile user made (all but one that already existed and that the tests do not name)."""
ROOT = Path(__file__).resolve().parents[1]

PLANT = r"""
set -e
umask 000
mkdir -p "$BAIT"
chmod 0777 "$BAIT"
echo "the hostile user's own file" > "$BAIT/existing"
for d in $FOLDERS; do
    mkdir -p "$d"
    chmod 0777 "$d"
    ln -s "$BAIT/written-through-$(basename $d)" "$d/$WATCHDOG"
    ln -s "$BAIT/leases-$(basename $d)" "$d/leases"
    ln -s "$BAIT/existing" "$d/lease"
    ln -s "$BAIT/tmp-$(basename $d)" "$d/$WATCHDOG.tmp1"
    ln -s "$BAIT/ballast-$(basename $d)" "$d.ballast"
    : > "$d/released"
    printf 'open("%s/imported-%s", "w").close()\nraise ImportError("planted")\n' "$BAIT" "$(basename $d)" > "$d/subprocess.py"
    cp "$d/subprocess.py" "$d/json.py"
done
"""


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, **kwargs)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {(res.stderr or res.stdout).strip()}")
    return res


def as_hostile(script: str, **env: str) -> None:
    sh("runuser", "-u", HOSTILE, "--", "env", *[f"{k}={v}" for k, v in env.items()], "sh", "-c", script)


def snapshot() -> dict[str, tuple]:
    """Every entry of the hostile user's folders (its bait and what it made in /tmp): kind, owner, size, mtime."""
    out = {}
    for top in [str(BAIT), *PLANTED, *(f + ".ballast" for f in PLANTED)]:
        if not os.path.lexists(top):
            continue
        paths = [top]
        if os.path.isdir(top) and not os.path.islink(top):
            for folder, dirs, files in os.walk(top):
                paths += [os.path.join(folder, n) for n in dirs + files]
        for path in paths:
            st = os.lstat(path)
            out[path] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns)
    return out


def _drop_hostile() -> None:
    """Remove what a hostile user planted (never a folder root made: another test's may be in use)."""
    for folder in OLD_FOLDERS:
        for path in (folder, folder + ".ballast"):
            if os.path.lexists(path) and os.lstat(path).st_uid != 0:
                sh("rm", "-rf", "--one-file-system", path, check=False)
    if sh("id", "-u", HOSTILE, check=False).returncode == 0:
        sh("userdel", "--remove", "--force", HOSTILE, check=False)


@pytest.fixture(scope="module")
def hostile():
    """``ckhostile1`` with its folders and links planted before chaoskit runs; the snapshot of them."""
    need_root_tool("useradd")
    need(sh("which", "runuser", check=False).returncode == 0, "runuser (util-linux)")
    from chaoskit.nodeside.watchdog import watchdog_source
    import hashlib

    _drop_hostile()  # a crashed session's leftover
    PLANTED[:] = [f for f in OLD_FOLDERS if not os.path.lexists(f) and not os.path.lexists(f + ".ballast")]
    taken = [f for f in OLD_FOLDERS if f not in PLANTED and f != "/tmp/chaoskit-ray"]  # the tests name all others
    need(not taken, f"free names to plant: {taken} exist already (made by an older chaoskit? remove them)")
    sh("useradd", "--create-home", "--shell", "/bin/sh", HOSTILE)
    try:
        watchdog = f"watchdog-{hashlib.sha256(watchdog_source().encode()).hexdigest()[:12]}.py"
        as_hostile(PLANT, BAIT=str(BAIT), FOLDERS=" ".join(PLANTED), WATCHDOG=watchdog)
        yield snapshot()
    finally:
        _drop_hostile()


def untouched(before: dict[str, tuple]) -> None:
    """Nothing written into, removed from or created in the hostile user's folders; no bait taken."""
    after = snapshot()
    assert sorted(set(after) - set(before)) == []
    assert sorted(set(before) - set(after)) == []
    changed = [p for p in before if before[p] != after[p]]
    assert changed == []


def new_tmp_entries(since: float) -> list[str]:
    """Entries named like chaoskit's files made in the world-writable folders since ``since``, not by ckhostile1."""
    out = []
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for name in os.listdir(top):
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if "chaoskit" in name and st.st_ctime >= since and path not in PLANTED and not path.endswith(".ballast"):
                out.append(path)
    return out


# -- the state folder --------------------------------------------------------------------------


def test_a_state_folder_someone_else_controls_is_refused_and_nothing_is_written_there(hostile, tmp_path):
    from chaoskit.nodeside.nodefs import StateDirError, state_dir

    world = tmp_path / "world-writable"
    world.mkdir()
    world.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    (tmp_path / "real").mkdir(mode=0o700)
    cases = {
        "/tmp/chaoskit-root": "is owned by uid",  # the hostile user's, made before us
        str(world): "is writable by others than its owner (mode 0777)",  # ours, but anyone can swap what is in it
        str(link): "is a symbolic link",
        "/tmp/chaoskit-root/state": "a folder above it, is owned by uid",  # ours inside theirs: they can rename it
    }
    for path, problem in cases.items():
        with pytest.raises(StateDirError) as info:
            state_dir(path)
        assert path in str(info.value) and problem in str(info.value), str(info.value)
        assert HOSTILE in str(info.value) or "owned" not in problem
    untouched(hostile)
    assert os.listdir(tmp_path / "real") == [] and os.listdir(world) == []
    made = state_dir(str(tmp_path / "fresh" / "state"))  # made by us: 0700, and accepted
    assert os.stat(made).st_mode & 0o777 == 0o700 and os.stat(made).st_uid == 0


def test_the_agent_refuses_a_workdir_someone_else_made_and_names_it(netns_lab, hostile):
    from chaoskit.cluster.transports.ssh import SSHTransport
    from chaoskit.core.errors import InfraError

    lab = netns_lab
    t = SSHTransport("n0", lab.mgmt_address("n0"), key_file=lab.key_path, known_hosts=lab.known_hosts_path,
                     process_scope="netns", workdir="/tmp/chaoskit-root", connect_timeout=5)
    with pytest.raises(InfraError) as info:
        t.connect()
    message = str(info.value)
    assert message.startswith("node n0: refusing chaoskit's state folder /tmp/chaoskit-root: it is owned by uid")
    assert HOSTILE in message and "workdir" in info.value.hint
    t.close()
    untouched(hostile)


def test_a_non_root_agent_keeps_its_state_in_its_own_home(hostile, tmp_path):
    """The agent started as an unprivileged user (here the hostile one itself, over its own login) makes
    ~/.local/state/chaoskit 0700; and refuses that folder once it is writable by others."""
    from chaoskit.nodeside.agent import BOOT
    from chaoskit.cluster.transports.channel import agent_program

    program = agent_program(None)

    def hello() -> dict:
        res = subprocess.run(["runuser", "-u", HOSTILE, "--", "python3", "-I", "-u", "-c", BOOT], cwd="/",
                             input=f"{len(program)}\n".encode() + program, capture_output=True, timeout=60)
        assert res.stdout, res.stderr.decode()[-2000:]
        return json.loads(res.stdout.splitlines()[0])

    state = HOME / ".local" / "state" / "chaoskit"
    first = hello()
    assert first["state_dir"] == str(state) and first["state_error"] is None
    st = os.lstat(state)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == int(sh("id", "-u", HOSTILE).stdout)
    os.chmod(state, 0o777)
    second = hello()
    assert second["state_dir"] is None
    assert second["state_error"] == f"refusing chaoskit's state folder {state}: it is writable by others than its owner (mode 0777)"
    sh("rm", "-rf", str(HOME / ".local"))


# -- drills over SSH ---------------------------------------------------------------------------


def _default_workdir_inventory(lab) -> Path:
    """The lab's inventory without its ``workdir``s: the agent picks (and checks) its own state folder."""
    doc = lab.inventory_document()
    for node in doc["nodes"]:
        node.pop("workdir")
    path = lab.directory / "shared-node-inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _files_under(folder: str) -> set[str]:
    out = set()
    for base, dirs, files in os.walk(folder):
        out |= {os.path.join(base, n) for n in dirs + files}
    return out


def test_link_down_over_ssh_writes_only_in_chaoskits_state_folder(netns_lab, hostile, tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.nodeside.nodefs import ROOT_STATE_DIR
    from chaoskit.cluster.selectors import resolve_nodes
    from chaoskit.faults.registry import get_fault
    from tests.conftest import connected, fault_context
    from tests.netns_fixtures import node_clean

    lab, start = netns_lab, time.time() - 1
    cls = get_fault("network.link_down")
    fault = cls(cls.Spec.model_validate({"kind": "network.link_down", "target": {"nodes": ["n0"]}, "duration": "30s"}), "f0")
    with connected(load_inventory(_default_workdir_inventory(lab))) as inventory, fault_context(inventory, tmp_path) as ctx:
        t = ctx.transport("n0")
        assert t.state_dir == ROOT_STATE_DIR  # root on the node (become: none, user root)
        [inj] = fault.inject(ctx, resolve_nodes(inventory, fault.spec.target))
        lease = ctx.leases.leases[inj.fault_id]
        assert lease.directory == f"{ROOT_STATE_DIR}/leases/{ctx.leases.run_id}/{inj.fault_id}"
        assert node_clean(lab, "n0") is not None, "the link is not down"
        during = _files_under(ROOT_STATE_DIR)
        assert {f"{lease.directory}/lease", f"{lease.directory}/watchdog.pid"} <= during
        assert os.lstat(ROOT_STATE_DIR).st_mode & 0o777 == 0o700
        for path in during:  # every one of chaoskit's files there: ours, writable by nobody else, no link among them
            st = os.lstat(path)
            assert st.st_uid == 0 and not (st.st_mode & 0o022) and not os.path.islink(path), path
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        assert fault.verify(ctx, inj) is None
    assert wait_until(lambda: node_clean(lab, "n0") is None, 5)
    assert not os.path.exists(f"{ROOT_STATE_DIR}/leases/{ctx.leases.run_id}")  # the run's leases are cleaned up
    untouched(hostile)
    assert new_tmp_entries(start) == []


CONTROLLER = r"""
import sys, time
from pathlib import Path
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.selectors import resolve_nodes
from chaoskit.faults.registry import get_fault
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal
from chaoskit.safety.lease import LeaseManager

inventory_path, run_dir = sys.argv[1], Path(sys.argv[2])
inventory = load_inventory(inventory_path)
cls = get_fault("network.link_down")
spec = cls.Spec.model_validate({"kind": "network.link_down", "target": {"nodes": ["n1"]}, "duration": "10m"})
leases = LeaseManager(run_dir / "leases", run_dir.name, 2.0)
ctx = RunContext(inventory, Journal(run_dir / "journal.jsonl"), leases)
[inj] = cls(spec, "f0").inject(ctx, resolve_nodes(inventory, spec.target))
print(leases.leases[inj.fault_id].directory, flush=True)
time.sleep(600)
"""


def test_the_watchdog_still_reverts_after_the_controller_dies(netns_lab, hostile, tmp_path):
    """The hostile user's ``released`` files and links sit where older watchdogs looked: the watchdog,
    in chaoskit's own folder, does not see them and reverts within the TTL of the SIGKILL."""
    from tests.netns_fixtures import node_clean

    lab, start = netns_lab, time.time() - 1
    run_dir = tmp_path / "killed-run"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(_default_workdir_inventory(lab)), str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        directory = proc.stdout.readline().strip()
        assert directory.startswith("/run/chaoskit/leases/killed-run/"), proc.stderr.read() if not directory else directory
        assert node_clean(lab, "n1") is not None, "the link is not down"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    killed = time.time()
    assert wait_until(lambda: node_clean(lab, "n1") is None, 2.0 + 5, interval=0.05), node_clean(lab, "n1")
    assert time.time() - killed <= 2.0 + 5
    assert wait_until(lambda: os.path.exists(f"{directory}/fired"), 5)
    assert "lease expired" in Path(f"{directory}/fired").read_text()
    subprocess.run(["rm", "-rf", "/run/chaoskit/leases/killed-run"], check=True)
    untouched(hostile)
    assert new_tmp_entries(start) == []


# -- fault helpers and the local transport -----------------------------------------------------


def test_fault_helpers_refuse_state_outside_chaoskits_folder(hostile, tmp_path):
    """mem.oom's and node.slow's tools and gpu.fail's crash loop, handed a path in the hostile user's
    folder (what older chaoskit used), write nothing there; their ``started`` file is parsed without echoing it."""
    from chaoskit.core.errors import InfraError
    from chaoskit.faults.gpu import CRASHLOOP
    from chaoskit.faults.memory import BALLAST, MEMORY_TOOL
    from chaoskit.faults.node_tool import parse_started
    from chaoskit.faults.slow import CGROUP_TOOL

    runs = {
        "node.slow": [CGROUP_TOOL, "throttle", "chaoskit-planted", "50", "100000", "/tmp/chaoskit-slow-planted/s.json",
                      str(os.getpid())],
        "mem.oom cap": [MEMORY_TOOL, "cap", "chaoskit-oom-x-planted", str(64 << 20), "/tmp/chaoskit-oom-planted/s.json",
                        "/tmp/chaoskit-oom-planted.ballast", str(os.getpid())],
        "mem.oom restore": [MEMORY_TOOL, "restore", "/tmp/chaoskit-oom-planted/released"],
        "ballast": [BALLAST, "/nonexistent/cgroup.procs", "/tmp/chaoskit-oom-planted/b", "1", str(os.getpid())],
        "crash loop": [CRASHLOOP, "/tmp/chaoskit-crashloop-planted/loop", "1", "0.05", json.dumps({"env": "x"}), "{}"],
    }
    for what, args in runs.items():
        res = subprocess.run([sys.executable, "-I", "-c", *args], capture_output=True, text=True, timeout=60, cwd="/")
        assert res.returncode != 0, what
        assert "refusing chaoskit's state folder /tmp/chaoskit-" in res.stderr and HOSTILE in res.stderr, (what, res.stderr)
    untouched(hostile)
    with pytest.raises(InfraError) as info:
        parse_started("root:$6$secret-hash:19000:0:99999:7:::\n", "gpu.fail: the crash loop's started file", "n0")
    assert "secret" not in str(info.value) and "root:" not in str(info.value)


def test_a_local_lease_runs_its_watchdog_isolated_from_a_hostile_cwd_and_pythonpath(hostile, tmp_path, monkeypatch):
    """The controller's current folder and PYTHONPATH name the hostile user's folder (with its
    ``subprocess.py``): the watchdog (``python3 -I``) imports nothing from there and still fires."""
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.core.errors import InfraError
    from chaoskit.safety.lease import LeaseManager

    marker = tmp_path / "reverted"
    monkeypatch.chdir("/tmp/chaoskit")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.environ.get("PYTHONPATH", str(ROOT)), "/tmp/chaoskit"]))
    leases = LeaseManager(tmp_path / "leases", "local-run", ttl=0.5)
    try:
        # a revert that carries a secret (as ipmitool -P does): on no command line another user can read
        revert = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()", str(marker), "-P", "hunter2-bmc"]
        lease = leases.arm(LocalTransport("local"), "f0", revert, duration=60)
        assert lease.directory == str(tmp_path / "leases" / "local-run" / "f0")
        cmdline = Path(f"/proc/{lease.watchdog_pid}/cmdline").read_bytes()
        assert b"watchdog" in cmdline and b"hunter2-bmc" not in cmdline
        assert os.stat(Path(lease.directory) / "revert.json").st_mode & 0o777 == 0o600
        leases.abandon("f0")  # no more renewals: the watchdog fires within the TTL
        assert wait_until(lambda: lease.fired is not None, 10), "the watchdog did not fire"
        assert "lease expired" in lease.fired and marker.exists()
    finally:
        leases.close()
    untouched(hostile)  # in particular no bait/imported-chaoskit: its subprocess.py was never imported
    with pytest.raises(InfraError, match="refusing chaoskit's state folder /tmp/chaoskit-root: it is owned by uid"):
        LeaseManager(Path("/tmp/chaoskit-root"), "r", ttl=1).arm(LocalTransport("local"), "f0", ["true"], duration=1)
    untouched(hostile)


# -- labs --------------------------------------------------------------------------------------


def test_the_munge_key_is_made_0400_and_never_written_through_a_link(hostile, tmp_path):
    from chaoskit.lab.slurm import new_munge_key

    key = tmp_path / "munge.key"
    key.symlink_to(BAIT / "existing")  # what a user who could write the folder would plant
    new_munge_key(key)
    st = os.lstat(key)
    assert not os.path.islink(key) and st.st_mode & 0o777 == 0o400 and st.st_size == 128 and st.st_uid == 0
    first = key.read_bytes()
    new_munge_key(key)  # a lab brought up again in the same folder: a new key, not the old one reused
    assert key.read_bytes() != first
    untouched(hostile)


def test_the_docker_labs_shared_folder_is_private_and_someone_elses_is_refused(hostile, tmp_path):
    from chaoskit.core.errors import InfraError
    from chaoskit.lab.docker import private_bind

    shared = tmp_path / "shared"
    private_bind(str(shared))
    # root's, and the lab accounts' group may pass through to the job's own folder (issue 48): no one else
    st = os.lstat(shared)
    assert (st.st_mode & 0o777, st.st_uid, grp.getgrgid(st.st_gid).gr_name) == (0o710, 0, "chaoskit-jobs")
    with pytest.raises(InfraError) as info:
        private_bind("/tmp/chaoskit")  # the hostile user's, as /tmp/chaoskit-docker would be had it come first
    assert "refusing chaoskit's state folder /tmp/chaoskit: it is owned by uid" in str(info.value)
    assert "CHAOSKIT_DOCKER_SHARED" in info.value.hint
    untouched(hostile)
