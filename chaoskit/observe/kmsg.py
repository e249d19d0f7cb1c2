"""The nodes' kernel logs: OOM kills (``oom.kill``) and NVIDIA Xid lines (``gpu.xid``), read on each node.

Every node with chaoskit's agent (SSH) streams its own ``/dev/kmsg`` through the agent (the ``kmsg`` op of
:mod:`chaoskit.nodeside.agent`): only the records that can matter (:data:`MATCH`), each with
the node's time it was logged, put on this machine's clock by the node's measured offset. A stream that
drops (the connection, the node) is started again after the last record it delivered (records carry the
kernel's sequence numbers), so a reconnect neither loses nor doubles a line. Nodes whose transport is local
(the process lab: the controller is the node) are read here, by the same function the agent runs.

Nodes that share one kernel (the netns and Slurm labs: namespaces of this machine) send the same records;
each stream names its kernel (``boot_id``), a record is published once per kernel, and attributed to the node
it concerns among that kernel's nodes:

- an OOM kill (``Memory cgroup out of memory: Killed process PID (comm)`` for a cgroup's limit, ``Out of
  memory: Killed process ...`` for the machine's, after an ``oom-kill:...,task_memcg=CGROUP,task=comm,pid=PID``
  line) to the node whose process table had the pid (refreshed every :data:`REFRESH_S`), or whose ``mem.oom``
  cgroup it died in (``chaoskit-oom-<node>-<token>``); any other kill (another job's) is dropped;
- an Xid (:mod:`chaoskit.cluster.xid`) to the node that owns its PCI id (the inventory's ``gpu_pci``, or
  nvidia-smi's answer on the node), or to the kernel's one node; an Xid of a device no node of the run owns is
  dropped (``unattributed``). Lines ``gpu.xid`` wrote carry its marker and are published ``injected: true``.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from typing import Any, Callable

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.api import KernelLogFollower, KmsgBatch
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.cluster.xid import normalize_pci, parse_xid
from chaoskit.core.errors import InfraError
from chaoskit.faults.memory import BALLAST_NAME, CGROUP_PREFIX
from chaoskit.nodeside import agent
from chaoskit.observe.events import EventBus, make_event

__all__ = ["KmsgProbe", "KMSG", "MATCH", "REFRESH_S", "parse_record"]

KMSG = "/dev/kmsg"
REFRESH_S = 0.5
"""How often the probe refreshes its table of the nodes' processes (a process born and OOM-killed between two
refreshes is attributed only through a ``mem.oom`` cgroup)."""
MATCH = ["Killed process", "oom-kill:", "NVRM: Xid"]
"""What a node's agent sends of its kernel log: OOM kills and Xid lines (plain substrings, matched on the node)."""
RETRY_S = 0.5
SEEN_MAX = 4096
"""Records remembered per kernel, to publish each once although every node of a shared kernel sends it."""

_KILLED = re.compile(r"(?P<scope>Memory cgroup out of memory|Out of memory): Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)")
_CONTEXT = re.compile(r"oom-kill:.*?task_memcg=(?P<memcg>[^,]*),task=(?P<comm>[^,]*),pid=(?P<pid>\d+)")


def parse_record(record: str) -> str:
    """The message of one ``/dev/kmsg`` record (``PRIO,SEQ,USEC,FLAGS;message``); a line without the prefix as is."""
    head, sep, message = record.partition(";")
    return message if sep and "," in head else record


class _Source(threading.Thread):
    """One stream of a kernel log, resumed after the last record it delivered whenever it ends."""

    def __init__(self, probe: "KmsgProbe", nodes: list[str], open_stream: Callable[..., Any], label: str) -> None:
        super().__init__(daemon=True, name=f"chaoskit-kmsg-{label}")
        self.probe, self.nodes, self.open_stream, self.label = probe, nodes, open_stream, label
        self.seq: int | None = None
        self.boot_id: str | None = None
        self.streams = 0
        """Streams started: more than one means the source resumed after its stream ended."""
        self.started = threading.Event()
        self.errors: list[str] = []
        self.stream: Any = None

    def run(self) -> None:
        stop = self.probe.stop_event
        while not stop.is_set():
            try:
                stream = self.open_stream(self._batch, seq=self.seq, match=MATCH)
            except InfraError as exc:
                self._note(exc.message)
                stop.wait(self.probe.retry_s)
                continue
            self.stream = stream
            self.streams += 1
            # The probe's stop cancels the stream (stop()), which ends this wait; the timeout is only a backstop.
            while not stream.done.wait(1.0):
                if stop.is_set():
                    stream.cancel()
                    stream.done.wait(2.0)
                    return
            if stop.is_set():
                return
            if stream.error:
                self._note(stream.error)
                if stream.error.startswith("cannot read the kernel log"):
                    return  # not root there, or dmesg_restrict: this node's log stays unread, and says so in errors
            stop.wait(self.probe.retry_s)

    def _note(self, message: str) -> None:
        if not self.errors or self.errors[-1] != message:
            self.errors.append(message)

    def _batch(self, batch: KmsgBatch) -> None:
        if batch.boot_id:
            self.boot_id = batch.boot_id
        kernel = self.boot_id or f"node:{self.label}"
        clock = getattr(self.probe.transports.get(self.nodes[0]), "clock", None)
        self.probe._records(kernel, self.nodes, batch, getattr(clock, "error_s", None))
        if batch.seq is not None:
            self.seq = batch.seq
        if batch.started:
            self.started.set()


class _LocalStream:
    """This machine's ``/dev/kmsg``, read by the agent's own ``op_kmsg`` on a thread of this process."""

    def __init__(self, on_batch: Callable[[KmsgBatch], None], seq: int | None, match: list[str], path: str) -> None:
        self.done = threading.Event()
        self.error: str | None = None
        self.rid = f"local-kmsg-{secrets.token_hex(4)}"
        self._on_batch = on_batch
        req = {"id": self.rid, "op": "kmsg", "seq": seq, "match": match, "path": path, "interval": 0.1}
        threading.Thread(target=self._run, args=(req,), daemon=True, name="chaoskit-kmsg-local").start()

    def _run(self, req: dict[str, Any]) -> None:
        try:
            agent.op_kmsg(req, self._emit)
        except Exception as exc:  # noqa: BLE001 - OpError (the log cannot be read), OSError: the source retries
            self.error = str(exc)
        self.done.set()

    def _emit(self, part: dict[str, Any]) -> None:
        self._on_batch(KmsgBatch([(float(t), int(n), int(p), str(text)) for t, n, p, text in part.get("records", [])],
                                 part.get("seq"), part.get("boot_id"), int(part.get("lost") or 0), bool(part.get("started"))))

    def cancel(self) -> None:
        agent.op_cancel({"stream": self.rid})


class KmsgProbe(threading.Thread):
    """Follow the kernel log of every node that can be read (its agent's stream, or this machine's own for local
    nodes); publish ``oom.kill`` and ``gpu.xid`` once per kernel, for the node each concerns."""

    def __init__(self, bus: EventBus, transports: dict[str, Any], path: str = KMSG, refresh_s: float = REFRESH_S,
                 gpu_pci: dict[str, list[str]] | None = None, retry_s: float = RETRY_S,
                 workers: Callable[[str], dict[int, int | None] | None] | None = None) -> None:
        super().__init__(daemon=True, name="chaoskit-kmsg")
        self.bus, self.transports, self.path, self.refresh_s, self.retry_s = bus, transports, path, refresh_s, retry_s
        self.workers = workers
        self._watched_nodes: set[str] | None = None
        """The process watcher's table of a node's workers (:meth:`ProcessWatcher.ranks`), where one runs: a
        remote node it watches is not polled here (its table comes from the node's own ``watch`` stream)."""
        self.stop_event = threading.Event()
        self.known: dict[str, dict[int, int | None]] = {}
        """node -> pid -> rank, of the nodes' processes (refreshed)."""
        self.memcg: dict[tuple[str, int], str] = {}
        self.own_cgroups: set[str] = set()
        """The leaves of the memory cgroups this run's ``mem.oom`` made (:meth:`claim_cgroup`): a kill of a pid no
        table knows is the run's only in one of them (another drill on the same kernel makes cgroups named alike)."""
        self._claims = threading.Lock()
        self.kills = 0
        self.xids = 0
        self.unattributed = 0
        """Xid lines of a device no node of the run owns (another machine's GPU on a shared kernel)."""
        self.lost = 0
        self.pci: dict[str, set[str]] = {n: {normalize_pci(p) for p in ids} for n, ids in (gpu_pci or {}).items()}
        self._seen: dict[str, dict[int, None]] = {}
        self._lock = threading.Lock()
        local = [n for n, t in transports.items() if isinstance(t, LocalTransport)]
        self.sources: list[_Source] = []
        if local:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # OSError here: this machine's log is not ours to read
            self.sources.append(_Source(self, local, lambda cb, seq, match: _LocalStream(cb, seq, match, path), "local"))
        for name, t in transports.items():
            if name not in local and isinstance(t, KernelLogFollower):
                self.sources.append(_Source(self, [name], t.kmsg, name))
        self._refresh()

    @classmethod
    def for_nodes(cls, bus: EventBus, nodes: list[Node], path: str = KMSG,
                  workers: Callable[[str], dict[int, int | None] | None] | None = None) -> "KmsgProbe | None":
        """The probe for the nodes whose kernel log can be read (this machine's, for local nodes; the node's own
        through its agent), or ``None`` when there are none (then it is not started and says nothing)."""
        readable = {n.name: n.conn for n in nodes if isinstance(n.conn, (LocalTransport, KernelLogFollower))}
        pci = {n.name: list(n.gpu_pci) for n in nodes if n.gpu_pci}
        if not readable:
            return None
        try:
            return cls(bus, readable, path, gpu_pci=pci, workers=workers)
        except OSError:  # this machine's log cannot be read here (no root, dmesg_restrict): the nodes' own then
            remote = {k: v for k, v in readable.items() if not isinstance(v, LocalTransport)}
            return cls(bus, remote, path, gpu_pci=pci, workers=workers) if remote else None

    def start(self) -> None:
        """Start every source; return once this machine's log (local nodes) is being read, so that a line logged
        after ``start`` is seen (the nodes' own streams start meanwhile: :meth:`ready` waits for them)."""
        for source in self.sources:
            source.start()
        super().start()
        for source in self.sources:
            if source.label == "local":
                source.started.wait(5.0)

    def ready(self, timeout: float = 10.0) -> bool:
        """Whether every source's stream is reading (a line logged from now on is seen), waiting up to ``timeout``."""
        return all(s.started.wait(timeout) for s in self.sources)

    @property
    def streams(self) -> dict[str, int]:
        """Streams started per source (more than one: resumed)."""
        return {s.label: s.streams for s in self.sources}

    @property
    def errors(self) -> list[str]:
        return [f"{s.label}: {e}" for s in self.sources for e in s.errors]

    def run(self) -> None:
        while not self.stop_event.wait(self.refresh_s):
            self._refresh()

    def _refresh(self) -> None:
        for node, transport in self.transports.items():
            if self._watched(node):
                continue
            try:  # a remote node's workers only (what its agent reads cheaply); this machine's every process
                procs = transport.processes() if isinstance(transport, LocalTransport) else transport.processes(workers_only=True)
            except Exception:  # noqa: BLE001 - a node we cannot read now keeps what we knew of it
                continue
            table = self.known.setdefault(node, {})
            if len(table) > 65536:
                table.clear()
            for p in procs:
                table[p.pid] = p.rank

    def _records(self, kernel: str, nodes: list[str], batch: KmsgBatch, uncertainty: float | None = None) -> None:
        with self._lock:
            self.lost += batch.lost if batch.started else 0
            seen = self._seen.setdefault(kernel, {})
            sharing = self._kernel_nodes(kernel, nodes)
            for ts, seq, _prio, text in batch.records:
                if seq in seen:
                    continue  # another node of the same kernel sent it first
                seen[seq] = None
                if len(seen) > SEEN_MAX:
                    for old in list(seen)[: SEEN_MAX // 2]:
                        del seen[old]
                self._line(kernel, sharing, parse_record(text), ts, uncertainty)

    def _kernel_nodes(self, kernel: str, nodes: list[str]) -> list[str]:
        """Every node known to run on ``kernel`` (the sources that named it), ``nodes`` included."""
        out = list(nodes)
        for s in self.sources:
            if s.boot_id == kernel:
                out += [n for n in s.nodes if n not in out]
        return out

    def _line(self, kernel: str, nodes: list[str], message: str, ts: float, uncertainty: float | None = None) -> None:
        extra = {"ts_uncertainty": uncertainty} if uncertainty else {}
        xid = parse_xid(message)
        if xid is not None:
            self._xid(nodes, xid, ts, extra)
            return
        context = _CONTEXT.search(message)
        if context:
            self.memcg[(kernel, int(context["pid"]))] = context["memcg"]
            return
        killed = _KILLED.search(message)
        if not killed:
            return
        pid = int(killed["pid"])
        memcg = self.memcg.pop((kernel, pid), "")
        if killed["comm"] == BALLAST_NAME:  # mem.oom's own ballast, killed after the rank: not the job's
            return
        tables = {n: self._table(n) for n in nodes}
        node = next((n for n in nodes if pid in tables[n]), None)
        rank = tables[node][pid] if node is not None else None
        if node is None:
            node = self._node_of_cgroup(memcg, nodes)
        if node is None:
            return  # another job's process on this kernel
        self.kills += 1
        self.bus.publish(make_event(
            "oom.kill", ts, node=node, rank=rank, pid=pid, process=killed["comm"], source="kmsg",
            who="kernel OOM killer", why=f"{killed['scope']}: killed pid {pid} ({killed['comm']})",
            **({"cgroup": memcg} if memcg else {}), **extra,
        ))

    def _xid(self, nodes: list[str], xid: Any, ts: float, extra: dict[str, Any]) -> None:
        owners = [n for n in nodes if xid.pci in self.pci.get(n, set())]
        node = owners[0] if owners else (nodes[0] if len(nodes) == 1 else None)
        if node is None:
            self.unattributed += 1
            return
        self.xids += 1
        what = "injected by chaoskit" if xid.injected else "NVIDIA driver"
        self.bus.publish(make_event(
            "gpu.xid", ts, node=node, rank=None, xid=xid.code, code=xid.code, pci=xid.pci, injected=xid.injected,
            fatal=xid.fatal, message=xid.message, source="kmsg", who=f"kernel log ({what})",
            why=f"Xid {xid.code} on PCI:{xid.pci}: {xid.message}" + (" (injected)" if xid.injected else ""),
            **({"token": xid.token} if xid.token else {}), **extra,
        ))

    def _watched(self, node: str) -> bool:
        if self._watched_nodes is None:
            self._watched_nodes = {n for n, t in self.transports.items() if self.workers is not None
                                   and not isinstance(t, LocalTransport) and self.workers(n) is not None}
        return node in self._watched_nodes

    def _table(self, node: str) -> dict[int, int | None]:
        """pid -> rank of the node's processes: the process watcher's (a watched remote node), else this probe's."""
        if self._watched(node) and self.workers is not None:
            return self.workers(node) or {}
        return self.known.get(node, {})

    def claim_cgroup(self, cgroup: str) -> None:
        """A memory cgroup this run made (its path, or its leaf): the kills in it are this run's nodes'."""
        with self._claims:
            self.own_cgroups.add(cgroup.rstrip("/").rsplit("/", 1)[-1])

    def _node_of_cgroup(self, memcg: str, nodes: list[str]) -> str | None:
        leaf = memcg.rsplit("/", 1)[-1]
        with self._claims:  # not _lock: this runs under it (_records)
            ours = leaf in self.own_cgroups
        if not leaf.startswith(CGROUP_PREFIX) or not ours:
            return None
        for node in sorted(nodes, key=len, reverse=True):  # n1-a before n1
            if leaf.startswith(f"{CGROUP_PREFIX}{node}-"):
                return node
        return None

    def stop(self) -> None:
        self.stop_event.set()
        for source in self.sources:
            if source.stream is not None:
                source.stream.cancel()
        for source in self.sources:
            source.join(timeout=3)
        self.join(timeout=2)
