"""What the SSH and docker transports share: a node reached through chaoskit's agent over one channel.

:class:`AgentTransport` holds the contract both keep (see :mod:`.ssh` for it in full): the first command starts
the agent (:mod:`chaoskit.nodeside.agent`) over one channel (:class:`~.channel.AgentChannel`) and later ones travel over
it as JSON requests with ids and deadlines; a dead agent is restarted, and after :data:`AGENT_RESTARTS` failed
starts in a row the transport falls back to one exec per command; every request has a deadline on the node and
on the client (``timeout + GRACE_S``); times the node reports come back on the controller's clock; the agent
keeps chaoskit's node-side files in a state folder it checked; argv travels as a JSON list, checked for control
characters (:func:`checked_argv`). The four streams (:meth:`AgentTransport.follow`,
:meth:`AgentTransport.watch_processes`, :meth:`AgentTransport.nvml`, :meth:`AgentTransport.kmsg`) are one shape:
a request that answers many times, each answer turned into the caller's batch on the controller's clock.

A subclass says how its channel is opened and nothing else: :attr:`AgentTransport.connected`,
``_open_client`` (the connection), ``_start_agent`` (one channel running the agent), ``_exec`` (one command
line, for the fallback), and where it has one a reason the agent did not start (``_refusal``, SSH's sudo).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from typing import Any, Callable, Iterable, Mapping

from chaoskit.cluster.clock import SAMPLES, ClockOffset, measure_clock
from chaoskit.cluster.transports.api import (
    CommandResult, FollowStream, JobScope, KmsgBatch, LineBatch, NvmlBatch, ProcInfo, StreamUnsupported, WatchMessage,
)
from chaoskit.cluster.transports.channel import (
    AgentChannel, AgentGone, AgentStream, DeadlineMissed, OpFailed, agent_program, boot_argv, start_stream,
)
from chaoskit.core.errors import InfraError, OutcomeUnknown, TargetGone
from chaoskit.core.shell import shell_quote

__all__ = [
    "AgentTransport",
    "AGENT_RESTARTS",
    "GRACE_S",
    "IDEMPOTENT_OPS",
    "TEST_SKEW_ENV",
    "checked_argv",
]

GRACE_S = 2.0
"""Client-side slack beyond a command's own timeout before the client gives up on it."""
AGENT_RESTARTS = 3
"""Failed agent starts in a row before the transport falls back to one exec per command."""
IDEMPOTENT_OPS = frozenset({"ping", "touch", "read", "write", "procs", "state", "rmtree", "statedir"})
"""Requests safe to send again when the connection died after they left."""
TEST_SKEW_ENV = "CHAOSKIT_TEST_CLOCK_SKEW"
"""Tests only: ``n1=7.5,n2=-3`` shifts the clock those nodes' agents report (a lab on one machine has one clock)."""
_LEASE_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class AgentTransport:
    """One node reached through chaoskit's agent over one channel (see the module docstring); a subclass opens
    the channel."""

    has_own_network = True
    has_own_clock = True  # measured by sync_clock
    processes_here = False
    container: str | None = None
    role = "node"
    """How errors name this host (``node``; SSH's bastions say ``bastion``)."""

    def __init__(
        self,
        node: str,
        *,
        python: str = "python3",
        workdir: str | None = None,
        process_scope: str = "all",
        scope_token: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        use_agent: bool = True,
    ) -> None:
        self.node = node
        self.python = python
        self._workdir = workdir
        """The inventory's ``workdir`` (``None``: the agent's default); the agent checks it like its default."""
        self._state_dir: str | None = None
        self._program: bytes | None = None
        self.node_scope = {"netns": process_scope == "netns", "env": scope_token}
        """Which processes are the node's: those in the agent's network namespace and/or with this CHAOSKIT_SCOPE."""
        self.job: JobScope | None = None
        """The drilled job's scope (:class:`~.api.JobScope`); the agent enforces it on every request."""
        self.connect_timeout = float(connect_timeout)
        self.command_timeout = float(command_timeout)
        self.use_agent = use_agent
        self.mode = "agent" if use_agent else "exec"
        """``agent`` (one channel, JSON requests) or ``exec`` (one exec per command)."""
        self.notes: list[str] = []
        self._client: Any = None
        self._agent: AgentChannel | None = None
        self._agent_failures = 0
        self._lock = threading.RLock()
        self._watchdog_path: str | None = None
        self.clock = ClockOffset()
        """The node's clock against this machine's; zero until :meth:`sync_clock` measured it."""

    @property
    def scope(self) -> dict[str, Any]:
        """The scope every request carries: the node's, and the drilled job's within it."""
        return {**self.node_scope, "job": self.job.wire() if self.job is not None else None}

    @property
    def label(self) -> str:
        """How messages name this host: ``node n0``, ``bastion gw``."""
        return f"{self.role} {self.node}"

    @property
    def runs_as(self) -> str:
        """The user the agent runs as on the node (what a state folder must belong to)."""
        return "root"

    # -- what a subclass provides -------------------------------------------------------

    @property
    def connected(self) -> bool:
        raise NotImplementedError

    def _open_client(self) -> Any:
        """The connection (an SSH client, the docker engine's API client)."""
        raise NotImplementedError

    def _start_agent(self) -> AgentChannel:
        """One channel running the agent, checked (:meth:`_checked_agent`)."""
        raise NotImplementedError

    def _exec(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """One shell command line (already quoted) with a client-side deadline: (exit status, stdout, stderr)."""
        raise NotImplementedError

    def _refusal(self, failure: str) -> InfraError | None:
        """Why the agent did not start, when the node refused it outright (no restart helps), else ``None``."""
        return None

    def _refused_exec(self, rc: int, out: str, err: str) -> None:
        """Raise when an exec's result says the node refused to run it at all (SSH: sudo)."""

    def _remote(self, argv: list[str]) -> str:
        """``argv`` as the command line an exec runs on the node."""
        return shell_quote(argv)

    # -- connection ---------------------------------------------------------------------

    def connect(self) -> "AgentTransport":
        """Open the connection and start the agent; idempotent."""
        with self._lock:
            self._connect_locked()
            if self.mode == "agent":
                try:
                    self._agent_locked()
                except AgentGone as exc:  # the next command retries, then falls back to exec
                    self.notes.append(f"the agent on {self.node} did not start: {exc}")
        return self

    def close(self) -> None:
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        """Close the agent channel and the connection (the caller holds the lock)."""
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - a connection already gone cannot be closed twice
                pass
            self._client = None

    def __enter__(self) -> "AgentTransport":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running_agent(self) -> AgentChannel | None:
        """The agent's channel when one is running now (nothing connected or started here), else ``None``:
        what a fan-out writes its request straight onto (:func:`chaoskit.cluster.transports.ssh_many.run_many`)."""
        agent = self._agent
        return agent if self.mode == "agent" and agent is not None and not agent.dead else None

    def _connect_locked(self) -> None:
        if self.connected:
            return
        self._drop_locked()
        self._client = self._open_client()

    # -- the agent ------------------------------------------------------------------------

    def _boot_command(self, timeout: float | None = None) -> str:
        """The command line that starts the agent (under ``timeout -k`` when one request is all it serves)."""
        argv = boot_argv(self.python)
        if timeout is not None:
            argv = ["timeout", "-k", "2", f"{max(timeout, 0.1):.3f}", *argv]
        return self._remote(argv)

    def _agent_locked(self) -> "AgentChannel | None":
        if self.mode != "agent":
            return None
        if self._agent is not None and not self._agent.dead:
            if self.connected:
                return self._agent
            self._agent.close()  # the connection under it is gone (a bastion dropped): a new one, a new agent
            self._agent = None
        self._connect_locked()
        try:
            self._agent = self._start_agent()
            self._agent_failures = 0
            skew = _test_skew().get(self.node)
            if skew is not None:
                self._agent.request({"op": "skew", "seconds": skew}, self.connect_timeout)
        except AgentGone as exc:
            self._agent = None
            refused = self._refusal(str(exc))
            if refused is not None:
                raise refused from None
            self._agent_failures += 1
            if self._agent_failures >= AGENT_RESTARTS:
                self.mode = "exec"
                self.notes.append(f"agent on {self.node} failed {AGENT_RESTARTS} times ({exc}); one exec per command from now on")
            raise
        return self._agent

    @property
    def program(self) -> bytes:
        """What the agent runs on this node (:func:`agent_program` with this node's ``workdir``)."""
        if self._program is None:
            self._program = agent_program(self._workdir)
        return self._program

    def _checked_agent(self, agent: "AgentChannel") -> "AgentChannel":
        """``agent``, once its hello names the state folder it checked; else it is closed and the node refused."""
        refused = agent.hello.get("state_error")
        if refused or not agent.hello.get("state_dir"):
            agent.close()
            raise InfraError(f"{self.label}: {refused or 'the agent named no state folder'}",
                             hint="chaoskit keeps its node-side files only in a folder it made: remove the one above "
                                  "(it is not chaoskit's), or point the inventory's workdir at a folder of the "
                                  f"user chaoskit runs as ({self.runs_as}) that only it can write")
        self._state_dir = agent.hello["state_dir"]
        return agent

    @property
    def state_dir(self) -> str:
        """chaoskit's state folder on the node, as the agent checked it (connects when needed)."""
        if self._state_dir is None:
            reply = self._request("statedir", self.command_timeout)
            self._state_dir = str(reply["state_dir"])
        return self._state_dir

    @property
    def workdir(self) -> str:
        """Where chaoskit's files are on the node: :attr:`state_dir`."""
        return self.state_dir

    def _call(self, op: str, timeout: float, /, **fields: Any) -> dict[str, Any]:
        """One request with a client-side deadline of ``timeout`` (plus grace).

        Without a working agent: ``run`` becomes one plain exec, anything else one
        exec of the agent serving just that request.
        """
        fields["op"] = op
        for _ in range(2):
            try:
                with self._lock:
                    agent = self._agent_locked()
            except AgentGone:
                continue
            if agent is None:
                break
            try:
                return agent.request(fields, timeout + GRACE_S)
            except AgentGone as exc:
                with self._lock:
                    if self._agent is agent:
                        self._agent = None
                if exc.sent and op not in IDEMPOTENT_OPS:
                    raise OutcomeUnknown(
                        f"{_describe(fields)}: the connection to node {self.node} was lost while it ran ({exc}); "
                        "its outcome is unknown"
                    ) from None
                continue
            except DeadlineMissed as exc:
                if exc.silent:  # nothing at all came back since the request left: wedged agent or dead link
                    with self._lock:
                        if self._agent is agent:
                            agent.close()
                            self._agent = None
                message = f"{_describe(fields)}: no answer from node {self.node} within {timeout:g}s"
                if op not in IDEMPOTENT_OPS:  # it was sent: it may have run
                    raise OutcomeUnknown(message + "; its outcome is unknown") from None
                raise InfraError(message) from None
        if op == "run":
            return self._exec_run(fields["argv"], float(fields["timeout"]))
        return self._oneshot(fields, timeout)

    def _exec_run(self, argv: list[str], timeout: float) -> dict[str, Any]:
        rc, out, err = self._exec(self._remote(["timeout", "-k", "2", f"{max(timeout, 0.1):.3f}", *argv]), timeout)
        self._refused_exec(rc, out, err)
        return {"rc": rc, "stdout": out, "stderr": err, "t": None, "timed_out": rc == 124}

    def _oneshot(self, fields: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The fallback: one exec running the agent for exactly one request."""
        request = (json.dumps({"id": 1, **fields}) + "\n").encode()
        stdin = f"{len(self.program)}\n".encode() + self.program + request
        rc, out, err = self._exec(self._boot_command(timeout), timeout, stdin=stdin)
        self._refused_exec(rc, out, err)
        for line in out.splitlines():
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if reply.get("id") == 1:
                if not reply.get("ok"):
                    raise OpFailed(reply.get("error", "failed"))
                return reply
        raise InfraError(f"{_describe(fields)} on node {self.node} failed (exit {rc}): {err.strip()[-300:] or 'no output'}")

    # -- the Transport protocol ----------------------------------------------------------

    def run(self, argv: list[str], timeout: float | None = None) -> CommandResult:
        """Run ``argv`` on the node (no shell) with a hard deadline; raise InfraError when it misses it."""
        argv = checked_argv(argv)
        timeout = self.command_timeout if timeout is None else float(timeout)
        try:
            reply = self._call("run", timeout, argv=argv, timeout=timeout)
        except OpFailed as exc:
            raise InfraError(f"{argv[0]} on node {self.node}: {exc}") from None
        if reply.get("timed_out"):
            raise InfraError(f"{argv[0]}: no answer within {timeout:g}s on node {self.node}")
        if reply["rc"] == 127 and not reply["stdout"]:
            raise InfraError(f"{argv[0]}: command not found on node {self.node}: {reply['stderr'].strip()}")
        return CommandResult(tuple(argv), reply["rc"], reply["stdout"], reply["stderr"], self.local_time(reply.get("t")))

    def local_time(self, t: float | None) -> float | None:
        """A time the node reported, on this machine's clock (:attr:`clock`); ``None`` stays ``None``."""
        return None if t is None else self.clock.to_controller(float(t))

    def sync_clock(self, samples: int = SAMPLES) -> ClockOffset:
        """Measure the node's clock offset (several agent round trips); later times are corrected by it."""
        self.clock = measure_clock(lambda: self.ping(timeout=self.command_timeout), samples)
        return self.clock

    # -- streams: one shape ----------------------------------------------------------------

    def _stream(self, what: str, fields: dict[str, Any], deliver: Callable[[dict[str, Any]], None], *,
                unsupported: type[Exception] = InfraError, quiet: bool = False) -> "FollowStream":
        """Start the agent's request ``fields`` that answers many times: ``deliver(reply)`` on the channel's
        delivery thread for each answer that went well, until the last (``more`` unset) ends the stream, with
        the agent's error if it failed. ``what`` names the stream in errors ("follow F on node N"): an
        :class:`InfraError` when the agent did not start, ``unsupported`` when this connection fell back to one
        exec per command. ``quiet``: answers ``deliver`` ignores anyway (heartbeats) end where they arrive."""
        try:
            with self._lock:
                agent = self._agent_locked()
        except AgentGone as exc:
            raise InfraError(f"cannot {what}: the agent did not start ({exc})") from None
        if agent is None:
            raise unsupported(f"cannot {what}: it needs chaoskit's agent, and this connection fell back to one exec per command")
        stream = AgentStream(agent)

        def message(reply: dict[str, Any]) -> None:
            if reply.get("ok"):
                deliver(reply)
            if not reply.get("more"):
                stream.finish(None if reply.get("ok") else str(reply.get("error", "failed")))

        stream.rid = start_stream(agent, what, fields, message, stream.finish, quiet=quiet)
        return stream

    def follow(self, path: str, on_batch: LineBatch, *, inode: int | None = None, offset: int = 0,
               interval: float = 0.02, roots: list[str] | None = None) -> "FollowStream":
        """Stream the complete lines of ``path`` on the node, from ``inode``/``offset`` (where an earlier
        stream stopped) or from its start; ``on_batch(lines, inode, offset)`` gets each batch with the
        position after it, each line as (time read, on this machine's clock; text). ``roots``: the
        folders the file must really be in (links resolved on the node), else the stream fails. It ends when
        cancelled or when the connection drops, and says where it stopped so that a new stream picks up there."""
        to_local = self.clock.to_controller

        def deliver(reply: dict[str, Any]) -> None:
            if "lines" in reply:
                on_batch([(to_local(float(t)), text) for t, text in reply["lines"]],
                         reply.get("inode"), int(reply.get("offset", 0)))

        fields = {"op": "follow", "path": checked_argv([path])[0], "inode": inode, "offset": int(offset), "interval": interval}
        if roots is not None:
            fields["roots"] = checked_argv(roots)
        return self._stream(f"follow {path} on node {self.node}", fields, deliver)

    def watch_processes(self, on_message: WatchMessage, *, known: list[tuple[int, int | None, str]] | None = None,
                        interval: float = 0.25, heartbeat: float = 1.0, beats: bool = True) -> "FollowStream":
        """Stream the changes of the node's training workers of the drilled job (the agent's ``watch``):
        ``on_message(seq, t, changes)`` for each message, ``t`` and every change's ``t`` on this machine's
        clock; a message without changes is the node's heartbeat. ``known``: the workers believed alive
        (pid, start time, state) from an earlier stream, so that only what changed since comes back.
        ``beats=False``: heartbeats end on paramiko's thread, where they arrive (the stream's ``last_heard``
        moves on), not on the delivery thread."""
        to_local = self.clock.to_controller

        def deliver(reply: dict[str, Any]) -> None:
            if "changes" in reply:
                changes = [{**c, "t": to_local(float(c["t"]))} for c in reply["changes"]]
                on_message(int(reply.get("seq", 0)), to_local(float(reply["t"])), changes)

        fields = {"op": "watch", "scope": self.scope, "interval": float(interval), "heartbeat": float(heartbeat),
                  "known": [[int(pid), None if start is None else int(start), str(state)] for pid, start, state in known or ()]}
        return self._stream(f"watch the processes of node {self.node}", fields, deliver,
                            unsupported=StreamUnsupported, quiet=not beats)

    def nvml(self, on_batch: Callable[[NvmlBatch], None]) -> "FollowStream":
        """Stream the node's GPU health as its agent reads it through NVML (the agent's ``nvml``): Xid and
        uncorrectable ECC events with the node's time on this machine's clock (:class:`NvmlBatch`)."""
        to_local = self.clock.to_controller

        def deliver(reply: dict[str, Any]) -> None:
            if reply.get("started") or reply.get("events"):
                on_batch(NvmlBatch(
                    [(to_local(float(t)), None if i is None else int(i), None if pci is None else str(pci), str(kind), int(data))
                     for t, i, pci, kind, data in reply.get("events", [])],
                    [(int(i), None if pci is None else str(pci)) for i, pci in reply["gpus"]] if reply.get("gpus") else None,
                    bool(reply.get("started"))))

        return self._stream(f"read the GPUs of node {self.node} through NVML", {"op": "nvml"}, deliver)

    def kmsg(self, on_batch: Callable[[KmsgBatch], None], *, seq: int | None = None,
             match: list[str] | None = None) -> "FollowStream":
        """Stream the node's own kernel log (``/dev/kmsg``, read by its agent): the records containing one of
        ``match``, from after ``seq`` (where an earlier stream stopped) or from now on, each with the time the
        node logged it on this machine's clock (:class:`~chaoskit.cluster.transports.api.KmsgBatch`)."""
        to_local = self.clock.to_controller

        def deliver(reply: dict[str, Any]) -> None:
            if "records" in reply or reply.get("started"):
                on_batch(KmsgBatch(
                    [(to_local(float(t)), int(n), int(prio), str(text)) for t, n, prio, text in reply.get("records", [])],
                    reply.get("seq"), reply.get("boot_id"), int(reply.get("lost") or 0), bool(reply.get("started"))))

        fields: dict[str, Any] = {"op": "kmsg", "seq": None if seq is None else int(seq),
                                  "match": [str(m) for m in (match or [])]}
        return self._stream(f"read the kernel log of node {self.node}", fields, deliver)

    # -- processes, files -------------------------------------------------------------------

    def processes(self, workers_only: bool = False, *, node_wide: bool = False) -> list[ProcInfo]:
        scope = self.node_scope if node_wide else self.scope
        reply = self._request("procs", self.command_timeout, scope=scope, workers=workers_only)
        return [ProcInfo(p["pid"], p["ppid"], p["cmdline"], p["env"], p["state"], p.get("uid"), p.get("start"))
                for p in reply["procs"]]

    def state(self, pid: int, start_time: int | None = None) -> str | None:
        fields: dict[str, Any] = {"pid": int(pid), "scope": self.scope}
        if start_time is not None:
            fields["start"] = int(start_time)
        return self._request("state", self.command_timeout, **fields)["state"]

    def in_scope(self, pid: int) -> bool:
        return self.state(pid) not in (None, "Z")

    def signal(self, pid: int, signum: int, start_time: int | None = None) -> float:
        fields: dict[str, Any] = {"pid": int(pid), "signal": int(signum), "scope": self.scope}
        if start_time is not None:
            fields["start"] = int(start_time)
        try:
            reply = self._call("signal", self.command_timeout, **fields)
        except OpFailed as exc:
            raise (TargetGone if exc.gone else InfraError)(f"refusing to signal pid {pid} on node {self.node}: {exc}") from None
        return self.clock.to_controller(float(reply["t"]))

    def spawn_detached(self, argv: list[str]) -> int:
        return int(self._request("spawn", self.command_timeout, argv=checked_argv(argv))["pid"])

    def touch(self, path: str, timeout: float = 5.0) -> None:
        self._request("touch", timeout, path=checked_argv([path])[0])

    def ping(self, timeout: float = 5.0) -> float:
        """One round trip to the node; return the node's own clock (uncorrected: what :meth:`sync_clock` measures)."""
        return float(self._request("ping", timeout)["t"])

    def write_file(self, path: str, data: str, mode: int = 0o600) -> None:
        self._request("write", self.command_timeout, path=checked_argv([path])[0], data=data, mode=mode)

    def read_file(self, path: str) -> str | None:
        return self._request("read", self.command_timeout, path=checked_argv([path])[0])["data"]

    def _request(self, op: str, timeout: float, /, **fields: Any) -> dict[str, Any]:
        try:
            return self._call(op, timeout, **fields)
        except OpFailed as exc:
            raise InfraError(f"{op} on node {self.node} failed: {exc}") from None

    # -- leases (WatchdogHost) -----------------------------------------------------------

    def lease_dir(self, lease_id: str) -> str:
        if not _LEASE_ID_RE.match(lease_id) or ".." in lease_id.split("/"):
            raise ValueError(f"invalid lease id {lease_id!r}")
        return f"{self.state_dir}/leases/{lease_id}"

    def start_watchdog(self, lease_id: str, ttl: float, duration: float, revert: list[str], source: str) -> tuple[str, int]:
        """Ship the watchdog ``source`` to the node's state folder (once) and start it detached there (``python3 -I``)."""
        directory = self.lease_dir(lease_id)
        if self._watchdog_path is None:
            path = f"{self.state_dir}/watchdog-{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
            self.write_file(path, source, 0o600)
            self._watchdog_path = path
        reply = self._request(
            "watchdog", self.command_timeout, script=self._watchdog_path, lease_dir=directory,
            ttl=float(ttl), duration=float(duration), revert=checked_argv(revert), wait=5,
        )
        return directory, int(reply["pid"])

    def lease_fired(self, directory: str) -> str | None:
        return self.read_file(f"{directory}/fired")

    def cleanup_leases(self, run_id: str) -> None:
        self._request("rmtree", min(5.0, self.command_timeout), path=self.lease_dir(run_id))


def checked_argv(argv: Iterable[Any]) -> list[str]:
    """``argv`` as strings, for a node: a :class:`ValueError` for an empty command or an argument with control
    characters (the values were validated by the fault that built them; this is the last line of defence)."""
    out = [str(a) for a in argv]
    if not out:
        raise ValueError("empty command")
    for a in out:
        if _CONTROL_RE.search(a):
            raise ValueError(f"refusing a command argument with control characters: {a!r}")
    return out


def _test_skew() -> dict[str, float]:
    spec = os.environ.get(TEST_SKEW_ENV, "")
    out = {}
    for item in filter(None, spec.split(",")):
        node, _, seconds = item.partition("=")
        out[node.strip()] = float(seconds)
    return out


def _describe(fields: Mapping[str, Any]) -> str:
    if fields.get("op") == "run":
        return str(fields.get("argv", ["?"])[0])
    return str(fields.get("op"))
