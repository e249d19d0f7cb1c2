"""The files a run and a game day leave behind, by name, and the readers that every layer shares.

A run folder holds ``result.json``, ``events.jsonl``, ``journal.jsonl``,
``logs/`` and ``report.html``; a game-day folder holds ``gameday.json``, one run
folder per scenario and ``index.html``, and its parent keeps ``history.jsonl``.
The report is rendered from these files alone.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from chaoskit.core.errors import ScenarioError

__all__ = [
    "RESULT_FILE", "EVENTS_FILE", "JOURNAL_FILE", "RUN_REPORT",
    "GAMEDAY_FILE", "GAMEDAY_REPORT", "HISTORY_FILE", "load_gameday", "read_history",
    "utc_stamp", "utc_iso", "parse_utc_iso", "empty_out_dir", "make_run_dir", "open_append", "open_regular", "NotRegularFile",
    "file_kind", "copy_regular", "make_folder_for", "TORCH_CACHE_VAR", "torch_cache_env",
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


def load_gameday(path: Path) -> dict[str, Any]:
    """Read ``gameday.json`` from a game-day folder."""
    return json.loads((Path(path) / GAMEDAY_FILE).read_text(encoding="utf-8"))


def read_history(path: Path, until: str | None = None) -> list[dict[str, Any]]:
    """Entries of a ``history.jsonl`` (bad lines skipped), oldest first; only those
    that started at or before ``until`` (an ISO time) when given."""
    if not Path(path).is_file():
        return []
    entries = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
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
    """Make ``out`` (a ``--out`` folder), refusing one that already holds files with a :class:`ScenarioError`."""
    if out.exists() and any(out.iterdir()):
        raise ScenarioError(f"--out {out} already holds files; a {what} needs an empty folder",
                            hint="pick another --out, or remove that folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def make_run_dir(path: Path, mode: int, default: bool) -> Path:
    """The run folder, made now: ``path`` with ``mkdir`` (which fails where anything, a link too, has the name), or,
    for a ``default`` name someone took first, the same name with a random suffix. The operator's own ``--out`` may
    be a folder that exists: then it must be a folder (not a link) of this user's that nobody else can write. Either
    way its parent must be this user's or root's, and not one that others can write without the sticky bit (they
    could swap the run folder for a link after it is made). :class:`ScenarioError` otherwise: nothing was injected."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pst = os.stat(path.parent)
    if pst.st_uid not in (os.geteuid(), 0):
        raise ScenarioError(f"the run folder's parent {path.parent} belongs to uid {pst.st_uid}, who could swap the run "
                            "folder for a link; choose another --out")
    if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
        raise ScenarioError(f"the run folder's parent {path.parent} can be written by anyone (mode "
                            f"{stat.S_IMODE(pst.st_mode):04o}, no sticky bit): someone could swap the run folder for a "
                            "link; choose another --out")
    candidate = path
    for _ in range(16):
        try:
            os.mkdir(candidate, mode)
            break
        except FileExistsError:
            if not default:
                break  # the operator's own folder: checked below
            candidate = path.with_name(f"{path.name}-{secrets.token_hex(3)}")
    st = os.lstat(candidate)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"run folder {candidate} is {'a link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; "
                            "chaoskit writes a run only into a folder of its own")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ScenarioError(f"run folder {candidate} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}): "
                            "others could plant links in it; choose another --out")
    return candidate


def open_append(path: Path, mode: int = 0o640):
    """``path`` opened to append text, made if absent, never through a link (``O_NOFOLLOW``)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "a", encoding="utf-8")


class NotRegularFile(OSError):
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


def open_regular(path: Path | str):
    """``path`` opened to read (binary) only once it is checked, for a file someone else may control (a job's
    output, the SDK's event file in the job's folder). It is walked from ``/`` one name at a time, each folder
    opened ``O_NOFOLLOW`` (one swapped for a link meanwhile is refused). A link is followed only when root or
    this user made it: one of anybody else's is refused, wherever on the path it is. The file itself is
    ``lstat``-ed before it is opened (a FIFO, a device such as ``/dev/watchdog``, a socket is never opened:
    opening one can block, or act), opened ``O_NOFOLLOW|O_NONBLOCK`` and ``fstat``-ed again.
    ``FileNotFoundError`` when it is not there, :class:`NotRegularFile` (with the reason) when it may not be read."""
    trusted = (0, os.geteuid())
    parts = [p for p in os.path.abspath(path).split("/") if p]
    links = 0
    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in trusted:
                    raise NotRegularFile(f"{path}: {part} is a link of uid {st.st_uid}'s; chaoskit follows only "
                                         "root's and its own")
                links += 1
                if links > MAX_LINKS:
                    raise NotRegularFile(f"{path}: more than {MAX_LINKS} links")
                target = os.readlink(part, dir_fd=dfd)
                if target.startswith("/"):
                    os.close(dfd)
                    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                parts = [p for p in target.split("/") if p] + parts
                continue
            if not parts:
                break
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotRegularFile(f"{path}: {part} on its way is not a folder (or became a link)") from None
                raise
            os.close(dfd)
            dfd = nfd
        else:
            raise NotRegularFile(f"{path} is a folder, not a regular file")
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file; chaoskit reads regular "
                                 "files only and never opens it")
        try:
            fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotRegularFile(f"{path} became a link; chaoskit never reads through one") from None
            raise
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file")
    return os.fdopen(fd, "rb")


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
    folder itself last: until then only this process can write in it. Its parent must be ours, not writable by
    others (as a run folder's is). :class:`ScenarioError` when the name is taken."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise ScenarioError(f"{path} already exists: the job's own folder is made new for each run; nothing was "
                            "started") from None
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
