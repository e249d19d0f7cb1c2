"""The transport contract: how chaoskit acts on one node.

Every value that reaches a shell goes through :func:`chaoskit.core.shell.shell_quote`
after being validated by the fault that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import math
import threading
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

from chaoskit.core.errors import InfraError

__all__ = [
    "ProcInfo", "rank_processes", "JobScope", "CommandResult", "Transport", "WatchdogHost", "FileFollower", "FollowStream", "LineBatch",
    "KmsgBatch", "KernelLogFollower", "PROC_ENV_KEYS", "PROC_ENV_PREFIXES", "proc_env", "ProcessStreamer", "WatchMessage",
    "StreamUnsupported", "GpuEventStreamer", "NvmlBatch", "InventorySite", "ListedNode",
]

LineBatch = Callable[[list[tuple[float, str]], "int | None", int], None]
"""``(lines, inode, offset)``: lines as (time read on the controller's clock, text), and where the file was left."""

WatchMessage = Callable[[int, float, list[dict[str, Any]]], None]
"""``(seq, t, changes)``: one message of a node's process watch, its time and every change's ``t`` on the
controller's clock; no changes: a heartbeat."""


class StreamUnsupported(InfraError):
    """The node's transport cannot stream (no agent on this connection): poll it instead."""


PROC_ENV_KEYS = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID",
})
PROC_ENV_PREFIXES = ("TORCHELASTIC_", "CHAOSKIT_")
"""The only environment variables of a node's processes that travel to the controller: what chaoskit reads
(ranks, torchrun's run id and restart count, the GPU a worker uses, the Slurm job, chaoskit's own marks).
Everything else (other users' tokens and passwords) stays on the node. The node's agent keeps its own
copy of this list (it is standard library only); a test holds the two equal."""


def proc_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` reduced to :data:`PROC_ENV_KEYS` and :data:`PROC_ENV_PREFIXES`."""
    return {k: v for k, v in env.items() if k in PROC_ENV_KEYS or k.startswith(PROC_ENV_PREFIXES)}


@dataclass(frozen=True)
class ProcInfo:
    """One process on a node, as a fault selector sees it (its environment reduced by :func:`proc_env`)."""

    pid: int
    ppid: int
    cmdline: str
    env: dict[str, str]
    state: str = "?"
    uid: int | None = None
    """Its user id where the transport reads it: the real uid (``/proc/PID/status``) from a node's agent, the
    owner of ``/proc/PID`` on this machine."""
    start_time: int | None = None
    """When it started (``/proc/PID/stat`` field 22, clock ticks since boot): with the pid, who it is. A signal
    that carries it is refused once the pid names another process."""

    @property
    def run_id(self) -> str | None:
        """torchrun's run id (the rendezvous id) of a worker."""
        return self.env.get("TORCHELASTIC_RUN_ID")

    @property
    def slurm_job(self) -> str | None:
        return self.env.get("SLURM_JOB_ID")

    @property
    def rank(self) -> int | None:
        value = self.env.get("RANK")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def is_worker(self) -> bool:
        """A training worker started by a torchrun agent."""
        return "TORCHELASTIC_RUN_ID" in self.env and self.rank is not None


def rank_processes(procs: list[ProcInfo]) -> list[ProcInfo]:
    """The workers of one node's process table that are ranks. A worker's helpers inherit its environment, ``RANK``
    and torchrun's marks included: a DataLoader worker (its child), the monitor process of NVRx's in-process
    Wrapper (a daemon: it leaves its parent). Each starts after the rank that made it, so of the workers of one
    rank, run and restart the rank is the first started (then the lowest pid); the others are left out: a fault
    on "rank 1" is on its training process."""
    first: dict[tuple[Any, ...], ProcInfo] = {}
    for p in procs:
        if not p.is_worker or p.state == "Z":
            continue
        key = (p.rank, p.run_id, p.env.get("TORCHELASTIC_RESTART_COUNT"))
        held = first.get(key)
        if held is None or _started(p) < _started(held):
            first[key] = p
    ranks = {id(p) for p in first.values()}
    return [p for p in procs if id(p) in ranks]


def _started(p: ProcInfo) -> tuple[float, int]:
    return (p.start_time if p.start_time is not None else math.inf, p.pid)


@dataclass(frozen=True)
class JobScope:
    """The drilled job on a node: what only its processes have. The node's agent (or, on this machine, the
    local transport) enforces it: a process outside it is never listed, signalled, throttled or killed.

    A process is the job's when it carries every mark given (torchrun's ``TORCHELASTIC_RUN_ID``, its real
    uid, Slurm's ``SLURM_JOB_ID``), or when it is the torchrun agent of such a worker: the worker's parent,
    with the same uid and Slurm job (torchrun sets the run id for its workers, not for itself), or an
    agent seen so before (``agents``: its pid and start time on this node, so that it stays the job's
    while it restarts its workers). ``pending``: the job is not chosen yet, so nothing is in scope."""

    run_id: str | None = None
    uid: int | None = None
    slurm_job: str | None = None
    pending: bool = False
    agents: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def of(cls, proc: ProcInfo) -> "JobScope":
        """The job a worker belongs to."""
        return cls(proc.run_id, proc.uid, proc.slurm_job)

    def wire(self) -> dict[str, Any]:
        """What travels to the node's agent with every request."""
        return {"run_id": self.run_id, "uid": self.uid, "slurm_job": self.slurm_job, "pending": self.pending,
                "agents": sorted([pid, start] for pid, start in self.agents)}

    @classmethod
    def from_wire(cls, job: dict[str, Any]) -> "JobScope":
        return cls(job.get("run_id"), job.get("uid"), job.get("slurm_job"), bool(job.get("pending")),
                   frozenset((int(a), int(b)) for a, b in job.get("agents") or ()))

    def owned(self, proc: ProcInfo) -> bool:
        """Same uid and Slurm job as the job (where it names them)."""
        return ((self.uid is None or proc.uid == self.uid)
                and (self.slurm_job is None or proc.slurm_job == self.slurm_job))

    def carries(self, proc: ProcInfo) -> bool:
        """Whether ``proc`` itself carries every mark of the job."""
        if self.pending:
            return False
        return self.owned(proc) and (self.run_id is None or proc.run_id == self.run_id)

    def select(self, procs: list[ProcInfo]) -> list[ProcInfo]:
        """The job's processes among ``procs`` (the node's): those that carry its marks, and their torchrun agents."""
        if self.pending:
            return []
        parents = {p.ppid for p in procs if self.carries(p) and p.rank is not None}
        return [p for p in procs if self.carries(p) or (self.owned(p) and (
            p.pid in parents or (p.pid, p.start_time) in self.agents))]

    def with_agents(self, procs: list[ProcInfo]) -> "JobScope":
        """This scope, remembering the torchrun agents among ``procs`` (the job's, on one node)."""
        agents = {(p.pid, p.start_time) for p in procs if not self.carries(p) and p.start_time is not None}
        return self if agents <= self.agents else replace(self, agents=self.agents | agents)

    def describe(self) -> str:
        if self.pending:
            return "no job chosen yet"
        parts = [f"run id {self.run_id}" if self.run_id is not None else None,
                 f"uid {self.uid}" if self.uid is not None else None,
                 f"Slurm job {self.slurm_job}" if self.slurm_job is not None else None]
        return ", ".join(p for p in parts if p) or "any process of the node"


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    finished_at: float | None = None
    """When the command returned on the node, on the controller's clock (the node's, corrected by its measured
    offset), where the transport knows it (a fault's ``t_fault``)."""


class Transport(Protocol):
    """What a fault may do on a node. Implementations: local (here), ssh, ray, docker."""

    node: str
    has_own_network: ClassVar[bool]
    """True when the node has a network stack of its own, so a NIC fault there cannot hit the controller's."""
    has_own_clock: ClassVar[bool]
    """True when the node keeps a clock of its own (:class:`~chaoskit.cluster.clock.ClockedTransport`): a run
    measures its offset before anything starts and the transport reports node times corrected."""
    processes_here: ClassVar[bool]
    """True when the node's processes are this machine's, read from its ``/proc`` without connecting (a process
    lab's node): a dry run counts what a ``process`` regex matches outside the job there."""
    container: str | None
    """The container that is this node, when an engine runs it (``network.partition`` with ``method: disconnect``)."""
    state_dir: str
    """chaoskit's state folder on the node (:mod:`chaoskit.nodeside.nodefs`: made by chaoskit, checked: owner, mode,
    not a link), where faults keep their node-side files; reading it may connect. Raises
    :class:`~chaoskit.core.errors.InfraError` when the node refused the folder."""

    def connect(self) -> object:
        """Open the connection now (host key verified, agent started); idempotent. Commands connect on first use anyway."""

    def ping(self, timeout: float = 5.0) -> float:
        """One round trip: the node's clock (``time.time()`` there); :class:`~chaoskit.core.errors.InfraError`
        when the node does not answer."""

    def close(self) -> None:
        """Drop the connection (the node's sessions died, e.g. with its power); the next command reconnects."""

    job: JobScope | None
    """The drilled job's scope on this node (``None``: every process of the node's own scope is the job's,
    as on a lab node chaoskit made for it). Set by the job runner once it knows the job (attach)."""

    def processes(self, workers_only: bool = False, *, node_wide: bool = False) -> list[ProcInfo]:
        """Processes that belong to this node's scope and to the drilled job (:attr:`job`), never others;
        with ``workers_only``, only torchrun's training workers (:attr:`ProcInfo.is_worker`), which is what the
        process probe polls. ``node_wide``: the node's whole scope, whatever the job (attach looks for its job
        there, ``doctor`` counts what a selector would match outside the job); never used to act on a process."""

    def signal(self, pid: int, signum: int, start_time: int | None = None) -> float:
        """Send ``signum`` to ``pid`` (which must be in scope, and, with ``start_time``, still the process that
        started then: a reused pid is refused); return when it was sent on the node, on the controller's clock."""

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        """Run one command with a hard deadline."""

    def spawn_detached(self, argv: list[str]) -> int:
        """Start a process that outlives the controller (its own session); return its pid."""

    def touch(self, path: str) -> None:
        """Update a file's mtime (lease renewal)."""

    def in_scope(self, pid: int) -> bool:
        """True when ``pid`` is a live process of this node."""

    def state(self, pid: int) -> str | None:
        """One-letter process state (R, S, T when stopped, Z) or ``None`` when gone or out of scope."""


@runtime_checkable
class WatchdogHost(Protocol):
    """A transport that starts lease watchdogs itself (the node is remote, so the
    controller's paths mean nothing there). :class:`~chaoskit.safety.lease.LeaseManager`
    uses it when the transport has these methods, else spawns the local watchdog."""

    def start_watchdog(self, lease_id: str, ttl: float, duration: float, revert: list[str], source: str) -> tuple[str, int]:
        """Ship the watchdog (``source``: one self-contained program, :func:`chaoskit.nodeside.watchdog.watchdog_source`)
        to the node's state folder and start it there with ``python3 -I``; return (its lease directory there, its pid)
        once it watches.

        The fault's deadline is ``duration`` from now on the node's own clock.
        """

    def cleanup_leases(self, run_id: str) -> None:
        """Remove the node-side lease directories of one run."""


class FollowStream(Protocol):
    """A file being followed on a node."""

    done: threading.Event
    """Set when the stream ended: cancelled, or its connection dropped."""
    error: str | None
    """Why it ended, when it was not cancelled."""

    def cancel(self) -> None: ...

    # A stream may also have ``last_heard``: ``time.monotonic()`` when its node last sent anything.


@runtime_checkable
class FileFollower(Protocol):
    """A transport that follows a file on its node (the node's agent reads it there)."""

    def follow(self, path: str, on_batch: LineBatch, *, inode: int | None = None, offset: int = 0,
               interval: float = 0.02, roots: list[str] | None = None) -> FollowStream:
        """Stream the complete lines of ``path`` from ``inode``/``offset`` (where an earlier stream stopped), across
        rotation and truncation; each batch with the position after it. ``roots``: the folders the file must
        really lie in (the site policy's log roots, links resolved where the file is read)."""


@runtime_checkable
class ProcessStreamer(Protocol):
    """A transport whose node watches its own processes and pushes the changes (the agent's ``watch``)."""

    def watch_processes(self, on_message: WatchMessage, *, known: list[tuple[int, int | None, str]] | None = None,
                        interval: float = 0.25, heartbeat: float = 1.0, beats: bool = True) -> FollowStream:
        """Stream the changes of the drilled job's training workers on the node: each message
        ``(seq, t, changes)``, a change ``{"ev": "appeared" | "stopped" | "resumed" | "zombie" | "exited",
        "pid", "start", "rank", "t", ...}``; a message without changes is the node's heartbeat (about every
        ``heartbeat`` seconds, the first at once). ``known``: the workers (pid, start time, state) believed
        alive, from an earlier stream: what changed since comes in the first message. ``beats=False``: the
        heartbeats are not delivered (no callback, no thread hand-off per node per second); the returned
        stream's ``last_heard`` (``time.monotonic()`` of the last bytes the node sent) says when it last
        spoke. Raises :class:`StreamUnsupported` when this connection cannot stream."""


@dataclass
class KmsgBatch:
    """Records of a node's kernel log, as a ``kmsg`` stream delivers them (:class:`KernelLogFollower`)."""

    records: list[tuple[float, int, int, str]]
    """(time logged, on this machine's clock; seq; priority; text), in the log's order."""
    seq: int | None
    """The last record the stream read (matched or not): where a new stream goes on."""
    boot_id: str | None = None
    """The node's kernel (``/proc/sys/kernel/random/boot_id``), on the first batch of a stream: nodes that share
    one kernel (the labs) share it."""
    lost: int = 0
    """Records the ring buffer overwrote before the stream read them (since the stream started)."""
    started: bool = False


@runtime_checkable
class KernelLogFollower(Protocol):
    """A transport whose node's agent follows the node's own kernel log."""

    def kmsg(self, on_batch: "Callable[[KmsgBatch], None]", *, seq: int | None = None,
             match: list[str] | None = None) -> FollowStream:
        """Stream the records of the node's ``/dev/kmsg`` that contain one of ``match``: from after ``seq`` (where
        an earlier stream stopped) or from now on; the first batch (``started``) once the stream reads."""


@dataclass
class NvmlBatch:
    """What a node's ``nvml`` stream says (:class:`GpuEventStreamer`): first its GPUs, then their events."""

    events: list[tuple[float, int | None, str | None, str, int]]
    """(time on this machine's clock, GPU index, PCI bus id, ``"xid"`` or ``"ecc"``, the Xid or 0)."""
    gpus: list[tuple[int, str | None]] | None = None
    """The GPUs that take events (index, PCI bus id): in the first batch (``started``)."""
    started: bool = False


@runtime_checkable
class GpuEventStreamer(Protocol):
    """A transport whose node's agent reads the node's GPUs through NVML (``libnvidia-ml.so.1``, loaded there)."""

    def nvml(self, on_batch: "Callable[[NvmlBatch], None]") -> FollowStream:
        """Stream the node's Xid and uncorrectable ECC events, each with the node's time put on this machine's
        clock; the stream fails at once (``error``) where NVML does not load or no GPU takes events."""


@dataclass
class InventorySite:
    """What a transport class is given to build a node an inventory file lists
    (``from_inventory(site, index, spec)``, called by :func:`chaoskit.cluster.inventory_file.build_inventory`)."""

    base: Path
    """The inventory file's folder: relative paths in it are relative to this."""
    ssh_for: Callable[[Any], Any]
    """A node's effective SSH settings (its own over the file's)."""
    error: Callable[..., Exception]
    """``error(message, *path)``: the file's error at that path (``file:line:col``)."""
    bastions: Any = None
    """The SSH bastions of the file (:class:`~chaoskit.cluster.transports.ssh_route.Bastions`), made first."""
    ssh_roots: list[str] | None = None
    """Where this machine's SSH files may lie (:mod:`chaoskit.cluster.ssh_paths`)."""
    trust_on_first_use: bool | None = None
    """The command line's override of the file's ``trust_on_first_use`` (``None``: the file's)."""
    vet_python: bool = False
    """The site policy names the agent's Python: check it on each node before it first runs."""
    discovered: dict[str, tuple[dict[str, str], Any]] = field(default_factory=dict)
    """Nodes a cluster manager listed (Ray's), by name: (labels, transport); a listed node takes its own out."""


@dataclass
class ListedNode:
    """What a transport class made of an inventory file's node: its transport, its labels, and the SSH settings
    it keeps (``None`` for a node not reached over SSH)."""

    conn: Any
    labels: dict[str, str]
    ssh: Any = None
