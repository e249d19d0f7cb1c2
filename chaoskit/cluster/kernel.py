"""What a node's kernel offers that faults depend on, checked on the node itself."""

from __future__ import annotations

from pathlib import Path

from chaoskit import nodeside
from chaoskit.cluster.transports.api import Transport

__all__ = ["NETEM_CHECK", "netem_available", "local_mounts"]

NETEM_CHECK = nodeside.source("netem_check")
"""A stdlib script (:mod:`chaoskit.nodeside.netem_check`): exit 0 when the kernel has ``sch_netem``."""


def netem_available(transport: Transport, python: str = "python3", timeout: float = 10.0) -> bool:
    """Whether the node's kernel has ``sch_netem`` (loaded, or a module that can be)."""
    res = transport.run([python, "-c", NETEM_CHECK], timeout)
    return res.returncode == 0


def local_mounts() -> list[list[str]]:
    """This machine's mounts (``/proc/self/mounts``), each as its fields: source, target (a space in it as
    ``\\040``), type, options, ...; none when it cannot be read."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [line.split() for line in lines]
