"""The controller's one reader of this machine's ``/proc``: which processes there are, and each one's command line,
owner, environment and ``stat`` fields, read one way everywhere. A process that ends between the scan and the read
is not an error: its reader answers None and a scan skips it.

The programs chaoskit runs on a node have their own, :mod:`chaoskit.nodeside.procstat` (standard library only,
bundled in front of them): ``core`` and ``nodeside`` are independent layers of the import contract (pyproject.toml),
so neither may import the other, and the controller's modules (``core/accounts.py`` among them) read through this
one. Both read ``stat`` by the same rule, the command name (field 2) skipped up to its last ``)`` (a name may hold
spaces and parentheses of its own); tests/test_procs.py holds them to the same answers.
"""

from __future__ import annotations

import os

__all__ = ["pids", "cmdline", "owner", "environ", "stat_fields", "name", "state", "start_time"]


def pids() -> list[int]:
    """The pid of every process on this machine, as ``/proc`` lists them (a process may be gone by the time it is
    read)."""
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]


def _read(pid: int, what: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as fh:
            return fh.read()
    except OSError:
        return None


def cmdline(pid: int) -> bytes | None:
    """``/proc/PID/cmdline`` as it is (the arguments, each ended by NUL), or None when it cannot be read."""
    return _read(pid, "cmdline")


def environ(pid: int) -> bytes | None:
    """``/proc/PID/environ`` as it is (``KEY=value`` items, NUL between), or None when it cannot be read (gone,
    or another user's)."""
    return _read(pid, "environ")


def owner(pid: int) -> int | None:
    """The uid that owns ``/proc/PID`` (the process's real user), or None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    raw = _read(pid, "stat")
    if raw is None:
        return None
    close = raw.rfind(b")")
    return raw[raw.find(b"(") + 1:close], raw[close + 2:].split()


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name, as bytes (``[0]`` the state, ``[1]`` the parent's
    pid, ``[19]`` the start time), or None when it cannot be read."""
    read = _stat(pid)
    return read[1] if read is not None else None


def name(pid: int) -> str | None:
    """The command name of ``pid`` (``stat``'s field 2, at most 15 bytes: what ``ps -o comm`` shows), or None."""
    read = _stat(pid)
    return read[0].decode(errors="replace") if read is not None else None


def state(pid: int) -> str | None:
    """The state letter of ``pid`` (``"R"``, ``"S"``, ``"Z"`` for a zombie, ...), or None when it cannot be read."""
    fields = stat_fields(pid)
    return fields[0].decode("ascii", "replace") if fields else None


def start_time(pid: int) -> bytes | None:
    """When ``pid`` started, in clock ticks after boot (field 22, as bytes), or None: with the pid it names one
    process, where the pid alone may since name another."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None
