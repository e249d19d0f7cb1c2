"""The run journal: what was armed, injected and reverted, durable before acting.

Each record is one JSON line, appended and fsynced before the action it
describes, so a crashed run can be rolled back from the journal alone.

A run keeps two: the one ``chaoskit rollback`` trusts, 0600 in the run's 0700 folder of
chaoskit's state (:func:`~chaoskit.core.state.private_dir`), and a copy in the run folder
for people to read. Password-like arguments are redacted in both
(:mod:`chaoskit.core.secrets`); rollback rebuilds a revert that needs one from the inventory.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from chaoskit.core.secrets import redact_value

__all__ = ["Journal", "argv_digest", "read_journal", "unreverted"]


class Journal:
    """Append-only records at ``path`` (made 0600, never through a link), each also appended to ``copy``."""

    def __init__(self, path: Path, copy: Path | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o600)
        self._copy = None if copy is None else _open_copy(Path(copy), flags)
        self._lock = threading.Lock()

    def record(self, action: str, private: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        """Append one record (safe from several threads: a fault's fan-out arms its nodes at once). ``private``
        fields go to this journal only (0600, in chaoskit's 0700 state), never to the run folder's copy."""
        entry = redact_value({"ts": time.time(), "action": action, **fields})
        line = (json.dumps(entry, default=str) + "\n").encode()
        own = line if not private else (json.dumps({**entry, **private}, default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, own)
            os.fsync(self._fd)
            if self._copy is not None:
                os.write(self._copy, line)
        return entry

    def close(self) -> None:
        os.close(self._fd)
        if self._copy is not None:
            os.close(self._copy)


def argv_digest(argv: list[str]) -> str:
    """The SHA-256 of an argv as armed, before any redaction: what ``rollback`` compares a revert rebuilt from the
    inventory with (kept in the private journal only: it is of the command with its password)."""
    return hashlib.sha256(json.dumps([str(a) for a in argv]).encode()).hexdigest()


def _open_copy(path: Path, flags: int) -> int | None:
    """The run folder's copy, appended to only when it is a plain file of this user's (never through a link)."""
    try:
        fd = os.open(path, flags, 0o640)
    except OSError:
        return None  # a link planted there, a folder gone: the trusted journal is what counts
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_nlink != 1 or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


def read_journal(path: Path) -> list[dict[str, Any]]:
    entries = []
    for line in Path(path).read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a crash
    return entries


def unreverted(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Armed faults with no matching ``reverted`` record."""
    done = {e["fault_id"] for e in entries if e.get("action") == "reverted"}
    return [e for e in entries if e.get("action") == "armed" and e.get("fault_id") not in done]
