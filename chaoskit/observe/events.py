"""The run's timeline: one thread-safe bus that every probe publishes into.

An event is a plain dict ``{"ts": float, "node": str, "rank": int|None,
"kind": str, ...}``; the bus appends each to ``events.jsonl`` (flushed per line)
and lets the runner wait for a condition on the timeline.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from chaoskit.core.event_kinds import EVENT_KINDS
from chaoskit.core.files import open_append, open_shown
from chaoskit.core.secrets import redact_value

__all__ = ["EventBus", "Event", "EVENT_KINDS", "make_event", "read_events"]

Event = dict[str, Any]

def make_event(kind: str, ts: float | None = None, **fields: Any) -> Event:
    return {"ts": time.time() if ts is None else ts, "kind": kind, **fields}


class EventBus:
    def __init__(self, path: Path | None = None) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._fh = open_append(Path(path)) if path else None  # never through a link planted at its name
        self.last_step: int | None = None
        self._listeners: list[Callable[[Event], None]] = []

    def publish(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            if event.get("kind") == "step" and isinstance(event.get("step"), int):
                self.last_step = event["step"]
            if self._fh:
                self._fh.write(json.dumps(redact_value(event), separators=(",", ":"), default=str) + "\n")
                self._fh.flush()
            self._cond.notify_all()
        for listener in self._listeners:
            listener(event)

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` (called under the bus lock) holds, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
            return True

    def snapshot(self) -> list[Event]:
        with self._cond:
            return sorted(self.events, key=lambda e: e["ts"])

    def close(self) -> None:
        with self._cond:
            if self._fh:
                self._fh.close()
                self._fh = None


def read_events(path: Path, readers: frozenset[int] = frozenset()) -> list[Event]:
    """The events of a run's ``events.jsonl`` by time: whatever a line holds, only an object with a finite ``ts``
    (and, where it has one, a whole-number ``step``) is an event; any other line (not JSON, invalid UTF-8, NaN) is
    passed over, so a report renders whatever the file holds. The file is opened as
    :func:`~chaoskit.core.files.open_shown` opens one for ``readers`` (a regular file, no link of another user's
    followed): ``FileNotFoundError``, :class:`~chaoskit.core.files.UnsafePath`."""
    with open_shown(path, readers) as fh:
        data = fh.read()
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, a number past int's digit limit, too deep
            continue
        if not isinstance(event, dict):
            continue
        ts, step = event.get("ts"), event.get("step")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            continue
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            continue
        out.append(event)
    return sorted(out, key=lambda e: e["ts"])


def sort_events(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=lambda e: e["ts"])
