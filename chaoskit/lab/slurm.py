"""The Slurm lab: a real slurmctld and one real slurmd per node, on the network-namespace lab.

Needs root and Debian's slurm-wlm (``apt-get install slurmctld slurmd munge``).
The nodes are those of a :class:`~chaoskit.lab.netns.NetnsLab` (a namespace each,
with its data and mgmt NICs and its sshd); on top of it:

- one ``munged`` for the lab, with its own key and socket (``AuthInfo=socket=``), so
  the machine's own munge, if any, is never touched; every namespace shares the socket
  (a unix socket is a file, not an address);
- what a lab account needs to submit and run a job (``slurm.conf``, munge's socket, the
  nodes' spool folders, where slurmstepd writes the batch script the job runs) in the lab's
  own folder under :data:`PUBLIC_ROOT`, root's with group ``chaoskit-jobs`` (mode 0710,
  ``slurm.conf`` 0640): the lab's job runs as a lab account (issue 48), which reaches
  nothing else of the lab (its state, its logs, the munge key stay in root's 0700 state
  folder); no other user reaches it;
- ``slurmctld`` in this machine's namespace, reached on the lab's mgmt bridge address:
  ``SlurmctldHost`` carries the machine's host name (slurmctld checks it) with that
  address in parentheses;
- one ``slurmd -N <node>`` per node, entered with ``nsenter --net=/var/run/netns/NS``:
  ``ip netns exec`` remounts /sys, and slurmd then finds no cgroup file system;
  ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` need no cgroups.

The generated ``slurm.conf`` keeps every timeout short so drills are fast; a scenario
sets them (:data:`DEFAULT_SETTINGS` names the keys). ``down`` leaves no daemon, state
folder, namespace or munge process that the lab started.

Power: ``python -m chaoskit.lab.slurm power off|on|status --dir DIR NODE``: the netns
lab's power (links down, every process of the namespace killed: slurmd, the job's
steps), and on power-on the node's slurmd starts again, which is what a booting node
does; ``ReturnToService=2`` lets slurmctld take it back when it registers.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.cluster.slurm import SlurmAccess
from chaoskit.core.accounts import job_group
from chaoskit.core import procs
from chaoskit.core.errors import InfraError
from chaoskit.core.shell import shell_quote
from chaoskit.core.state import state_dir
from chaoskit.lab.admin import lab_main
from chaoskit.lab import labdir
from chaoskit.lab.labdir import run_tool
from chaoskit.lab.netns import NetnsLab, require_netns_tools
from chaoskit.nodeside import nodefs

__all__ = ["SlurmLab", "slurm_lab_dir", "require_slurm_tools", "DEFAULT_SETTINGS", "PARTITION", "HEALTHCHECK",
           "PUBLIC_ROOT"]

TOOLS = ("slurmctld", "slurmd", "munged", "nsenter", "scontrol", "sbatch", "squeue", "scancel", "sinfo", "srun")
HINT = "apt-get install -y slurmctld slurmd slurm-client munge"
PARTITION = "chaoskit"
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"

DEFAULT_SETTINGS: dict[str, float] = {
    "slurmd_timeout": 6.0,
    "requeue_hold": 5.0,
    "sched_interval": 2.0,
    "message_timeout": 5.0,
    "kill_wait": 2.0,
    "health_check_interval": 0.0,
}
"""The lab's Slurm timings, in seconds (short, so a drill lasts seconds, not minutes):

- ``slurmd_timeout``: ``SlurmdTimeout``: how long slurmctld waits for a silent slurmd before the node is DOWN;
- ``requeue_hold``: ``AuthInfo=cred_expire``: a requeued job may not start before its old credentials expired
  (the BeginTime a requeued job waits for; Slurm's default 120 s);
- ``sched_interval``: ``SchedulerParameters=sched_interval``: the main scheduler's period (it also runs on events);
- ``message_timeout``: ``MessageTimeout``; ``kill_wait``: ``KillWait`` (SIGTERM to SIGKILL of a job's steps);
- ``health_check_interval``: ``HealthCheckInterval`` with ``HealthCheckProgram`` = :data:`HEALTHCHECK` (0: none): every
  slurmd runs the site-style check that drains a node whose GPU has a fatal Xid in the kernel log (the lab's
  emulated GPU ids, one per node, in ``gpus/NODE``; the node found by its address in ``nodemap``, since the
  namespaces share one host name).
"""

HEALTHCHECK = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "healthcheck.sh"
"""The example health check the lab runs (a source checkout's ``examples/slurm/healthcheck.sh``)."""


PUBLIC_ROOT = Path("/run/chaoskit-slurm")
"""Where each Slurm lab keeps what its job's account needs to submit and run a job (``<lab id>/slurm.conf``,
``<lab id>/munge/munge.socket``): root's folders in the lab accounts' group (:data:`~chaoskit.core.accounts.JOB_GROUP`),
mode 0710, which that group may pass through and no one else may enter."""


def slurm_lab_dir() -> Path:
    return state_dir() / "lab" / "slurm"


def require_slurm_tools() -> dict[str, str]:
    """Paths of what the lab needs; :class:`InfraError` (exit 3) naming what is missing, or that root is needed."""
    if os.geteuid() != 0:
        raise InfraError("the Slurm lab needs root (network namespaces, slurmctld, slurmd, munged)",
                         hint=f"run it with sudo; it also needs: {HINT}")
    found = {name: shutil.which(name, path=os.environ.get("PATH", "") + ":" + _SBIN) for name in TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise InfraError(f"the Slurm lab needs {', '.join(missing)}", hint=HINT)
    require_netns_tools()
    return {k: v for k, v in found.items() if v}


@dataclass
class SlurmLab:
    lab_id: str
    directory: Path
    nodes: int
    spare: int = 0
    settings: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    port: int = 6817
    hostname: str = ""
    bin_dir: str = "/usr/sbin"
    created: float = field(default_factory=time.time)
    public: str = ""
    """The lab's folder under :data:`PUBLIC_ROOT` (its ``slurm.conf`` and munge's socket, which a lab account reaches);
    ``""``: a lab made before it existed, whose two are in :attr:`directory` (its job is then root's)."""

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def create(cls, nodes: int, spare: int = 0, settings: dict[str, float] | None = None,
               directory: str | os.PathLike[str] | None = None) -> "SlurmLab":
        """Build the lab; return once slurmctld sees every node IDLE. On failure nothing is left."""
        tools = require_slurm_tools()
        directory = Path(directory or slurm_lab_dir()).resolve()
        labdir.claim(directory, "Slurm lab", 0o700)  # root's alone: what others reach is in PUBLIC_ROOT
        net = NetnsLab.create(nodes, spare=spare, directory=directory / "netns")
        lab = cls(net.lab_id, directory, nodes, spare, {**DEFAULT_SETTINGS, **(settings or {})}, _free_port(),
                  socket.gethostname(), str(Path(tools["slurmctld"]).parent), public=str(PUBLIC_ROOT / net.lab_id))
        labdir.build_whole(lab._save, lab._build, lab.down)
        return lab

    @classmethod
    def load(cls, directory: str | os.PathLike[str] | None = None) -> "SlurmLab | None":
        data = labdir.load(Path(directory or slurm_lab_dir()))
        if data is None:
            return None
        data["settings"] = {**DEFAULT_SETTINGS, **data.get("settings", {})}  # a lab made before a setting existed had its default
        return cls(**data)

    def down(self) -> None:
        """Stop every daemon the lab started (slurmd with its namespace, slurmctld, munged), remove the namespaces
        and the lab's directory (slurmctld's state, the spools, the munge key)."""
        net = self.net
        if net is not None:
            for node in net.node_names():
                net._kill_node(node)
        for name in ("slurmctld", "munged"):
            _kill_pidfile(self.directory / f"{name}.pid")
        labdir.kill_marked(str(self.directory / "slurm.conf"))
        labdir.kill_marked(str(self.munge_socket))
        if net is not None:
            net.down()
        if self.public:
            shutil.rmtree(self.public, ignore_errors=True)  # never follows a link out of it
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- names and paths ------------------------------------------------------------------

    @property
    def net(self) -> NetnsLab | None:
        return NetnsLab.load(self.directory / "netns")

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(self.nodes + self.spare)]

    @property
    def reachable(self) -> bool:
        """Whether a lab account can submit to this lab (its ``slurm.conf`` and munge's socket in :attr:`public`)."""
        return bool(self.public)

    @property
    def conf_path(self) -> Path:
        return Path(self.public or self.directory) / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return Path(self.public or self.directory) / "munge" / "munge.socket"

    @property
    def inventory_path(self) -> Path:
        return self.directory / "inventory.yaml"

    def node_dir(self, node: str) -> Path:
        return self.directory / "nodes" / node

    def spool_dir(self, node: str) -> Path:
        """``node``'s ``SlurmdSpoolDir``, where slurmstepd writes the batch script the job's account runs."""
        return Path(self.public or self.directory) / "nodes" / node / "spool"

    def access(self) -> SlurmAccess:
        return SlurmAccess(conf=str(self.conf_path))

    def power_argv(self, node: str, action: str) -> list[str]:
        return [sys.executable, "-m", "chaoskit.lab.slurm", "power", action, "--dir", str(self.directory), node]

    def inventory_document(self, net: NetnsLab | None = None) -> dict[str, Any]:
        """The netns lab's inventory, with this lab's power commands (they restart slurmd) and labels."""
        doc = (net or self.net).inventory_document()
        doc["ssh"]["key"] = str(self.directory / "netns" / doc["ssh"]["key"])
        doc["ssh"]["known_hosts"] = str(self.directory / "netns" / doc["ssh"]["known_hosts"])
        for node in doc["nodes"]:
            node["labels"]["lab"] = "slurm"
            node["power"] = {a: self.power_argv(node["name"], a) for a in ("off", "on", "status")}
        return doc

    # -- power ----------------------------------------------------------------------------

    def power(self, node: str, action: str) -> bool:
        net = self._net()
        if action == "on":
            on = net.power(node, "on")
            if not self._slurmd_alive(node):
                self._start_slurmd(node)
            return on
        if action == "status":
            return net.power(node, "status") and self._slurmd_alive(node)
        return net.power(node, action)

    def status(self) -> dict[str, Any]:
        net = self._net()
        try:
            slurm = self.access().nodes()
        except InfraError:
            slurm = {}
        return {
            "kind": "slurm", "id": self.lab_id, "directory": str(self.directory), "conf": str(self.conf_path),
            "inventory": str(self.inventory_path), "slurmctld": _alive(self.directory / "slurmctld.pid"),
            "nodes": [{"name": n, "address": net.mgmt_address(n), "on": net.power(n, "status"),
                       "slurm_state": slurm.get(n, {}).get("State", "?")} for n in self.node_names()],
        }

    # -- building -------------------------------------------------------------------------

    def _net(self) -> NetnsLab:
        net = self.net
        if net is None:
            raise InfraError(f"the Slurm lab in {self.directory} has no netns lab under it (half torn down?)",
                             hint="chaoskit lab down")
        return net

    def _save(self, state: str) -> None:
        labdir.save(self.directory, asdict(self), state)

    def _build(self) -> None:
        net = self._net()
        if self.public:
            _group_folder(Path(self.public), new=True)
        self._start_munged()
        (self.directory / "ctld").mkdir(mode=0o700, exist_ok=True)
        for node in self.node_names():
            (self.node_dir(node)).mkdir(parents=True, exist_ok=True)
            if self.public:  # slurmstepd writes the batch script there, which the job's account runs
                _group_folder(self.spool_dir(node), new=True)
            else:
                self.spool_dir(node).mkdir(exist_ok=True)
        if self.settings.get("health_check_interval", 0) > 0:
            self._write_healthcheck(net)
        if self.public:
            _write_for_group(self.conf_path, self.conf_text(net))
        else:
            self.conf_path.write_text(self.conf_text(net))
        net.open_to_all(net.controller_address, self.port)  # every user's sbatch/squeue (munge is their login)
        _run([os.path.join(self.bin_dir, "slurmctld"), "-c", "-f", str(self.conf_path)], env=self._env())
        for node in self.node_names():
            self._start_slurmd(node)
        self._wait_idle(self.node_names(), timeout=30.0)
        import yaml

        header = f"# chaoskit Slurm lab {self.lab_id}: generated by `chaoskit lab up --kind slurm`; removed by `lab down`.\n"
        self.inventory_path.write_text(header + yaml.safe_dump(self.inventory_document(net), sort_keys=False, width=200))

    def _write_healthcheck(self, net: NetnsLab) -> None:
        """The example health check, copied into the lab, and the wrapper slurmd runs: the lab's settings for it."""
        if not HEALTHCHECK.is_file():
            raise InfraError(f"health_check_interval needs the example health check {HEALTHCHECK}, which is missing",
                             hint="run from a chaoskit source checkout, or leave health_check_interval unset")
        d = self.directory
        script = d / "healthcheck.sh"
        shutil.copyfile(HEALTHCHECK, script)
        script.chmod(0o700)
        (d / "gpus").mkdir(mode=0o700, exist_ok=True)
        doc = net.inventory_document()
        rows = []
        for n in doc["nodes"]:
            (d / "gpus" / n["name"]).write_text("\n".join(n.get("gpu_pci", [])) + "\n")
            rows += [f"{net.mgmt_address(n['name'])} {n['name']}", f"{net.data_address(n['name'])} {n['name']}"]
        (d / "nodemap").write_text("\n".join(rows) + "\n")
        # The lab's nodes "booted" now: an Xid line an earlier lab left in this machine's kernel log is not theirs.
        state = d / "healthcheck-state"
        state.mkdir(mode=0o700)
        booted = f"{time.monotonic():.6f}\n"  # the kernel log's clock (seconds since boot)
        for n in doc["nodes"]:
            (state / f"{n['name']}.last").write_text(booted)
        env = {"SLURM_CONF": str(self.conf_path), "HC_GPU_DIR": str(d / "gpus"), "HC_NODE_MAP": str(d / "nodemap"),
               "HC_STATE_DIR": str(d / "healthcheck-state")}
        wrapper = d / "healthcheck"
        wrapper.write_text("#!/bin/sh\n# chaoskit Slurm lab: the example health check with this lab's settings\n"
                           + "".join(f"{k}={shell_quote([v])}; export {k}\n" for k, v in env.items())
                           + f"exec /bin/sh {shell_quote([str(script)])}\n")
        wrapper.chmod(0o700)

    def conf_text(self, net: NetnsLab) -> str:
        s = self.settings
        d = self.directory
        lines = [
            f"# slurm.conf of chaoskit Slurm lab {self.lab_id} (generated; removed by `chaoskit lab down`)",
            f"ClusterName={self.lab_id}",
            # slurmctld checks its host name against SlurmctldHost; the address is the lab's mgmt bridge.
            f"SlurmctldHost={self.hostname}({net.controller_address})",
            f"SlurmctldPort={self.port}",
            "SlurmdPort=6818",  # one per namespace: the same port on every node's own address
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={int(max(5, s['requeue_hold']))}",
            f"StateSaveLocation={d / 'ctld'}",
            f"SlurmdSpoolDir={Path(self.public or d) / 'nodes' / '%n' / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'nodes' / '%n' / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'nodes' / '%n' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            f"SchedulerParameters=sched_interval={int(max(1, s['sched_interval']))}",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "JobRequeue=1",
            f"SlurmdTimeout={int(max(1, s['slurmd_timeout']))}",
            f"SlurmctldTimeout={int(max(3, s['slurmd_timeout']))}",
            f"MessageTimeout={int(max(2, s['message_timeout']))}",
            f"KillWait={int(max(1, s['kill_wait']))}",
            "InactiveLimit=0",
            "MinJobAge=600",
            *([f"HealthCheckProgram={d / 'healthcheck'}", f"HealthCheckInterval={int(max(1, s['health_check_interval']))}",
               "HealthCheckNodeState=ANY"] if s.get("health_check_interval", 0) > 0 else []),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for node in self.node_names():
            lines.append(f"NodeName={node} NodeHostname={node} NodeAddr={net.mgmt_address(node)} CPUs=1 "
                         "RealMemory=100 State=UNKNOWN")
        # OverSubscribe=YES: jobs that ask (--oversubscribe) may share a node; no other job does
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        return "\n".join(lines) + "\n"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def _start_munged(self) -> None:
        mdir = self.directory / "munge"
        mdir.mkdir(mode=0o700, exist_ok=True)  # the key, seed and log: root's alone
        if self.public:  # the socket where the lab accounts reach it (the key, seed and log stay here)
            _group_folder(self.munge_socket.parent, new=True)
        key = new_munge_key(mdir / "munge.key")
        # --force: munged refuses root and a key it cannot prove private otherwise; the key is ours, 0400.
        _run(["munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
              f"--pid-file={self.directory / 'munged.pid'}", f"--log-file={mdir / 'munged.log'}",
              f"--seed-file={mdir / 'munged.seed'}"])

    def _start_slurmd(self, node: str) -> None:
        net = self._net()
        (self.node_dir(node) / "slurmd.pid").unlink(missing_ok=True)
        _run(["nsenter", f"--net=/var/run/netns/{net.netns(node)}",
              os.path.join(self.bin_dir, "slurmd"), "-f", str(self.conf_path), "-N", node], env=self._env())

    def _slurmd_alive(self, node: str) -> bool:
        return _alive(self.node_dir(node) / "slurmd.pid")

    def _wait_idle(self, nodes: list[str], timeout: float) -> None:
        end = time.time() + timeout
        states: dict[str, Any] = {}
        while time.time() < end:
            try:
                states = {n: f.get("State", "") for n, f in self.access().nodes().items()}
            except InfraError:
                states = {}
            if all(states.get(n, "").split("+")[0] in ("IDLE", "ALLOCATED", "MIXED") and "NOT_RESPONDING" not in states.get(n, "")
                   for n in nodes):
                return
            time.sleep(0.2)
        log = self.directory / "slurmctld.log"
        tail = log.read_text()[-400:].strip() if log.exists() else ""
        raise InfraError(f"slurmctld did not see every node idle within {timeout:g}s: {states or 'no answer'}"
                         + (f"; slurmctld.log ends: {tail}" if tail else ""))


def _group_folder(folder: Path, new: bool) -> None:
    """``folder`` (in :data:`PUBLIC_ROOT`, made too when missing) root's with the lab accounts' group, mode 0710:
    made here (``new``: refused when anything is there, a link included), else checked to be root's own folder, not
    a link. Mode and group are set on the opened folder, never through a path a link could redirect."""
    gid = job_group()
    if gid is None:
        raise InfraError("the Slurm lab needs root")
    if folder != PUBLIC_ROOT:  # its parents first, up to PUBLIC_ROOT (which /run holds)
        if PUBLIC_ROOT not in folder.parents:
            raise InfraError(f"{folder} is not under {PUBLIC_ROOT}")
        _group_folder(folder.parent, new=False)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        if new:
            raise InfraError(f"{folder} is already there; a new Slurm lab makes its own",
                             hint="chaoskit lab down, or remove it if no lab uses it") from None
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0:
            raise InfraError(f"{folder} is not root's (uid {st.st_uid}); the Slurm lab keeps its slurm.conf only in a "
                             "folder of root's", hint="remove it; chaoskit makes it again")
        os.fchown(fd, 0, gid)
        os.fchmod(fd, 0o710)
    finally:
        os.close(fd)


def _write_for_group(path: Path, text: str) -> None:
    """``path`` made new with ``text``, root's with the lab accounts' group, mode 0640 from its first byte (no link
    followed, nothing that was there reused)."""
    gid = job_group()
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchown(fd, 0, gid if gid is not None else 0)
        os.fchmod(fd, 0o640)
        with os.fdopen(os.dup(fd), "w") as fh:
            fh.write(text)
    finally:
        os.close(fd)


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return run_tool(argv, env=env, timeout=timeout, hint=HINT)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(path: Path) -> bool:
    pid = _pid(path)
    if pid is None:
        return False
    return procs.state(pid) not in (None, "Z")


def _kill_pidfile(path: Path, timeout: float = 5.0) -> None:
    """SIGTERM the daemon of ``path`` (it cleans up its socket), SIGKILL it if it lingers."""
    pid = _pid(path)
    if pid is None or not _alive(path):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.time() + wait
        while time.time() < end and _alive(path):
            time.sleep(0.05)
        if not _alive(path):
            return


def new_munge_key(key: Path) -> Path:
    """A new munge key at ``key``: 128 random bytes, mode 0400 from its first byte, made with O_EXCL|O_NOFOLLOW
    (whatever was there before, a link included, is removed first, never written through or reused)."""
    key.unlink(missing_ok=True)
    nodefs.create_file(str(key), secrets.token_bytes(128), 0o400)
    return key


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoskit.lab.slurm``: the lab's power commands, and up/down/status for debugging."""
    return lab_main(argv, "python -m chaoskit.lab.slurm", "Slurm lab", lambda nodes, spare, directory: SlurmLab.create(nodes, spare, directory=directory),
                    SlurmLab.load, lambda lab: lab.conf_path)


if __name__ == "__main__":
    sys.exit(main())
