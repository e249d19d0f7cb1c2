"""Probes: sources of events on the run's timeline.

- :class:`SdkLogProbe` tails the JSONL file the SDK writes from inside the job;
- :class:`LogRegexProbe` maps lines of a job's output to events (torchrun's own
  failure lines built in, more from the scenario);
- :class:`FileLogProbe` tails a log file on this machine, :class:`RemoteLogProbe`
  one on a node, read there by the node's agent;
- :class:`ProcessWatcher` sees training workers appear and vanish on each node
  (pushed by the node's agent where it can stream, else polled per node), and a
  node that falls silent (``node.unreachable``).

What the job prints is untrusted and unbounded: lines are cut at
:data:`~chaoskit.core.limits.MAX_LINE_BYTES`, a captured digit group is a number only up to
:data:`~chaoskit.core.limits.MAX_NUMBER_DIGITS` digits, and a scenario's regex runs with a time
bound (the ``regex`` package's ``timeout``): a pattern that takes longer on a line is an error
(:attr:`LogRegexProbe.errors`), that line is skipped, and the reading goes on.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from chaoskit.cluster.clock import ClockedTransport
from chaoskit.cluster.transports.api import FileFollower, ProcessStreamer, StreamUnsupported, rank_processes
from chaoskit.core.errors import InfraError
from chaoskit.cluster.policy import under_roots
from chaoskit.core.files import NotRegularFile, open_inside, open_regular
from chaoskit.core.limits import MAX_LINE_BYTES, MAX_NUMBER_DIGITS, REGEX_TIMEOUT_S
from chaoskit.core.lines import LineCutter, strip_ansi
from chaoskit.core.threads import DaemonPool
from chaoskit.observe.events import EventBus, make_event
from chaoskit.observe.rules import LogRule

__all__ = ["SdkLogProbe", "LogRegexProbe", "ProcessWatcher", "FileLogProbe", "RemoteLogProbe", "TEE_PREFIX", "coerce_capture"]


NUMERIC_FIELDS = frozenset({"step", "rank", "local_rank", "pid", "exitcode", "restart_count", "world_size"})
"""Captured fields an event needs as numbers: a line whose capture is not one gives no event."""

_NUMBER = re.compile(r"-?[0-9]{1,%d}" % MAX_NUMBER_DIGITS)


def coerce_capture(value: str | None) -> Any:
    """A captured value: an int when it is at most MAX_NUMBER_DIGITS ASCII digits, else the text."""
    if value is None:
        return None
    if _NUMBER.fullmatch(value):
        return int(value)
    return value


TEE_PREFIX = re.compile(r"^\[(?:(rank)|[A-Za-z_][\w-]*?)(\d{1,6})\]:")
"""torchrun --tee / --role: ``[rank3]:`` (a global rank) or ``[default0]:`` (role and local rank) before a worker's line."""


class LogRegexProbe:
    """Turn log lines into events. Feed it lines as they arrive (``feed``) or tail files.

    Lines are matched without their ANSI colour codes. With ``tee_prefixes``, a torchrun ``--tee`` prefix is
    taken off the line first and gives its events their ``rank`` (or ``local_rank``). A ``ckpt.load.end`` that
    names no step takes the step of the node's (and rank's) last ``ckpt.load.start``: frameworks often print the
    checkpoint's path when a load begins and only "finished" when it ends."""

    def __init__(self, bus: EventBus, rules: Iterable[LogRule], timeout: float = REGEX_TIMEOUT_S,
                 tee_prefixes: bool = False) -> None:
        self.bus = bus
        self.rules = list(rules)
        for rule in self.rules:
            rule.pattern  # compiled here, before the run reads a line  # noqa: B018
        self.timeout = timeout
        self.tee_prefixes = tee_prefixes
        self._load_step: dict[tuple[str, Any], int] = {}
        self.errors: list[str] = []
        """Patterns that took longer than ``timeout`` on a line (once each): the run reports them."""

    def feed(self, node: str, line: str, ts: float | None = None, *, uncertainty: float | None = None) -> None:
        """One line of ``node``'s output, seen at ``ts`` (now by default); ``uncertainty``: how far ``ts`` may be
        off, when it was read on another machine's clock and corrected by a measured offset."""
        ts = time.time() if ts is None else ts
        line = strip_ansi(line[:MAX_LINE_BYTES])
        prefix: dict[str, int] = {}
        if self.tee_prefixes:
            m = TEE_PREFIX.match(line)
            if m:
                prefix = {"rank" if m.group(1) else "local_rank": int(m.group(2))}
                line = line[m.end():]
        for rule in self.rules:
            try:
                m = rule.pattern.search(line, timeout=self.timeout)
            except TimeoutError:
                self._slow(rule, node, line)
                continue
            if m:
                fields = {k: coerce_capture(v) for k, v in m.groupdict().items() if v is not None}
                if any(k in NUMERIC_FIELDS and not isinstance(v, int) for k, v in fields.items()):
                    continue  # e.g. a 10,000-digit "step": no event of that line
                event = make_event(rule.event, ts, node=node, source=fields.pop("source", "log"))
                if uncertainty:
                    event["ts_uncertainty"] = round(uncertainty, 6)
                event.update(prefix)
                event.update(dict(rule.fields))
                event.update(fields)
                self._carry_load_step(event)
                self.bus.publish(event)

    def _carry_load_step(self, event: dict[str, Any]) -> None:
        key = (event.get("node"), event.get("rank"))
        if event["kind"] == "ckpt.load.start" and isinstance(event.get("step"), int):
            self._load_step[key] = event["step"]
        elif event["kind"] == "ckpt.load.end" and "step" not in event and key in self._load_step:
            event["step"] = self._load_step[key]

    def _slow(self, rule: LogRule, node: str, line: str) -> None:
        message = (f"probes.log: the pattern {rule.pattern.pattern[:80]!r} took longer than {self.timeout:g}s on a "
                   f"line of {len(line)} characters from {node}; such lines give no {rule.event} event")
        if all(not e.startswith(f"probes.log: the pattern {rule.pattern.pattern[:80]!r}") for e in self.errors):
            self.errors.append(message)


class _Tailer(threading.Thread):
    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(daemon=True, name=f"chaoskit-tail-{path.name}")
        self.path, self.interval = path, interval
        self.stop_event = threading.Event()
        self.seen_refusal: str | None = None
        """Why the file was first not read (a FIFO, a device, another user's link: see
        :func:`~chaoskit.core.files.open_regular`): what the run's notes say."""

    CHUNK = 1 << 20

    def lines(self):
        """Every line of the file as it grows (cut at MAX_LINE_BYTES), read a MiB at a time; after ``stop``,
        what is left, the last line too. A file truncated in place (a requeued Slurm job's output, opened
        again with O_TRUNC) or replaced by a new one is read again from its start."""
        pos, inode, cutter = 0, None, LineCutter()
        while not self.stop_event.is_set():
            try:
                with self._open() as fh:
                    st = os.fstat(fh.fileno())
                    if st.st_ino != inode or st.st_size < pos:
                        if inode is not None:
                            pos, cutter = 0, LineCutter()
                        inode = st.st_ino
                    fh.seek(pos)
                    chunk = fh.read(self.CHUNK)
            except FileNotFoundError:
                chunk = b""
            except NotRegularFile as exc:  # job output is the job's: never a FIFO that blocks, a device that acts
                self.seen_refusal, chunk = self.seen_refusal or str(exc), b""
            if chunk:
                pos += len(chunk)
                for raw in cutter.feed(chunk):
                    yield raw.decode(errors="replace")
            else:
                self.stop_event.wait(self.interval)
        # drain what is left after stop
        try:
            with self._open() as fh:
                fh.seek(pos)
                while chunk := fh.read(self.CHUNK):
                    for raw in cutter.feed(chunk):
                        if raw:
                            yield raw.decode(errors="replace")
            rest = cutter.rest()
            if rest and not cutter.skipping:
                yield rest.decode(errors="replace")
        except FileNotFoundError:
            pass
        except NotRegularFile as exc:
            self.seen_refusal = self.seen_refusal or str(exc)

    def _open(self):
        return open_regular(self.path)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)


def _constant(name: str) -> float:
    """NaN, Infinity and -Infinity as the floats they name: a job's own values (a loss gone NaN is what the loss
    watch looks for) may be any float; ``ts`` and the whole-number fields may not (:func:`sdk_event`)."""
    return float(name)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)




SDK_MAX_DEPTH = 16
"""The deepest nesting of lists and objects an SDK event line may have."""


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests no deeper than ``limit``."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def sdk_event(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """One line of the SDK's event file as an event, or why it is none: job output is data, so a line that is not
    JSON, not an object, holds a whole number of more than MAX_NUMBER_DIGITS digits, nests deeper than
    :data:`SDK_MAX_DEPTH`, or lacks a finite ``ts`` and a ``kind`` is no event (and never an exception). A value
    of the job's own may be NaN or infinite (a loss that went NaN is the news); ``ts`` and the whole-number
    fields (``step``, ``rank``, ...) may not."""
    if not line.strip():
        return None, None
    try:
        event = json.loads(line, parse_int=_bounded_int, parse_constant=_constant)
    except RecursionError:
        return None, "nested too deep"
    except ValueError as exc:  # JSONDecodeError is one
        return None, " ".join(str(exc).split())[:120]
    if not isinstance(event, dict):
        return None, "not a JSON object"
    if not _depth(event, SDK_MAX_DEPTH):
        return None, f"nested deeper than {SDK_MAX_DEPTH}"
    ts, kind = event.get("ts"), event.get("kind")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return None, "no finite ts"
    if not isinstance(kind, str) or not kind or len(kind) > 64:
        return None, "no kind"
    if any(event.get(k) is not None and (isinstance(event[k], bool) or not isinstance(event[k], int)) for k in NUMERIC_FIELDS):
        return None, f"a field of {', '.join(sorted(NUMERIC_FIELDS))} that is not a whole number"
    return event, None


class SdkLogProbe(_Tailer):
    """Tail the SDK's event file; every line is already an event, or is counted and dropped (:func:`sdk_event`)."""

    def __init__(self, bus: EventBus, path: Path, interval: float = 0.01) -> None:
        super().__init__(Path(path), interval)
        self.bus = bus
        self.bad = 0
        """Lines that were no event (dropped)."""
        self.first_bad: str | None = None

    def run(self) -> None:
        for line in self.lines():
            event, why = sdk_event(line)
            if event is None:
                if why is not None:
                    self.bad += 1
                    self.first_bad = self.first_bad or why
                continue
            event.setdefault("source", "sdk")
            self.bus.publish(event)

    @property
    def errors(self) -> list[str]:
        """What the run's notes say of the dropped lines (once, with their count and the first one's reason) and
        of a file that was refused."""
        out = [f"probes.sdk: {self.seen_refusal}"] if self.seen_refusal else []
        if not self.bad:
            return out
        return [*out, f"probes.sdk: {self.bad} line(s) of {self.path.name} were no event and were dropped "
                      f"(the first: {self.first_bad})"]


class FileLogProbe(_Tailer):
    """Tail a job's log file through a :class:`LogRegexProbe`.

    A scenario's ``probes.log_files`` name files the job writes, and chaoskit reads them as root: with ``folder``
    (the job's own folder), ``path`` is relative to it and opened by :func:`~chaoskit.core.files.open_inside`,
    following no link below it; with ``roots``, an absolute ``path`` is read only inside one of them (an empty list:
    never). ``owners``: the file must be one of theirs (the job's user first), so a file only root may read never
    reaches the events. Without these (chaoskit's own followers, a Slurm job's output) it is read as
    :func:`~chaoskit.core.files.open_regular` reads one."""

    def __init__(self, probe: LogRegexProbe, node: str, path: Path, interval: float = 0.01, *,
                 folder: Path | None = None, owners: tuple[int, ...] = (), roots: list[str] | None = None) -> None:
        super().__init__(Path(path), interval)
        self.probe, self.node = probe, node
        self.folder, self.owners, self.roots = folder, owners, roots

    def _open(self):
        if self.folder is not None:
            return open_inside(self.folder, str(self.path), self.owners)
        if self.roots is not None and not under_roots(str(self.path), self.roots):
            raise NotRegularFile(f"{self.path} is outside the job's folder and the site policy's log_roots "
                                 f"({', '.join(self.roots) or 'none'}); chaoskit reads it only inside them")
        fh = open_regular(self.path)
        uid = os.fstat(fh.fileno()).st_uid
        if self.owners and uid not in self.owners:
            fh.close()
            raise NotRegularFile(f"{self.path} belongs to uid {uid}, not to the job's user (uid {self.owners[0]}) or "
                                 "chaoskit's; chaoskit reads only their files")
        return fh

    def run(self) -> None:
        for line in self.lines():
            self.probe.feed(self.node, line)

    @property
    def errors(self) -> list[str]:
        """A file that was refused (not a regular file), for the run's notes."""
        return [f"log file on {self.node}: {self.seen_refusal}"] if self.seen_refusal else []


class RemoteLogProbe(threading.Thread):
    """Follow a log file on a node through its agent (:class:`FileFollower`); each line goes through a
    :class:`LogRegexProbe` with the time the node read it, on the controller's clock.

    When the connection drops, a new stream starts where the last delivered batch ended, so
    no line is lost or counted twice; rotation and truncation are the agent's to follow."""

    def __init__(self, probe: LogRegexProbe, node: str, transport: FileFollower, path: str,
                 retry_s: float = 0.5, roots: list[str] | None = None) -> None:
        super().__init__(daemon=True, name=f"chaoskit-follow-{node}")
        self.probe, self.node, self.transport, self.path, self.retry_s = probe, node, transport, path, retry_s
        self.roots = roots
        """The site policy's log roots: the node's agent refuses a file that is not really inside one."""
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
                if self.roots is None:
                    stream = self.transport.follow(self.path, self._batch, inode=self.inode, offset=self.offset)
                else:
                    stream = self.transport.follow(self.path, self._batch, inode=self.inode, offset=self.offset,
                                                   roots=self.roots)
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


RANKS_MAX = 65536
"""Workers remembered per node (pid -> rank), gone ones included; the oldest half is forgotten past it."""


class _NodeWatch:
    """What the watcher knows of one node: its workers believed alive, when it last answered, its stream."""

    def __init__(self, node: str, transport: Any, streams: bool) -> None:
        self.node, self.transport = node, transport
        self.streams = streams
        self.workers: dict[int, tuple[int | None, int | None, str]] = {}
        """pid -> (start time, rank, state) of the workers believed alive."""
        self.changes = 0
        """Counts what the node's streams have said: a stream started, a message with changes."""
        self.ranks: dict[int, int | None] = {}
        """pid -> rank of every worker seen on the node, gone ones included (bounded: :data:`RANKS_MAX`)."""
        self.heard = time.monotonic()
        """When the node last answered (``time.monotonic()``)."""
        self.unreachable_since: float | None = None
        self.unreachable_at = 0.0
        """When ``node.unreachable`` was published (wall clock): its ``node.reachable`` is never earlier."""
        self.stream: Any = None
        self.epoch = 0
        self.seq = 0
        self.busy: Any = None
        """The poll or stream start in flight (a future), at most one per node."""
        self.busy_since = 0.0
        self.retry_at = 0.0
        self.scope: Any = None


class ProcessWatcher(threading.Thread):
    """See each node's training workers appear and vanish; publish ``process.gone`` when one ends, and
    ``node.unreachable`` when a node has been silent for ``heartbeat_timeout`` (``node.reachable`` once it
    answers again).

    A node whose transport streams (:class:`~chaoskit.cluster.transports.api.ProcessStreamer`: its agent
    watches its own ``/proc`` and pushes the changes, with a heartbeat every second) costs the controller
    only its messages; the others are polled every ``interval``, each node on its own, concurrently, with
    the poll's own deadline, so a silent node never holds up another. A node that does not answer keeps its
    workers: they are unknown, not gone, until it answers again and says what became of them. Stream starts
    and polls run in a bounded pool (``max_workers``)."""

    def __init__(self, bus: EventBus, transports: dict[str, Any], interval: float = 0.05,
                 heartbeat_timeout: float = 3.0, retry_s: float = 0.5, max_workers: int = 32,
                 streams: bool = True, heartbeat_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="chaoskit-procwatch")
        self.bus, self.transports, self.interval = bus, transports, interval
        self.heartbeat_timeout, self.retry_s = float(heartbeat_timeout), float(retry_s)
        self.heartbeat_s = min(float(heartbeat_s), self.heartbeat_timeout / 2)
        """How often a streaming node's agent sends its heartbeat: at least twice per timeout."""
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._nodes = {name: _NodeWatch(name, t, streams and isinstance(t, ProcessStreamer))
                       for name, t in transports.items()}
        # daemon threads: a poll wedged past its deadline (a Ray driver's get once its cluster is gone) must not
        # keep chaoskit from exiting, as an executor's threads, joined at exit, would
        self._pool = DaemonPool(max(1, min(max_workers, len(transports))), "chaoskit-procwatch")
        self.errors: list[str] = []

    @property
    def seen(self) -> dict[tuple[str, int], int | None]:
        """(node, pid) -> rank of every worker believed alive (an unreachable node's included: unknown, not gone)."""
        with self._lock:
            return {(n.node, pid): w[1] for n in self._nodes.values() for pid, w in n.workers.items()}

    def ranks(self, node: str) -> dict[int, int | None] | None:
        """pid -> rank of every worker seen on ``node`` since the start, those gone included (what the kernel-log
        probe needs to attribute an OOM kill whose victim has already been reported gone); ``None``: not watched."""
        nw = self._nodes.get(node)
        if nw is None:
            return None
        with self._lock:
            return dict(nw.ranks)

    def changes(self, node: str) -> int | None:
        """A counter that moves whenever ``node``'s watch stream says something of its workers (a stream started,
        a worker appeared, ended, stopped, resumed); ``None`` where the node has no live stream (it is polled,
        its stream is down or not started yet). What attach discovery reads before re-reading a node's table."""
        nw = self._nodes.get(node)
        if nw is None or not nw.streams:
            return None
        with self._lock:
            stream = nw.stream
            if stream is None or stream.done.is_set() or nw.scope != getattr(nw.transport, "scope", None):
                return None  # down, or watching a scope the node no longer has (restarted within a second)
            return nw.changes

    @property
    def unreachable(self) -> set[str]:
        with self._lock:
            return {n.node for n in self._nodes.values() if n.unreachable_since is not None}

    def run(self) -> None:
        # Polled nodes are due every interval; streamed ones need only their silence checked, ten times per
        # heartbeat timeout (at most every 0.25 s): node.unreachable comes within the timeout + a tenth of it.
        tick = self.interval if any(not n.streams for n in self._nodes.values()) else min(0.25, self.heartbeat_timeout / 10)
        last_scope = 0.0
        while not self.stop_event.is_set():
            mono = time.monotonic()
            check_scope = mono - last_scope >= 1.0
            if check_scope:
                last_scope = mono
            for nw in self._nodes.values():
                if nw.busy is not None and nw.busy.done():
                    nw.busy = None
                if nw.streams:
                    self._tend_stream(nw, mono, check_scope)
                elif nw.busy is None and mono >= nw.retry_at:
                    nw.retry_at = mono + self.interval
                    nw.busy, nw.busy_since = self._pool.submit(self._poll, nw), mono
                self._check_silence(nw, mono)
            self.stop_event.wait(tick)
        with self._lock:
            streams = [nw.stream for nw in self._nodes.values() if nw.stream is not None]
            for nw in self._nodes.values():
                nw.epoch += 1
        for stream in streams:
            stream.cancel()
        self._pool.shutdown(cancel_futures=True)

    # -- streams -------------------------------------------------------------------------------------------

    def _tend_stream(self, nw: _NodeWatch, mono: float, check_scope: bool) -> None:
        stream = nw.stream
        if stream is not None and not stream.done.is_set():
            if check_scope and getattr(nw.transport, "scope", None) != nw.scope:  # the job's scope changed: restart
                stream.cancel()
            return
        if stream is not None and stream.error:
            self._note(f"{nw.node}: the process watch ended: {stream.error}")
        if nw.busy is None and mono >= nw.retry_at:
            nw.retry_at = mono + self.retry_s
            nw.busy, nw.busy_since = self._pool.submit(self._start_stream, nw), mono

    def _start_stream(self, nw: _NodeWatch) -> None:
        with self._lock:
            nw.epoch += 1
            epoch = nw.epoch
            known = [(pid, w[0], w[2]) for pid, w in nw.workers.items()]
            nw.seq = 0
        scope = getattr(nw.transport, "scope", None)
        try:
            stream = nw.transport.watch_processes(lambda seq, t, changes: self._message(nw, epoch, seq, t, changes),
                                                  known=known, heartbeat=self.heartbeat_s, beats=False)
        except StreamUnsupported as exc:
            self._note(f"{nw.node}: {exc.message}; polling it instead")
            nw.streams = False
            return
        except Exception as exc:  # noqa: BLE001 - a node that cannot be reached now: tried again, silence counts
            self._note(f"{nw.node}: {getattr(exc, 'message', exc)}")
            return
        with self._lock:
            if epoch == nw.epoch:
                nw.stream, nw.scope = stream, scope
                nw.changes += 1
                return
        stream.cancel()  # stopped meanwhile

    def _message(self, nw: _NodeWatch, epoch: int, seq: int, t: float, changes: list[dict[str, Any]]) -> None:
        with self._lock:
            if epoch != nw.epoch or seq <= nw.seq:
                return  # a message of a stream given up, or one seen already
            nw.seq = seq
            self._heard(nw)
            if changes:
                nw.changes += 1
            for c in changes:
                pid, ev = int(c["pid"]), c.get("ev")
                if ev == "appeared":
                    nw.workers[pid] = (c.get("start"), c.get("rank"), str(c.get("state", "S")))
                    self._remember(nw, pid, c.get("rank"))
                    if c.get("state") == "Z":
                        self._gone(nw, pid, float(c["t"]), c)
                elif ev in ("exited", "zombie"):
                    self._gone(nw, pid, float(c["t"]), c)
                elif ev in ("stopped", "resumed") and pid in nw.workers:
                    start, rank, _ = nw.workers[pid]
                    nw.workers[pid] = (start, rank, "T" if ev == "stopped" else "S")
                    self.bus.publish(make_event(f"process.{ev}", float(c["t"]), node=nw.node, rank=rank, pid=pid,
                                                source="procwatch"))

    @staticmethod
    def _remember(nw: _NodeWatch, pid: int, rank: int | None) -> None:
        if len(nw.ranks) >= RANKS_MAX:
            for old in list(nw.ranks)[: RANKS_MAX // 2]:
                del nw.ranks[old]
        nw.ranks[pid] = rank

    def _gone(self, nw: _NodeWatch, pid: int, ts: float, change: dict[str, Any]) -> None:
        known = nw.workers.pop(pid, None)
        if known is None:
            return
        extra = {k: change[k] for k in ("exitcode", "signal") if change.get(k) is not None}
        self.bus.publish(make_event("process.gone", ts, node=nw.node, rank=known[1], pid=pid, source="procwatch", **extra))

    # -- polls ---------------------------------------------------------------------------------------------

    def _poll(self, nw: _NodeWatch) -> None:
        try:
            procs = nw.transport.processes(workers_only=True)
        except Exception:  # noqa: BLE001 - no answer is no news: the node's workers stay unknown, not gone
            return
        ts = time.time()
        alive = {p.pid: (p.start_time, p.rank, p.state) for p in rank_processes(procs) if p.state != "Z"}
        with self._lock:
            self._heard(nw)
            for pid in [p for p in nw.workers if p not in alive]:
                self._gone(nw, pid, ts, {})
            for pid, (start, rank, state) in alive.items():
                was = nw.workers.get(pid)
                nw.workers[pid] = (start, rank, state)
                if was is None:
                    self._remember(nw, pid, rank)
                if was is not None and (was[2] == "T") != (state == "T"):
                    self.bus.publish(make_event("process.stopped" if state == "T" else "process.resumed", ts,
                                                node=nw.node, rank=rank, pid=pid, source="procwatch"))

    # -- silence -------------------------------------------------------------------------------------------

    def _heard(self, nw: _NodeWatch, at: float | None = None) -> None:
        """The node answered, at ``at`` (``time.monotonic()``; default now). Called under the lock."""
        mono = time.monotonic()
        nw.heard = max(nw.heard, mono if at is None else at)
        if nw.unreachable_since is not None:
            wall = max(time.time() - (mono - nw.heard), nw.unreachable_at)
            silent = wall - nw.unreachable_since
            nw.unreachable_since = None
            self.bus.publish(make_event("node.reachable", wall, node=nw.node, source="chaoskit",
                                        who="chaoskit heartbeat", silent_s=round(silent, 3)))

    def _check_silence(self, nw: _NodeWatch, mono: float) -> None:
        # A streamed node's heartbeats are not delivered (``beats=False``): its stream says when it last spoke.
        stream = nw.stream
        rx = getattr(stream, "last_heard", None) if stream is not None else None
        if rx is not None and rx > nw.heard:
            if nw.unreachable_since is None:
                nw.heard = rx  # the common case, every tick for every node: no lock (a float store)
            else:
                with self._lock:
                    self._heard(nw, rx)
        if nw.unreachable_since is not None or mono - nw.heard < self.heartbeat_timeout:
            return
        with self._lock:
            if nw.unreachable_since is not None or mono - nw.heard < self.heartbeat_timeout:
                return
            wall = nw.unreachable_at = time.time()
            nw.unreachable_since = wall - (mono - nw.heard)
            self.bus.publish(make_event(
                "node.unreachable", wall, node=nw.node, source="chaoskit", who="chaoskit heartbeat",
                why=f"no answer for {mono - nw.heard:.1f}s (heartbeat timeout {self.heartbeat_timeout:g}s)",
                last_heard=round(nw.unreachable_since, 6), workers_unknown=sorted(w[1] for w in nw.workers.values()
                                                                                   if w[1] is not None)))

    def _note(self, message: str) -> None:
        with self._lock:
            if not self.errors or self.errors[-1] != message:
                self.errors.append(message)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)
