"""Files that chaoskit reads, runs or writes as root on an author's word: each opened once, checked on what was
opened, and used as that (issue 48).

An inventory or scenario names a program (``cluster.slurm.bin``, a node's ``power:`` commands, a ``launch: command``
script) or a file (``cluster.slurm.conf``, ``ssh.config``, ``ssh.known_hosts``, a compose file, a batch script).
Checking a path and then using it again by name lets its author swap a link between the two: root then uses the
author's file. So :func:`open_checked` walks the path from ``/`` one name at a time (each folder opened
``O_NOFOLLOW`` and ``fstat``-ed, a link read once and followed from where it was), opens the file itself without
following a link and checks *that* descriptor; the caller then reads the bytes (:meth:`CheckedFile.read`), runs the
program (:meth:`CheckedFile.exec_path` with ``pass_fds``) or appends (``append=True``) through it, never the name.

``root_only``: the rule for what root runs or reads as a system file: a regular file that root owns and that neither
its group nor others can write, in a folder (and every folder above it, links resolved) with the same properties
(writable by others only with the sticky bit): what the system's packages install, or what the site's admin put
there. :func:`untrusted_file` and :func:`untrusted_program` say why a path fails it, for validation's early error
(advice only: the use checks again, on what it uses). Stdlib only.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

from chaoskit.core.errors import ScenarioError
from chaoskit.core.files import file_kind

__all__ = ["CheckedFile", "UntrustedFile", "open_checked", "read_authors_file", "open_program", "untrusted_file", "untrusted_program",
           "under"]

MAX_LINKS = 40
"""Links one path may pass through (the kernel's own limit for a path, ``ELOOP``)."""


class UntrustedFile(OSError):
    """A path :func:`open_checked` refused, the reason in its message (its ``strerror``); nothing was read or run."""

    def __init__(self, message: str, err: int = errno.EPERM) -> None:
        super().__init__(err, message)

    def __str__(self) -> str:
        return str(self.strerror)


class CheckedFile:
    """One opened, checked file: ``fd`` (closed with the object), ``path`` as it was named, ``real`` where the
    opened file was when it was opened (links resolved along the walk), ``st`` its ``fstat``."""

    def __init__(self, fd: int, path: str, real: str, st: os.stat_result, root_only: bool = False) -> None:
        self.fd, self.path, self.real, self.st = fd, path, real, st
        self.root_only = root_only
        """Checked as root's alone, with every folder of ``real`` root's and writable by nobody else."""

    def read(self, limit: int = 1 << 20) -> bytes:
        """The file's first ``limit`` bytes, from its start, through the checked descriptor."""
        chunks, offset = [], 0
        while offset < limit:
            chunk = os.pread(self.fd, min(limit - offset, 1 << 16), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def exec_path(self) -> str:
        """What to ``exec`` to run this very file. Checked ``root_only``: its real path (links resolved), which
        nobody but root can change (every folder of it is root's, writable by nobody else), so a program that
        finds its siblings from its ``$0`` works as it does when an admin runs it. Otherwise ``/proc/self/fd/N``:
        the child needs the descriptor open, so pass ``pass_fds=(self.fd,)`` (a ``#!`` script's interpreter opens
        that path itself)."""
        return self.real if self.root_only else f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "CheckedFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checked(path: str | os.PathLike[str], *, root_only: bool = False, append: bool = False,
                 roots: list[str] | None = None, what: str = "") -> CheckedFile:
    """``path`` opened once, checked on the descriptor, for the caller to use through it (see the module).

    Every folder on the way is opened ``O_NOFOLLOW`` from the one before (a name swapped for a link meanwhile is
    refused); a link is read once and followed from its own folder. The file is ``lstat``-ed before it is opened (a
    FIFO, a device, a socket is never opened) and ``fstat``-ed once opened: it must be a regular file.
    ``roots``: the file, where it really is, must lie inside one of these folders. ``root_only``: the rule of the
    module. ``append``: open to append (``O_CREAT``, mode 0600; the last name never followed), a file of the
    effective user's only; its folder must exist. ``what`` names the file in messages (``known_hosts``).
    :class:`UntrustedFile` with the reason when refused; ``FileNotFoundError`` when it is not there."""
    name = os.fspath(path)
    label = f"{what} {name}".strip()
    stack = _walk(name, label, follow_last=not append)
    try:
        folders, last = stack
        dfd = folders[-1][0]
        real = "/".join(n for _, _, n in folders[1:])
        real = f"/{real}/{last}" if real else f"/{last}"
        if roots is not None and not under(real, roots):
            raise UntrustedFile(f"{label} is outside the allowed roots ({', '.join(roots)})")
        if append:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(last, flags, 0o600, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise UntrustedFile(f"{label} is a link (or not a regular file); chaoskit never writes through "
                                        "one") from None
                raise
        else:
            try:
                lst = os.stat(last, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name) from None
            if not stat.S_ISREG(lst.st_mode):
                raise UntrustedFile(f"{label} is not a regular file ({file_kind(lst.st_mode)}); chaoskit never opens it")
            fd = _open_at(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dfd, label)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedFile(f"{label} is not a regular file ({file_kind(st.st_mode)})")
            if append and st.st_uid != os.geteuid():
                raise UntrustedFile(f"{label} belongs to uid {st.st_uid}, not to the user chaoskit runs as; it is "
                                    "not written")
            if root_only:
                _root_only(name, real, st, folders)
        except BaseException:
            os.close(fd)
            raise
        return CheckedFile(fd, name, real, st, root_only=root_only)
    finally:
        for fd_, _, _ in stack[0]:
            os.close(fd_)


def open_program(program: str) -> CheckedFile:
    """``program`` (a path, or a name looked up in ``PATH`` once) opened by :func:`open_checked` with ``root_only``:
    run it as ``[checked.exec_path(), ...]`` with ``pass_fds=(checked.fd,)``. ``FileNotFoundError`` when it is not
    there, :class:`UntrustedFile` when someone other than root could change it."""
    found = program if "/" in program else shutil.which(program)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"{program}: not found in PATH")
    return open_checked(found, root_only=True)


def untrusted_file(path: str) -> str | None:
    """Why ``path`` (links resolved) is not a file only root can change, or ``None`` (advice: see the module)."""
    try:
        open_checked(path, root_only=True).close()
    except OSError as exc:
        return str(exc) if isinstance(exc, UntrustedFile) else f"{path}: {exc.strerror}"
    return None


def untrusted_program(program: str) -> str | None:
    """Why ``program`` (a path, or a name looked up in PATH) is not a program only root can change, or ``None``."""
    found = program if "/" in program else shutil.which(program)
    if found is None:
        return f"{program}: not found in PATH"
    return untrusted_file(found)


def under(real: str, roots: list[str]) -> bool:
    """Whether the path ``real`` (already where the file really is) lies inside one of ``roots`` (their links
    resolved)."""
    for root in roots:
        r = os.path.realpath(root).rstrip("/")
        if real == (r or "/") or real.startswith(r + "/"):
            return True
    return False


def _walk(name: str, label: str, follow_last: bool) -> tuple[list[tuple[int, os.stat_result, str]], str]:
    """The opened folders from ``/`` to the one holding ``name``'s last part, each ``(fd, fstat, its name)``, and
    that last part. The caller closes the fds."""
    parts = [p for p in os.path.abspath(name).split("/") if p]
    if not parts:
        raise UntrustedFile(f"{label} is a folder, not a regular file")
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    folders = [(root, os.fstat(root), "")]
    links = 0
    try:
        while True:
            part = parts.pop(0)
            if part == "." or part == "..":
                if part == ".." and len(folders) > 1:
                    os.close(folders.pop()[0])
                if not parts:
                    raise UntrustedFile(f"{label} is a folder, not a regular file")
                continue
            dfd = folders[-1][0]
            if parts or follow_last:
                try:
                    st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name) from None
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_LINKS:
                        raise UntrustedFile(f"{label}: more than {MAX_LINKS} links", errno.ELOOP)
                    try:
                        target = os.readlink(part, dir_fd=dfd)
                    except OSError:
                        raise UntrustedFile(f"{label}: {part} changed while it was read") from None
                    if target.startswith("/"):
                        while len(folders) > 1:
                            os.close(folders.pop()[0])
                    parts = [p for p in target.split("/") if p] + parts
                    if not parts:
                        raise UntrustedFile(f"{label} is a folder, not a regular file")
                    continue
            if not parts:
                return folders, part
            nfd = _open_at(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dfd, label)
            folders.append((nfd, os.fstat(nfd), part))
    except BaseException:
        for fd, _, _ in folders:
            os.close(fd)
        raise


def _open_at(part: str, flags: int, dfd: int, label: str, mode: int = 0o600) -> int:
    try:
        return os.open(part, flags, mode, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            raise UntrustedFile(f"{label}: {part} on its way is not what it was when checked (a link, or not a "
                                "folder); chaoskit never opens through one") from None
        raise


def _root_only(name: str, real: str, st: os.stat_result, folders: list[tuple[int, os.stat_result, str]]) -> None:
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise UntrustedFile(f"{name} ({real}) can be changed by someone other than root (uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}); chaoskit runs and reads as root only what root alone "
                            "can change")
    for i in range(len(folders) - 1, -1, -1):
        fst = folders[i][1]
        if fst.st_uid != 0 or (fst.st_mode & 0o022 and not fst.st_mode & stat.S_ISVTX):
            folder = "/" + "/".join(n for _, _, n in folders[1:i + 1])
            raise UntrustedFile(f"{name}: its folder {folder} can be changed by someone other than root (uid "
                                f"{fst.st_uid}, mode {stat.S_IMODE(fst.st_mode):04o}), who could replace it")


def read_authors_file(path, *, roots, field: str, what: str, limit: int,
                      nothing: str) -> tuple[bytes, os.stat_result, str]:
    """An author's file (a ``launch: command`` script, a batch script), read once through the checked descriptor
    (:func:`open_checked`, inside ``roots`` when given), at most ``limit`` bytes: its bytes, its ``fstat`` and where
    it really is.
    :class:`~chaoskit.core.errors.ScenarioError` at ``field`` when it is missing, refused or too large, ending
    with ``nothing`` ("nothing was started")."""
    try:
        with open_checked(path, roots=roots, what=what) as checked:
            data, st, real = checked.read(limit + 1), checked.st, checked.real
    except FileNotFoundError:
        raise ScenarioError(f"{field}: no {what} {path}; {nothing}") from None
    except UntrustedFile as exc:
        raise ScenarioError(f"{field}: {exc}; {nothing}") from None
    if len(data) > limit:
        raise ScenarioError(f"{field}: {path} is larger than {limit >> 20} MiB; {nothing}")
    return data, st, real
