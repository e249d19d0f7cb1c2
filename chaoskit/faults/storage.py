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

from chaoskit.cluster.selectors import NodeTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.sizes import ByteSize, format_size
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import journaled_python, node_python, undo

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

_TOOL_BODY = r"""
import errno, fnmatch, json, os, secrets, stat, sys
D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
W = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
def die(code, msg):
    sys.stderr.write(msg + "\n")
    sys.exit(code)
def ident(st):
    return "%d:%d" % (st.st_dev, st.st_ino)
def checked(value, what):
    if not value or len(value) > 4096 or any(ord(c) < 32 or c == "\x7f" for c in value):
        die(6, "refusing: %s %r is not a valid path" % (what, value))
    return value
def name_ok(name, prefix):
    if not name.startswith(prefix) or "/" in name or len(name) > 255 or not name[len(prefix):].isalnum():
        die(6, "refusing: %r is not a name chaoskit makes (%s<token>)" % (name, prefix))
    return name
def id_ok(value):
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        die(6, "refusing: %r is not a device:inode" % value)
    return value
def open_root(root, partial=False):
    # The checkpoint folder, walked from / without following a link anyone but root could have made.
    # partial: the nearest folder there is on the way when it does not exist (yet), and whether it is the folder.
    checked(root, "the checkpoint folder")
    if not root.startswith("/"):
        die(5, "refusing: the checkpoint folder %r is not an absolute path" % root)
    fd, parts, hops = os.open("/", D), [p for p in root.split("/") if p not in ("", ".")], 0
    while parts:
        name = parts.pop(0)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            if partial:
                return fd, False
            die(1, "the checkpoint folder %s does not exist" % root)
        if stat.S_ISLNK(st.st_mode):
            here = os.fstat(fd)
            hops += 1
            if st.st_uid != 0 or here.st_uid != 0 or here.st_mode & 0o022 or hops > 40:
                die(5, "refusing: the checkpoint folder %s has a symbolic link (%s -> %s) that a user other than root "
                       "can change; give its real path" % (root, name, os.readlink(name, dir_fd=fd)))
            target = os.readlink(name, dir_fd=fd)
            if target.startswith("/"):
                os.close(fd)
                fd = os.open("/", D)
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        if not stat.S_ISDIR(st.st_mode):
            die(1, "the checkpoint folder %s is not a folder" % root)
        nfd = os.open(name, D, dir_fd=fd)  # ".." included: never a link
        os.close(fd)
        fd = nfd
    return (fd, True) if partial else fd
def become(rootfd):
    # Act as the owner of the checkpoint folder (the job's user), not as root.
    st = os.fstat(rootfd)
    if os.geteuid() != 0 or st.st_uid == 0:
        return
    try:
        import pwd
        pw = pwd.getpwuid(st.st_uid)
        gid, groups = pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid)
    except (ImportError, KeyError):
        gid, groups = st.st_gid, []
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(st.st_uid, st.st_uid, st.st_uid)
def parts_of(root, rel):
    checked(rel, "path")
    if rel.startswith("/"):
        top, norm = os.path.normpath(root).rstrip("/"), os.path.normpath(rel)
        if norm == top:
            rel = "."
        elif norm.startswith(top + "/"):
            rel = norm[len(top) + 1:]
        else:
            die(2, "%s is outside the job's checkpoint folder %s" % (rel, root))
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        die(2, "%s leaves the job's checkpoint folder %s ('..')" % (rel, root))
    return parts
def descend(fd, parts, root, rel, partial=False):
    # Down from the root by names: no "..", no link. Returns (fd, how many parts were there).
    for i, name in enumerate(parts):
        where = os.path.join(root, *parts[:i + 1])
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            if partial:
                return fd, i
            die(1, "%s does not exist" % where)
        if stat.S_ISLNK(st.st_mode):
            die(2, "%s: %s is a symbolic link (to %s); storage faults follow no links, so it counts as outside the "
                   "job's checkpoint folder %s" % (rel, where, os.readlink(name, dir_fd=fd), root))
        if not stat.S_ISDIR(st.st_mode):
            die(2, "%s: %s is not a folder" % (rel, where))
        nfd = os.open(name, D, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd, len(parts)
def enter(root, root_id, rel, folder_id):
    # The folder REL of ROOT as chaoskit saw it at inject: the same inodes, as the folder's owner.
    rootfd = open_root(root)
    if root_id is not None and ident(os.fstat(rootfd)) != id_ok(root_id):
        die(3, "refusing: the checkpoint folder %s is not the folder it was at inject (inode %s now, %s then): it was "
               "replaced; nothing was touched" % (root, ident(os.fstat(rootfd)), root_id))
    become(rootfd)
    fd, _ = descend(rootfd, parts_of(root, rel), root, rel)
    if folder_id is not None and ident(os.fstat(fd)) != id_ok(folder_id):
        die(3, "refusing: %s is not the folder it was at inject (inode %s now, %s then): it was replaced; nothing "
               "was touched" % (os.path.join(root, rel), ident(os.fstat(fd)), folder_id))
    return fd
def lstat_at(fd, name):
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
def copy(src, dst, count):
    left, off = count, 0
    while left > 0:
        block = os.pread(src, min(left, 1 << 20), off)
        if not block:
            break
        view = memoryview(block)
        while view:
            n = os.write(dst, view)
            view = view[n:]
        off += len(block)
        left -= len(block)
def remove_tree(parent, name, depth=0):
    # Remove NAME in the folder PARENT through fds: nothing below it is followed.
    st = lstat_at(parent, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode) or depth > 32:
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, D, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            remove_tree(fd, entry, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
def aside_of(parent, aside, orig_id, orig_uid, where):
    # The aside folder and its original, or (None, None) when there is none; refused when not what chaoskit made.
    st = lstat_at(parent, aside)
    if st is None:
        return None, None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        die(3, "refusing: %s is not the aside folder chaoskit made (%s, owner %d, mode %o): it was replaced; nothing "
               "was put back" % (where, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "type %o" % stat.S_IFMT(st.st_mode),
                                 st.st_uid, stat.S_IMODE(st.st_mode)))
    fd = os.open(aside, D, dir_fd=parent)
    orig = lstat_at(fd, "original")
    if orig is not None and (not stat.S_ISREG(orig.st_mode) or ident(orig) != orig_id or orig.st_uid != orig_uid):
        die(3, "refusing: %s/original is not the checkpoint chaoskit moved aside (inode %s, owner %d; it moved inode "
               "%s, owner %d): it was replaced; nothing was put back" % (where, ident(orig), orig.st_uid, orig_id, orig_uid))
    return fd, orig
op = sys.argv[1]
if op in ("corrupt", "restore", "check"):
    root, root_id, rel, parent_id, aside, orig_id, orig_uid, mode = sys.argv[2:10]
    name_ok(aside, ASIDE)
    orig_id, orig_uid = id_ok(orig_id), int(orig_uid)
    if mode not in ("truncate", "flip", "remove"):
        die(6, "refusing: mode %r" % mode)
    parts = parts_of(root, rel)
    if not parts:
        die(6, "refusing: %r names no file" % rel)
    parent = enter(root, root_id, "/".join(parts[:-1]) or ".", parent_id)
    name, target = parts[-1], os.path.join(root, *parts)
    where = os.path.join(os.path.dirname(target), aside)
if op == "find":
    root, rel, pattern = sys.argv[2], sys.argv[3], sys.argv[4]
    rootfd = open_root(root)
    root_id = ident(os.fstat(rootfd))
    become(rootfd)
    parts = parts_of(root, rel)
    fd, _ = descend(rootfd, parts, root, rel)
    best = None
    for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):
                continue
            st = lstat_at(dirfd, name)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            sub = os.path.normpath(os.path.join(*(parts + [dirpath, name])))
            key = (st.st_mtime_ns, sub)
            if best is None or key > best[0]:
                best = (key, sub, st, ident(os.fstat(dirfd)))
    out = {"root": root, "root_id": root_id, "folder": os.path.join(root, *parts)}
    if best is not None:
        _, sub, st, parent_id = best
        out.update(checkpoint=os.path.join(root, sub), rel=sub, id=ident(st), uid=st.st_uid, bytes=st.st_size,
                   parent_id=parent_id)
    print(json.dumps(out))
elif op == "corrupt":
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=parent)
    st = os.fstat(src)
    if not stat.S_ISREG(st.st_mode) or ident(st) != orig_id:
        die(3, "refusing: %s is no longer the checkpoint that was found (inode %s now, %s then); nothing was injected"
               % (target, ident(st), orig_id))
    try:
        os.mkdir(aside, 0o700, dir_fd=parent)  # fails if anything is there already; never follows a link
    except FileExistsError:
        die(3, "refusing: %s is there already and chaoskit did not make it; nothing was injected" % where)
    afd = os.open(aside, D, dir_fd=parent)
    now = None
    if mode != "remove":
        out = os.open("corrupted", W, 0o600, dir_fd=afd)
        try:
            if mode == "truncate":
                copy(src, out, st.st_size // 2)
            else:
                copy(src, out, st.st_size)
                count = min(FLIPS, st.st_size)
                for off in sorted({(st.st_size - 1) * i // max(1, count - 1) for i in range(count)}) if st.st_size else []:
                    b = os.pread(src, 1, off)
                    os.pwrite(out, bytes([b[0] ^ 0xFF]), off)
            if os.geteuid() == 0:
                os.fchown(out, st.st_uid, st.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(out)
            now = os.fstat(out).st_size
        finally:
            os.close(out)
    os.rename(name, "original", src_dir_fd=parent, dst_dir_fd=afd)
    moved = lstat_at(afd, "original")
    if moved is None or ident(moved) != orig_id:  # swapped between the look and the rename: give it back
        if moved is not None:
            os.rename("original", name, src_dir_fd=afd, dst_dir_fd=parent)
        remove_tree(parent, aside)
        die(3, "refusing: %s was replaced while it was being moved aside; nothing was injected" % target)
    if mode != "remove":
        tmp = ".chaoskit-tmp-" + secrets.token_hex(8)
        os.link("corrupted", tmp, src_dir_fd=afd, dst_dir_fd=parent, follow_symlinks=False)  # fails if tmp exists
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    os.fsync(afd)
    os.fsync(parent)
    print(json.dumps({"checkpoint": target, "bytes": st.st_size, "now": now, "aside": where}))
elif op == "restore":
    afd, orig = aside_of(parent, aside, orig_id, orig_uid, where)
    if afd is None:
        print(json.dumps({"restored": False, "why": "nothing kept aside", "checkpoint": target}))
        sys.exit(0)
    now = lstat_at(parent, name)
    corrupted = lstat_at(afd, "corrupted")
    if orig is None:
        why = ("the original was never moved aside" if now is not None and ident(now) == orig_id
               else "the original was no longer in the aside folder; nothing to put back")
        restored = False
    elif now is None or (mode != "remove" and corrupted is not None and ident(now) == ident(corrupted)):
        os.rename("original", name, src_dir_fd=afd, dst_dir_fd=parent)
        os.fsync(parent)
        why, restored = ("put back (the corrupted file had been removed meanwhile)" if now is None and mode != "remove" else "put back"), True
    else:
        why, restored = "the job wrote a new %s meanwhile; kept the job's" % name, False
    os.close(afd)
    remove_tree(parent, aside)
    os.fsync(parent)
    print(json.dumps({"restored": restored, "why": why, "checkpoint": target}))
elif op == "check":
    afd, orig = aside_of(parent, aside, orig_id, orig_uid, where)
    print("the original is still kept aside in %s" % where if afd is not None else "")
elif op == "statfs":
    root, rel = sys.argv[2], sys.argv[3]
    parts = parts_of(root, rel)
    rootfd, there = open_root(root, partial=True)  # before the job starts, its folder may not exist yet
    out = {"folder": os.path.join(root, *parts), "rel": "/".join(parts) or "."}
    fd, depth = rootfd, -1
    if there:
        out["root_id"] = ident(os.fstat(rootfd))
        become(rootfd)
        fd, depth = descend(rootfd, parts, root, rel, partial=True)
    st = os.fstatvfs(fd)
    out.update(free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize)
    if depth == len(parts):
        out["folder_id"] = ident(os.fstat(fd))
    print(json.dumps(out))
elif op == "fill":
    root, root_id, rel, folder_id, name, limit = sys.argv[2:8]
    name_ok(name, FILL)
    limit = int(limit)
    fd = enter(root, root_id, rel, folder_id)
    folder = os.path.join(root, *parts_of(root, rel))
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    if free > limit:
        die(REFUSED, "the file system of %s has %d bytes free, more than the limit of %d" % (folder, free, limit))
    try:
        out = os.open(name, W, 0o600, dir_fd=fd)  # fails if anything is there already; never follows a link
    except FileExistsError:
        die(3, "refusing: %s is there already and chaoskit did not make it; nothing was injected"
               % os.path.join(folder, name))
    written, block, full = 0, b"\0" * (1 << 20), False
    try:
        while written < limit:
            try:
                n = os.write(out, block[: min(len(block), limit - written)])
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                full = True
                break
            written += n
        try:
            os.fsync(out)
        except OSError:
            pass
    finally:
        os.close(out)
    left = os.fstatvfs(fd)
    print(json.dumps({"file": os.path.join(folder, name), "bytes": written, "free_before": free,
                      "free_after": left.f_bavail * left.f_frsize, "full": full}))
elif op in ("unfill", "filled"):
    root, root_id, rel, folder_id, name = sys.argv[2:7]
    name_ok(name, FILL)
    fd = enter(root, root_id, rel, folder_id)
    path = os.path.join(root, *(parts_of(root, rel) + [name]))
    st = lstat_at(fd, name)
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()):
        die(3, "refusing: %s is not the fill file chaoskit wrote (%s, owner %d): it was replaced; left alone"
               % (path, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "type %o" % stat.S_IFMT(st.st_mode), st.st_uid))
    if op == "filled":
        print("the fill file %s is still there" % path if st is not None else "")
    elif st is not None:
        os.unlink(name, dir_fd=fd)
        os.fsync(fd)
else:
    die(6, "unknown operation %r" % op)
"""

STORAGE_TOOL = f"ASIDE, FILL, FLIPS, REFUSED = {ASIDE_PREFIX!r}, {FILL_PREFIX!r}, {FLIPPED_BYTES}, {REFUSED}\n" + _TOOL_BODY
"""``python3 -I -c STORAGE_TOOL OP ...`` on the node. Every operation opens the checkpoint folder ``ROOT`` from ``/``
without following a link anyone but root could have made (exit 5 otherwise), then acts as the folder's owner (the
job's user) and goes down from it through directory fds by name: no ``..``, no link followed (exit 2: the scenario's
``path`` leaves the folder). Files it makes are ``O_CREAT|O_EXCL|O_NOFOLLOW`` or ``mkdir``; modes and times are set on
its own fds. What a revert needs comes on its command line (``*_ID`` are ``device:inode`` recorded at inject) and is
checked again: anything replaced meanwhile is refused (exit 3) and left alone.

``find ROOT PATH PATTERN``, ``corrupt|restore|check ROOT ROOT_ID FILE PARENT_ID ASIDE ORIG_ID ORIG_UID MODE``
(``FILE`` relative to ``ROOT``, ``ASIDE`` a name in its folder), ``statfs ROOT PATH``,
``fill ROOT ROOT_ID PATH FOLDER_ID NAME LIMIT``, ``unfill|filled ROOT ROOT_ID PATH FOLDER_ID NAME``."""

EXIT_PATH, EXIT_REPLACED, EXIT_ROOT, EXIT_ARGV = 2, 3, 5, 6


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
        return tool_argv(journaled_python(python, node), "restore" if cls.kind == "storage.corrupt" else "unfill", *args)

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
        problem = _bad_root(str(root))
        if problem:
            raise InfraError(f"{self.kind}: {problem}; nothing was injected")
        return str(root)

    def _where(self) -> str:
        return "<checkpoint folder>" + ("" if self.spec.path in (".", "./") else f"/{self.spec.path}")

    def _tool(self, ctx: FaultContext, transport: Transport, args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Any:
        res = transport.run(tool_argv(node_python(ctx, transport, transport.node), *args), timeout)
        if res.returncode == EXIT_PATH:
            i = self.fault_id.lstrip("f").split(".")[0]
            raise ScenarioError(f"faults.{i}.path: {_last(res)} on node {transport.node}; nothing was injected")
        if res.returncode != 0:
            raise InfraError(f"{self.kind} on node {transport.node}: {args[0]} failed: {_last(res)}")
        return json.loads(res.stdout) if res.stdout.strip() else None

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
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <storage tool> restore <its folder>/"
                                      f"{ASIDE_PREFIX}<token> <its inode>' after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"as the checkpoint folder's owner: move it aside into <its folder>/{ASIDE_PREFIX}"
                                      f"<token>/original; {harm}", t.node))
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
            name = ASIDE_PREFIX + secrets.token_hex(8)
            aside = posixpath.join(posixpath.dirname(checkpoint), name)
            where = [root, found["root_id"], found["rel"], found["parent_id"], name, found["id"], str(found["uid"]),
                     self.spec.mode]
            revert = tool_argv(node_python(ctx, transport, t.node), "restore", *where)
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{checkpoint}")
            try:
                done = self._tool(ctx, transport, ["corrupt", *where])
            except (InfraError, ScenarioError):
                undo(ctx, transport, fid, revert)
                raise
            ts = time.time()
            detail = {"mechanism": self.spec.mode, "fidelity": "real", "checkpoint": checkpoint, "aside": aside,
                      "bytes": done["bytes"], "bytes_now": done["now"], "revert": revert}
            out.append(Injection(fid, self.kind, t.node, [f"{t.node}:{checkpoint}"], ts, detail))
        return out

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        python, args = parse_revert(cls.kind, revert)
        res = transport.run(tool_argv(python, "check", *args), COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check the aside folder {args[4]}: {_last(res)}"
        return res.stdout.strip() or None


class FullFault(_StorageFault):
    kind = "storage.full"
    Spec = FullSpec

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

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        root = self._root(ctx)
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            fs = self._tool(ctx, transport, ["statfs", root, self.spec.path])
            self._refuse_if_roomy(fs["free"], fs["folder"], t.node)
            if "folder_id" not in fs:
                raise InfraError(f"storage.full: {fs['folder']} does not exist on node {t.node}; nothing was injected")
            name = FILL_PREFIX + secrets.token_hex(8)
            python = node_python(ctx, transport, t.node)
            where = [root, fs["root_id"], fs["rel"], fs["folder_id"], name]
            revert = tool_argv(python, "unfill", *where)
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
            out.append(Injection(fid, self.kind, t.node, [f"{t.node}:{fs['folder']}"], ts, detail))
        return out

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        python, args = parse_revert(cls.kind, revert)
        res = transport.run(tool_argv(python, "filled", *args), COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check the fill file {args[4]}: {_last(res)}"
        return res.stdout.strip() or None


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
    problems = [_bad_root(root), None if _ID.match(root_id) and _ID.match(folder_id) else "a device:inode is malformed",
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


def _bad_root(root: str) -> str | None:
    """Why ``root`` cannot be a checkpoint folder sent to a node, or ``None``."""
    if not root.startswith("/") or len(root) > 4096 or _CONTROL.search(root):
        return f"the checkpoint folder {root!r} is not an absolute path of printable characters"
    if root != "/" and posixpath.normpath(root) != root.rstrip("/"):
        return f"the checkpoint folder {root!r} is not a normalised path"
    return None


def _last(res: Any) -> str:
    """The last line the node's tool wrote on stderr (its one clear line), or its exit status."""
    return (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]


