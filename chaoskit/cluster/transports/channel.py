"""The channel to chaoskit's agent on a node: what the SSH and docker transports both speak.

The agent (:mod:`chaoskit.nodeside.agent`, with :mod:`chaoskit.nodeside.nodefs` and the shared node-side modules in front:
:func:`agent_program`) is started by running :func:`boot_argv` on the node, which reads the program from stdin;
from then on the channel carries JSON lines both ways, requests multiplexed by id (see :mod:`chaoskit.nodeside.agent` for
the protocol). :class:`AgentChannel` works over a paramiko channel (replies parsed right in paramiko's
transport thread) or over anything with ``sendall``, ``recv``, ``recv_stderr_ready``, ``recv_stderr`` and
``close`` (the docker transport's exec socket, a socket pair in the tests).

Contract:

- :meth:`AgentChannel.request` answers with the agent's reply, or raises :class:`AgentGone` (the channel
  died; ``sent`` says whether the request had left), :class:`DeadlineMissed` (no reply in time; ``silent``
  says whether nothing at all came back since the request left) or :class:`OpFailed` (``ok: false``).
- :meth:`AgentChannel.stream` (and :func:`start_stream`, which turns a dead channel into an
  :class:`~chaoskit.core.errors.InfraError`) starts a request that answers many times; the callbacks run on
  the channel's own delivery thread, in order.
- :class:`Broadcast` writes one request to many channels at once, encoded once, and wakes once, when the
  last of them answered.
- A reply line longer than :data:`MAX_REPLY_BYTES` ends the channel.
- Every open channel that sent nothing for :data:`KEEPALIVE_S` gets a ``ping`` (one thread for the process,
  :class:`_Keepalive`): an agent that hears nothing for :data:`AGENT_IDLE_EXIT_S` takes its controller for gone
  and ends itself, so an agent whose controller died behind a half-open connection does not live on.
- :func:`boot_argv` names the controller in the agent's command line (:func:`controller_tag`): ``chaoskit
  audit`` tells the agents of a live controller from those of one that is gone (:func:`parse_controller_tag`).

Nothing here imports paramiko at module level.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from chaoskit import nodeside
from chaoskit.core import procs
from chaoskit.core.errors import InfraError
from chaoskit.nodeside import jobscope, procstat
from chaoskit.nodeside.agent import BOOT
from chaoskit.nodeside.nodefs import bundle

__all__ = [
    "AgentChannel",
    "AgentGone",
    "AgentStream",
    "Broadcast",
    "DeadlineMissed",
    "OpFailed",
    "AGENT_SOURCE",
    "MAX_REPLY_BYTES",
    "agent_program",
    "boot_argv",
    "controller_alive",
    "controller_tag",
    "parse_controller_tag",
    "start_stream",
    "AGENT_TAG",
    "AGENT_IDLE_EXIT_S",
    "KEEPALIVE_S",
]

AGENT_SOURCE = nodeside.source("agent")
"""The agent's own source; what a node runs is :func:`agent_program` of it."""

MAX_REPLY_BYTES = 32 << 20
"""The longest reply line the controller takes from a node's agent (a ``procs`` of every process on a big node, each
command line capped at the agent's CMDLINE_MAX, is far less); a longer one ends the channel."""


KEEPALIVE_S = 5.0
"""How long a channel may send nothing before it sends the agent a ``ping``."""
AGENT_IDLE_EXIT_S = 60.0
"""How long an agent waits, hearing nothing (not even the keepalive), before it takes its controller for gone and
ends itself: twelve keepalives missed, far beyond any pause of a live controller."""
AGENT_TAG = "chaoskit-agent"
"""The word after :data:`BOOT` on an agent's command line; the controller's tag follows it."""


def agent_program(workdir: str | None, idle_exit_s: float = AGENT_IDLE_EXIT_S) -> bytes:
    """The program the agent runs on a node: nodefs' source, the state folder asked for, how long it lives
    without hearing from its controller, the agent."""
    return bundle(AGENT_SOURCE, jobscope, procstat, CHAOSKIT_WORKDIR=workdir, CHAOSKIT_IDLE_EXIT_S=idle_exit_s).encode("utf-8")


def boot_argv(python: str) -> list[str]:
    """The command that starts the agent on a node with ``python``: it reads :func:`agent_program`'s bytes
    (a byte count, a newline, the program) from stdin and runs them (``-I``: nothing from the current folder,
    the user's site folder or ``PYTHON*`` is imported as root). The words after the program are not read by
    it: they name this controller on the node's process list (:func:`controller_tag`)."""
    return [python, "-I", "-u", "-c", BOOT, AGENT_TAG, controller_tag()]


def controller_tag(pid: int | None = None) -> str:
    """``controller=HOST/PID/START``: this machine's host name, the controller's pid and its start time (clock
    ticks since boot, ``/proc/PID/stat``), so that a pid used again by another process is not taken for it."""
    pid = os.getpid() if pid is None else pid
    return f"controller={_host()}/{pid}/{_start_ticks(pid) or 0}"


def parse_controller_tag(cmdline: str) -> tuple[str, int, int] | None:
    """(host, pid, start) from an agent's command line (``ps`` or ``/proc``), or ``None`` if it is not one."""
    marker = f"{BOOT} {AGENT_TAG} controller="
    at = cmdline.find(marker)
    if at < 0:
        return None
    words = cmdline[at + len(marker):].split(None, 1)
    if not words:
        return None
    host, _, rest = words[0].partition("/")
    pid, _, start = rest.partition("/")
    return (host, int(pid), int(start)) if pid.isdigit() and start.isdigit() else None


def controller_alive(host: str, pid: int, start: int) -> bool | None:
    """Whether the controller a tag names still runs: ``None`` when it ran on another machine (nothing here
    can say; its agents end themselves :data:`AGENT_IDLE_EXIT_S` after it last spoke)."""
    if host != _host():
        return None
    return _start_ticks(pid) == start if start else os.path.exists(f"/proc/{pid}")


def _host() -> str:
    """This machine's host name, as a tag carries it (only characters a host name has)."""
    return "".join(c for c in socket.gethostname() if c.isalnum() or c in "-._") or "unknown"


def _start_ticks(pid: int) -> int | None:
    start = procs.start_time(pid)
    return int(start) if start is not None and start.isdigit() else None


class AgentGone(Exception):
    """The agent channel is dead (EOF, send failure).

    ``sent`` tells whether the request had left: one that had may have run, so only
    idempotent requests are retried on a new agent (a second ``ip link set down``
    after the node's watchdog restored the link would undo the safety net).
    """

    def __init__(self, reason: str, sent: bool = False) -> None:
        super().__init__(reason)
        self.sent = sent


class OpFailed(Exception):
    """The agent answered ``ok: false``; ``gone``: the process the op named is no more (nothing was done)."""

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class DeadlineMissed(Exception):
    """No reply within the deadline; ``silent``: nothing at all came back on the channel since the request left
    (a wedged agent or a dead link, not just a slow command)."""

    def __init__(self, silent: bool) -> None:
        super().__init__()
        self.silent = silent


class AgentChannel:
    """One exec channel running the agent; requests are multiplexed by id.

    Over a paramiko channel the agent's replies are parsed and handed to their
    waiters right in paramiko's transport thread, as the data arrives
    (:class:`_ReplyFeed`): no reader thread, no copy through the channel's
    buffer, one thread hand-off per reply. Any other channel (the docker
    transport's exec socket) gets a reader thread calling ``recv``.
    """

    def __init__(self, chan: Any, node: str) -> None:
        self.chan, self.node = chan, node
        self.dead = False
        self.reason = ""
        self.hello: dict[str, Any] = {}
        self._pending: dict[int, _Slot] = {}
        self._streams: dict[int, tuple[Callable[[dict[str, Any]], None], Callable[[str], None]]] = {}
        self._deliveries: queue.SimpleQueue | None = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._buf = bytearray()
        self.last_rx = time.monotonic()
        self.last_tx = time.monotonic()

    @classmethod
    def start(cls, client: Any, command: str, timeout: float, node: str, program: bytes) -> "AgentChannel":
        try:
            chan = client.get_transport().open_session(timeout=timeout)
            chan.exec_command(command)
        except Exception as exc:  # noqa: BLE001
            raise AgentGone(f"cannot start the agent: {exc}") from None
        return cls.over(chan, timeout, node, program)

    @classmethod
    def over(cls, chan: Any, timeout: float, node: str, program: bytes) -> "AgentChannel":
        """Ship the agent's ``program`` down ``chan`` (a channel already running :data:`BOOT`) and wait for its hello."""
        agent = cls(chan, node)
        hello = _Slot()
        agent._pending[0] = hello
        agent._listen()  # before the source leaves: nothing is printed until the agent has it
        try:
            chan.sendall(f"{len(program)}\n".encode() + program)
        except Exception as exc:  # noqa: BLE001
            agent.close()
            raise AgentGone(f"cannot start the agent: {exc}") from None
        if not hello.wait(timeout):
            agent.close()
            raise AgentGone(f"the agent did not start within {timeout:g}s")
        if hello.gone:
            raise AgentGone(hello.gone)
        agent.hello = hello.reply or {}
        _KEEPALIVE.add(agent)
        return agent

    def _listen(self) -> None:
        if _ReplyFeed.fits(self.chan):
            self.chan.in_buffer = _ReplyFeed(self)
        else:
            threading.Thread(target=self._read_loop, name=f"chaoskit-agent-{self.node}", daemon=True).start()

    def request(self, fields: dict[str, Any], timeout: float) -> dict[str, Any]:
        rid = next(_request_ids)
        slot = _Slot()
        self.submit(rid, (json.dumps({"id": rid, **fields}) + "\n").encode(), slot)
        return self.wait(rid, slot, timeout)

    def submit(self, rid: int, data: bytes, slot: _Slot) -> None:
        """Write one request (``data``, one JSON line carrying ``rid``) for ``slot``.

        On return the slot is in flight; on :class:`AgentGone` it has been completed
        (``gone`` set), so a batch it belongs to never waits for it.
        """
        with self._lock:
            if self.dead:
                slot.gone = self.reason
                slot.complete()
                raise AgentGone(self.reason)
            self._pending[rid] = slot
        slot.sent_at = time.monotonic()
        try:
            self._send(data)
        except Exception as exc:  # noqa: BLE001
            self._die(f"send failed: {exc}")  # completes the slot
            raise AgentGone(self.reason) from None

    def stream(self, fields: dict[str, Any], on_message: Callable[[dict[str, Any]], None],
               on_gone: Callable[[str], None], quiet: bool = False) -> int:
        """Start a request that answers many times: each answer goes to ``on_message`` until one
        without ``more``; ``on_gone(reason)`` when the channel dies first. Both are called on this
        channel's delivery thread, in order, never on paramiko's transport thread (a callback that
        sends on this channel, or waits for it, must not hold up the thread that reads it).
        ``quiet``: an answer with ``more`` and an empty ``changes`` (a ``watch`` heartbeat) is not
        delivered; it has moved :attr:`last_rx` on, which is all a heartbeat says."""
        rid = next(_request_ids)
        with self._lock:
            if self.dead:
                raise AgentGone(self.reason)
            self._streams[rid] = (on_message, on_gone, quiet)
        try:
            self._send((json.dumps({"id": rid, **fields}) + "\n").encode())
        except Exception as exc:  # noqa: BLE001
            self._die(f"send failed: {exc}")
            raise AgentGone(self.reason) from None
        return rid

    def cancel(self, rid: int) -> None:
        """End a stream (best effort: a dead channel has ended it already)."""
        try:
            self._send((json.dumps({"id": next(_request_ids), "op": "cancel", "stream": rid}) + "\n").encode())
        except Exception:  # noqa: BLE001
            pass

    def keepalive(self) -> None:
        """A ``ping`` whose answer nobody waits for (an answer to no pending id is dropped), if nothing else was
        sent for :data:`KEEPALIVE_S`: the agent hears its controller (best effort: a dead channel is left)."""
        if self.dead or time.monotonic() - self.last_tx < KEEPALIVE_S:
            return
        try:
            self._send((json.dumps({"id": next(_request_ids), "op": "ping"}) + "\n").encode())
        except Exception:  # noqa: BLE001 - the next request finds the channel dead and says why
            pass

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self.chan.sendall(data)
            self.last_tx = time.monotonic()

    def wait(self, rid: int, slot: _Slot, timeout: float) -> dict[str, Any]:
        slot.wait(timeout)
        return self.outcome(rid, slot)

    def outcome(self, rid: int, slot: _Slot) -> dict[str, Any]:
        """The reply of a request whose wait is over; :class:`DeadlineMissed` if none came."""
        with self._lock:  # a reply or a death lands under this lock, so what is read here is final
            self._pending.pop(rid, None)
            reply, gone = slot.reply, slot.gone
        if reply is None and gone is None:
            raise DeadlineMissed(silent=self.last_rx < slot.sent_at)
        if gone is not None:
            raise AgentGone(gone, sent=True)
        if not reply.get("ok"):
            raise OpFailed(reply.get("error", "failed"), gone=reply.get("gone") is True)
        return reply

    def close(self) -> None:
        self._die("closed")
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass

    def _feed(self, data: bytes) -> None:
        """Bytes of the agent's stdout, in order; every complete line is a reply."""
        self.last_rx = time.monotonic()
        buf = self._buf
        if not buf and data.endswith(b"\n") and data.count(b"\n") == 1:
            self._dispatch(data)  # the common case: one whole reply per packet
            return
        buf += data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            self._dispatch(bytes(buf[start:nl]))
            start = nl + 1
        del buf[:start]
        if len(buf) > MAX_REPLY_BYTES:  # a reply without end (what a node sends is bounded): no more of this channel
            buf.clear()
            self._die(f"a reply of more than {MAX_REPLY_BYTES >> 20} MiB without a line end; the channel is closed")
            try:
                self.chan.close()
            except Exception:  # noqa: BLE001
                pass

    def _read_loop(self) -> None:
        try:
            while True:
                data = self.chan.recv(65536)
                if not data:
                    break
                self._feed(data)
        except Exception as exc:  # noqa: BLE001
            self._die(f"connection lost: {exc}")
            return
        err = b""
        try:
            while self.chan.recv_stderr_ready():
                err += self.chan.recv_stderr(65536)
        except Exception:  # noqa: BLE001
            pass
        self._exited(err)

    def _exited(self, stderr: bytes) -> None:
        detail = stderr.decode(errors="replace").strip().splitlines()
        self._die("the agent exited" + (f": {detail[-1]}" if detail else ""))

    def _dispatch(self, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            return
        rid = reply.get("id")
        with self._lock:
            stream = self._streams.get(rid)
            if stream is not None:
                if not reply.get("more"):
                    del self._streams[rid]
                elif stream[2] and reply.get("changes") == []:
                    return  # a heartbeat: last_rx has it
                self._deliver(stream[0], reply)
                return
            slot = self._pending.pop(rid, None)
            if slot is None:
                return
            slot.reply = reply
        slot.complete()

    def _die(self, reason: str) -> None:
        with self._lock:
            if self.dead:
                return
            self.dead, self.reason = True, reason
            pending, self._pending = self._pending, {}
            for slot in pending.values():
                slot.gone = reason
            for _, on_gone, _ in self._streams.values():
                self._deliver(on_gone, reason)
            self._streams = {}
            if self._deliveries is not None:
                self._deliveries.put(None)  # the delivery thread ends after what is queued
        for slot in pending.values():
            slot.complete()

    def _deliver(self, callback: Callable[[Any], None], arg: Any) -> None:
        """Run a stream's callback on this channel's delivery thread (started with the first one;
        the caller holds ``self._lock``)."""
        if self._deliveries is None:
            self._deliveries = queue.SimpleQueue()
            threading.Thread(target=self._delivery_loop, args=(self._deliveries,),
                             name=f"chaoskit-stream-{self.node}", daemon=True).start()
        self._deliveries.put((callback, arg))

    @staticmethod
    def _delivery_loop(deliveries: queue.SimpleQueue) -> None:
        while (item := deliveries.get()) is not None:
            callback, arg = item
            try:
                callback(arg)
            except Exception:  # noqa: BLE001 - a probe's bug must not stop the streams behind it
                logging.getLogger(__name__).exception("a stream callback failed")


class AgentStream:
    """A running ``follow`` or ``watch``: :attr:`done` once it ended, :attr:`error` why (``None``: cancelled or finished)."""

    def __init__(self, agent: AgentChannel) -> None:
        self.agent, self.rid = agent, 0
        self.done = threading.Event()
        self.error: str | None = None

    def finish(self, error: str | None) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()

    def cancel(self) -> None:
        if not self.done.is_set():
            self.agent.cancel(self.rid)

    @property
    def last_heard(self) -> float:
        """``time.monotonic()`` when the node last sent anything on this stream's channel."""
        return self.agent.last_rx


class Broadcast:
    """One request to many agents: encoded once (one id for all, the same bytes written to every channel) and
    answered into one batch, so the caller's thread wakes once, when the last of them answered or is gone, not
    once per node.

    ``Broadcast(fields, channels)`` writes the request onto each channel; :attr:`unsent` names those that
    were dead before it left. :meth:`collect` then waits and hands back each sent key's reply, or the
    :class:`DeadlineMissed`, :class:`OpFailed` or :class:`AgentGone` (``sent=True``) that stands for it."""

    def __init__(self, fields: Mapping[str, Any], channels: Mapping[str, AgentChannel]) -> None:
        self.rid = next(_request_ids)
        data = (json.dumps({"id": self.rid, **fields}) + "\n").encode()
        self._batch = _Batch(len(channels))
        self._sent: dict[str, tuple[AgentChannel, _Slot]] = {}
        self.unsent: list[str] = []
        """The keys whose channel was gone before the request left (the request cannot have run there)."""
        for key, agent in channels.items():
            slot = _Slot(self._batch)
            try:
                agent.submit(self.rid, data, slot)
            except AgentGone:
                self.unsent.append(key)
                continue
            self._sent[key] = (agent, slot)

    def collect(self, timeout: float) -> dict[str, dict[str, Any] | Exception]:
        """Wait up to ``timeout`` seconds for the last reply; every sent key's reply or exception, in send order."""
        self._batch.wait(timeout)
        out: dict[str, dict[str, Any] | Exception] = {}
        for key, (agent, slot) in self._sent.items():
            try:
                out[key] = agent.outcome(self.rid, slot)
            except (DeadlineMissed, OpFailed, AgentGone) as exc:
                out[key] = exc
        return out


class _Keepalive:
    """The one thread of the process that keeps every open agent channel heard (:meth:`AgentChannel.keepalive`),
    started with the first channel; channels are held weakly, and a dead one is dropped."""

    def __init__(self) -> None:
        self._channels: weakref.WeakSet[AgentChannel] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, agent: AgentChannel) -> None:
        with self._lock:
            self._channels.add(agent)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="chaoskit-keepalive", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            time.sleep(KEEPALIVE_S / 2)
            with self._lock:
                channels = list(self._channels)
            for agent in channels:
                if agent.dead:
                    with self._lock:
                        self._channels.discard(agent)
                else:
                    agent.keepalive()


_KEEPALIVE = _Keepalive()


def start_stream(agent: AgentChannel, what: str, fields: dict[str, Any], on_message: Callable[[dict[str, Any]], None],
                 on_gone: Callable[[str], None], quiet: bool = False) -> int:
    """Start one of the agent's streams; :class:`InfraError` (what callers retry on) when its channel closed
    between being picked and the request leaving: a node powered off mid-drill."""
    try:
        return agent.stream(fields, on_message, on_gone, quiet=quiet)
    except AgentGone as exc:
        raise InfraError(f"cannot {what}: the agent's connection closed ({exc})") from None


# -- private helpers ----------------------------------------------------------------

_request_ids = itertools.count(1)
"""One id space for the whole process, so a fan-out encodes its request once and
writes the same bytes to every node (each agent only needs ids unique on its channel)."""


class _Batch:
    """Completion of many requests at once: the fan-out's thread wakes once, when the
    last of them is answered (or gone), not once per node."""

    __slots__ = ("_left", "_lock", "_all")

    def __init__(self, expected: int) -> None:
        self._left = expected
        self._lock = threading.Lock()
        self._all = threading.Lock()
        self._all.acquire()
        if expected <= 0:
            self._all.release()

    def one_done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._all.release()

    def wait(self, timeout: float) -> bool:
        return self._all.acquire(timeout=max(0.0, timeout))


class _Slot:
    """One request in flight: completed exactly once, by its reply or by the channel's death."""

    __slots__ = ("reply", "gone", "sent_at", "_wake", "_batch")

    def __init__(self, batch: _Batch | None = None) -> None:
        self.reply: dict[str, Any] | None = None
        self.gone: str | None = None
        self.sent_at = 0.0
        self._batch = batch
        if batch is None:  # a bare lock: cheaper to wait on and to wake than an Event
            self._wake = threading.Lock()
            self._wake.acquire()

    def complete(self) -> None:
        if self._batch is None:
            self._wake.release()
        else:
            self._batch.one_done()

    def wait(self, timeout: float) -> bool:
        return self._wake.acquire(timeout=max(0.0, timeout))


class _ReplyFeed:
    """Stands in for a paramiko channel's ``in_buffer`` (a ``BufferedPipe``).

    paramiko's transport thread calls ``feed`` with each packet of the agent's
    stdout and ``close`` at EOF or when the connection dies; the agent's replies
    are dispatched right there. What ``Channel.recv`` would otherwise do with the
    bytes it consumed, tell the server the window has room again, is done here
    too, on a short-lived thread (a ``WINDOW_ADJUST`` goes out every ~10% of the
    window, 200 KiB by default): the transport thread must never wait to send,
    since during a key exchange only it can let a sender through.
    """

    def __init__(self, agent: AgentChannel) -> None:
        self.agent = agent

    @staticmethod
    def fits(chan: Any) -> bool:
        try:
            from paramiko import Channel
            from paramiko.buffered_pipe import BufferedPipe
        except ImportError:
            return False
        return isinstance(chan, Channel) and type(getattr(chan, "in_buffer", None)) is BufferedPipe

    def feed(self, data: bytes) -> None:
        try:
            self.agent._feed(data)
            room = self.agent.chan._check_add_window(len(data))
            if room:
                threading.Thread(target=self._adjust_window, args=(room,), daemon=True).start()
        except Exception as exc:  # noqa: BLE001 - never let an exception end paramiko's transport thread
            self.agent._die(f"bad data from the agent: {exc}")

    def _adjust_window(self, room: int) -> None:
        from paramiko.common import cMSG_CHANNEL_WINDOW_ADJUST
        from paramiko.message import Message

        chan = self.agent.chan
        m = Message()
        m.add_byte(cMSG_CHANNEL_WINDOW_ADJUST)
        m.add_int(chan.remote_chanid)
        m.add_int(room)
        try:
            chan.transport._send_user_message(m)
        except Exception:  # noqa: BLE001 - a connection going away is noticed by close()
            pass

    def close(self) -> None:
        chan = self.agent.chan
        if not chan.eof_received:  # closed without EOF: the connection went away under the channel
            self.agent._die("connection lost")
            return
        # the caller holds the channel's lock, so read the stderr buffer itself, not recv_stderr
        self.agent._exited(chan.in_stderr_buffer.empty())

    # what else a Channel may ask of its buffer; the agent's bytes never wait here
    def read_ready(self) -> bool:
        return False

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        return b""

    def empty(self) -> bytes:
        return b""

    def set_event(self, event: threading.Event) -> None:
        pass

    def __len__(self) -> int:
        return 0
