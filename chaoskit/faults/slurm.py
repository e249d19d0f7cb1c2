"""Scheduler faults: what Slurm itself does to a job and its nodes, and nothing to anyone else's.

- ``slurm.drain``: ``scontrol update nodename=N state=drain reason="chaoskit slurm.drain <token>"`` (a node
  taken out for maintenance: the job on it keeps running, nothing new lands there). The node's state and
  reason are read first: a node that is already drained, down or failed (an administrator's, or Slurm's)
  is refused before anything is armed, so chaoskit never resumes a node it did not drain. The revert,
  run on the controller by the runner, the lease's watchdog and ``chaoskit rollback`` alike, is
  ``python -m chaoskit.cluster.slurm resume N REASON``: it resumes the node only while it is still drained
  with chaoskit's own reason; a node an administrator drained meanwhile (a reason of their own) stays
  drained. The watchdog runs on the controller (as :mod:`chaoskit.faults.power`'s does): a controller that
  dies mid-drill still gets the node resumed once the lease goes stale.
- ``slurm.requeue``: ``scontrol requeue JOB`` for this drill's job (the one chaoskit submitted, or the
  attached ``workload.slurm_job``) running on the target node: what preemption does. Slurm kills the job's
  steps, holds it (``BeginTime``: the requeue hold) and starts it again; nothing to revert. Other jobs on
  the node are left alone; a node that runs none of this drill's jobs is an error, not a requeue.

Both act through the node's :attr:`~chaoskit.cluster.inventory.Node.scheduler` (a
:class:`~chaoskit.cluster.slurm.SlurmAccess`); a node that Slurm does not manage is refused
by ``validate``.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any, Literal

from pydantic import Field

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.selectors import NodeTarget, node_targets
from chaoskit.cluster.slurm import SlurmAccess, job_ids
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.launches import LAUNCHES
from chaoskit.core.shell import shell_quote
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import slurm_drain

__all__ = ["DrainFault", "DrainSpec", "RequeueFault", "RequeueSpec"]

REASON = "chaoskit slurm.drain"
"""The start of the reason chaoskit drains a node with; each drain adds a token of its own."""
OWN_REASON = re.compile(re.escape(REASON) + r" [0-9a-f]{8}")
"""A reason of chaoskit's own drain (what a journaled revert's last argument must be)."""
OUT_OF_SERVICE = frozenset({"DRAIN", "DOWN", "FAIL"})
"""State flags of a node someone already took out of service: ``slurm.drain`` refuses it."""


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
    duration: PositiveDuration = Field(30.0, description=(
        "How long the node stays drained; then it is resumed, if it is still drained by this drill. A node already "
        "drained, down or failed before the drill is refused (it stays as its administrator left it)."))


class DrainFault(Fault):
    kind = "slurm.drain"
    covers = ("hardware.maintenance",)
    Spec = DrainSpec
    target_type = "node"
    lasting = True
    revert_runs_on = "controller"

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        super().__init__(spec, fault_id)
        self.reason = f"{REASON} {secrets.token_hex(4)}"
        """The reason this drill drains its nodes with: its revert resumes a node only while it still says this."""

    def unfit(self, node: Node) -> str | None:
        return _unfit(node)

    def needs(self) -> tuple[str, ...]:
        return ()  # scontrol runs on the controller, not on the node

    def drain_argv(self, node: Node) -> list[str]:
        return _access(node).argv("scontrol", "update", f"nodename={node.name}", "state=drain", f"reason={self.reason}")

    def resume_argv(self, node: Node) -> list[str]:
        return _access(node).resume_argv(node.name, self.reason)

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        _known_to_slurm(targets)
        for t in targets:
            _in_service(t.info)

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        out = []
        for t in node_targets(ctx.inventory, targets):
            d = self.spec.duration
            out.append(Action(t.node, f"on the controller: scontrol show node {t.node} (a node already drained, down or "
                                      "failed is refused)", t.node))
            out.append(Action(t.node, f"arm lease on the controller: watchdog runs '{shell_quote(self.resume_argv(t.info))}' "
                                      f"after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"on the controller: {shell_quote(self.drain_argv(t.info))}", t.node))
            out.append(Action(t.node, f"after {d:g}s, on the controller: {shell_quote(self.resume_argv(t.info))} (resumes "
                                      "the node only while it is drained with this drill's reason)", t.node))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            access = _access(t.info)
            before = _in_service(t.info)  # again: an administrator may have drained it since preflight
            resume = self.resume_argv(t.info)
            ctx.arm(ctx.controller(t.node), fid, self.kind, resume, self.spec.duration, target=t.node, on="controller")
            res = access.run("scontrol", "update", f"nodename={t.node}", "state=drain", f"reason={self.reason}", check=False)
            ts = time.time()
            if res.returncode != 0:
                try:
                    access.resume_if_drained_by(t.node, self.reason)
                finally:
                    ctx.leases.release(fid)
                raise InfraError(f"scontrol could not drain node {t.node}: {(res.stderr or res.stdout).strip()}")
            out.append(Injection(fid, self.kind, t.node, [t.node], ts, {"resume": resume, "reason": self.reason,
                                                                         "before": before}))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        node = ctx.inventory[injection.node]
        injection.detail["revert"] = _access(node).resume_if_drained_by(node.name, injection.detail.get("reason", self.reason))

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        return _still_drained(ctx.inventory[injection.node], injection.detail.get("reason", self.reason))

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Node | None = None) -> list[str]:
        """The conditional resume of this node, rebuilt from the inventory's Slurm and the drill's own reason:
        a node drained for another reason (an administrator's) stays drained."""
        if node is None or not revert or not OWN_REASON.fullmatch(revert[-1]):
            raise ValueError("not a slurm.drain revert chaoskit arms (a resume conditional on chaoskit's own reason)")
        if len(revert) < 3 or revert[-3] != "--" or revert[-2] != node.name:
            raise ValueError(f"the journal's slurm.drain revert is not for node {node.name}")
        return _access(node).resume_argv(node.name, revert[-1])

    @classmethod
    def check_reverted(cls, transport: Any, revert: list[str], node: Node | None = None) -> str | None:
        if node is None or node.scheduler is None or not revert or not OWN_REASON.fullmatch(revert[-1]):
            return None
        return _still_drained(node, revert[-1])

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """The node drained with chaoskit's own reason."""
        drain = slurm_drain(view.node)
        if drain is not None and (drain[1] or "").startswith(REASON):
            return ["Slurm drain with chaoskit's reason: %s (%s)" % drain]
        return []


def _in_service(node: Node) -> dict[str, Any]:
    """The node's state and reason as Slurm has them; :class:`InfraError` when someone already took it out of service
    (drained, down, failed): chaoskit would otherwise hand it back to the scheduler at its revert."""
    state, reason, by = _access(node).node_state(node.name)
    if set(state.split("+")) & OUT_OF_SERVICE:
        why = f" (reason {reason!r}{f', set by {by}' if by else ''})" if reason else ""
        raise InfraError(f"node {node.name} is already {state}{why}: slurm.drain leaves a node that is out of service "
                         "as it is; nothing was drained",
                         hint="drill a node in service, or resume it first if it should be (scontrol update state=resume)")
    return {"state": state, "reason": reason or None}


def _still_drained(node: Node, reason: str) -> str | None:
    """What is left of a drain with ``reason``: ``None`` once the node is resumed, or drained by someone else."""
    try:
        state, now, _ = _access(node).node_state(node.name)
    except InfraError as exc:
        return f"cannot read node {node.name}'s state from Slurm: {exc}"
    return f"node {node.name} is still {state} ({now})" if "DRAIN" in state.split("+") and now == reason else None


class RequeueSpec(FaultSpec):
    """Requeue this drill's Slurm job running on the selected node (what preemption does to it)."""

    kind: Literal["slurm.requeue"]


class RequeueFault(Fault):
    kind = "slurm.requeue"
    covers = ("hardware.maintenance",)
    Spec = RequeueSpec
    target_type = "node"

    def unfit(self, node: Node) -> str | None:
        return _unfit(node)

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        launch = getattr(workload, "launch", None)
        if launch in LAUNCHES and LAUNCHES[launch].found and getattr(workload, "slurm_job", None) is None:
            return "kind", ("slurm.requeue requeues only the drilled job, and an attached job is known to Slurm by its id: "
                            "set workload.slurm_job")
        return None

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        _known_to_slurm(targets)

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        return [Action(t.node, "on the controller: " + shell_quote(_access(t.info).argv(
                    "scontrol", "requeue", f"<this drill's job on {t.node}>")) + " (other jobs there are left alone)", t.node)
                for t in node_targets(ctx.inventory, targets)]

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        ours = set(getattr(ctx, "scheduler_jobs", None) or ())
        chosen: list[tuple[int, NodeTarget, list[str]]] = []
        for i, t in enumerate(targets):  # every target checked before any job is requeued
            running = _access(t.info).jobs_on(t.node)
            mine = sorted({i for j in running for i in job_ids(j) & ours})  # ours by the id the run knows it by
            if not mine:
                others = len([j for j in running if not job_ids(j) & ours])
                raise InfraError(f"node {t.node} runs none of this drill's Slurm jobs ({', '.join(sorted(ours)) or 'none known'})"
                                 + (f"; the {others} other job(s) there are left alone" if others else "")
                                 + "; nothing was requeued",
                                 hint="slurm.requeue acts only on the job chaoskit submitted or attached to (workload.slurm_job)")
            chosen.append((i, t, mine))
        out = []
        done: set[str] = set()
        for i, t, mine in chosen:
            access = _access(t.info)
            for job in mine:
                if job in done:  # one job on several target nodes is requeued once
                    continue
                done.add(job)
                ts = time.time()  # before: Slurm's probe may see the job requeued before scontrol returns
                res = access.run("scontrol", "requeue", job, check=False)
                if res.returncode != 0:
                    raise InfraError(f"scontrol requeue {job} failed: {(res.stderr or res.stdout).strip()}",
                                     hint="only batch jobs can be requeued, and only with JobRequeue=1 or --requeue")
                out.append(Injection(f"{self.fault_id}.{i}", self.kind, t.node, [f"{t.node}/job{job}"], ts, {"job": job}))
        return out
