"""The process lab: N nodes on this machine, each a scope of local processes.

No root needed. A node is whatever the lab starts for it (a torchrun agent and
its workers), marked with ``CHAOSKIT_SCOPE=<lab id>.<node>`` in the environment
every descendant inherits; :class:`~chaoskit.cluster.transports.local.LocalTransport`
uses that mark to keep faults inside the node. ``lab down`` kills every process
carrying the lab's mark, so nothing outlives the lab.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.transports.local import LocalTransport, read_proc
from chaoskit.cluster.xid import lab_pci
from chaoskit.core.accounts import Account, lab_account_names, setpriv_argv
from chaoskit.core.errors import InfraError
from chaoskit.core.state import not_ours, state_dir

__all__ = ["ProcessLab", "lab_state_path", "JobNetns", "JOB_NETNS_PREFIX"]

JOB_NETNS_PREFIX = "ckjob-"
"""Named network namespaces a process lab's job runs in when chaoskit is root (``ip netns list`` shows them)."""


def lab_state_path() -> Path:
    return state_dir() / "lab" / "process.json"


@dataclass
class ProcessLab:
    lab_id: str
    nodes: int
    persistent: bool = False
    state: Path | None = None
    """Where a persistent lab records itself (default :func:`lab_state_path`; the Ray lab's nodes keep their own)."""
    created: float | None = None
    """When the lab was made (unix time): a process that started before it is none of its nodes'."""

    @classmethod
    def create(cls, nodes: int, persistent: bool = False, state: Path | None = None) -> "ProcessLab":
        lab = cls(f"lab-{secrets.token_hex(4)}", nodes, persistent, state, created=time.time())
        if persistent:
            path = lab.state_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"lab_id": lab.lab_id, "nodes": nodes, "created": lab.created}))
        return lab

    @classmethod
    def load(cls, state: Path | None = None) -> "ProcessLab | None":
        """The lab ``chaoskit lab up`` recorded at ``state``, or ``None``."""
        path = state or lab_state_path()
        if not path.exists() or not_ours(path, "the process lab record") is not None:  # another user's: not adopted
            return None
        data = json.loads(path.read_text())
        created = data.get("created")
        return cls(data["lab_id"], int(data["nodes"]), persistent=True, state=state,
                   created=float(created) if isinstance(created, (int, float)) else None)

    @property
    def state_path(self) -> Path:
        return self.state or lab_state_path()

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(self.nodes)]

    def scope(self, node: str) -> str:
        return f"{self.lab_id}.{node}"

    def inventory(self) -> Inventory:
        nodes = []
        for i, name in enumerate(self.node_names()):
            labels = {"rack": f"r{i // 2}", "role": "worker", "lab": "process"}
            nodes.append(Node(name, "127.0.0.1", "local", labels, 0, self._transport(name),
                              gpu_pci=(lab_pci(self.lab_id, i),)))
        return Inventory(self.lab_id, nodes)

    def _transport(self, node: str) -> LocalTransport:
        """The node's processes: its scope's token, of chaoskit's user or the lab's job account, started after
        the lab was made (a token copied into another user's process, or an older one, is not the node's)."""
        return LocalTransport(node, self.scope(node), uids=lab_uids(), since=_ticks_since_boot(self.created))

    def inventory_of(self, names: list[str]) -> Inventory:
        """Nodes ``names`` of this lab by their scopes alone (a crashed run's, whose lab may be gone)."""
        return Inventory(self.lab_id, [Node(n, conn=LocalTransport(n, self.scope(n))) for n in names])

    def processes(self) -> list[tuple[str, int, str]]:
        """(node, pid, command line) of every live process of this lab (of its users: :meth:`_transport`)."""
        prefix = self.lab_id + "."
        uids, since = lab_uids(), _ticks_since_boot(self.created)
        out = []
        for p in read_proc():
            scope = p.env.get(LocalTransport.SCOPE_ENV, "")
            if (scope.startswith(prefix) and p.state != "Z" and p.uid in uids
                    and (since is None or p.start_time is None or p.start_time >= since)):
                out.append((scope[len(prefix):], p.pid, p.cmdline))
        return out

    def node_status(self) -> list[dict]:
        """Per node (``lab status``): its name, a one-line detail, and its live processes."""
        procs = self.processes()
        return [{"name": n, "detail": f"{sum(1 for p in procs if p[0] == n)} process(es)",
                 "processes": [{"pid": pid, "cmdline": cmd} for node, pid, cmd in procs if node == n]}
                for n in self.node_names()]

    def kill_all(self, grace: float = 5.0) -> int:
        """SIGTERM every process of the lab, SIGKILL what is left after ``grace``; return how many there were."""
        procs = self.processes()
        for sig, wait in ((signal.SIGCONT, 0), (signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            for _, pid, _ in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while time.time() < deadline and self.processes():
                time.sleep(0.05)
        return len(procs)

    def down(self) -> int:
        n = self.kill_all()
        if self.persistent:
            self.state_path.unlink(missing_ok=True)
        return n


def lab_uids() -> frozenset[int]:
    """Who a process lab's processes may run as: chaoskit's own user, and as root the lab accounts (a run's
    inventory narrows it to its own account: backends/process.py)."""
    uids = {os.geteuid()}
    if os.geteuid() == 0:
        for name in lab_account_names():
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
    return frozenset(uids)


def _ticks_since_boot(when: float | None) -> int | None:
    """``when`` (unix time) in ``/proc/PID/stat``'s start-time unit, less a second of slack; ``None`` if unknown."""
    if when is None:
        return None
    try:
        with open("/proc/stat", "rb") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return max(0, int((when - 1.0 - btime) * os.sysconf("SC_CLK_TCK")))


@dataclass
class JobNetns:
    """A private network namespace for one run's job on the process lab (root only): its nodes' agents and workers
    share its loopback, so torchrun's rendezvous store, the workers' stores and gloo's sockets are reachable by the
    job alone; no other user of the machine can enter it. Its name is random (not the lab's id), made per run and
    removed at the run's end (or by ``chaoskit rollback`` from the run's marker)."""

    name: str

    @classmethod
    def create(cls) -> "JobNetns":
        ns = cls(JOB_NETNS_PREFIX + secrets.token_hex(6))
        for argv in (["ip", "netns", "add", ns.name], ["ip", "-n", ns.name, "link", "set", "lo", "up"]):
            res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if res.returncode != 0:
                ns.remove()
                raise InfraError(f"could not make the job's network namespace: {' '.join(argv)}: "
                                 f"{res.stderr.strip() or res.returncode}", hint="is iproute2 installed?")
        return ns

    def prefix(self, account: Account | None) -> list[str]:
        """What starts a command in the namespace (as ``account`` when given)."""
        return ["ip", "netns", "exec", self.name, *(setpriv_argv(account) if account is not None else [])]

    def remove(self) -> bool:
        """Remove the namespace's name (idempotent); its last process gone, the namespace goes with it."""
        if not re.fullmatch(re.escape(JOB_NETNS_PREFIX) + "[0-9a-f]{12}", self.name):
            return False
        res = subprocess.run(["ip", "netns", "del", self.name], capture_output=True, text=True, timeout=30)
        return res.returncode == 0
