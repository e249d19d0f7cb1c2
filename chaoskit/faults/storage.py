"""Checkpoint storage faults: the newest checkpoint corrupted (``storage.corrupt``), its file system full (``storage.full``).

Both act inside the job's checkpoint folder only (``CHAOSKIT_CKPT_DIR`` of a job
chaoskit starts, ``workload.checkpoint_dir`` of an attached one): ``path`` is a
folder inside it, and a path that leaves it (``..``, an absolute path elsewhere,
a symlink out, as the node resolves it) is refused before anything is armed.

- ``storage.corrupt``: the newest checkpoint under ``path`` (by modification
  time, among the names matching ``pattern``) is truncated to half its size, has
  bytes flipped, or is removed. The original is first moved aside into a folder of
  chaoskit's own beside it (``.chaoskit-aside-<token>``: the same file system, so
  keeping it costs a rename, not a copy of a multi-gigabyte file) and put back at
  revert, unless the job has written a new file under that name meanwhile (a
  save after it fell back to an older checkpoint): the job's newer file wins and
  the aside copy is dropped. The aside folder is not the lease's folder because a
  lease's folder is removed when the run closes, even when its watchdog has yet to
  revert.
- ``storage.full``: one file (``.chaoskit-fill-<token>``) written with zeros until
  the file system of ``path`` is full, at most ``size`` bytes; removed at revert.
  Refused unless that file system has no more free space than ``size`` (checked on
  the node at preflight and again at inject): the limit is what keeps a drill from
  filling a shared disk. The labs give the job a small checkpoint file system of
  its own for it (``workload.checkpoint_fs``).

The reverts are armed as leases first, so a SIGKILLed controller still ends with
the checkpoint back and the fill file gone. Everything on the node is done by
:data:`STORAGE_TOOL`, a stdlib-only script run as ``python3 -c`` through the
node's transport.
"""

from __future__ import annotations

import json
import posixpath
import secrets
import sys
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit.cluster.selectors import NodeTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.sizes import ByteSize, format_size
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection

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

STORAGE_TOOL = r"""
import fnmatch, hashlib, json, os, shutil, sys
ASIDE, FILL, FLIPS, REFUSED = %r, %r, %d, %d
def real(path):
    return os.path.realpath(path)
def inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")
def resolve(root, rel):
    root_r = real(root)
    target = real(os.path.join(root, rel))
    if not inside(target, root_r):
        sys.stderr.write("%%s resolves to %%s, outside the job's checkpoint folder %%s\n" %% (rel, target, root_r))
        sys.exit(2)
    return root_r, target
def existing(path):
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
def ident(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
def save(state_path, state):
    tmp = state_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, state_path)
def put_back(src, dst):
    tmp = dst + ".chaoskit-restore"
    try:
        os.replace(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)
def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
op = sys.argv[1]
if op == "find":
    root, rel, pattern = sys.argv[2], sys.argv[3], sys.argv[4]
    root_r, folder = resolve(root, rel)
    best = None
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            key = (st.st_mtime_ns, path)
            if best is None or key > best[0]:
                best = (key, path, st.st_size)
    out = {"root": root_r, "folder": folder}
    if best is not None:
        out.update(checkpoint=best[1], bytes=best[2])
    print(json.dumps(out))
elif op == "corrupt":
    root, target, mode, aside = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    if not inside(real(target), real(root)) or not os.path.basename(aside).startswith(ASIDE):
        sys.exit("refusing: %%s is not inside %%s" %% (target, root))
    os.mkdir(aside, 0o700)
    state_path = os.path.join(aside, "state.json")
    original = os.path.join(aside, "original")
    size = os.path.getsize(target)
    state = {"target": target, "mode": mode, "bytes": size, "sha256": sha(target), "after": None}
    save(state_path, state)
    os.rename(target, original)
    if mode == "truncate":
        with open(original, "rb") as src, open(target + ".chaoskit-tmp", "wb") as dst:
            left = size // 2
            while left > 0:
                block = src.read(min(left, 1 << 20))
                if not block:
                    break
                dst.write(block)
                left -= len(block)
            dst.flush()
            os.fsync(dst.fileno())
        shutil.copystat(original, target + ".chaoskit-tmp")
        os.replace(target + ".chaoskit-tmp", target)
    elif mode == "flip":
        shutil.copy2(original, target + ".chaoskit-tmp")
        with open(target + ".chaoskit-tmp", "r+b") as fh:
            count = min(FLIPS, size)
            offsets = sorted({(size - 1) * i // max(1, count - 1) for i in range(count)}) if size else []
            for off in offsets:
                fh.seek(off)
                b = fh.read(1)
                fh.seek(off)
                fh.write(bytes([b[0] ^ 0xFF]))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(target + ".chaoskit-tmp", target)
    fsync_dir(os.path.dirname(target))
    state["after"] = ident(target)
    save(state_path, state)
    print(json.dumps({"checkpoint": target, "bytes": size, "now": None if mode == "remove" else os.path.getsize(target), "aside": aside}))
elif op == "restore":
    aside = sys.argv[2]
    if not os.path.basename(aside.rstrip("/")).startswith(ASIDE):
        sys.exit("refusing: %%s is not a chaoskit aside folder" %% aside)
    state_path, original = os.path.join(aside, "state.json"), os.path.join(aside, "original")
    try:
        with open(state_path) as fh:
            state = json.load(fh)
    except FileNotFoundError:
        shutil.rmtree(aside, ignore_errors=True)
        print(json.dumps({"restored": False, "why": "nothing kept aside"}))
        sys.exit(0)
    target = state["target"]
    now = ident(target)
    if not os.path.exists(original):
        why, restored = "the original was never moved aside", False
    elif now is None or (state["after"] is not None and now == state["after"]) or (state["after"] is None and state["mode"] != "remove"):
        put_back(original, target)
        fsync_dir(os.path.dirname(target))
        why, restored = ("put back (the corrupted file had been removed meanwhile)" if now is None and state["mode"] != "remove" else "put back"), True
    else:
        why, restored = "the job wrote a new %%s meanwhile; kept the job's" %% os.path.basename(target), False
    shutil.rmtree(aside)
    print(json.dumps({"restored": restored, "why": why, "checkpoint": target}))
elif op == "check":
    aside = sys.argv[2]
    print("the original is still kept aside in %%s" %% aside if os.path.exists(aside) else "")
elif op == "statfs":
    root, rel = sys.argv[2], sys.argv[3]
    root_r, folder = resolve(root, rel)
    st = os.statvfs(existing(folder))
    print(json.dumps({"folder": folder, "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}))
elif op == "fill":
    root, rel, limit, token = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    root_r, folder = resolve(root, rel)
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if free > limit:
        sys.stderr.write("the file system of %%s has %%d bytes free, more than the limit of %%d\n" %% (folder, free, limit))
        sys.exit(REFUSED)
    path = os.path.join(folder, FILL + token)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    written, block, full = 0, b"\0" * (1 << 20), False
    try:
        while written < limit:
            try:
                n = os.write(fd, block[: min(len(block), limit - written)])
            except OSError as exc:
                if exc.errno not in (28, 122):  # ENOSPC, EDQUOT
                    raise
                full = True
                break
            written += n
        try:
            os.fsync(fd)
        except OSError:
            pass
    finally:
        os.close(fd)
    left = os.statvfs(folder)
    print(json.dumps({"file": path, "bytes": written, "free_before": free, "free_after": left.f_bavail * left.f_frsize, "full": full}))
elif op == "unfill":
    path = sys.argv[2]
    if not os.path.basename(path).startswith(FILL):
        sys.exit("refusing: %%s is not a chaoskit fill file" %% path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
elif op == "filled":
    path = sys.argv[2]
    print("the fill file %%s is still there" %% path if os.path.exists(path) else "")
""" % (ASIDE_PREFIX, FILL_PREFIX, FLIPPED_BYTES, REFUSED)
"""``python3 -c STORAGE_TOOL OP ...`` on the node: ``find ROOT PATH PATTERN``, ``corrupt ROOT FILE MODE ASIDE``,
``restore ASIDE``, ``check ASIDE``, ``statfs ROOT PATH``, ``fill ROOT PATH LIMIT TOKEN``, ``unfill FILE``,
``filled FILE``. ``PATH`` is taken inside ``ROOT`` and refused (exit 2) when it resolves outside it."""


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


class _StorageSpec(FaultSpec):
    path: str = Field(
        ".", min_length=1, max_length=4096,
        description="A folder inside the job's checkpoint folder: relative to it ('.', the default, is the folder "
                    "itself), or absolute inside workload.checkpoint_dir. Anything outside it is refused.",
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

    def needs(self) -> tuple[str, ...]:
        return ("python3",)

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        launch = getattr(workload, "launch", None)
        if launch == "ray-train":
            return "kind", f"{self.kind} acts on the job's checkpoint folder; a ray-train job keeps its checkpoints in Ray's storage"
        root = getattr(workload, "checkpoint_dir", None)
        if launch == "attach" and root is None:
            return "path", (f"{self.kind} on an attached job needs the folder it keeps its checkpoints in: "
                            "set workload.checkpoint_dir")
        problem = check_inside(self.spec.path, root)
        return ("path", problem) if problem else None

    def _root(self, ctx: FaultContext) -> str:
        root = getattr(ctx, "checkpoint_dir", None)
        if not root:
            raise InfraError(f"{self.kind}: the job's checkpoint folder is not known")
        return str(root)

    def _where(self) -> str:
        return "<checkpoint folder>" + ("" if self.spec.path in (".", "./") else f"/{self.spec.path}")

    def _tool(self, ctx: FaultContext, transport: Transport, args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Any:
        res = transport.run([_python(ctx, transport, transport.node), "-c", STORAGE_TOOL, *args], timeout)
        if res.returncode == 2 and "outside the job's checkpoint folder" in res.stderr:
            i = self.fault_id.lstrip("f").split(".")[0]
            raise ScenarioError(f"faults.{i}.path: {res.stderr.strip()} on node {transport.node}; nothing was injected")
        if res.returncode != 0:
            raise InfraError(f"{self.kind} on node {transport.node}: {args[0]} failed: "
                             f"{(res.stderr.strip().splitlines() or [str(res.returncode)])[-1]}")
        return json.loads(res.stdout) if res.stdout.strip() else None

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        res = ctx.transport(injection.node).run(injection.detail["revert"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            raise InfraError(f"{self.kind}: revert on node {injection.node} failed: {res.stderr.strip() or res.returncode}")
        if res.stdout.strip().startswith("{"):
            injection.detail["restore"] = json.loads(res.stdout)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        end = time.time() + VERIFY_S
        while True:
            try:
                problem = self.check_reverted(transport, injection.detail["revert"])
            except InfraError as exc:
                problem = str(exc)
            if problem is None or time.time() >= end:
                return problem
            time.sleep(0.1)


class CorruptFault(_StorageFault):
    kind = "storage.corrupt"
    Spec = CorruptSpec
    primes: ClassVar[bool] = True

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, mode, where = self.spec.duration, self.spec.mode, self._where()
        harm = {"truncate": "truncate it to half its size", "remove": "leave it removed",
                "flip": f"flip {FLIPPED_BYTES} of its bytes (XOR 0xff, first to last)"}[mode]
        out = []
        for t in targets:
            out.append(Action(t.node, f"find the newest file matching '{self.spec.pattern}' under {where} (refused if "
                                      "the path resolves outside the checkpoint folder)", t.node))
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -c <storage tool> restore <its folder>/"
                                      f"{ASIDE_PREFIX}<token>' after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"move it aside into <its folder>/{ASIDE_PREFIX}<token>/original; {harm}", t.node))
            out.append(Action(t.node, f"after {d:g}s: put the original back (unless the job wrote a new file under that "
                                      "name meanwhile); remove the aside folder", t.node))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        root = self._root(ctx)
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            found = self._tool(ctx, transport, ["find", root, self.spec.path, self.spec.pattern])
            if "checkpoint" not in found:
                raise InfraError(f"storage.corrupt: no checkpoint matching '{self.spec.pattern}' under {found['folder']} "
                                 f"on node {t.node}; nothing was injected",
                                 hint="trigger the fault after the job's first save (at: {step: N} past checkpoint_every)")
            checkpoint = found["checkpoint"]
            aside = posixpath.join(posixpath.dirname(checkpoint), ASIDE_PREFIX + secrets.token_hex(6))
            revert = [_python(ctx, transport, t.node), "-c", STORAGE_TOOL, "restore", aside]
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{checkpoint}")
            try:
                done = self._tool(ctx, transport, ["corrupt", root, checkpoint, self.spec.mode, aside])
            except (InfraError, ScenarioError):
                _undo(ctx, transport, fid, revert)
                raise
            ts = time.time()
            detail = {"mechanism": self.spec.mode, "fidelity": "real", "checkpoint": checkpoint, "aside": aside,
                      "bytes": done["bytes"], "bytes_now": done["now"], "revert": revert}
            out.append(Injection(fid, self.kind, t.node, [f"{t.node}:{checkpoint}"], ts, detail))
        return out

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        aside = revert[-1]
        if not posixpath.basename(aside).startswith(ASIDE_PREFIX):
            raise ValueError(f"not a chaoskit aside folder: {aside!r}")
        res = transport.run([*revert[:3], "check", aside], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check {aside}: {res.stderr.strip()}"
        return res.stdout.strip() or None


class FullFault(_StorageFault):
    kind = "storage.full"
    Spec = FullSpec

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, size, where = self.spec.duration, format_size(self.spec.size), self._where()
        out = []
        for t in targets:
            out.append(Action(t.node, f"statvfs {where} (df): refused unless its file system has at most {size} free", t.node))
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -c <storage tool> unfill {where}/{FILL_PREFIX}"
                                      f"<token>' after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"write {where}/{FILL_PREFIX}<token> with zeros until the file system is full "
                                      f"(at most {size})", t.node))
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

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        root = self._root(ctx)
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            fs = self._tool(ctx, transport, ["statfs", root, self.spec.path])
            self._refuse_if_roomy(fs["free"], fs["folder"], t.node)
            token = secrets.token_hex(6)
            fill = posixpath.join(fs["folder"], FILL_PREFIX + token)
            python = _python(ctx, transport, t.node)
            revert = [python, "-c", STORAGE_TOOL, "unfill", fill]
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{fs['folder']}")
            res = transport.run([python, "-c", STORAGE_TOOL, "fill", root, self.spec.path, str(self.spec.size), token],
                                FILL_TIMEOUT_S)
            if res.returncode != 0:
                _undo(ctx, transport, fid, revert)
                if res.returncode == REFUSED:  # it grew roomier between the two looks
                    self._refuse_if_roomy(self.spec.size + 1, fs["folder"], t.node)
                raise InfraError(f"storage.full on node {t.node}: fill failed: {res.stderr.strip() or res.returncode}")
            done = json.loads(res.stdout)
            ts = time.time()
            detail = {"mechanism": "fill", "fidelity": "real", "file": done["file"], "bytes": done["bytes"],
                      "free_before": done["free_before"], "free_after": done["free_after"], "full": done["full"],
                      "revert": revert}
            out.append(Injection(fid, self.kind, t.node, [f"{t.node}:{fs['folder']}"], ts, detail))
        return out

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        fill = revert[-1]
        if not posixpath.basename(fill).startswith(FILL_PREFIX):
            raise ValueError(f"not a chaoskit fill file: {fill!r}")
        res = transport.run([*revert[:3], "filled", fill], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check {fill}: {res.stderr.strip()}"
        return res.stdout.strip() or None


def _python(ctx: FaultContext, transport: Transport, node: str) -> str:
    if isinstance(transport, LocalTransport):
        return sys.executable  # the controller is the node
    info = ctx.inventory[node]
    return info.ssh.python if info.ssh is not None else "python3"


def _undo(ctx: FaultContext, transport: Transport, fid: str, revert: list[str]) -> None:
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
