"""What a node's kernel offers that faults depend on, checked on the node itself."""

from __future__ import annotations

from chaoskit import nodeside
from chaoskit.cluster.transports.api import Transport

__all__ = ["NETEM_CHECK", "netem_available"]

NETEM_CHECK = nodeside.source("netem_check")
"""A stdlib script (:mod:`chaoskit.nodeside.netem_check`): exit 0 when the kernel has ``sch_netem``."""


def netem_available(transport: Transport, python: str = "python3", timeout: float = 10.0) -> bool:
    """Whether the node's kernel has ``sch_netem`` (loaded, or a module that can be)."""
    res = transport.run([python, "-c", NETEM_CHECK], timeout)
    return res.returncode == 0
