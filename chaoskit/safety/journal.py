"""The run journal: what was armed, injected and reverted, durable before acting.

Each record is one JSON line, appended and fsynced before the action it
describes, so a crashed run can be rolled back from the journal alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Journal", "read_journal", "unreverted"]


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, action: str, **fields: Any) -> dict[str, Any]:
        entry = {"ts": time.time(), "action": action, **fields}
        os.write(self._fd, (json.dumps(entry, default=str) + "\n").encode())
        os.fsync(self._fd)
        return entry

    def close(self) -> None:
        os.close(self._fd)


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
