"""``chaoskit audit``: what of chaoskit's is still on a cluster's nodes, found from the nodes themselves.

Rollback trusts the journal; the audit trusts nothing but what each node shows. Every fault kind says how to
find its own leftovers (:meth:`~chaoskit.faults.api.Fault.leftovers`: its qdisc handle, its nft tables, its
cgroups' names, its state files, its Slurm reason, its node's power state), each node is read once through a
:class:`NodeRead` that every kind shares, and beside the kinds the audit looks for what safety itself leaves:
lease folders of runs that are no longer alive (their watchdogs never reverted), watchdogs still running for
them, node agents whose controller is gone (each agent's command line names its controller), files in a node's
state folder that no kind claims (an in-process fault's orders, a helper's state), runs that died with faults
their journal shows armed and not reverted, and what the lab itself says is wrong (a node powered off, a Slurm
node not idle, the job's processes still running).

Nothing is changed. :func:`fix` reverts what the trusted journals of the dead runs allow (``chaoskit rollback``'s
:func:`~chaoskit.crash.recover`) and audits again.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.backends.registry import CLUSTERS, backend
from chaoskit.cluster.fanout import fan_out
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.channel import AGENT_IDLE_EXIT_S, controller_alive, parse_controller_tag
from chaoskit.core import procs
from chaoskit.core.accounts import unheld_account_processes
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.state import state_dir
from chaoskit.crash import recover
from chaoskit.faults.registry import fault_kinds
from chaoskit.lab.process import JOB_NETNS_PREFIX
from chaoskit.labpool import node_problems
from chaoskit.safety.journal import read_journal, unreverted
from chaoskit.safety.lease import default_lease_root
from chaoskit.safety.rollback import RollbackOutcome, find_crashed_runs

__all__ = ["Leftover", "AuditResult", "NodeRead", "audit", "fix", "audit_inventory"]

READ_TIMEOUT_S = 15.0
LEASE_GRACE_S = 5.0
"""How long past its TTL a lease may go unrenewed before the audit says its watchdog failed (it polls every ~0.1 s)."""
KNOWN_STATE = re.compile(r"watchdog-[0-9a-f]{12}\.py|leases/?|leases/.*")
"""What a node's state folder holds between drills: the watchdog's script, the leases folder (whose lease folders
the audit reads itself: one neither released nor fired, of a run that is gone, is a lease nobody renews)."""
CONTROLLER = "controller"


@dataclass
class Leftover:
    node: str
    """The node it is on (``controller`` for this machine's own state)."""
    what: str
    kind: str
    """The fault kind that found it, or what safety leaves: ``lease``, ``watchdog``, ``agent``, ``state``, ``journal``,
    ``lab``."""
    also_on: list[str] = field(default_factory=list)
    """Other nodes that show the same thing (nodes that share this machine's kernel or folders)."""

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "kind": self.kind, "what": self.what, "also_on": self.also_on}


@dataclass
class AuditResult:
    target: str
    nodes: list[str]
    leftovers: list[Leftover]
    unreadable: dict[str, str]
    """Nodes the audit could not read, and why: nothing can be said of them."""
    live_runs: list[str]
    """Runs of this controller still alive: what they hold is theirs, not counted."""
    fixed: list[dict[str, Any]] = field(default_factory=list)
    took_s: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.leftovers and not self.unreadable

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "clean": self.clean, "nodes": self.nodes,
                "leftovers": [x.as_dict() for x in self.leftovers], "unreadable": self.unreadable,
                "live_runs": self.live_runs, "fixed": self.fixed, "took_s": round(self.took_s, 3)}


class NodeRead:
    """One node read for the audit (:class:`~chaoskit.faults.api.NodeView`): each command runs once, read-only."""

    def __init__(self, node: Node, checkpoint_dirs: list[str]) -> None:
        if node.conn is None:
            raise InfraError(f"node {node.name} has no transport")
        self.node = node
        self.transport: Transport = node.conn
        self._checkpoint_dirs = checkpoint_dirs
        self._runs: dict[tuple[str, ...], str | None] = {}
        self.problem: str | None = None
        self._mtimes: dict[str, float] = {}
        try:  # an unreachable node is unreadable, not clean
            self.transport.ping(timeout=READ_TIMEOUT_S)
            self.reachable = True
        except (InfraError, OSError) as exc:
            self.problem, self.reachable = str(exc) or type(exc).__name__, False
        self.state_dir: str | None = None
        if self.reachable:
            try:
                self.state_dir = self.transport.state_dir
            except InfraError as exc:
                self.problem = str(exc)

    def run(self, argv: list[str]) -> str | None:
        key = tuple(argv)
        if not self.reachable:
            return None
        if key not in self._runs:
            try:
                res = self.transport.run(list(argv), READ_TIMEOUT_S)
                self._runs[key] = res.stdout if res.returncode == 0 else None
            except (InfraError, OSError, ValueError):
                self._runs[key] = None
        return self._runs[key]

    def ps(self) -> list[tuple[int, str, str]]:
        out = []
        for line in (self.run(["ps", "-ww", "-eo", "pid=,stat=,args="]) or "").splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2 and parts[0].isdigit():
                out.append((int(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
        return out

    def cgroups(self) -> list[str]:
        found = self.run(["find", "/sys/fs/cgroup", "-maxdepth", "5", "-type", "d", "-name", "chaoskit-*"])
        return sorted((found or "").split())

    def state_entries(self) -> list[str]:
        if self.state_dir is None:
            return []
        found = self.run(["find", self.state_dir, "-mindepth", "1", "-maxdepth", "4", "-printf", "%y %T@ %P\\n"]) or ""
        out = []
        for line in found.splitlines():
            kind, mtime, rel = (line.split(" ", 2) + ["", ""])[:3]
            if rel:
                out.append(rel + "/" if kind == "d" else rel)
                try:
                    self._mtimes[out[-1]] = float(mtime)
                except ValueError:
                    pass
        return sorted(out)

    def mtime(self, rel: str, default: float) -> float:
        """When ``rel`` (as :meth:`state_entries` names it) was last modified, on the node's clock."""
        return self._mtimes.get(rel, default)

    def checkpoint_files(self, prefix: str) -> list[str]:
        out: list[str] = []
        for folder in self._checkpoint_dirs:
            found = self.run(["find", folder, "-maxdepth", "6", "-name", f"{prefix}*", "-prune", "-print"])
            out += (found or "").splitlines()
        return sorted(set(out))


def audit_inventory(target: str, slurm_conf: str | None = None) -> tuple[str, Inventory, list[str]]:
    """The nodes ``target`` names: a lab kind (``process``, ``netns``, ``slurm``: the lab of that kind that is up) or
    an inventory file (``slurm_conf``: its nodes are Slurm's, through that ``slurm.conf``, as a scenario's
    ``scheduler: slurm`` says); and what the lab itself says is wrong with them."""
    if target in CLUSTERS.names():
        back = backend(target)
        inventory = back.lab_inventory()
        if inventory is None:
            raise ScenarioError(f"no {target} lab is up to audit",
                                hint="'chaoskit lab status' shows the labs; an inventory file names your own nodes")
        problems = [p for status in back.lab_status() for p in node_problems(status.nodes)]
        return f"{target} lab {inventory.name}", inventory, problems
    path = Path(target)
    if not path.is_file():
        raise ScenarioError(f"{target}: neither a lab kind ({', '.join(CLUSTERS.names())}) nor an inventory file")
    if slurm_conf is not None:  # the nodes as Slurm knows them: its drains are read too
        if not Path(slurm_conf).is_file():
            raise ScenarioError(f"--slurm-conf {slurm_conf}: no such file")
        return str(path), backend("slurm").rollback_inventory({"inventory": str(path), "slurm": {"conf": slurm_conf}}, []), []
    return str(path), load_inventory(path), []


def audit(target: str, *, checkpoint_dirs: list[str] | None = None, slurm_conf: str | None = None) -> AuditResult:
    """Everything of chaoskit's still on ``target``'s nodes (see the module docstring); changes nothing."""
    t0 = time.time()
    name, inventory, lab_problems = audit_inventory(target, slurm_conf)
    dirs = [_checked_dir(d) for d in checkpoint_dirs or []]
    try:
        live = _live_runs()
        # while a run of this controller is live, the lab's job and its nodes' states are that run's
        found: list[Leftover] = [] if live else [Leftover(CONTROLLER, p, "lab") for p in lab_problems]
        found += _controller_leftovers(live)
        reads = fan_out({n.name: (lambda n=n: _read_node(n, dirs, live)) for n in inventory.nodes})
        unreadable = {}
        for n in inventory.nodes:
            got = reads[n.name]
            if isinstance(got, BaseException):
                unreadable[n.name] = str(got) or type(got).__name__
                continue
            found += got[0]
            if got[1] is not None:
                unreadable[n.name] = got[1]
    finally:
        inventory.close()
    return AuditResult(name, inventory.names(), _merged(found), unreadable, sorted(live), took_s=time.time() - t0)


def fix(target: str, *, checkpoint_dirs: list[str] | None = None, slurm_conf: str | None = None) -> AuditResult:
    """Revert what the dead runs' trusted journals show armed (``chaoskit rollback``), then audit again."""
    fixed = []
    for done in map(recover, find_crashed_runs()):
        fixed += [{"run": done.run.run_id, **_outcome(o)} for o in done.faults]
        if done.lab:
            fixed.append({"run": done.run.run_id, "lab": done.lab, "ok": True})
    result = audit(target, checkpoint_dirs=checkpoint_dirs, slurm_conf=slurm_conf)
    result.fixed = fixed
    return result


# -- what is read -------------------------------------------------------------------------


def _read_node(node: Node, checkpoint_dirs: list[str], live: set[str]) -> tuple[list[Leftover], str | None]:
    """What is left on ``node``, and why it could not be read (``None``: it was)."""
    view = NodeRead(node, checkpoint_dirs)
    out: list[Leftover] = []
    claimed: list[str] = []
    for kind, cls in sorted(fault_kinds().items()):
        claimed += cls.state_prefixes
        try:
            out += [Leftover(node.name, line, kind) for line in cls.leftovers(view)]
        except (InfraError, OSError, ValueError) as exc:
            out.append(Leftover(node.name, f"could not be checked for {kind}: {exc}", kind))
    entries = view.state_entries()
    for rel in entries:  # files nobody claims (an in-process fault's orders): a folder, empty, holds nothing
        top = rel.split("/", 1)[0]
        if rel.endswith("/") or KNOWN_STATE.fullmatch(rel) or any(
                top == p[:-1] if p.endswith("/") else top.startswith(p) for p in claimed):  # "inproc/": that folder
            continue
        out.append(Leftover(node.name, f"state {rel} in {view.state_dir}", "state"))
    out += _node_leases(view, entries, live)
    out += _node_agents(view)
    return out, view.problem


def _node_agents(view: NodeRead) -> list[Leftover]:
    """Agents on the node whose controller, on this machine, is no longer running (its pid gone or another
    process's now). An agent of a controller on another machine cannot be judged from here; it ends itself
    :data:`~chaoskit.cluster.transports.channel.AGENT_IDLE_EXIT_S` after it last heard from it, as these do."""
    out = []
    for pid, _, cmdline in view.ps():
        tag = parse_controller_tag(cmdline)
        if tag is None or not os.path.basename(cmdline.split(None, 1)[0]).startswith("python"):
            continue  # not an agent, or the sudo or timeout in front of one (the agent is its child)
        host, controller, _ = tag
        if controller_alive(*tag) is False:
            out.append(Leftover(view.node.name, f"agent pid {pid}: its controller (pid {controller} on {host}) is gone; "
                                                f"it ends itself {AGENT_IDLE_EXIT_S:g}s after it last heard from it",
                                "agent"))
    return out


def _node_leases(view: NodeRead, entries: list[str], live: set[str]) -> list[Leftover]:
    """A node's lease folders (``leases/<run>/<fault>/``) neither released nor fired: one that no watchdog waits on
    (its revert will never run: the node lost its watchdog) or whose lease was not renewed for longer than its
    watchdog's TTL (its controller is gone and the watchdog has not reverted). A lease renewed within its TTL is a
    live run's, of this controller or another one; a watchdog waiting on a lease folder that is gone is left too."""
    if view.state_dir is None:
        return []
    root = f"{view.state_dir}/leases/"
    watchdogs = _watchdogs(view.ps(), root)
    now = _node_time(view)
    out = []
    for rel in entries:
        parts = rel.rstrip("/").split("/")
        if not (len(parts) == 3 and parts[0] == "leases" and rel.endswith("/")) or parts[1] in live:
            continue
        if any(f"{rel}{f}" in entries for f in ("released", "fired")):
            continue  # nothing is armed any more
        name = f"{parts[1]}/{parts[2]}"
        dog = watchdogs.pop(f"{root}{name}", None)
        if dog is None:
            out.append(Leftover(view.node.name, f"lease {name}: no watchdog waits on it, and it was neither released "
                                                "nor fired (its revert may never have run)", "lease"))
            continue
        age = None if now is None else now - view.mtime(f"{rel}lease", default=0.0)
        if age is not None and age > dog[1] + LEASE_GRACE_S:
            out.append(Leftover(view.node.name, f"lease {name} past its TTL ({age:.0f}s without renewal, TTL {dog[1]:g}s): "
                                                f"watchdog pid {dog[0]} has not reverted", "lease"))
    for directory, (pid, _) in sorted(watchdogs.items()):
        if directory[len(root):].split("/", 1)[0] not in live and f"{directory[len(view.state_dir) + 1:]}/" not in entries:
            out.append(Leftover(view.node.name, f"watchdog pid {pid} waits on lease folder {directory}, which is gone", "watchdog"))
    return out


def _watchdogs(procs: list[tuple[int, str, str]], root: str) -> dict[str, tuple[int, float]]:
    """Lease folder -> (pid, TTL) of each watchdog (``python -I SCRIPT LEASE_DIR TTL DEADLINE``) under ``root``."""
    out = {}
    for pid, _, cmdline in procs:
        words = cmdline.split()
        for i, word in enumerate(words[:-1]):
            if word.startswith(root) and "watchdog" in " ".join(words[:i]):
                try:
                    out[word.rstrip("/")] = (pid, float(words[i + 1]))
                except ValueError:
                    pass
                break
    return out


def _node_time(view: NodeRead) -> float | None:
    text = view.run(["date", "+%s.%N"])
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _controller_leftovers(live: set[str]) -> list[Leftover]:
    """This machine's own: lease folders (of nodes without a remote watchdog) of runs that are gone, their
    watchdogs, and dead runs whose trusted journal shows faults armed and not reverted."""
    out = []
    root = default_lease_root()
    if root.is_dir():
        for run in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in live):
            for lease in sorted(p for p in run.iterdir() if p.is_dir() and not p.is_symlink()):
                if not any((lease / f).exists() for f in ("released", "fired")):  # else nothing is armed any more
                    out.append(Leftover(CONTROLLER, f"lease {run.name}/{lease.name} of a run that is gone", "lease"))
    prefix = f"{root}/"
    for pid, cmdline in _controller_procs():
        if "watchdog" in cmdline and prefix in cmdline and not any(f"{prefix}{run}/" in cmdline for run in live):
            out.append(Leftover(CONTROLLER, f"watchdog running: pid {pid} {cmdline[:120]}", "watchdog"))
    held = " ".join(m.read_text(errors="replace") for m in (state_dir() / "runs").glob("*.json")
                    if m.stem in live) if (state_dir() / "runs").is_dir() else ""
    for ns in _job_namespaces():
        # a process lab's job namespace (root's runs) that no live run of ours holds and no process is in (a run of
        # another state folder, its job running, is not ours to name)
        if ns not in held and not _netns_in_use(ns):
            out.append(Leftover(CONTROLLER, f"network namespace {ns} of a process-lab job whose run is gone", "lab"))
    out += _account_leftovers()
    for run in find_crashed_runs():
        pending = unreverted(read_journal(run.journal)) if run.journal.is_file() else []
        for entry in pending:
            out.append(Leftover(CONTROLLER, f"run {run.run_id} died with {entry.get('kind')} armed on {entry.get('node')} "
                                            f"({entry.get('fault_id')}) and not reverted in its journal", "journal"))
    return out


def _account_leftovers() -> list[Leftover]:
    """Processes that run as a lab account no lab or run holds (a dead run's job), but a Ray lab's nodes while its
    record says it is up (they keep its account once ``lab up`` has ended)."""
    labs = {p.stem for p in (state_dir() / "ray-labs").glob("*.json")} if (state_dir() / "ray-labs").is_dir() else set()
    out = []
    for name, pids in unheld_account_processes().items():
        left = []
        for pid in pids:
            raw = procs.environ(pid)
            if raw is None:
                continue
            env = raw.split(b"\0")
            scope = next((e.split(b"=", 1)[1].decode(errors="replace") for e in env if e.startswith(b"CHAOSKIT_SCOPE=")), "")
            if scope.split(".", 1)[0] not in labs or not scope:
                left.append(pid)
        if left:
            out.append(Leftover(CONTROLLER, f"processes left running as lab account {name}, which no run or lab holds: "
                                            f"pid {', '.join(map(str, left[:10]))}", "account"))
    return out


def _job_namespaces() -> list[str]:
    """The named network namespaces of process-lab jobs on this machine (``ip netns`` keeps them in /run/netns)."""
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(JOB_NETNS_PREFIX))
    except OSError:
        return []


def _netns_in_use(name: str) -> bool:
    """Whether a process is in the named network namespace (``ip netns pids``)."""
    try:
        res = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=READ_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(res.stdout.split())


def _controller_procs() -> list[tuple[int, str]]:
    out = []
    for pid in procs.pids():
        raw = procs.cmdline(pid)
        if raw is not None:
            out.append((pid, raw.replace(b"\0", b" ").decode(errors="replace").strip()))
    return out


def _live_runs() -> set[str]:
    """Runs of this controller whose process is alive: their marker is there and not a crashed run's."""
    markers = state_dir() / "runs"
    crashed = {r.run_id for r in find_crashed_runs()}
    return {m.stem for m in markers.glob("*.json")} - crashed if markers.is_dir() else set()


def _merged(found: list[Leftover]) -> list[Leftover]:
    """One entry per thing. Kinds of one family find the same line (``network.blackhole`` and ``network.degrade``
    share a qdisc handle): the first keeps it. A line that names a path or a pid names one thing of this machine
    where several nodes share it (a process lab's state folder, a namespace's cgroups): it is listed once, with
    the other nodes that show it; a line without either (``link eth0 is down``) is each node's own."""
    out: dict[tuple[str, str], Leftover] = {}
    for item in found:
        shared = "/" in item.what or re.search(r"\bpid \d+", item.what) is not None
        key = ("" if shared else item.node, item.what)
        first = out.setdefault(key, item)
        if first is not item and item.node != first.node and item.node not in first.also_on:
            first.also_on.append(item.node)
    return list(out.values())


def _checked_dir(path: str) -> str:
    if not path.startswith("/") or "\0" in path or any(c in path for c in "\n\r"):
        raise ScenarioError(f"--checkpoint-dir {path!r}: give an absolute path")
    return os.path.normpath(path)


def _outcome(o: RollbackOutcome) -> dict[str, Any]:
    return {"fault_id": o.fault_id, "kind": o.kind, "node": o.node, "ok": o.ok, "problem": o.problem}
