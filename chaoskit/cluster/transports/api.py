"""The transport contract: how chaoskit acts on one node.

Every value that reaches a shell goes through :func:`chaoskit.core.shell.shell_quote`
after being validated by the fault that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
import threading
from typing import Callable, ClassVar, Protocol, runtime_checkable

__all__ = ["ProcInfo", "CommandResult", "Transport", "WatchdogHost", "FileFollower", "FollowStream", "LineBatch"]

LineBatch = Callable[[list[tuple[float, str]], "int | None", int], None]
"""``(lines, inode, offset)``: lines as (time read on the controller's clock, text), and where the file was left."""


@dataclass(frozen=True)
class ProcInfo:
    """One process on a node, as a fault selector sees it."""

    pid: int
    ppid: int
    cmdline: str
    env: dict[str, str]
    state: str = "?"

    @property
    def rank(self) -> int | None:
        value = self.env.get("RANK")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def is_worker(self) -> bool:
        """A training worker started by a torchrun agent."""
        return "TORCHELASTIC_RUN_ID" in self.env and self.rank is not None


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
    container: str | None
    """The container that is this node, when an engine runs it (``network.partition`` with ``method: disconnect``)."""
    state_dir: str
    """chaoskit's state folder on the node (:mod:`chaoskit.cluster.nodefs`: made by chaoskit, checked: owner, mode,
    not a link), where faults keep their node-side files; reading it may connect. Raises
    :class:`~chaoskit.core.errors.InfraError` when the node refused the folder."""

    def connect(self) -> object:
        """Open the connection now (host key verified, agent started); idempotent. Commands connect on first use anyway."""

    def ping(self, timeout: float = 5.0) -> float:
        """One round trip: the node's clock (``time.time()`` there); :class:`~chaoskit.core.errors.InfraError`
        when the node does not answer."""

    def close(self) -> None:
        """Drop the connection (the node's sessions died, e.g. with its power); the next command reconnects."""

    def processes(self, workers_only: bool = False) -> list[ProcInfo]:
        """Processes that belong to this node (its scope), never others; with ``workers_only``, only
        torchrun's training workers (:attr:`ProcInfo.is_worker`), which is what the process probe polls."""

    def signal(self, pid: int, signum: int) -> float:
        """Send ``signum`` to ``pid`` (which must be in scope); return when it was sent on the node, on the controller's clock."""

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
        """Ship the watchdog (``source``: one self-contained program, :func:`chaoskit.safety.watchdog.watchdog_source`)
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


@runtime_checkable
class FileFollower(Protocol):
    """A transport that follows a file on its node (the node's agent reads it there)."""

    def follow(self, path: str, on_batch: LineBatch, *, inode: int | None = None, offset: int = 0,
               interval: float = 0.02, roots: list[str] | None = None) -> FollowStream:
        """Stream the complete lines of ``path`` from ``inode``/``offset`` (where an earlier stream stopped), across
        rotation and truncation; each batch with the position after it. ``roots``: the folders the file must
        really lie in (the site policy's log roots, links resolved where the file is read)."""
