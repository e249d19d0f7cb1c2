"""Fault kinds by name, loaded from the ``chaoskit.faults`` entry-point group.

Built-in kinds are declared in ``pyproject.toml`` the same way a plugin declares
its own, so the extension path is the one used every day. When chaoskit runs
from a source tree that was never installed, the built-ins are loaded directly.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

from chaoskit.faults.api import Fault

__all__ = ["fault_kinds", "get_fault", "GROUP"]

GROUP = "chaoskit.faults"

_BUILTIN = {
    "process.kill": "chaoskit.faults.process:KillFault",
    "process.hang": "chaoskit.faults.process:HangFault",
    "network.link_down": "chaoskit.faults.network:LinkDownFault",
    "network.blackhole": "chaoskit.faults.network:BlackholeFault",
    "network.degrade": "chaoskit.faults.network:DegradeFault",
    "network.partition": "chaoskit.faults.network:PartitionFault",
    "node.poweroff": "chaoskit.faults.power:PowerOffFault",
}


@functools.lru_cache(maxsize=1)
def fault_kinds() -> dict[str, type[Fault]]:
    """Every known fault kind, by name, sorted."""
    found: dict[str, type[Fault]] = {}
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.load()
    for name, target in _BUILTIN.items():
        if name not in found:
            module, _, attr = target.partition(":")
            found[name] = getattr(importlib.import_module(module), attr)
    for name, cls in found.items():
        if getattr(cls, "kind", None) != name:
            raise RuntimeError(f"fault plugin {cls!r} registered as {name!r} but declares kind {cls.kind!r}")
    return dict(sorted(found.items()))


def get_fault(kind: str) -> type[Fault]:
    return fault_kinds()[kind]
