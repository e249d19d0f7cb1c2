"""Labs a game day shares: consecutive scenarios on the same kind and shape of lab run on one.

A game day orders its scenarios so that those with the same :meth:`ClusterBackend.reuse_key`
(same kind, nodes, spares, settings; for docker, the same compose project) run back to back
(:func:`group_order`). Before the first of a group of two or more, :class:`LabPool` brings the
lab up as ``chaoskit lab up`` would, so each run's ``open`` attaches to it instead of building
its own; after the group, and on any way out (an error, Ctrl-C, SIGTERM), it takes it down again.
A lab of that kind that was already up (somebody's ``lab up``) is never touched: the group's runs
then behave as they would without a game day.

Between two drills on a shared lab it is verified clean (:func:`leftovers`): the previous run's
journal shows every revert verified, none of the job's processes is left on any node, and every
node is powered on (running, for a container; idle, for a Slurm node). A lab still not clean after
``settle_s`` is taken down and brought up afresh, and the game day says why.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterBackend, ClusterSpec
from chaoskit.backends.registry import backend
from chaoskit.cluster.transports.api import ProcInfo
from chaoskit.cluster.transports.local import read_proc

__all__ = ["LabPool", "group_order", "leftovers", "job_processes", "node_problems", "journal_problems"]

JOB_MARKS = ("chaoskit.workloads", "chaoskit/workloads", "torch.distributed.run", "torchrun", "RayTrainWorker")
"""What in a command line makes a process the drilled job's (beside torchrun's environment)."""


def group_order(keys: list[str | None]) -> list[int]:
    """Indexes of ``keys`` (one per scenario, in the order given) with equal keys made adjacent: each group
    where its first member was, in the order given within it; ``None`` (no shared lab) keeps its place."""
    first: dict[str, int] = {}
    order: list[tuple[int, int]] = []
    for i, key in enumerate(keys):
        rank = i if key is None else first.setdefault(key, i)
        order.append((rank, i))
    return [i for _, i in sorted(order)]


def is_job_process(proc: ProcInfo) -> bool:
    return proc.is_worker or "TORCHELASTIC_RUN_ID" in proc.env or any(m in proc.cmdline for m in JOB_MARKS)


def job_processes(handle) -> list[str]:
    """The drilled job's processes still alive on an opened lab's nodes: one line each. Every lab node shares this
    machine's kernel (a namespace, a container, a process scope), and the job chaoskit starts carries its node's
    ``CHAOSKIT_SCOPE``, so they are read here from ``/proc`` (root reads a container's too), without a node's agent."""
    scopes = {handle.scope(node.name): node.name for node in handle.inventory.nodes}
    return [f"{scopes[p.env['CHAOSKIT_SCOPE']]}: pid {p.pid} {p.cmdline[:80]}" for p in read_proc()
            if p.env.get("CHAOSKIT_SCOPE") in scopes and p.state != "Z" and is_job_process(p)]


def node_problems(nodes: list[dict[str, Any]]) -> list[str]:
    """What ``lab status`` shows wrong with a lab's nodes: powered off, a container not running, a Slurm node not idle."""
    out = []
    for n in nodes:
        if n.get("on") is False:
            out.append(f"{n['name']} is powered off")
        state = n.get("state")
        if isinstance(state, str) and state != "running":
            out.append(f"{n['name']} is {state}")
        procs = n.get("processes")
        if isinstance(procs, list):  # a lab that lists its nodes' processes (process, Ray): the job's must be gone
            out += [f"{n['name']}: pid {p.get('pid')} {str(p.get('cmdline'))[:80]}" for p in procs
                    if isinstance(p, dict) and any(m in str(p.get("cmdline")) for m in JOB_MARKS)]
        slurm = n.get("slurm_state")
        if isinstance(slurm, str):
            flags = set(slurm.upper().rstrip("*~#!%$@^-").split("+"))
            if not flags & {"IDLE"} or flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "NOT_RESPONDING", "FAIL", "ALLOCATED", "MIXED", "COMPLETING"}:
                out.append(f"{n['name']} is {slurm} in Slurm")
    return out


def journal_problems(run_dir: Path) -> list[str]:
    """Reverts a run's journal (and its samples', with repeats) records as not verified: a fault's watchdog may
    still hold something on the lab."""
    out = []
    for journal in sorted([run_dir / "journal.jsonl", *run_dir.glob("sample-*/journal.jsonl")]):
        try:
            lines = journal.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("action") == "reverted" and entry.get("verified") is False:
                out.append(f"{entry.get('kind')} on {entry.get('node')}: revert not verified ({entry.get('problem')})")
    return out


def leftovers(back: ClusterBackend, spec: ClusterSpec, base: Path, run_dir: Path | None) -> list[str]:
    """What the previous drill (``run_dir``) left on the shared lab: one line per problem, empty when clean."""
    problems = journal_problems(run_dir) if run_dir is not None else []
    statuses = back.lab_status()
    for status in statuses:
        problems += node_problems(status.nodes)
    if problems or (statuses and all(isinstance(n.get("processes"), list) for s in statuses for n in s.nodes)):
        return problems  # not clean already (a node still off cannot be opened), or every node's processes were read above
    handle = back.open(spec, base)  # the lab that is up: its nodes' scopes (nothing is connected)
    try:
        problems += job_processes(handle)
    finally:
        handle.teardown()
    return problems


@dataclass
class HeldLab:
    kind: str
    key: str
    spec: ClusterSpec
    base: Path
    up_s: float
    scenarios: list[str] = field(default_factory=list)
    down_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "up_s": round(self.up_s, 3), "down_s": None if self.down_s is None else round(self.down_s, 3),
                "scenarios": self.scenarios}


class LabPool:
    """The one lab a game day holds at a time (see the module docstring). ``say`` prints one line."""

    def __init__(self, say: Callable[[str], None], settle_s: float = 30.0) -> None:
        self.say, self.settle_s = say, settle_s
        self.held: HeldLab | None = None
        self.history: list[HeldLab] = []

    @staticmethod
    def key(spec: ClusterSpec, base: Path) -> str | None:
        try:
            key = backend(spec.kind).reuse_key(spec, base)
        except Exception:  # noqa: BLE001 - a spec the backend cannot place (no compose file) runs alone, and says why
            return None
        return None if key is None else f"{spec.kind}:{key}"

    def before(self, scenario: str, spec: ClusterSpec, base: Path, group_size: int, previous_run: Path | None) -> dict[str, Any] | None:
        """Make the lab ready for the next scenario; return what its record keeps (``None``: no shared lab)."""
        key = self.key(spec, base)
        if self.held is not None and self.held.key != key:
            self.release()
        if self.held is not None:
            problems = self._settle(previous_run)
            if not problems:
                self.held.scenarios.append(scenario)
                return {"kind": spec.kind, "reused": True}
            self.say(f"the {self.held.kind} lab is not clean after the last drill ({'; '.join(problems[:3])}): "
                     "building it again")
            self.release()
            if not self._hold(spec, base, key):
                return {"kind": spec.kind, "reused": False, "not_clean": problems}
            self.held.scenarios.append(scenario)
            return {"kind": spec.kind, "reused": False, "up_s": round(self.held.up_s, 3), "not_clean": problems}
        if key is None or group_size < 2 or not self._hold(spec, base, key):
            return None
        self.held.scenarios.append(scenario)
        return {"kind": spec.kind, "reused": False, "up_s": round(self.held.up_s, 3)}

    def _settle(self, previous_run: Path | None) -> list[str]:
        """Wait up to ``settle_s`` for the lab to be clean (a Slurm node registering after its power-on, a job's
        last process exiting); what is still wrong then."""
        assert self.held is not None
        end = time.time() + self.settle_s
        while True:
            problems = leftovers(backend(self.held.kind), self.held.spec, self.held.base, previous_run)
            if not problems or time.time() >= end or any("revert not verified" in p for p in problems):
                return problems
            time.sleep(1.0)

    def _hold(self, spec: ClusterSpec, base: Path, key: str) -> bool:
        back = backend(spec.kind)
        try:
            if back.lab_status():  # somebody's lab of this kind: leave it alone
                return False
            t0 = time.time()
            back.lab_up(back.reuse_spec(spec, base), base, say=lambda msg: None)
        except Exception as exc:  # noqa: BLE001 - each run then makes its own lab, and reports what fails there
            self.say(f"could not bring up a {spec.kind} lab to share ({type(exc).__name__}: {exc}); each scenario makes its own")
            try:
                self._down(back, spec, base)  # whatever a half-made lab left
            except Exception:  # noqa: BLE001 - nothing was up to take down
                pass
            return False
        self.held = HeldLab(spec.kind, key, spec, base, time.time() - t0)
        self.history.append(self.held)
        self.say(f"{spec.kind} lab up in {self.held.up_s:.1f}s, shared by the next scenarios")
        return True

    def release(self) -> None:
        """Take the held lab down (safe to call twice)."""
        held, self.held = self.held, None
        if held is None:
            return
        t0 = time.time()
        self._down(backend(held.kind), held.spec, held.base)
        held.down_s = time.time() - t0
        self.say(f"{held.kind} lab down in {held.down_s:.1f}s after {len(held.scenarios)} scenario(s)")

    @staticmethod
    def _down(back: ClusterBackend, spec: ClusterSpec, base: Path) -> None:
        reused = back.reuse_spec(spec, base)
        compose = getattr(reused, "compose", None)
        back.lab_down(Path(compose) if compose else None)
