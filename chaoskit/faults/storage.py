"""Checkpoint storage faults: the newest checkpoint corrupted (``storage.corrupt``), its file system full (``storage.full``).

Both act inside the job's checkpoint folder only (``CHAOSKIT_CKPT_DIR`` of a job
chaoskit starts, ``workload.checkpoint_dir`` of an attached one): ``path`` is a
folder inside it, and a path that leaves it (``..``, an absolute path elsewhere)
or goes through a symbolic link (in or out) is refused before anything is armed.

The checkpoint folder may belong to, or be writable by, a user who is hostile to
root, so the node-side tool trusts no name in it. It opens the folder from ``/``
without following a link that anyone but root could have made, then acts as the
folder's owner (the job's user: ``setresuid``/``setresgid`` when it runs as
root) and works through directory fds, by name, with ``O_NOFOLLOW``. What it
creates is ``mkdir`` or ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a random name (a name
that is there already is refused, not reused); modes and times are set on its
own fds. A revert keeps no state in a file: the checkpoint's path (relative to
the folder) and the device:inode of the folder, of the checkpoint's folder and
of the checkpoint itself (and its owner) are recorded at inject on the revert's
command line, and checked again at restore. A folder or aside copy replaced
meanwhile is refused with a clear error (exit 3) and left alone, never copied
back; the revert then fails, visibly.

- ``storage.corrupt``: the newest checkpoint under ``path`` (by modification
  time, among the names matching ``pattern``) is truncated to half its size, has
  bytes flipped, or is removed. The original is moved aside into a folder of
  chaoskit's own beside it (``.chaoskit-aside-<token>``, 0700: the same file
  system, so keeping it costs a rename, not a copy of a multi-gigabyte file); the
  harmed copy is written there (``corrupted``) and hard-linked into the
  checkpoint's place. At revert the original is put back, unless the job has
  written a new file under that name meanwhile (it is no longer the ``corrupted``
  inode: a save after it fell back to an older checkpoint): the job's newer file
  wins and the aside copy is dropped. The aside folder is not the lease's folder
  because a lease's folder is removed when the run closes, even when its watchdog
  has yet to revert.
- ``storage.full``: one file (``.chaoskit-fill-<token>``, made ``O_EXCL``) written
  with zeros until the file system of ``path`` is full, at most ``size`` bytes;
  removed at revert while it is a regular file of the folder owner's (anything
  else there is refused and left alone).
  Refused unless that file system has no more free space than ``size`` (checked on
  the node at preflight and again at inject): the limit is what keeps a drill from
  filling a shared disk. The labs give the job a small checkpoint file system of
  its own for it (``workload.checkpoint_fs``).

The reverts are armed as leases first, so a SIGKILLed controller still ends with
the checkpoint back and the fill file gone. Everything on the node is done by
:data:`STORAGE_TOOL`, a stdlib-only script run as ``python3 -I -c`` through the
node's transport.
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit import nodeside
from chaoskit.cluster.selectors import NodeTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.sizes import ByteSize, format_size
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import (
    bad_root, checkpoint_job_problem, checkpoint_root, checkpoint_where, journaled_python, node_python, undo, until_reverted,
)

__all__ = ["CorruptFault", "CorruptSpec", "FullFault", "FullSpec", "STORAGE_TOOL", "ASIDE_PREFIX", "FILL_PREFIX"]

COMMAND_TIMEOUT_S = 30.0
FILL_TIMEOUT_S = 300.0
VERIFY_S = 5.0
ASIDE_PREFIX = ".chaoskit-aside-"
FILL_PREFIX = ".chaoskit-fill-"
FLIPPED_BYTES = 64
"""Bytes flipped (XOR 0xff), spread evenly from the file's first byte to its last: a zip-based
``torch.save`` file then fails to load for certain (its end-of-directory record is hit)."""
REFUSED = 4
"""The tool's exit status when the file system has more free space than the limit."""

STORAGE_TOOL = (f"ASIDE, FILL, FLIPS, REFUSED = {ASIDE_PREFIX!r}, {FILL_PREFIX!r}, {FLIPPED_BYTES}, {REFUSED}\n"
                + nodeside.source("storage_tool"))
"""``python3 -I -c STORAGE_TOOL OP ...`` on the node (:mod:`chaoskit.nodeside.storage_tool` says what each
operation does and refuses)."""

EXIT_PATH, EXIT_REPLACED, EXIT_ROOT, EXIT_ARGV = 2, 3, 5, 6


class _StorageSpec(FaultSpec):
    path: str = Field(
        ".", min_length=1, max_length=4096,
        description="A folder inside the job's checkpoint folder: relative to it ('.', the default, is the folder "
                    "itself), or absolute inside workload.checkpoint_dir. Anything outside it, or a path through a "
                    "symbolic link, is refused on the node.",
    )
    duration: PositiveDuration = Field(..., description="How long the fault lasts; the node reverts it by itself after that.")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if any(ord(c) < 32 or c == "\x7f" for c in v):
            raise ValueError("path must not contain control characters")
        return v


class CorruptSpec(_StorageSpec):
    """Truncate, flip bytes of, or remove the newest checkpoint under ``path``; put the original back after ``duration``."""

    kind: Literal["storage.corrupt"]
    mode: Literal["truncate", "flip", "remove"] = Field(
        ..., description=f"truncate: cut it to half its size; flip: XOR {FLIPPED_BYTES} bytes spread over it "
                         "(first and last included); remove: take it away.")
    pattern: str = Field(
        "*", min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.*?\[\]-]+$",
        description="Which file names are checkpoints (a shell glob, e.g. 'ckpt-*.pt'); the newest match is corrupted. "
                    "Hidden files are never taken.",
    )


class FullSpec(_StorageSpec):
    """Fill the file system of ``path`` with one file, at most ``size``; remove it after ``duration``."""

    kind: Literal["storage.full"]
    size: ByteSize = Field(
        ..., description="The most this fault may write (e.g. 64MiB). Refused when the file system has more free space "
                         "than this: give the job a small checkpoint file system (workload.checkpoint_fs).")


class _StorageFault(Fault):
    target_type = "node"
    lasting: ClassVar[bool] = True
    revert_op: ClassVar[str]
    """The storage tool's operation that reverts the fault (its lease's revert)."""
    check_op: ClassVar[str]
    """The storage tool's operation that says what of the fault is left, on the revert's arguments."""
    checked: ClassVar[str]
    """What that operation looks at (its name is the revert's fifth argument), as an error says it."""

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """In the checkpoint folders audited: an aside (the checkpoint beside it is still the harmed copy, or gone),
        a fill file, a temporary file of the storage tool."""
        out = []
        for path in view.checkpoint_files(".chaoskit-"):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(ASIDE_PREFIX):
                out.append(f"aside {path} (storage.corrupt: the checkpoint beside it is not restored)")
            elif name.startswith(FILL_PREFIX):
                out.append(f"fill file {path} (storage.full)")
            else:
                out.append(f"storage tool's file {path}")
        return out

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The storage tool's own restore (or unfill), rebuilt from values of the forms it makes
        (:func:`parse_revert`), with a Python chaoskit runs its helpers with on this node."""
        python, args = parse_revert(cls.kind, revert)
        return tool_argv(journaled_python(python, node), cls.revert_op, *args)

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        python, args = parse_revert(cls.kind, revert)
        res = transport.run(tool_argv(python, cls.check_op, *args), COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check {cls.checked} {args[4]}: {_last(res)}"
        return res.stdout.strip() or None

    def needs(self) -> tuple[str, ...]:
        return ("python3",)

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        return checkpoint_job_problem(self.kind, self.spec.path, workload)

    def _root(self, ctx: FaultContext) -> str:
        return checkpoint_root(self.kind, ctx)

    def _where(self) -> str:
        return checkpoint_where(self.spec.path)

    def _tool(self, ctx: FaultContext, transport: Transport, args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Any:
        res = transport.run(tool_argv(node_python(ctx, transport, transport.node), *args), timeout)
        if res.returncode == EXIT_PATH:
            i = self.fault_id.lstrip("f").split(".")[0]
            raise ScenarioError(f"faults.{i}.path: {_last(res)} on node {transport.node}; nothing was injected")
        if res.returncode != 0:
            raise InfraError(f"{self.kind} on node {transport.node}: {args[0]} failed: {_last(res)}")
        return json.loads(res.stdout) if res.stdout.strip() else None

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        root = self._root(ctx)
        return [self.inject_on(ctx, root, f"{self.fault_id}.{i}", t) for i, t in enumerate(targets)]

    def inject_on(self, ctx: FaultContext, root: str, fid: str, t: NodeTarget) -> Injection:
        """The fault on one target node, in the checkpoint folder ``root``; its lease armed first and released
        again (:func:`undo`) when the node-side step fails."""
        raise NotImplementedError

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        revert = injection.detail["revert"]
        parse_revert(self.kind, revert)
        res = ctx.transport(injection.node).run(revert, COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            raise InfraError(f"{self.kind}: revert on node {injection.node} failed: {_last(res)}")
        if res.stdout.strip().startswith("{"):
            injection.detail["restore"] = json.loads(res.stdout)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        return until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"]), VERIFY_S)


class CorruptFault(_StorageFault):
    kind = "storage.corrupt"
    covers = ("storage.checkpoint",)
    Spec = CorruptSpec
    revert_op, check_op, checked = "restore", "check", "the aside folder"
    primes: ClassVar[bool] = True

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, mode, where = self.spec.duration, self.spec.mode, self._where()
        harm = {"truncate": "truncate it to half its size", "remove": "leave it removed",
                "flip": f"flip {FLIPPED_BYTES} of its bytes (XOR 0xff, first to last)"}[mode]
        out = []
        for t in targets:
            out.append(Action(t.node, f"find the newest file matching '{self.spec.pattern}' under {where} (refused if "
                                      "the path resolves outside the checkpoint folder)", t.node))
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <storage tool> restore <its folder>/"
                                      f"{ASIDE_PREFIX}<token> <its inode>' after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"as the checkpoint folder's owner: move it aside into <its folder>/{ASIDE_PREFIX}"
                                      f"<token>/original; {harm}", t.node))
            out.append(Action(t.node, f"after {d:g}s: put the original back (unless the job wrote a new file under that "
                                      "name meanwhile); remove the aside folder", t.node))
        return out

    def inject_on(self, ctx: FaultContext, root: str, fid: str, t: NodeTarget) -> Injection:
        transport = ctx.transport(t.node)
        found = self._tool(ctx, transport, ["find", root, self.spec.path, self.spec.pattern])
        if "checkpoint" not in found:
            raise InfraError(f"storage.corrupt: no checkpoint matching '{self.spec.pattern}' under {found['folder']} "
                             f"on node {t.node}; nothing was injected",
                             hint="trigger the fault after the job's first save (at: {step: N} past checkpoint_every)")
        checkpoint = found["checkpoint"]
        name = ASIDE_PREFIX + secrets.token_hex(8)
        aside = posixpath.join(posixpath.dirname(checkpoint), name)
        where = [root, found["root_id"], found["rel"], found["parent_id"], name, found["id"], str(found["uid"]),
                 self.spec.mode]
        revert = tool_argv(node_python(ctx, transport, t.node), self.revert_op, *where)
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{checkpoint}")
        try:
            done = self._tool(ctx, transport, ["corrupt", *where])
        except (InfraError, ScenarioError):
            undo(ctx, transport, fid, revert)
            raise
        ts = time.time()
        detail = {"mechanism": self.spec.mode, "fidelity": "real", "checkpoint": checkpoint, "aside": aside,
                  "bytes": done["bytes"], "bytes_now": done["now"], "revert": revert}
        return Injection(fid, self.kind, t.node, [f"{t.node}:{checkpoint}"], ts, detail)


class FullFault(_StorageFault):
    kind = "storage.full"
    covers = ("storage.disk",)
    Spec = FullSpec
    revert_op, check_op, checked = "unfill", "filled", "the fill file"

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, size, where = self.spec.duration, format_size(self.spec.size), self._where()
        out = []
        for t in targets:
            out.append(Action(t.node, f"statvfs {where} (df): refused unless its file system has at most {size} free", t.node))
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <storage tool> unfill {where}/"
                                      f"{FILL_PREFIX}<token>' after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"as the checkpoint folder's owner: create {where}/{FILL_PREFIX}<token> (O_EXCL) "
                                      f"and write zeros until the file system is full (at most {size})", t.node))
            out.append(Action(t.node, f"after {d:g}s: remove {where}/{FILL_PREFIX}<token>", t.node))
        return out

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        root = self._root(ctx)
        for t in targets:
            transport = ctx.transport(t.node)
            fs = self._tool(ctx, transport, ["statfs", root, self.spec.path])
            self._refuse_if_roomy(fs["free"], fs["folder"], t.node)

    def _refuse_if_roomy(self, free: int, folder: str, node: str) -> None:
        if free > self.spec.size:
            i = self.fault_id.lstrip("f").split(".")[0]
            raise ScenarioError(
                f"faults.{i}.size: the file system of {folder} on node {node} has {format_size(free)} free, more than "
                f"the limit of {format_size(self.spec.size)}; storage.full fills only a file system no larger than its "
                "limit, so nothing was injected",
                hint="give the job a small checkpoint file system (workload: {checkpoint_fs: 64MiB}), or raise size "
                     "if filling that much is what you mean")

    def inject_on(self, ctx: FaultContext, root: str, fid: str, t: NodeTarget) -> Injection:
        transport = ctx.transport(t.node)
        fs = self._tool(ctx, transport, ["statfs", root, self.spec.path])
        self._refuse_if_roomy(fs["free"], fs["folder"], t.node)
        if "folder_id" not in fs:
            raise InfraError(f"storage.full: {fs['folder']} does not exist on node {t.node}; nothing was injected")
        name = FILL_PREFIX + secrets.token_hex(8)
        python = node_python(ctx, transport, t.node)
        where = [root, fs["root_id"], fs["rel"], fs["folder_id"], name]
        revert = tool_argv(python, self.revert_op, *where)
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{fs['folder']}")
        res = transport.run(tool_argv(python, "fill", *where, str(self.spec.size)), FILL_TIMEOUT_S)
        if res.returncode != 0:
            undo(ctx, transport, fid, revert)
            if res.returncode == REFUSED:  # it grew roomier between the two looks
                self._refuse_if_roomy(self.spec.size + 1, fs["folder"], t.node)
            raise InfraError(f"storage.full on node {t.node}: fill failed: {_last(res)}")
        done = json.loads(res.stdout)
        ts = time.time()
        detail = {"mechanism": "fill", "fidelity": "real", "file": done["file"], "bytes": done["bytes"],
                  "free_before": done["free_before"], "free_after": done["free_after"], "full": done["full"],
                  "revert": revert}
        return Injection(fid, self.kind, t.node, [f"{t.node}:{fs['folder']}"], ts, detail)

def tool_argv(python: str, op: str, *args: str) -> list[str]:
    """The node's command for one operation of :data:`STORAGE_TOOL` (isolated: no PYTHON* variables, no cwd on the path)."""
    return [python, "-I", "-c", STORAGE_TOOL, op, *args]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ID = re.compile(r"^[0-9]+:[0-9]+$")
_TOKEN = re.compile(r"^[0-9a-f]{16}$")


def parse_revert(kind: str, revert: list[str]) -> tuple[str, list[str]]:
    """``(python, arguments)`` of a revert this module made for ``kind``; ``ValueError`` for any other argv.

    A revert read back (a journal, a lease) is run only when it is exactly the shape :func:`tool_argv` gives:
    the storage tool itself, ``restore``/``unfill``, and arguments of the kinds they take."""
    op, count, prefix = {"storage.corrupt": ("restore", 8, ASIDE_PREFIX), "storage.full": ("unfill", 5, FILL_PREFIX)}[kind]
    if len(revert) != 5 + count or revert[1:5] != ["-I", "-c", STORAGE_TOOL, op]:
        raise ValueError(f"not a {kind} revert chaoskit makes")
    python, args = revert[0], revert[5:]
    root, root_id, rel, folder_id, name = args[:5]
    problems = [bad_root(root), None if _ID.match(root_id) and _ID.match(folder_id) else "a device:inode is malformed",
                None if name.startswith(prefix) and _TOKEN.match(name[len(prefix):]) else f"{name!r} is not a name it makes",
                None if rel and not rel.startswith("/") and ".." not in rel.split("/") and not _CONTROL.search(rel)
                else f"{rel!r} is not a path inside the checkpoint folder"]
    if kind == "storage.corrupt":
        problems.append(None if _ID.match(args[5]) and args[6].isdigit() and args[7] in ("truncate", "flip", "remove")
                        else "the original's inode, owner or mode is malformed")
    problem = next((p for p in problems if p), None)
    if problem or _CONTROL.search(python) or not python:
        raise ValueError(f"not a {kind} revert chaoskit makes: {problem or 'the python is malformed'}")
    return python, args


def _last(res: Any) -> str:
    """The last line the node's tool wrote on stderr (its one clear line), or its exit status."""
    return (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]


