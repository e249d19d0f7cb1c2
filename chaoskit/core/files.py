"""The files a run and a game day leave behind, by name, and the readers that every layer shares.

A run folder holds ``result.json``, ``events.jsonl``, ``journal.jsonl``,
``logs/`` and ``report.html``; a game-day folder holds ``gameday.json``, one run
folder per scenario and ``index.html``, and its parent keeps ``history.jsonl``.
The report is rendered from these files alone.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from chaoskit.core.errors import ScenarioError

__all__ = [
    "RESULT_FILE", "EVENTS_FILE", "JOURNAL_FILE", "RUN_REPORT",
    "GAMEDAY_FILE", "GAMEDAY_REPORT", "HISTORY_FILE", "load_gameday", "read_history",
    "utc_stamp", "utc_iso", "empty_out_dir",
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
