"""Probes: sources of events on the run's timeline.

- :class:`SdkLogProbe` tails the JSONL file the SDK writes from inside the job;
- :class:`LogRegexProbe` maps lines of a job's output to events (torchrun's own
  failure lines built in, more from the scenario);
- :class:`FileLogProbe` tails a log file on this machine, :class:`RemoteLogProbe`
  one on a node, read there by the node's agent;
- :class:`ProcessWatcher` sees training workers appear and vanish in the
  process table of each node.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from chaoskit.cluster.clock import ClockedTransport
from chaoskit.cluster.transports.api import FileFollower
from chaoskit.core.errors import InfraError
from chaoskit.observe.events import EventBus, make_event

__all__ = ["SdkLogProbe", "LogRegexProbe", "LogRule", "ProcessWatcher", "FileLogProbe", "RemoteLogProbe", "TORCHRUN_RULES"]


@dataclass(frozen=True)
class LogRule:
    pattern: re.Pattern[str]
    event: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, match: str, event: str, fields: dict[str, Any] | None = None) -> "LogRule":
        return cls(re.compile(match), event, tuple((fields or {}).items()))


TORCHRUN_RULES = (
    # torch/distributed/elastic/multiprocessing/api.py, as the agent reports a dead worker:
    # "failed (exitcode: -9) local_rank: 0 (pid: 2368) of binary: ..."
    LogRule.of(
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)",
        "worker.exit",
        {"source": "torchrun", "who": "torchrun agent"},
    ),
)


def _coerce(value: str | None) -> Any:
    if value is None:
        return None
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return value


class LogRegexProbe:
    """Turn log lines into events. Feed it lines as they arrive (``feed``) or tail files."""

    def __init__(self, bus: EventBus, rules: Iterable[LogRule]) -> None:
        self.bus = bus
        self.rules = list(rules)

    def feed(self, node: str, line: str, ts: float | None = None, *, uncertainty: float | None = None) -> None:
        """One line of ``node``'s output, seen at ``ts`` (now by default); ``uncertainty``: how far ``ts`` may be
        off, when it was read on another machine's clock and corrected by a measured offset."""
        ts = time.time() if ts is None else ts
        for rule in self.rules:
            m = rule.pattern.search(line)
            if m:
                fields = {k: _coerce(v) for k, v in m.groupdict().items() if v is not None}
                event = make_event(rule.event, ts, node=node, source=fields.pop("source", "log"))
                if uncertainty:
                    event["ts_uncertainty"] = round(uncertainty, 6)
                event.update(dict(rule.fields))
                event.update(fields)
                self.bus.publish(event)


class _Tailer(threading.Thread):
    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(daemon=True, name=f"chaoskit-tail-{path.name}")
        self.path, self.interval = path, interval
        self.stop_event = threading.Event()

    def lines(self):
        pos, buf = 0, b""
        while not self.stop_event.is_set():
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                pos += len(chunk)
                buf += chunk
                *complete, buf = buf.split(b"\n")
                for raw in complete:
                    yield raw.decode(errors="replace")
            else:
                self.stop_event.wait(self.interval)
        # drain what is left after stop
        try:
            with open(self.path, "rb") as fh:
                fh.seek(pos)
                for raw in (buf + fh.read()).split(b"\n"):
                    if raw:
                        yield raw.decode(errors="replace")
        except FileNotFoundError:
            pass

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)


class SdkLogProbe(_Tailer):
    """Tail the SDK's event file; every line is already an event."""

    def __init__(self, bus: EventBus, path: Path, interval: float = 0.01) -> None:
        super().__init__(Path(path), interval)
        self.bus = bus

    def run(self) -> None:
        for line in self.lines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and isinstance(event.get("ts"), (int, float)) and "kind" in event:
                event.setdefault("source", "sdk")
                self.bus.publish(event)


class FileLogProbe(_Tailer):
    """Tail a job's log file (for jobs chaoskit did not start) through a :class:`LogRegexProbe`."""

    def __init__(self, probe: LogRegexProbe, node: str, path: Path, interval: float = 0.01) -> None:
        super().__init__(Path(path), interval)
        self.probe, self.node = probe, node

    def run(self) -> None:
        for line in self.lines():
            self.probe.feed(self.node, line)


class RemoteLogProbe(threading.Thread):
    """Follow a log file on a node through its agent (:class:`FileFollower`); each line goes through a
    :class:`LogRegexProbe` with the time the node read it, on the controller's clock.

    When the connection drops, a new stream starts where the last delivered batch ended, so
    no line is lost or counted twice; rotation and truncation are the agent's to follow."""

    def __init__(self, probe: LogRegexProbe, node: str, transport: FileFollower, path: str,
                 retry_s: float = 0.5) -> None:
        super().__init__(daemon=True, name=f"chaoskit-follow-{node}")
        self.probe, self.node, self.transport, self.path, self.retry_s = probe, node, transport, path, retry_s
        self.inode: int | None = None
        self.offset = 0
        self.lines = 0
        self.streams = 0
        """Streams started: more than one means the probe resumed after a dropped connection."""
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                stream = self.transport.follow(self.path, self._batch, inode=self.inode, offset=self.offset)
            except InfraError as exc:
                self._note(exc.message)
                self.stop_event.wait(self.retry_s)
                continue
            self.streams += 1
            while not stream.done.wait(0.05):
                if self.stop_event.is_set():
                    stream.cancel()
                    stream.done.wait(2.0)
                    return
            if stream.error:
                self._note(stream.error)
            self.stop_event.wait(self.retry_s)

    def _note(self, message: str) -> None:
        if not self.errors or self.errors[-1] != message:
            self.errors.append(message)

    def _batch(self, lines: list[tuple[float, str]], inode: int | None, offset: int) -> None:
        clock = self.transport.clock if isinstance(self.transport, ClockedTransport) else None
        uncertainty = clock.error_s if clock is not None else None
        with self._lock:
            for ts, text in lines:
                self.probe.feed(self.node, text, ts, uncertainty=uncertainty)
            self.lines += len(lines)
            self.inode, self.offset = inode, offset

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


class ProcessWatcher(threading.Thread):
    """Poll each node's process table; publish ``process.gone`` when a worker vanishes."""

    def __init__(self, bus: EventBus, transports: dict[str, Any], interval: float = 0.05) -> None:
        super().__init__(daemon=True, name="chaoskit-procwatch")
        self.bus, self.transports, self.interval = bus, transports, interval
        self.stop_event = threading.Event()
        self.seen: dict[tuple[str, int], int | None] = {}

    def run(self) -> None:
        while not self.stop_event.is_set():
            now: dict[tuple[str, int], int | None] = {}
            for node, transport in self.transports.items():
                try:
                    procs = transport.processes(workers_only=True)
                except Exception:  # noqa: BLE001 - an unreachable node (powered off, NIC down) has no workers we can see
                    procs = []
                for proc in procs:
                    if proc.is_worker and proc.state != "Z":
                        now[(node, proc.pid)] = proc.rank
            ts = time.time()
            for key, rank in self.seen.items():
                if key not in now:
                    self.bus.publish(make_event("process.gone", ts, node=key[0], rank=rank, pid=key[1], source="procwatch"))
            self.seen = now
            self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)

