"""The fault catalog and fault coverage.

The catalog is the fault landscape of a training cluster (docs/architecture.md, "Catalog and
coverage"): classes by category (hardware, network, software, storage) and scope
(rank, node, rack, cluster), each with the fault kinds that exercise it and a
real-world weight: how many of the 419 unexpected interruptions of Llama 3 405B
pre-training had their root cause in that class (``chaoskit/data/``).

Coverage of a set of drills (a game day):

- plain: classes covered / classes in the catalog;
- weighted: share of the real interruptions whose class is covered.

A class is *covered* when some scenario claims it (``covers:``, which defaults
from its fault kinds), injected a fault of a kind that exercises it, and the job
recovered within its SLOs (verdict ``pass``). Otherwise it *failed* (attempted,
not passed), is *not runnable here* (this cluster lacks what it needs: a GPU,
tc netem, an installed fault kind; with the reason), or was *not attempted*.

Pure functions over plain data, except :func:`detect_capabilities`, which probes
this machine.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from chaoskit.cluster.kernel import NETEM_CHECK, local_mounts
from chaoskit.core.errors import did_you_mean
from chaoskit.faults.registry import FAULTS, fault_covers, fault_kinds

__all__ = [
    "CATEGORIES",
    "SCOPES",
    "STATUSES",
    "FaultClass",
    "Mechanism",
    "GPU_UNVERIFIED",
    "Capabilities",
    "catalog",
    "catalog_by_id",
    "interruption_rows",
    "total_interruptions",
    "classes_exercised_by",
    "resolve_covers",
    "detect_capabilities",
    "compute_coverage",
]

CATEGORIES = ("hardware", "network", "software", "storage")
SCOPES = ("rank", "node", "rack", "cluster")

COVERED, FAILED, NOT_RUNNABLE, NOT_ATTEMPTED = "covered", "failed", "not runnable here", "not attempted"
STATUSES = (COVERED, FAILED, NOT_RUNNABLE, NOT_ATTEMPTED)

DATA_FILE = "llama3_interruptions.csv"


@dataclass(frozen=True)
class Mechanism:
    """One way a fault kind does its harm, as the catalog's ``here`` column shows it.

    ``fidelity``: ``real`` (the hardware's own failure, e.g. a GPU's compute mode) or
    ``emulated`` (an imitation the job cannot tell apart on its recovery path, e.g. a
    crash loop for a failed GPU). ``requires``: keys of :data:`REQUIREMENTS`.
    ``note``: what is still unproven about it (``not yet verified on a GPU``).
    ``emulates``: for an emulated mechanism, what the job sees instead of the real failure."""

    kind: str
    name: str
    fidelity: str
    requires: tuple[str, ...] = ()
    note: str | None = None
    emulates: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "fidelity": self.fidelity,
                "requires": list(self.requires), "note": self.note, "emulates": self.emulates}


GPU_UNVERIFIED = "not yet verified on a GPU"
"""Until bench/gpu_check.sh has passed on a GPU machine, the NVIDIA mechanisms say so."""

_GPU_FAIL = (
    Mechanism("gpu.fail", "nvidia", "real", ("gpu",), GPU_UNVERIFIED),
    Mechanism("gpu.fail", "crashloop", "emulated", emulates=(
        "the failed device's workers killed as they appear (scope device: torchrun restarts in place and dies "
        "again); scope node: every process of the job on the node, its torchrun agent included, as a health "
        "check that takes the node out of the job does, so a spare or the scheduler must take its place")),
)
_GPU_XID = Mechanism("gpu.xid", "kmsg", "emulated", emulates=(
    "the driver's Xid line in the node's kernel log (root), what health checks and log monitors read, for the "
    "node's GPU (the labs: an emulated PCI id); with_failure, gpu.fail's failure of the device follows it"))


@dataclass(frozen=True)
class FaultClass:
    """One class of the catalog.

    ``kinds``: fault kinds whose injection reproduces this class faithfully, as the
    job sees it. ``requires``: what the cluster must offer (keys of
    :data:`REQUIREMENTS`). ``sources``: the ``category`` values of the data file
    this class absorbs; ``weight`` is the sum of their interruption counts.
    ``mechanisms``: for kinds that act in more than one way, each way with its
    fidelity and its own requirements; the class can run here when one of them can.
    """

    id: str
    scope: str
    name: str
    description: str
    kinds: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    weight: int = 0
    mechanisms: tuple[Mechanism, ...] = ()
    xid_codes: tuple[int, ...] = ()
    """The NVIDIA Xid codes of this class: a ``gpu.xid`` of one of them exercises it."""
    cuda_errors: tuple[str, ...] = ()
    """The CUDA errors of this class: an ``inproc.raise`` of one of them (``inproc.raise:ecc``) exercises it."""

    def exercised_by(self, tag: str) -> bool:
        """Whether a fault known as ``tag`` (its kind, or ``kind:variant``: ``gpu.xid:79``) exercises this class."""
        kind, _, variant = tag.partition(":")
        if kind not in self.kinds:
            return False
        if kind == "gpu.xid" and variant:
            return variant.isdigit() and int(variant) in self.xid_codes
        if kind == "inproc.raise":  # a CUDA error's text is a GPU's or a driver's failure; any other, a crash
            return variant in self.cuda_errors if self.cuda_errors else not variant
        return True

    @property
    def category(self) -> str:
        return self.id.split(".", 1)[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "category": self.category, "scope": self.scope, "name": self.name,
            "description": self.description, "kinds": list(self.kinds), "requires": list(self.requires),
            "weight": self.weight, "mechanisms": [m.as_dict() for m in self.mechanisms],
            **({"xid_codes": list(self.xid_codes)} if self.xid_codes else {}),
            **({"cuda_errors": list(self.cuda_errors)} if self.cuda_errors else {}),
        }


REQUIREMENTS = {
    "gpu": "a GPU on the nodes",
    "netns": "nodes with their own network stack (root and iproute2, for the network-namespace lab)",
    "netem": "tc netem (root, iproute2's tc and the sch_netem kernel module)",
    "cgroup": "a cgroup cpu controller the nodes' chaoskit may write (root; v2 cpu.max or v1 cpu)",
    "checkpoint_fs": "a small file system of the job's own for its checkpoints (the process lab mounts a tmpfs: root)",
    "memcg": "a cgroup memory controller the nodes' chaoskit may write (root; v2 memory.max or v1 memory)",
    "slurm": "a Slurm cluster (the Slurm lab: root, slurmctld, slurmd and munge installed)",
    "fuse": "FUSE on the nodes (root, /dev/fuse, libfuse3 and the mfusepy binding: pip install 'chaoskit[fuse]')",
}

# The catalog. Each class sits at the scope where it usually strikes; the order is
# the order of reports. Its kinds are not listed here: each kind names the classes it
# reproduces (``covers`` in its class body), and catalog() gathers them.
_CLASSES = (
    FaultClass("hardware.gpu", "rank", "GPU failure",
               "A GPU fails or falls off the bus (faulty GPU, GPU system processor, thermal interface); "
               "its rank dies or hangs.",
               sources=("hardware.gpu",), mechanisms=(*_GPU_FAIL, _GPU_XID),
               xid_codes=(74, 79)),
    FaultClass("hardware.sdc", "rank", "Silent data corruption",
               "A GPU computes wrong numbers and says nothing: no error, no log line, training goes on from "
               "corrupt state (and saves it), until a checksum, a loss watch or nobody notices.",
               sources=("hardware.gpu/Silent Data Corruption",),
               mechanisms=(Mechanism("inproc.bitflip", "in-process", "real", (), (
                   "one bit of a parameter or gradient flipped in the training process's own memory (CPU tensors "
                   "on the labs); a flip inside a GPU kernel is not imitated")),
                           Mechanism("inproc.nan", "in-process", "real", (), (
                               "NaN or Inf written into one rank's loss or gradients: corruption that shows")))),
    FaultClass("hardware.gpu_memory", "rank", "GPU memory error",
               "Uncorrectable ECC error in HBM or on-chip SRAM; the rank's process dies with a CUDA error "
               "and the device stays unusable until it is reset.",
               sources=("hardware.gpu_memory",),
               mechanisms=(*_GPU_FAIL, _GPU_XID, Mechanism("inproc.raise", "in-process exception", "emulated", emulates=(
                   "the CUDA runtime's own error ('uncorrectable ECC error encountered') raised in the rank's step, "
                   "and the process's exit, with no GPU failing"))),
               xid_codes=(48, 63, 64, 94, 95), cuda_errors=("ecc",)),
    FaultClass("hardware.host", "node", "Host lost",
               "The whole node goes away without warning: CPU, system memory, chassis or IO board failure.",
               sources=("hardware.host",)),
    FaultClass("hardware.maintenance", "node", "Host maintenance",
               "The scheduler takes nodes away for maintenance or a higher-priority job: the job is requeued "
               "(preempted) and restarts on other nodes from its checkpoint, or the node is drained and nothing "
               "new lands on it.",
               requires=("slurm",), sources=("maintenance",)),
    FaultClass("hardware.power", "node", "Power loss",
               "A power supply fails and the node drops without warning.",
               sources=("hardware.power",)),
    FaultClass("hardware.slow", "node", "Slow node (straggler)",
               "A node keeps working but slowly (thermal throttling, a failing fan, a noisy neighbour); every "
               "rank waits for it in each collective, so the whole job slows down without failing.",
               mechanisms=(Mechanism("node.slow", "cgroup", "emulated", ("cgroup",),
                                     "a CPU share imitates a slow GPU"),
                           Mechanism("node.slow", "nvidia", "real", ("gpu",), GPU_UNVERIFIED),
                           Mechanism("inproc.slow", "in-process", "emulated", (), emulates=(
                               "a share of one rank's every step slept or spent computing, from inside the process "
                               "(no root, no cgroup), as a slow GPU would take it")))),
    FaultClass("network.nic", "node", "NIC down",
               "A node's data NIC goes down; its ranks can no longer reach their peers.",
               requires=("netns",), sources=("network.nic",)),
    FaultClass("network.link", "node", "Switch or cable failure",
               "A switch port or cable fails: packets to and from a node vanish while the NIC still looks up.",
               requires=("netns",), sources=("network.link",)),
    FaultClass("network.degraded", "node", "Degraded link",
               "A link keeps working but slowly: added latency, packet loss, reduced bandwidth.",
               requires=("netns", "netem")),
    FaultClass("network.partition", "rack", "Network partition",
               "A top-of-rack switch or a fabric fault splits the job into groups that cannot reach each other.",
               requires=("netns",)),
    FaultClass("software.crash", "rank", "Process crash",
               "A training process dies: a software bug, a broken dependency, a signal.",
               sources=("software",)),
    FaultClass("software.hang", "rank", "Process hang",
               "A rank stops making progress without exiting; its peers wait in a collective until "
               "a timeout or watchdog fires (NCCL watchdog timeouts).",
               sources=("software.hang",),
               mechanisms=(Mechanism("process.hang", "SIGSTOP", "real", (), "every thread frozen, a watchdog's or "
                                     "heartbeat's too"),
                           Mechanism("inproc.hang", "in-process", "real", (), "the training thread held before its "
                                     "collective; heartbeat and watchdog threads run on, as in a stuck kernel"),
                           Mechanism("inproc.gil", "GIL held", "real", (), "the process's GIL held: no Python "
                                     "thread of it runs, its C++ threads (gloo, NCCL's watchdog) do"))),
    FaultClass("software.oom", "rank", "Out of memory",
               "A rank runs out of host or device memory and is killed by the OOM killer or the allocator.",
               mechanisms=(Mechanism("mem.oom", "cgroup", "real", ("memcg",),
                                     "host memory: the rank's cgroup capped and filled, the kernel's OOM killer ends it; "
                                     "GPU memory is not exhausted"),)),
    FaultClass("software.driver", "node", "Driver or CUDA error",
               "The GPU driver or CUDA runtime fails on a node; every rank there errors out.",
               xid_codes=(13, 31, 43),
               cuda_errors=("illegal_address", "launch_failure", "illegal_instruction", "misaligned_address",
                            "hardware_stack_error", "device_assert", "nvlink", "out_of_memory", "launch_timeout"),
               mechanisms=(Mechanism("gpu.xid", "kmsg", "emulated", emulates=(
                   "the driver's Xid 13/31/43 line in the node's kernel log; with_failure, the rank killed as the "
                   "CUDA error would (gpu.fail's crash loop, or the device's compute mode on a GPU node)")),
                           Mechanism("inproc.raise", "in-process exception", "emulated", emulates=(
                               "the CUDA runtime's own error text ('an illegal memory access was encountered', ...) "
                               "raised in the rank's step as PyTorch reports it, and the process's exit")))),
    FaultClass("storage.checkpoint", "cluster", "Checkpoint corruption",
               "The newest checkpoint is truncated or corrupt; restore must fall back to an older one.",
               mechanisms=(Mechanism("storage.corrupt", "truncate/flip/remove", "real", (),
                                     "the newest checkpoint file itself, put back at revert"),)),
    FaultClass("storage.disk", "node", "Disk full or failed",
               "A node's local disk (SSD) fails or fills up; checkpoint writes and logging fail there.",
               sources=("storage",),
               mechanisms=(Mechanism("storage.full", "fill", "real", ("checkpoint_fs",),
                                     "fills the job's own checkpoint file system"),
                           Mechanism("storage.error", "fuse", "real", ("fuse",),
                                     "a failing disk's errno (EIO, ENOSPC, EROFS, ...) from a FUSE passthrough over "
                                     "the checkpoint folder; the device itself is not harmed"))),
    # The Llama 3 table (Table 5) has no class for it: storage that is slow or fails some operations without going
    # away shows there as whatever it caused (a save past a timeout as a hang, an EIO as a software failure), so
    # its weight is 0 and it counts toward plain coverage only.
    FaultClass("storage.degraded", "node", "Slow or failing checkpoint storage",
               "A node's checkpoint storage is slow (latency, low bandwidth) or fails a share of its operations "
               "(EIO, ENOSPC, EROFS): saves and loads take longer or fail, and a detector may take a slow save for a "
               "hang.",
               mechanisms=(Mechanism("storage.slow", "fuse", "real", ("fuse",),
                                     "latency and bandwidth added by a FUSE passthrough over the checkpoint folder "
                                     "(the job's real reads and writes through the kernel's VFS); the block device "
                                     "is not throttled"),
                           Mechanism("storage.error", "fuse", "real", ("fuse",),
                                     "an errno for a share of the chosen operations, from the same passthrough"))),
)


@functools.lru_cache(maxsize=1)
def interruption_rows() -> tuple[dict[str, Any], ...]:
    """The rows of the shipped data file, counts as ints."""
    text = resources.files("chaoskit").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        rows.append({"category": row["category"], "root_cause": row["root_cause"],
                     "interruptions": int(row["interruptions"]), "percent": float(row["percent"])})
    return tuple(rows)


def total_interruptions() -> int:
    """Sum of the counts (419): the denominator of weighted coverage."""
    return sum(r["interruptions"] for r in interruption_rows())


def catalog() -> tuple[FaultClass, ...]:
    """Every class, with its weight from the data file and its kinds: those whose ``covers`` names it, sorted.

    Raises ``RuntimeError`` if a data category belongs to no class or to several
    (the weights would no longer sum to the total), or if a kind claims a class the
    catalog does not have, or a mechanism belongs to a kind that does not claim its class.
    """
    return _catalog(FAULTS.generation)


@functools.lru_cache(maxsize=2)
def _catalog(generation: int) -> tuple[FaultClass, ...]:
    ids = {c.id for c in _CLASSES}
    covers = fault_covers()
    for kind, claimed in covers.items():
        if unknown := sorted(set(claimed) - ids):
            raise RuntimeError(f"fault kind {kind!r}: covers names {', '.join(unknown)}, not a class of the catalog")
    kinds = {c.id: tuple(k for k, claimed in covers.items() if c.id in claimed) for c in _CLASSES}
    for c in _CLASSES:
        if stray := sorted({m.kind for m in c.mechanisms} - set(kinds[c.id])):
            raise RuntimeError(f"catalog class {c.id}: a mechanism of {', '.join(stray)}, which does not cover it")
    owners: dict[str, list[str]] = {}
    for cls in _CLASSES:
        for src in cls.sources:
            owners.setdefault(src, []).append(cls.id)
    weights: dict[str, int] = {}
    for row in interruption_rows():
        # a root cause a class takes for itself ("hardware.gpu/Silent Data Corruption") before its category's class
        owner = owners.get(f"{row['category']}/{row['root_cause']}") or owners.get(row["category"], [])
        if len(owner) != 1:
            raise RuntimeError(f"{DATA_FILE}: category {row['category']!r} maps to {len(owner)} catalog classes, expected 1")
        weights[owner[0]] = weights.get(owner[0], 0) + row["interruptions"]
    return tuple(replace(c, weight=weights.get(c.id, 0), kinds=kinds[c.id]) for c in _CLASSES)


def catalog_by_id() -> dict[str, FaultClass]:
    return {c.id: c for c in catalog()}


def classes_exercised_by(kinds: Iterable[str]) -> list[str]:
    """Ids of the classes that any of ``kinds`` exercises, in catalog order (a kind, or a fault's
    ``kind:variant`` tag, :meth:`FaultClass.exercised_by`)."""
    kinds = set(kinds)
    return [c.id for c in catalog() if any(c.exercised_by(k) for k in kinds)]


def resolve_covers(declared: list[str] | None, kinds: Iterable[str]) -> list[str]:
    """The classes a scenario claims: ``declared`` (its ``covers:``) or, if unset,
    every class its fault kinds exercise.

    Raises ``ValueError`` for an unknown id or a class that none of ``kinds``
    exercises (a scenario cannot claim what it does not inject).
    """
    kinds = list(kinds)
    exercised = classes_exercised_by(kinds)
    if declared is None:
        return exercised
    known = catalog_by_id()
    for cid in declared:
        if cid not in known:
            raise ValueError(f"covers: unknown fault class {cid!r}{did_you_mean(cid, known)}; see 'chaoskit catalog'")
        if cid not in exercised:
            by = ", ".join(known[cid].kinds) or "no fault kind yet"
            raise ValueError(f"covers: {cid} is not exercised by {', '.join(kinds)} (it is exercised by {by})")
    return [c for c in known if c in declared]


@dataclass
class Capabilities:
    """What this cluster can run: installed fault kinds, and each missing
    requirement (a key of ``REQUIREMENTS``) with the reason it is missing."""

    kinds: frozenset[str] = frozenset()
    missing: dict[str, str] = field(default_factory=dict)

    def unrunnable_reason(self, cls: FaultClass) -> str | None:
        """Why ``cls`` cannot run here, or ``None`` when it can (by one of its mechanisms, if it lists them)."""
        reasons = [self.missing[r] for r in cls.requires if r in self.missing]
        if cls.mechanisms and not reasons:
            why = [self.mechanism_reason(m) for m in cls.mechanisms]
            if any(w is None for w in why):
                return None
            return "; ".join(f"{m.kind} {m.name}: {w}" for m, w in zip(cls.mechanisms, why))
        if not cls.kinds:
            reasons.append("no fault kind exercises it yet")
        elif not self.kinds & set(cls.kinds):
            reasons.append(f"fault kind {' or '.join(cls.kinds)} is not installed")
        return "; ".join(reasons) or None

    def mechanism_reason(self, mechanism: Mechanism) -> str | None:
        """Why ``mechanism`` cannot run here, or ``None``."""
        reasons = [self.missing[r] for r in mechanism.requires if r in self.missing]
        if mechanism.kind not in self.kinds:
            reasons.append(f"fault kind {mechanism.kind} is not installed")
        return "; ".join(reasons) or None

    def here(self, cls: FaultClass) -> list[str]:
        """One line per mechanism of ``cls``: its name, real or emulated, whether it runs here, and its note.
        What an emulated mechanism stands in for is in the catalog's JSON (``emulates``), to keep the table short."""
        out = []
        for m in cls.mechanisms:
            reason = self.mechanism_reason(m)
            line = f"{m.kind} {m.name}: {m.fidelity}, " + ("runnable" if reason is None else f"not runnable: {reason}")
            out.append(line + (f" ({m.note})" if m.note else ""))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"kinds": sorted(self.kinds), "missing": dict(self.missing)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Capabilities":
        return cls(frozenset(data.get("kinds", ())), dict(data.get("missing", {})))


def detect_capabilities() -> Capabilities:
    """Probe this machine: installed fault kinds, GPU, root, iproute2, tc netem."""
    missing: dict[str, str] = {}
    if not (Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi")):
        missing["gpu"] = "no GPU here (no /dev/nvidia0, no nvidia-smi)"
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not root:
        missing["netns"] = "network-namespace nodes need root"
    elif not shutil.which("ip"):
        missing["netns"] = "network-namespace nodes need iproute2 (ip), which is not installed"
    if not root:
        missing["cgroup"] = "cgroups need root"
    elif not _cpu_cgroup_here():
        missing["cgroup"] = "no cgroup cpu controller is mounted (v2 cpu.max or v1 cpu)"
    if not root:
        missing["checkpoint_fs"] = "a checkpoint file system of the job's own (tmpfs) needs root"
    elif not shutil.which("mount"):
        missing["checkpoint_fs"] = "mount (util-linux) is not installed"
    if not root:
        missing["memcg"] = "cgroups need root"
    elif not _memory_cgroup_here():
        missing["memcg"] = "no cgroup memory controller is mounted (v2 memory.max or v1 memory)"
    if not root:
        missing["slurm"] = "the Slurm lab needs root"
    elif not all(shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") for t in ("slurmctld", "slurmd", "munged")):
        missing["slurm"] = "slurmctld, slurmd and munge are not installed"
    if not root:
        missing["fuse"] = "mounting a FUSE file system over the checkpoint folder needs root"
    elif not Path("/dev/fuse").exists():
        missing["fuse"] = "this kernel has no /dev/fuse"
    elif importlib.util.find_spec("mfusepy") is None:
        missing["fuse"] = "the FUSE binding is not installed: pip install 'chaoskit[fuse]' (and apt-get install libfuse3-3)"
    if "netns" in missing:
        missing["netem"] = "tc netem needs root and iproute2"
    elif not shutil.which("tc"):
        missing["netem"] = "tc (iproute2) is not installed"
    elif not _netem_here():
        missing["netem"] = "this kernel has no sch_netem (loaded, built in or loadable)"
    return Capabilities(frozenset(fault_kinds()), missing)


def _cpu_cgroup_here() -> bool:
    return _cgroup_controller_here("cpu")


def _memory_cgroup_here() -> bool:
    return _cgroup_controller_here("memory")


def _cgroup_controller_here(controller: str) -> bool:
    for parts in local_mounts():
        if len(parts) > 3 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return True
        if len(parts) > 3 and parts[2] == "cgroup2" and controller in _read(Path(parts[1]) / "cgroup.controllers").split():
            return True
    return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _netem_here() -> bool:
    """The network faults' own check, run on this machine."""
    return subprocess.run([sys.executable, "-c", NETEM_CHECK], capture_output=True, timeout=30).returncode == 0


def compute_coverage(records: Iterable[dict[str, Any]], caps: Capabilities) -> dict[str, Any]:
    """Coverage of a game day.

    ``records``: one per scenario, with ``scenario`` (name), ``covers`` (class ids
    it claims), ``injected_kinds`` (kinds it actually injected) and ``status``
    (``pass``, ``fail``, ``aborted``, ``interrupted``, ``error``, or ``None`` for a
    scenario that has not run). Returns each class's status and scenarios, the
    plain and weighted scores and their numerators and denominators.
    """
    records = list(records)
    classes = []
    for cls in catalog():
        claims = [r for r in records if cls.id in (r.get("covers") or [])]
        ran = [r for r in claims if r.get("status") is not None]
        injected = [r for r in ran if set(r.get("injected_kinds") or []) & set(cls.kinds)]
        passed = [r for r in injected if r.get("status") == "pass"]
        reason = caps.unrunnable_reason(cls)
        if passed:
            status = COVERED
        elif injected or (ran and reason is None):
            status, reason = FAILED, None
        elif reason is not None:
            status = NOT_RUNNABLE
        else:
            status = NOT_ATTEMPTED
        classes.append({
            **cls.as_dict(),
            "status": status,
            "reason": reason if status == NOT_RUNNABLE else None,
            "scenarios": [{"scenario": r.get("scenario"), "status": r.get("status")} for r in claims],
        })
    covered = [c for c in classes if c["status"] == COVERED]
    weight_total = total_interruptions()
    weight_covered = sum(c["weight"] for c in covered)
    return {
        "classes": classes,
        "covered": [c["id"] for c in covered],
        "covered_count": len(covered),
        "total": len(classes),
        "plain": len(covered) / len(classes),
        "weight_covered": weight_covered,
        "weight_total": weight_total,
        "weighted": weight_covered / weight_total,
        "counts": {s: sum(1 for c in classes if c["status"] == s) for s in STATUSES},
    }
