"""What the faults that run a helper script on the node share (``mem.oom``, ``node.slow``, ``gpu.fail``'s crash loop).

A helper is a stdlib-only program with :mod:`chaoskit.nodeside.nodefs` in front of it (:func:`helper_source`),
run as ``python3 -I -c SOURCE ARGS...`` (:func:`helper_argv`) through the node's transport. Its files lie in
the node's state folder (:attr:`~chaoskit.cluster.transports.api.Transport.state_dir`, which chaoskit made and
checked), under a random name (:func:`state_path`); a path read back (from a revert armed earlier, or the
journal) is accepted only when it has that form (:func:`own_state_path`). What a helper wrote is parsed here
without echoing it (:func:`parse_started`): an error names the file, never its contents. The kinds whose helper is
a cgroup tool (:func:`chaoskit.nodeside.cgroups.tool_main`) share one base class, :class:`CgroupTool`. Beside
them, what more than one kind reads of a node the same way: its Slurm drain, as ``chaoskit audit`` looks for one a
drill left (:func:`slurm_drain`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import sys
import time
from typing import Any, Callable, ClassVar

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.errors import InfraError
from chaoskit.core.launches import LAUNCHES
from chaoskit.faults.api import Fault, FaultContext, Injection, NodeView
from chaoskit.nodeside.nodefs import bundle

__all__ = ["checkpoint_root", "checkpoint_where", "COMMAND_TIMEOUT_S", "VERIFY_S", "helper_source", "helper_argv", "tool_prefix", "node_python", "run_helper",
           "state_path", "own_state_path", "read_node_file", "wait_node_file", "parse_started", "undo", "process_tree",
           "check_state_gone", "until_reverted", "slurm_drain", "CgroupTool", "check_inside", "checkpoint_job_problem", "bad_root"]

COMMAND_TIMEOUT_S = 15.0
VERIFY_S = 5.0
"""How long a verify waits for the node to show the fault gone (a killed helper still exiting)."""


def helper_source(source: str, *modules: Any, **constants: Any) -> str:
    """``source`` (a :mod:`chaoskit.nodeside` program) as one program for ``python3 -I -c``: nodefs' functions first
    (``check_dir``, ``create_file``, ...), then the shared node-side ``modules`` it uses, then its ``constants``."""
    return bundle(source, *modules, **constants)


def helper_argv(python: str, source: str, *args: str) -> list[str]:
    """``python -I -c SOURCE ARGS...``: nothing from the node's current folder, site folder or ``PYTHON*`` is imported."""
    return [python, "-I", "-c", source, *args]


def journaled_python(python: str, node: Any) -> str:
    """``python`` when it is one a helper of ``node`` runs with (:func:`node_python`: this machine's for a local
    node, else the inventory's ``ssh.python`` or ``python3``); else ValueError."""
    ssh = getattr(node, "ssh", None)
    allowed = {sys.executable, "python3", *([ssh.python] if ssh is not None and ssh.python else [])}
    if python not in allowed:
        raise ValueError(f"the revert runs {python!r}, not a Python chaoskit runs its helpers with on this node")
    return python


def journaled_helper(revert: list[str], node: Any, source: str, op: str, prefix: str, suffix: str = "") -> list[str]:
    """A helper revert ``python -I -c SOURCE OP STATE`` rebuilt from a journal: the same helper source, the
    same op, a state path this node's :func:`state_path` makes; else ValueError."""
    if len(revert) != 6 or revert[1:3] != ["-I", "-c"] or revert[3] != source or revert[4] != op:
        raise ValueError("not a revert chaoskit arms for this kind (another tool, or another version of its helper)")
    python = journaled_python(revert[0], node)
    state = own_state_path(node.conn, revert[5], prefix, suffix)
    return helper_argv(python, source, op, state)


def tool_prefix(argv: list[str]) -> list[str]:
    """The ``python -I -c SOURCE`` part of a helper's argv (what a ``check`` of the same helper runs)."""
    try:
        return argv[: argv.index("-c") + 2]
    except ValueError:
        raise ValueError(f"not a chaoskit helper command: {argv[:2]!r}") from None


def node_python(ctx: FaultContext, transport: Transport, node: str) -> str:
    """The Python the node's helpers run with: the controller's for a local node, else the inventory's."""
    if isinstance(transport, LocalTransport):
        return sys.executable  # the controller is the node
    info = ctx.inventory[node]
    return info.ssh.python if info.ssh is not None else "python3"


def run_helper(transport: Transport, python: str, source: str, args: list[str], kind: str, hint: str) -> dict[str, Any]:
    """Run one helper command; its stdout as JSON, or :class:`InfraError` with its last line of stderr."""
    res = transport.run(helper_argv(python, source, *args), COMMAND_TIMEOUT_S)
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1:] or [f"exit {res.returncode}"]
        raise InfraError(f"{kind} on node {transport.node}: {args[0]} failed: {last[0]}", hint=hint)
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise InfraError(f"{kind} on node {transport.node}: {args[0]} answered something that is not JSON") from None


def state_path(transport: Transport, prefix: str, suffix: str = "") -> str:
    """A new, unguessable path in the node's state folder: ``<state_dir>/<prefix><16 hex digits><suffix>``."""
    return f"{transport.state_dir}/{prefix}{secrets.token_hex(8)}{suffix}"


def own_state_path(transport: Transport, path: str, prefix: str, suffix: str = "") -> str:
    """``path`` when it is one :func:`state_path` made on this node (the folder and the name's form); else ValueError."""
    name = re.escape(prefix) + r"[0-9a-f]{12,32}" + re.escape(suffix)
    folder, _, base = str(path).rpartition("/")
    if folder != transport.state_dir or not re.fullmatch(name, base):
        raise ValueError(f"not a chaoskit state path of node {transport.node}: {path!r}")
    return path


def read_node_file(transport: Transport, path: str) -> str:
    """The text of a file a helper wrote on the node, or "" when it is not there (yet)."""
    res = transport.run(["cat", path], COMMAND_TIMEOUT_S)
    return res.stdout if res.returncode == 0 else ""


def wait_node_file(transport: Transport, path: str, timeout: float) -> str | None:
    """The text of ``path`` once a helper wrote it; ``None`` after ``timeout``."""
    end = time.time() + timeout
    while time.time() < end:
        text = read_node_file(transport, path)
        if text.strip():
            return text
        time.sleep(0.05)
    return None


def parse_started(text: str, what: str, node: str) -> tuple[float, int]:
    """A helper's ``started`` file: (its clock, its pid). Anything else is an error naming ``what``, not the text."""
    words = text.split()
    try:
        t, pid = float(words[0]), int(words[1])
    except (IndexError, ValueError):
        raise InfraError(f"{what} on node {node} is not the '<time> <pid>' line chaoskit's helper writes") from None
    if pid <= 1 or t != t:  # NaN
        raise InfraError(f"{what} on node {node} is not the '<time> <pid>' line chaoskit's helper writes")
    return t, pid


def check_state_gone(transport: Transport, revert: list[str], prefix: str, what: str) -> str | None:
    """Run the ``check`` of the helper a revert runs (``... restore STATE``) for ``what`` (a cgroup the helper made):
    ``None`` when it and the state file are gone, else what is left."""
    state = own_state_path(transport, revert[-1], prefix, ".json")
    res = transport.run([*tool_prefix(revert), "check", state, what or "/nonexistent"], COMMAND_TIMEOUT_S)
    if res.returncode != 0:
        return f"cannot check the cgroups: {res.stderr.strip()}"
    return res.stdout.strip() or None


def until_reverted(check: Callable[[], str | None], timeout: float = VERIFY_S) -> str | None:
    """Poll ``check`` (what is left of a fault, or ``None``) until it says nothing is; its last answer after ``timeout``.
    An :class:`InfraError` from it counts as what is left."""
    end = time.time() + timeout
    while True:
        try:
            problem = check()
        except InfraError as exc:
            problem = str(exc)
        if problem is None or time.time() >= end:
            return problem
        time.sleep(0.1)


def slurm_drain(node: Node) -> tuple[str, str | None] | None:
    """``(state, reason)`` of ``node`` when its Slurm has it drained; ``None`` when it is not, when the node is
    not one of a Slurm cluster's, or when Slurm does not answer (what an audit reads: nothing to report)."""
    if node.scheduler is None:
        return None
    try:
        state, reason, _ = node.scheduler.node_state(node.name)
    except InfraError:
        return None
    return (state, reason) if "DRAIN" in state.split("+") else None


# -- the job's checkpoint folder, as the storage kinds (storage.py, storage_io.py) take it ----------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_inside(path: str, root: str | None) -> str | None:
    """Why ``path`` (relative to the checkpoint folder ``root``, or absolute) is not inside it, or ``None``.

    ``root`` ``None``: the folder is only known at run time (a job chaoskit starts), so only a relative
    path can be judged now."""
    if posixpath.isabs(path):
        if root is None:
            return (f"path {path!r} is absolute, but the job's checkpoint folder (<job dir>/checkpoints, "
                    "CHAOSKIT_CKPT_DIR) is only known at run time: give a path relative to it ('.' is the folder itself)")
        norm, top = posixpath.normpath(path), posixpath.normpath(root)
        if norm != top and not norm.startswith(top.rstrip("/") + "/"):
            return f"path {path!r} is outside the job's checkpoint folder {root}"
        return None
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        return f"path {path!r} leaves the job's checkpoint folder"
    return None


def checkpoint_job_problem(kind: str, path: str, workload: Any) -> tuple[str, str] | None:
    """What in a storage fault's ``path`` does not fit the scenario's ``workload`` (:meth:`Fault.check_job`)."""
    launch = getattr(workload, "launch", None)
    keeps = LAUNCHES[launch].checkpoints if launch in LAUNCHES else "job"
    if keeps == "ray":
        return "kind", f"{kind} acts on the job's checkpoint folder; a {launch} job keeps its checkpoints in Ray's storage"
    root = getattr(workload, "checkpoint_dir", None)
    if keeps == "given" and root is None:
        return "path", f"{kind} on an attached job needs the folder it keeps its checkpoints in: set workload.checkpoint_dir"
    problem = check_inside(path, root)
    return ("path", problem) if problem else None


def checkpoint_root(kind: str, ctx: FaultContext) -> str:
    """The job's checkpoint folder a checkpoint storage fault acts in (``ctx.checkpoint_dir``), checked with
    :func:`bad_root`; :class:`InfraError` when it is not known or not fit."""
    root = getattr(ctx, "checkpoint_dir", None)
    if not root:
        raise InfraError(f"{kind}: the job's checkpoint folder is not known")
    problem = bad_root(str(root))
    if problem:
        raise InfraError(f"{kind}: {problem}; nothing was injected")
    return str(root)


def checkpoint_where(path: str) -> str:
    """A checkpoint storage fault's ``path`` for the plan: inside the checkpoint folder."""
    return "<checkpoint folder>" + ("" if path in (".", "./") else f"/{path}")


def bad_root(root: str) -> str | None:
    """Why ``root`` cannot be a checkpoint folder sent to a node, or ``None``."""
    if not root.startswith("/") or len(root) > 4096 or _CONTROL.search(root):
        return f"the checkpoint folder {root!r} is not an absolute path of printable characters"
    if root != "/" and posixpath.normpath(root) != root.rstrip("/"):
        return f"the checkpoint folder {root!r} is not a normalised path"
    return None


def undo(ctx: FaultContext, transport: Transport, fid: str, revert: list[str]) -> None:
    """The inject failed after the lease was armed: revert now, or leave it to the watchdog within the TTL."""
    leases = ctx.leases
    try:
        transport.run(revert, COMMAND_TIMEOUT_S)
    except InfraError:
        if leases is not None:
            leases.abandon(fid)
        return
    if leases is not None:
        leases.release(fid)


def process_tree(transport: Transport, pid: int) -> list[int]:
    """``pid`` and its descendants, all of the node's scope."""
    children: dict[int, list[int]] = {}
    for p in transport.processes():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


class CgroupTool(Fault):
    """A kind that moves a rank's processes into a cgroup of chaoskit's own, through a cgroup tool on the node
    (``mem.oom``, ``node.slow``; :func:`chaoskit.nodeside.cgroups.tool_main`).

    Per rank (a target whose process is a child of a rank already moved is skipped: it inherits ``RANK``): the
    tool's ``probe`` for the controller; a new state file's path; the tool's ``restore`` of it armed as a lease;
    the kind's :meth:`move_in` (the tool's own operation, which writes the processes' cgroups down in the state
    file first); then :meth:`after_move`. When anything after the lease fails, the revert runs at once
    (:func:`undo`). A subclass sets the class attributes below and provides :meth:`move_in`, :meth:`after_move`
    and :meth:`own_cgroup`."""

    lasting: ClassVar[bool] = True
    tool_source: ClassVar[str]
    """The cgroup tool, as :func:`helper_source` bundles it."""
    state_prefix: ClassVar[str]
    """Its state files are ``<state folder>/<state_prefix><token>.json`` (the kind's ``state_prefixes`` too)."""
    controller: ClassVar[str]
    """The cgroup controller the tool acts through (``memory``, ``cpu``)."""
    cgroup_what: ClassVar[str]
    """What its cgroups hold, as ``leftovers`` names them (``memory cap``)."""

    # What a subclass provides -------------------------------------------------------------

    def move_in(self, transport: Transport, python: str, t: Any, pids: list[int], state: str, token: str) -> dict[str, Any]:
        """Run the tool's operation that makes the cgroup ``token`` names and moves ``pids`` in: its answer
        (``version``, ``cgroup``, ``moved``, ...)."""
        raise NotImplementedError

    def after_move(self, ctx: FaultContext, transport: Transport, python: str, t: Any, state: str,
                   done: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """What follows the move (``t``'s pid is in ``done["moved"]``): the fault's time and the kind's own entries
        of the injection's detail."""
        raise NotImplementedError

    def inject_otherwise(self, ctx: FaultContext, transport: Transport, fid: str, t: Any) -> Injection | None:
        """An injection by another mechanism than the cgroup for ``t``, or ``None`` (the default): the cgroup."""
        return None

    @classmethod
    def own_cgroup(cls, name: str) -> bool:
        """Whether a cgroup named ``name`` is one this kind makes."""
        raise NotImplementedError

    # The verbs ------------------------------------------------------------------------

    def inject(self, ctx: FaultContext, targets: list[Any]) -> list[Injection]:
        out: list[Injection] = []
        covered: set[tuple[str, int]] = set()
        for i, t in enumerate(targets):
            if (t.node, t.pid) in covered:  # a child of a rank already in a chaoskit cgroup (it inherits RANK)
                continue
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            other = self.inject_otherwise(ctx, transport, fid, t)
            if other is not None:
                covered.add((t.node, t.pid))
                out.append(other)
                continue
            pids = process_tree(transport, t.pid)
            covered.update((t.node, p) for p in pids)
            python = node_python(ctx, transport, t.node)
            probe = self.run_tool(transport, python, ["probe"])
            if probe.get("version") is None:
                c = self.controller
                raise InfraError(f"{self.kind}: node {t.node} has no cgroup {c} controller (v2 {c}.max or v1 {c})")
            state = state_path(transport, self.state_prefix, ".json")
            token = os.path.basename(state)[len(self.state_prefix):-len(".json")]
            revert = helper_argv(python, self.tool_source, "restore", state)
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=t.label())
            try:
                done = self.move_in(transport, python, t, pids, state, token)
                if t.pid not in done["moved"]:
                    raise InfraError(f"{self.kind}: could not move pid {t.pid} into {done['cgroup']} on node {t.node}")
                ts, own = self.after_move(ctx, transport, python, t, state, done)
            except InfraError:
                undo(ctx, transport, fid, revert)
                raise
            detail = {"mechanism": f"cgroup {done['version']}", "fidelity": "real", "cgroup": done["cgroup"],
                      "state": state, **own, "revert": revert}
            out.append(Injection(fid, self.kind, t.node, [t.label()], ts, detail))
        return out

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        return until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"],
                                                          cgroup=injection.detail["cgroup"]))

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The cgroup tool's ``restore`` of a state file in the node's state folder."""
        return journaled_helper(revert, node, cls.tool_source, "restore", cls.state_prefix, ".json")

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None, cgroup: str | None = None) -> str | None:
        return check_state_gone(transport, revert, cls.state_prefix, cgroup or "")

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """Its cgroups (:meth:`own_cgroup`) and its state files (``<state_prefix>*``)."""
        out = [f"cgroup {path} ({cls.kind}'s {cls.cgroup_what})" for path in view.cgroups()
               if cls.own_cgroup(path.rsplit("/", 1)[-1])]
        return out + [f"state {name} ({cls.kind})" for name in view.state_entries()
                      if name.startswith(cls.state_prefix) and "/" not in name.rstrip("/")]

    def run_tool(self, transport: Transport, python: str, args: list[str]) -> dict[str, Any]:
        """One command of the kind's cgroup tool (:func:`run_helper`)."""
        return run_helper(transport, python, self.tool_source, args, self.kind, "cgroups need root on the node")
