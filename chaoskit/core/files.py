"""The files a run and a game day leave behind, by name, and the readers that every layer shares.

A run folder holds ``result.json``, ``events.jsonl``, ``journal.jsonl``,
``logs/`` and ``report.html``; a game-day folder holds ``gameday.json``, one run
folder per scenario and ``index.html``, and its parent keeps ``history.jsonl``.
The report is rendered from these files alone.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any, Callable

from chaoskit.core.errors import ScenarioError

__all__ = [
    "RESULT_FILE", "EVENTS_FILE", "JOURNAL_FILE", "RUN_REPORT",
    "GAMEDAY_FILE", "GAMEDAY_REPORT", "HISTORY_FILE", "load_gameday", "read_history",
    "utc_stamp", "utc_iso", "parse_utc_iso", "empty_out_dir", "make_run_dir", "open_append", "append_own", "open_regular", "NotRegularFile",
    "UnsafePath", "open_folder", "open_inside", "open_shown", "others_who_change", "ANYONE", "write_new", "file_kind", "copy_regular", "make_folder_for", "TORCH_CACHE_VAR",
    "torch_cache_env",
]

RESULT_FILE = "result.json"
EVENTS_FILE = "events.jsonl"
JOURNAL_FILE = "journal.jsonl"
RUN_REPORT = "report.html"
GAMEDAY_FILE = "gameday.json"
GAMEDAY_REPORT = "index.html"
HISTORY_FILE = "history.jsonl"
TORCH_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"


def torch_cache_env(folder: Path | str) -> dict[str, str]:
    """The variable that keeps a job's torch compile caches in ``folder``/torchinductor. Unset, torch makes
    ``/tmp/torchinductor_<user>`` (``os.makedirs(exist_ok=True)``, when DDP imports ``torch._dynamo``): a guessable
    name in a world-writable folder, which another user on the node can make first, or make a link, for root's job
    to write through. Triton's cache goes inside it."""
    return {TORCH_CACHE_VAR: str(Path(folder) / "torchinductor")}


def load_gameday(path: Path, readers: frozenset[int] = frozenset()) -> dict[str, Any]:
    """Read ``gameday.json`` from a game-day folder, opened as :func:`open_shown` opens a file for ``readers``."""
    with open_shown(Path(path) / GAMEDAY_FILE, readers) as fh:
        return json.loads(fh.read().decode("utf-8"))


def read_history(path: Path, until: str | None = None, readers: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """Entries of a ``history.jsonl`` (bad lines skipped), oldest first; only those
    that started at or before ``until`` (an ISO time) when given. Opened as :func:`open_shown` opens a file for
    ``readers``: none when it is not there; :class:`UnsafePath` when it may not be read."""
    try:
        fh = open_shown(path, readers)
    except FileNotFoundError:
        return []
    with fh:
        text = fh.read().decode("utf-8", errors="replace")
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and (until is None or str(entry.get("started_at", "")) <= until):
            entries.append(entry)
    return sorted(entries, key=lambda e: str(e.get("started_at", "")))


def utc_stamp(t: float) -> str:
    """``20261201T083000Z``: how a report folder's name says when it started."""
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def utc_iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def parse_utc_iso(text: Any) -> float | None:
    """The Unix time of an ISO 8601 instant as result.json and gameday.json write it (``...Z`` or ``+00:00``);
    ``None`` for anything else (missing, not a string, not a date)."""
    if not isinstance(text, str):
        return None
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def empty_out_dir(out: Path, what: str) -> Path:
    """Make ``out`` (a ``--out`` folder) as :func:`make_run_dir` makes a run folder (its parents walked from ``/``,
    following only root's links and this user's, none of them a folder someone else could change; ``out`` made
    from its parent's descriptor, or, when it exists, a folder of this user's that nobody else can write),
    refusing one that already holds files. :class:`ScenarioError` either way."""
    out = make_run_dir(out, 0o755, default=False)
    if any(out.iterdir()):
        raise ScenarioError(f"--out {out} already holds files; a {what} needs an empty folder",
                            hint="pick another --out, or remove that folder")
    return out


def make_run_dir(path: Path, mode: int, default: bool) -> Path:
    """The run folder, made now: ``path`` with ``mkdir`` (which fails where anything, a link too, has the name), or,
    for a ``default`` name someone took first, the same name with a random suffix. The operator's own ``--out`` may
    be a folder that exists: then it must be a folder (not a link) of this user's that nobody else can write.
    Its parents are walked from ``/`` (:func:`open_folder`, missing ones made 0755 on the way): a link is followed
    only when root or this user made it, and every folder on the way must be this user's or root's, and not one
    that others can write without the sticky bit (they could swap the run folder, or a folder above it, for a link
    after it is made, and root's later writes by name would go there). The run folder is made from the parent's
    descriptor, never by name. :class:`ScenarioError` otherwise: nothing was injected."""
    path = Path(os.path.abspath(path))
    try:
        pfd = open_folder(path.parent, make=True, folder_problem=_run_parent_problem)
    except UnsafePath as exc:
        raise ScenarioError(f"the run folder's parent {path.parent}: {exc}; choose another --out") from None
    try:
        candidate = path
        for _ in range(16):
            try:
                os.mkdir(candidate.name, mode, dir_fd=pfd)
                break
            except FileExistsError:
                if not default:
                    break  # the operator's own folder: checked below
                candidate = path.with_name(f"{path.name}-{secrets.token_hex(3)}")
        st = os.stat(candidate.name, dir_fd=pfd, follow_symlinks=False)
    finally:
        os.close(pfd)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"run folder {candidate} is {'a link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; "
                            "chaoskit writes a run only into a folder of its own")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ScenarioError(f"run folder {candidate} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}): "
                            "others could plant links in it; choose another --out")
    return candidate


def _run_parent_problem(st: os.stat_result) -> str | None:
    """What is wrong with a folder on the way to a run folder (as ``nodefs`` asks of one above its state folder)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to uid {st.st_uid}, who could swap the run folder for a link"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"can be written by {'anyone' if st.st_mode & 0o002 else 'its group'} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, no sticky bit): someone could swap the run folder for a link")
    return None


def open_append(path: Path, mode: int = 0o640):
    """``path`` opened to append text, made if absent, never through a link (``O_NOFOLLOW``)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "a", encoding="utf-8")


def append_own(path: Path | str, text: str, mode: int = 0o644) -> None:
    """Append ``text`` to ``path`` (a ``history.jsonl`` that game days share), made if absent, without following a
    link: its folder is reached as :func:`open_folder` reaches one, the file opened ``O_NOFOLLOW`` from that
    folder's descriptor, and written only when it is a regular file of this user's with no other name (a hard link
    someone planted to a file of root's is never appended to). :class:`UnsafePath` otherwise."""
    path = Path(path)
    dfd = open_folder(path.parent)
    try:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         mode, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(f"{path} is a link; chaoskit never appends through one") from None
            raise
    finally:
        os.close(dfd)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise UnsafePath(f"{path} is {file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'not ours alone'} "
                             f"(uid {st.st_uid}, {st.st_nlink} names); chaoskit appends only to a file of its own")
        fh.write(text)


class UnsafePath(OSError):
    """A path chaoskit will not go through: a link on it that neither root nor this user made, a folder on it that
    became a link while it was walked, or (for a run folder) a folder on it that someone else could change."""


class NotRegularFile(UnsafePath):
    """A file chaoskit was to read that is not a regular file (a FIFO, a device, a socket, a folder), or whose
    path changed to pass through a link while it was walked: it was never opened, or closed at once."""


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``a FIFO``, ``a character device``, ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


MAX_LINKS = 16
"""Links one path may pass through (as the kernel's own limit, ``ELOOP``)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(path: Path | str, *, make: bool = False, error: type[UnsafePath] = NotRegularFile,
          folder_problem: Callable[[os.stat_result], str | None] | None = None) -> tuple[int, str | None, Any]:
    """``(folder, name, st)``: a descriptor of the folder that holds ``path``'s last name, that name (``None`` when
    the path ends at ``/``) and its ``lstat``.

    The path is walked from ``/`` one name at a time, each folder opened ``O_NOFOLLOW`` (one swapped for a link
    meanwhile is refused). A link is followed only when root or this user made it: one of anybody else's is
    refused, wherever on the path it is (the last name too). ``make``: a missing folder on the way (the last name
    too) is made (0755, from its parent's descriptor). ``folder_problem`` is asked of every folder
    passed through (``/`` too); its answer refuses the path. Raises ``error`` (with the reason) or
    ``FileNotFoundError``; the caller closes the descriptor."""
    trusted = (0, os.geteuid())
    parts = [p for p in os.path.abspath(path).split("/") if p]
    links = 0
    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_folder(dfd, "/", folder_problem, error)
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            try:
                st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                if not make:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=dfd)
                except FileExistsError:
                    pass  # made meanwhile: checked as any other below
                st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in trusted:
                    raise error(f"{path}: {part} is a link of uid {st.st_uid}'s; chaoskit follows only "
                                "root's and its own")
                links += 1
                if links > MAX_LINKS:
                    raise error(f"{path}: more than {MAX_LINKS} links")
                target = os.readlink(part, dir_fd=dfd)
                if target.startswith("/"):
                    os.close(dfd)
                    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                parts = [p for p in target.split("/") if p] + parts
                continue
            if not parts:
                return dfd, part, st
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise error(f"{path}: {part} on its way is not a folder (or became a link)") from None
                raise
            os.close(dfd)
            dfd = nfd
            _check_folder(dfd, part, folder_problem, error)
        return dfd, None, os.fstat(dfd)
    except BaseException:
        os.close(dfd)
        raise


def _check_folder(dfd: int, name: str, problem: Callable[[os.stat_result], str | None] | None,
                  error: type[UnsafePath]) -> None:
    said = problem(os.fstat(dfd)) if problem is not None else None
    if said:
        raise error(f"{name} {said}")


def open_folder(path: Path | str, *, make: bool = False, error: type[UnsafePath] = UnsafePath,
                folder_problem: Callable[[os.stat_result], str | None] | None = None) -> int:
    """A descriptor (``O_DIRECTORY``) of the folder ``path``, walked as :func:`open_regular` walks (only root's links
    and this user's followed, the folder itself too); ``make``: missing folders made 0755 on the way;
    ``folder_problem`` asked of every folder passed through. ``error`` (an :class:`UnsafePath`) or
    ``FileNotFoundError``; the caller closes it."""
    dfd, name, _ = _walk(path, make=make, error=error, folder_problem=folder_problem)
    if name is None:
        return dfd
    try:
        try:
            nfd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise error(f"{path} is not a folder (or became a link)") from None
            raise
    finally:
        os.close(dfd)
    try:
        _check_folder(nfd, name, folder_problem, error)
    except BaseException:
        os.close(nfd)
        raise
    return nfd


def open_regular(path: Path | str):
    """``path`` opened to read (binary) only once it is checked, for a file someone else may control (a job's
    output, the SDK's event file in the job's folder). It is walked from ``/`` one name at a time, each folder
    opened ``O_NOFOLLOW`` (one swapped for a link meanwhile is refused). A link is followed only when root or
    this user made it: one of anybody else's is refused, wherever on the path it is. The file itself is
    ``lstat``-ed before it is opened (a FIFO, a device such as ``/dev/watchdog``, a socket is never opened:
    opening one can block, or act), opened ``O_NOFOLLOW|O_NONBLOCK`` and ``fstat``-ed again.
    ``FileNotFoundError`` when it is not there, :class:`NotRegularFile` (with the reason) when it may not be read."""
    dfd, name, st = _walk(path)
    try:
        if name is None:
            raise NotRegularFile(f"{path} is a folder, not a regular file")
        return _open_checked(dfd, name, st, path)
    finally:
        os.close(dfd)


ANYONE = -1
"""In :func:`others_who_change`'s answer: every local user."""


def others_who_change(folder: Path | str) -> frozenset[int]:
    """Who, besides root and this user, can change what ``folder`` holds, and so can plant what chaoskit reads
    there and read what it writes there: the owner of a folder on its path (``folder`` too) that is not root's or
    this user's, and :data:`ANYONE` when ``folder`` can be written by others (with the sticky bit too: they can
    still add files) or a folder above it can without the sticky bit. Empty when nobody else can. The path is
    walked as :func:`open_folder` walks it (:class:`UnsafePath`, ``FileNotFoundError``)."""
    seen: list[os.stat_result] = []
    os.close(open_folder(folder, folder_problem=lambda st: seen.append(st)))
    others: set[int] = set()
    for i, st in enumerate(seen):
        if st.st_uid not in (0, os.geteuid()):
            others.add(st.st_uid)
        if st.st_mode & 0o022 and (i == len(seen) - 1 or not st.st_mode & stat.S_ISVTX):
            others.add(ANYONE)
    return frozenset(others)


def open_shown(path: Path | str, readers: frozenset[int] = frozenset()):
    """``path`` opened as :func:`open_regular` opens it (a regular file, no link of another user's followed), for
    content chaoskit copies into a file that ``readers`` (:func:`others_who_change` of that file's folder) can
    read: then it must be a file each of them could read themselves, by its mode (readable by all, or their own,
    or their group's) and every folder on its way (they may pass through it), so root never copies a file only
    root may read (``/etc/shadow`` linked in, a root ``0600`` file renamed, a file in a root ``0700`` folder that
    a path of theirs names) where they read it. :class:`UnsafePath` (with the reason) otherwise;
    ``FileNotFoundError``."""
    folders: list[os.stat_result] = []
    dfd, name, st = _walk(path, folder_problem=lambda fst: folders.append(fst))
    try:
        if name is None:
            raise NotRegularFile(f"{path} is a folder, not a regular file")
        fh = _open_checked(dfd, name, st, path)
    finally:
        os.close(dfd)
    st = os.fstat(fh.fileno())
    shut = [uid for uid in readers if not _may(st, uid, 0o444) or not all(_may(f, uid, 0o111) for f in folders)]
    if shut:
        fh.close()
        who = "every local user" if ANYONE in shut else "uid " + ", ".join(str(u) for u in sorted(shut))
        raise UnsafePath(f"{path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) is not one {who} could "
                         "read, who can read what chaoskit writes from it; chaoskit never copies it there")
    return fh


def _may(st: os.stat_result, uid: int, bits: int) -> bool:
    """Whether ``uid`` (:data:`ANYONE`: every user) has ``bits`` (``0o444`` read, ``0o111`` search) on a file of
    ``st`` by its mode, as the kernel decides for a user who is not root (ACLs aside)."""
    if uid == ANYONE:
        return bool(st.st_mode & bits & 0o007)
    if st.st_uid == uid:
        return bool(st.st_mode & bits & 0o700)
    try:
        user = pwd.getpwuid(uid)
        in_group = st.st_gid in os.getgrouplist(user.pw_name, user.pw_gid)
    except KeyError:
        in_group = False
    return bool(st.st_mode & bits & (0o070 if in_group else 0o007))


def open_inside(folder: Path | str, relative: str, owners: tuple[int, ...] = ()):
    """``relative`` (no ``..``, not absolute) opened to read (binary) inside ``folder`` (a job's own folder, which
    its user fills), following no link at all below ``folder``: each name is opened ``O_NOFOLLOW`` from the
    descriptor of the one above, so a link the job's user planted (to ``/etc/shadow``, to another user's folder)
    is refused, never read. ``folder`` itself is reached as :func:`open_regular` reaches a file. The file must be
    regular and, with ``owners``, owned by one of them; one of another owner's (a hard link to a file only root may
    read) is refused, as is one with more than one name that is not the first owner's (a hard link the job's user
    made to a file of chaoskit's). ``FileNotFoundError`` or :class:`NotRegularFile`, as :func:`open_regular`."""
    parts = [p for p in str(relative).split("/") if p not in ("", ".")]
    if not parts or str(relative).startswith("/") or ".." in parts:
        raise NotRegularFile(f"{relative}: not a path inside {folder}; chaoskit reads only below the job's folder")
    dfd = open_folder(folder, error=NotRegularFile)
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotRegularFile(f"{folder}/{relative}: {part} is a link or not a folder; chaoskit follows "
                                         "no link in the job's folder") from None
                raise
            os.close(dfd)
            dfd = nfd
        st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise NotRegularFile(f"{folder}/{relative} is a link; chaoskit follows no link in the job's folder")
        fh = _open_checked(dfd, parts[-1], st, f"{folder}/{relative}")
    finally:
        os.close(dfd)
    st = os.fstat(fh.fileno())
    if owners and (st.st_uid not in owners or st.st_uid != owners[0] and st.st_nlink > 1):
        fh.close()
        raise NotRegularFile(f"{folder}/{relative} belongs to uid {st.st_uid}{' and has other names' if st.st_uid in owners else ''}, "
                             f"not to the job's user (uid {owners[0]}); chaoskit reads only the job's own files")
    return fh


def _open_checked(dfd: int, name: str, st: Any, path: Path | str):
    """``name`` in ``dfd`` (``st``: its ``lstat``) opened to read once it is a regular file, never through a link."""
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise NotRegularFile(f"{path} is a folder, not a regular file")
        raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file; chaoskit reads regular "
                             "files only and never opens it")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(f"{path} became a link; chaoskit never reads through one") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file")
    return os.fdopen(fd, "rb")


def write_new(path: Path | str, data: str | bytes, *, replace: bool = False, make_folders: bool = False,
              mode: int = 0o644) -> Path:
    """Write ``path`` (a report, a starter file) without following a link: its folder is reached as
    :func:`open_folder` reaches one (a link of anybody's but root's and this user's is refused), and the file is
    made ``O_CREAT|O_EXCL|O_NOFOLLOW`` from that folder's descriptor. ``replace``: the data goes to a fresh random
    name made so beside it, renamed over ``path`` from the same descriptor, so a link planted at ``path`` is
    replaced, never written through, and a reader sees the old file or the new one. The folder may be one that
    others can write: nothing here is opened by name there. ``FileExistsError`` when ``path`` exists (a link too)
    and not ``replace``; :class:`UnsafePath` when its folder may not be reached; ``make_folders``: missing folders
    are made (0755). Returns ``path``."""
    path = Path(path)
    body = data.encode("utf-8") if isinstance(data, str) else data
    dfd = open_folder(path.parent, make=make_folders)
    try:
        name = f".{path.name[:64]}.{secrets.token_hex(8)}.tmp" if replace else path.name
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
            if replace:
                os.replace(name, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            if replace:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
    return path


def copy_regular(src: Path, dst: Path, limit: int = 1 << 30) -> bool:
    """Copy ``src`` (a file someone else may control, read by :func:`open_regular`) to a new ``dst`` of ours
    (``O_EXCL``, never through a link), at most ``limit`` bytes; ``False`` when ``src`` is not there or is not a
    regular file."""
    try:
        fh = open_regular(src)
    except (FileNotFoundError, NotRegularFile):
        return False
    with fh:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        with os.fdopen(fd, "wb") as out:
            left = limit
            while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
    return True


def make_folder_for(path: Path, uid: int, gid: int, dirs: tuple[str, ...] = (), files: tuple[str, ...] = ()) -> Path:
    """A new folder ``path`` (``mkdir``: it fails where anything, a link too, has the name) for a job that runs as
    another user, with ``dirs`` and empty ``files`` in it, all given to ``uid``/``gid`` (mode 0700 / 0600), the
    folder itself last: until then only this process can write in it. Its parent is reached as :func:`open_folder`
    reaches one (missing folders made 0755; a link of anybody's but root's and this user's refused) and the
    folder made from the parent's descriptor; the parent must be ours, not writable by others (as a run folder's
    is). :class:`ScenarioError` when the name is taken or the parent may not be reached."""
    path = Path(path)
    try:
        pfd = open_folder(path.parent, make=True)
    except UnsafePath as exc:
        raise ScenarioError(f"the job's folder {path} was not made: {exc}; nothing was started") from None
    try:
        try:
            os.mkdir(path.name, 0o700, dir_fd=pfd)
        except FileExistsError:
            raise ScenarioError(f"{path} already exists: the job's own folder is made new for each run; nothing was "
                                "started") from None
        dfd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        for name in dirs:
            os.mkdir(name, 0o700, dir_fd=dfd)
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        for name in files:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            os.fchown(fd, uid, gid)
            os.close(fd)
        os.fchown(dfd, uid, gid)
    finally:
        os.close(dfd)
    return path
