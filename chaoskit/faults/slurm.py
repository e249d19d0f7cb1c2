"""Scheduler faults: what Slurm itself does to a job and its nodes.

- ``slurm.drain``: ``scontrol update nodename=N state=drain reason=chaoskit`` (a node taken
  out for maintenance: the job on it keeps running, nothing new lands there); reverted
  with ``state=resume``. The command runs on the controller, so the lease's watchdog
  runs there too (as :mod:`chaoskit.faults.power`'s does): a controller that dies
  mid-drill still gets the node resumed once the lease goes stale.
- ``slurm.requeue``: ``scontrol requeue JOB`` for the job running on the target node:
  what preemption does. Slurm kills the job's steps, holds it (``BeginTime``: the
  requeue hold) and starts it again; nothing to revert.

Both act through the node's :attr:`~chaoskit.cluster.inventory.Node.scheduler` (a
:class:`~chaoskit.cluster.slurm.SlurmAccess`); a node that Slurm does not manage is refused
by ``validate``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.selectors import NodeTarget, node_targets
from chaoskit.cluster.slurm import SlurmAccess
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.shell import shell_quote
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection

__all__ = ["DrainFault", "DrainSpec", "RequeueFault", "RequeueSpec"]

REASON = "chaoskit"


def _unfit(node: Node) -> str | None:
    if node.scheduler is None:
        return f"node {node.name} is not managed by Slurm (the cluster has no scheduler: kind: slurm)"
    return None


def _known_to_slurm(targets: list[NodeTarget]) -> None:
    """Raise before anything is armed when Slurm has no node of a target's name (on a real cluster the
    inventory's node names must be its Slurm node names)."""
    for t in targets:
        known = _access(t.info).nodes()
        if t.node not in known:
            raise InfraError(f"Slurm knows no node {t.node!r} (its nodes: {', '.join(sorted(known)) or 'none'})",
                             hint="name the inventory's nodes as Slurm does (scontrol show node)")


def _access(node: Node) -> SlurmAccess:
    if node.scheduler is None:
        raise InfraError(_unfit(node) or "")
    return node.scheduler


class DrainSpec(FaultSpec):
    """Drain the selected Slurm nodes; resume them after ``duration``."""

    kind: Literal["slurm.drain"]
    duration: PositiveDuration = Field(30.0, description="How long the node stays drained; then state=resume.")


class DrainFault(Fault):
    kind = "slurm.drain"
    Spec = DrainSpec
    target_type = "node"
    lasting = True
    revert_runs_on = "controller"

    def unfit(self, node: Node) -> str | None:
        return _unfit(node)

    def needs(self) -> tuple[str, ...]:
        return ()  # scontrol runs on the controller, not on the node

    @staticmethod
    def drain_argv(node: Node) -> list[str]:
        return _access(node).argv("scontrol", "update", f"nodename={node.name}", "state=drain", f"reason={REASON}")

    @staticmethod
    def resume_argv(node: Node) -> list[str]:
        return _access(node).argv("scontrol", "update", f"nodename={node.name}", "state=resume")

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        _known_to_slurm(targets)

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        out = []
        for t in node_targets(ctx.inventory, targets):
            d = self.spec.duration
            out.append(Action(t.node, f"arm lease on the controller: watchdog runs '{shell_quote(self.resume_argv(t.info))}' "
                                      f"after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"on the controller: {shell_quote(self.drain_argv(t.info))}", t.node))
            out.append(Action(t.node, f"after {d:g}s, on the controller: {shell_quote(self.resume_argv(t.info))}", t.node))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            resume = self.resume_argv(t.info)
            ctx.arm(LocalTransport(t.node), fid, self.kind, resume, self.spec.duration, target=t.node, on="controller")
            res = _access(t.info).run("scontrol", "update", f"nodename={t.node}", "state=drain", f"reason={REASON}", check=False)
            ts = time.time()
            if res.returncode != 0:
                _access(t.info).run("scontrol", "update", f"nodename={t.node}", "state=resume", check=False)
                ctx.leases.release(fid)
                raise InfraError(f"scontrol could not drain node {t.node}: {(res.stderr or res.stdout).strip()}")
            out.append(Injection(fid, self.kind, t.node, [t.node], ts, {"resume": resume}))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        node = ctx.inventory[injection.node]
        res = _access(node).run("scontrol", "update", f"nodename={node.name}", "state=resume", check=False)
        if res.returncode != 0 and "not drained" not in (res.stderr + res.stdout).lower():
            raise InfraError(f"scontrol could not resume node {node.name}: {(res.stderr or res.stdout).strip()}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        return _still_drained(ctx.inventory[injection.node])

    @classmethod
    def check_reverted(cls, transport: Any, revert: list[str], node: Node | None = None) -> str | None:
        return _still_drained(node) if node is not None and node.scheduler is not None else None


def _still_drained(node: Node) -> str | None:
    try:
        state = _access(node).nodes().get(node.name, {}).get("State", "")
    except InfraError as exc:
        return f"cannot read node {node.name}'s state from Slurm: {exc}"
    return f"node {node.name} is still {state}" if "DRAIN" in state.split("+") else None


class RequeueSpec(FaultSpec):
    """Requeue the Slurm job running on the selected node (what preemption does to it)."""

    kind: Literal["slurm.requeue"]


class RequeueFault(Fault):
    kind = "slurm.requeue"
    Spec = RequeueSpec
    target_type = "node"

    def unfit(self, node: Node) -> str | None:
        return _unfit(node)

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        _known_to_slurm(targets)

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        return [Action(t.node, "on the controller: " + shell_quote(_access(t.info).argv("scontrol", "requeue", "<job on " + t.node + ">")),
                       t.node) for t in node_targets(ctx.inventory, targets)]

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            access = _access(t.info)
            jobs = access.jobs_on(t.node)
            if not jobs:
                raise InfraError(f"no Slurm job runs on node {t.node}; nothing was requeued")
            for job in jobs:
                res = access.run("scontrol", "requeue", job, check=False)
                ts = time.time()
                if res.returncode != 0:
                    raise InfraError(f"scontrol requeue {job} failed: {(res.stderr or res.stdout).strip()}",
                                     hint="only batch jobs can be requeued, and only with JobRequeue=1 or --requeue")
                out.append(Injection(f"{self.fault_id}.{i}", self.kind, t.node, [f"{t.node}/job{job}"], ts, {"job": job}))
        return out
