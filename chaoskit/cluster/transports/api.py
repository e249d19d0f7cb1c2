"""The transport contract: how chaoskit acts on one node.

Every value that reaches a shell goes through :func:`shell_quote` after being
validated by the fault that produced it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

__all__ = ["ProcInfo", "CommandResult", "Transport", "shell_quote"]


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


class Transport(Protocol):
    """What a fault may do on a node. Implementations: local (here), ssh, ray, docker."""

    node: str

    def processes(self) -> list[ProcInfo]:
        """Processes that belong to this node (its scope), never others."""

    def signal(self, pid: int, signum: int) -> float:
        """Send ``signum`` to ``pid`` (which must be in scope); return the time it was sent, on the node."""

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        """Run one command with a hard deadline."""

    def spawn_detached(self, argv: list[str]) -> int:
        """Start a process that outlives the controller (its own session); return its pid."""

    def touch(self, path: str) -> None:
        """Update a file's mtime (lease renewal)."""


def shell_quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)
