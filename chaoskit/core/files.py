"""The files a run and a game day leave behind, by name, and the readers that every layer shares.

A run folder holds ``result.json``, ``events.jsonl``, ``journal.jsonl``,
``logs/`` and ``report.html``; a game-day folder holds ``gameday.json``, one run
folder per scenario and ``index.html``, and its parent keeps ``history.jsonl``.
The report is rendered from these files alone.
"""

from __future__ import annotations

import datetime as _dt
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
    "utc_stamp", "utc_iso", "empty_out_dir", "make_run_dir", "open_append",
]

RESULT_FILE = "result.json"
EVENTS_FILE = "events.jsonl"
JOURNAL_FILE = "journal.jsonl"
RUN_REPORT = "report.html"
GAMEDAY_FILE = "gameday.json"
GAMEDAY_REPORT = "index.html"
HISTORY_FILE = "history.jsonl"


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
    way its parent may not be one that others can write without the sticky bit (they could swap the run folder for a
    link after it is made). :class:`ScenarioError` otherwise: nothing was injected."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pst = os.stat(path.parent)
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
