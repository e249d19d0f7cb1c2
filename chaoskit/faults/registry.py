"""Fault kinds by name, from the ``chaoskit.faults`` entry-point group (see :mod:`chaoskit.core.registry`)."""

from __future__ import annotations

from chaoskit.core.registry import Registry
from chaoskit.faults.api import Fault

__all__ = ["FAULTS", "fault_kinds", "fault_kinds_markdown", "get_fault", "GROUP"]

GROUP = "chaoskit.faults"


def _check(name: str, cls: type[Fault]) -> None:
    if getattr(cls, "kind", None) != name:
        raise RuntimeError(f"fault plugin {cls!r} registered as {name!r} but declares kind {getattr(cls, 'kind', None)!r}")


FAULTS: Registry[type[Fault]] = Registry("fault kind", GROUP, {
    "process.kill": "chaoskit.faults.process:KillFault",
    "process.hang": "chaoskit.faults.process:HangFault",
    "network.link_down": "chaoskit.faults.network:LinkDownFault",
    "network.blackhole": "chaoskit.faults.network:BlackholeFault",
    "network.degrade": "chaoskit.faults.network:DegradeFault",
    "network.partition": "chaoskit.faults.network:PartitionFault",
    "node.poweroff": "chaoskit.faults.power:PowerOffFault",
    "gpu.fail": "chaoskit.faults.gpu:GpuFailFault",
    "gpu.xid": "chaoskit.faults.gpu:GpuXidFault",
    "node.slow": "chaoskit.faults.slow:SlowFault",
    "storage.corrupt": "chaoskit.faults.storage:CorruptFault",
    "storage.full": "chaoskit.faults.storage:FullFault",
    "mem.oom": "chaoskit.faults.memory:OomFault",
    "slurm.drain": "chaoskit.faults.slurm:DrainFault",
    "slurm.requeue": "chaoskit.faults.slurm:RequeueFault",
    "inproc.hang": "chaoskit.faults.inproc:InprocHangFault",
    "inproc.gil": "chaoskit.faults.inproc:InprocGilFault",
    "inproc.raise": "chaoskit.faults.inproc:InprocRaiseFault",
    "inproc.nan": "chaoskit.faults.inproc:InprocNanFault",
    "inproc.bitflip": "chaoskit.faults.inproc:InprocBitflipFault",
    "inproc.slow": "chaoskit.faults.inproc:InprocSlowFault",
}, check=_check)


def fault_kinds() -> dict[str, type[Fault]]:
    """Every known fault kind, by name, sorted."""
    return FAULTS.all()


def get_fault(kind: str) -> type[Fault]:
    return FAULTS.get(kind)


def fault_kinds_markdown() -> str:
    """The README's table of fault kinds, one row a kind, from each kind's spec: what it acts on and the first
    sentence of its docstring (a test keeps the README's copy equal to this)."""
    acts_on = {"process": "ranks", "node": "nodes"}
    rows = ["| kind | acts on | what it does |", "| --- | --- | --- |"]
    for name, cls in fault_kinds().items():
        doc = " ".join((cls.Spec.__doc__ or "").split())
        first = doc.split(". ")[0].rstrip(".").replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{name}` | {acts_on.get(cls.target_type, cls.target_type)} | {first} |")
    return "\n".join(rows) + "\n"
