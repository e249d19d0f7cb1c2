"""OOM kills from the kernel's log: ``/dev/kmsg`` read from now on, one ``oom.kill`` event per kill of a node's process.

The kernel logs every OOM kill (``Memory cgroup out of memory: Killed process
PID (comm) ...`` for a cgroup's limit, ``Out of memory: Killed process ...`` for
the machine's), preceded by an ``oom-kill:...,task_memcg=CGROUP,task=comm,pid=PID``
line. A kill counts for a node when the pid was one of that node's processes
(a table refreshed every :data:`REFRESH_S`), or when it died in a cgroup that
``mem.oom`` made for that node (``chaoskit-oom-<node>-<token>``); any other kill on
this machine (another job's) is not the run's and is dropped.

Limitation: the probe reads *this machine's* kernel log, so it serves the nodes
whose transport is local (the process lab; the controller is the node). A node
reached over SSH, Ray or docker has a kernel log of its own that this probe does
not read yet: there a ``mem.oom`` kill is still seen through torchrun
(``worker.exit`` with exit code -9) and the process table.
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import time
from typing import Any

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.faults.memory import BALLAST_NAME, CGROUP_PREFIX
from chaoskit.observe.events import EventBus, make_event

__all__ = ["KmsgProbe", "KMSG", "REFRESH_S", "parse_record"]

KMSG = "/dev/kmsg"
REFRESH_S = 0.5
"""How often the probe refreshes its table of the nodes' processes (a process born and OOM-killed between two
refreshes is attributed only through a ``mem.oom`` cgroup)."""

_KILLED = re.compile(r"(?P<scope>Memory cgroup out of memory|Out of memory): Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)")
_CONTEXT = re.compile(r"oom-kill:.*?task_memcg=(?P<memcg>[^,]*),task=(?P<comm>[^,]*),pid=(?P<pid>\d+)")


def parse_record(record: str) -> str:
    """The message of one ``/dev/kmsg`` record (``PRIO,SEQ,USEC,FLAGS;message``); a line without the prefix as is."""
    head, sep, message = record.partition(";")
    return message if sep and "," in head else record


class KmsgProbe(threading.Thread):
    """Follow the kernel log of this machine and publish ``oom.kill`` for the kills of the given nodes' processes."""

    def __init__(self, bus: EventBus, transports: dict[str, Any], path: str = KMSG, refresh_s: float = REFRESH_S) -> None:
        super().__init__(daemon=True, name="chaoskit-kmsg")
        self.bus, self.transports, self.path, self.refresh_s = bus, transports, path, refresh_s
        self.stop_event = threading.Event()
        self.known: dict[int, tuple[str, int | None]] = {}
        self.memcg: dict[int, str] = {}
        self.kills = 0
        # Opened here, so that a kill logged between the constructor and start() is not missed.
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)  # from now on: what the log held before is not this run's
        self._refresh()

    @classmethod
    def for_nodes(cls, bus: EventBus, nodes: list[Node], path: str = KMSG) -> "KmsgProbe | None":
        """The probe for the nodes whose kernel is this machine's, or ``None`` when there are none or the log
        cannot be read here (no root, ``dmesg_restrict``): then it is not started and says nothing."""
        local = {n.name: n.conn for n in nodes if isinstance(n.conn, LocalTransport)}
        if not local:
            return None
        try:
            return cls(bus, local, path)
        except OSError:
            return None

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        last_refresh, pending = time.monotonic(), b""
        try:
            while not self.stop_event.is_set():
                if time.monotonic() - last_refresh >= self.refresh_s:
                    self._refresh()
                    last_refresh = time.monotonic()
                if not poller.poll(100):
                    continue
                try:
                    chunk = os.read(self.fd, 8192)  # /dev/kmsg: one record per read
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on with the next
                        continue
                    if exc.errno == errno.EAGAIN:
                        continue
                    raise
                if not chunk:  # a plain file (tests) at its end
                    self.stop_event.wait(0.05)
                    continue
                ts = time.time()
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    if raw and not raw.startswith(b" "):  # " KEY=value" continuation lines carry no message
                        self._line(parse_record(raw.decode(errors="replace")), ts)
        finally:
            os.close(self.fd)

    def _refresh(self) -> None:
        for node, transport in self.transports.items():
            try:
                procs = transport.processes()
            except Exception:  # noqa: BLE001 - a node we cannot read now keeps what we knew of it
                continue
            for p in procs:
                self.known[p.pid] = (node, p.rank)
        if len(self.known) > 65536:
            self.known.clear()

    def _line(self, message: str, ts: float) -> None:
        context = _CONTEXT.search(message)
        if context:
            self.memcg[int(context["pid"])] = context["memcg"]
            return
        killed = _KILLED.search(message)
        if not killed:
            return
        pid = int(killed["pid"])
        if killed["comm"] == BALLAST_NAME:  # mem.oom's own ballast, killed after the rank: not the job's
            self.memcg.pop(pid, None)
            return
        node, rank = self.known.get(pid, (None, None))
        memcg = self.memcg.pop(pid, "")
        if node is None:
            node = self._node_of_cgroup(memcg)
        if node is None:
            return  # another job's process on this machine
        self.kills += 1
        self.bus.publish(make_event(
            "oom.kill", ts, node=node, rank=rank, pid=pid, process=killed["comm"], source="kmsg",
            who="kernel OOM killer", why=f"{killed['scope']}: killed pid {pid} ({killed['comm']})",
            **({"cgroup": memcg} if memcg else {}),
        ))

    def _node_of_cgroup(self, memcg: str) -> str | None:
        leaf = memcg.rsplit("/", 1)[-1]
        if not leaf.startswith(CGROUP_PREFIX):
            return None
        for node in sorted(self.transports, key=len, reverse=True):  # n1-a before n1
            if leaf.startswith(f"{CGROUP_PREFIX}{node}-"):
                return node
        return None

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)
