"""``recovery: slurm-requeue``: a batch job that Slurm requeues (``sbatch --requeue``). torchrun inside the
allocation restarts its workers where it can; a node that fails (DOWN after ``SlurmdTimeout``, drained by the
health check) or a preemption makes slurmctld requeue the job, hold it (``BeginTime``), allocate it again (an idle
node as the spare) and start it anew from its newest checkpoint. It is measured as the restart model
(:func:`chaoskit.measure.measure_fault`), the reallocation also in the scheduler's steps
(:func:`chaoskit.measure.reallocation_steps`, from the cluster's own events).

The stack of every job Slurm runs as a batch job (``launch: sbatch``; ``reference`` and ``uninstrumented`` on a
cluster with Slurm, through chaoskit's generated ``--requeue`` script) whose scenario names none; ``recovery:
restart`` there says the same and runs the same, as before this stack was one. Slurm's own binaries (sbatch,
squeue, scontrol) are the cluster's: the Slurm lab checks for them (chaoskit/lab/slurm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoskit.core.durations import parse_duration
from chaoskit.stacks.api import LONG_DETECTION_S, CannotRun, Stack

__all__ = ["SlurmRequeue"]


def _slurm(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
           pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    if e.get("kind") == "job.node_fail":
        nodes = [n for n in e.get("nodes") or [] if isinstance(n, str)]
        words = str(e.get("why") or f"job {e.get('job')} NODE_FAIL")
    else:
        nodes = [e["node"]] if isinstance(e.get("node"), str) else []
        state = e.get("slurm_state") or e.get("state") or e.get("kind")
        # one poll gives NOT_RESPONDING (no reason kept) and DOWN (with Slurm's Reason) at once: the node's reason
        reason = e.get("reason") or next((x.get("reason") for x in timeline if x.get("ts") == e.get("ts")
                                          and x.get("source") == "slurm" and x.get("node") == e.get("node")
                                          and x.get("reason")), None)
        words = f"NodeName={e.get('node')} State={state}" + (f" Reason={reason}" if reason else "")
    return {"by": e.get("who") or "slurmctld", "words": words, "parties": [{"rank": None, "node": n} for n in nodes]}


class SlurmRequeue(Stack):
    name = "slurm-requeue"
    blame_readers = {("node.drain", "slurm"): _slurm, ("node.down", "slurm"): _slurm, ("job.node_fail", "slurm"): _slurm}
    describe = ("Slurm's requeue of a batch job: torchrun inside the allocation; a lost node is DOWN after "
                "SlurmdTimeout, then the job is requeued, allocated again and resumed from its checkpoint")
    launches = ("reference", "uninstrumented", "sbatch")
    refusal = ("recovery: slurm-requeue is Slurm's requeue of a batch job, only used with launch: {launches} on a "
               "cluster with Slurm, not launch: {launch}")
    scorecard_column = "slurm"
    scorecard_cluster = "slurm"

    def default_under(self, launch: str, scheduled: bool) -> bool:
        # an author's batch script runs only under Slurm (validate refuses it elsewhere); the reference job is a
        # batch job (chaoskit's generated --requeue script) only on a cluster with Slurm
        return launch in self.launches and (scheduled or launch == "sbatch")

    def cluster_problem(self, handle: Any) -> str | None:
        if handle.scheduler is not None:
            return None
        return ("recovery: slurm-requeue needs a cluster with Slurm to requeue the job (kind: slurm, or an inventory "
                "with scheduler: slurm)")

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        inproc = sorted({f.get("kind") for f in doc.get("faults", []) if str(f.get("kind", "")).startswith("inproc.")})
        if inproc:
            raise CannotRun(f"{', '.join(inproc)}: a Slurm batch job has no chaoskit bootstrap on its path yet, so the "
                            "in-process channel does not reach its ranks (docs/inprocess.md)")
        doc["cluster"] = {"kind": self.scorecard_cluster, "nodes": 2, "spare": 1}
        doc["workload"]["recovery"] = self.name
        for fault in doc.get("faults", []):
            target = fault.get("target") or {}
            if target.get("nodes"):  # the Slurm lab's nodes are n0..n2; a row's n1 is a job node there too
                target["nodes"] = [n for n in target["nodes"] if n in ("n0", "n1")] or ["n1"]
        return doc

    def ran_timeouts(self, result: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        slurm = ((result.get("cluster") or {}).get("slurm") or {})
        settings = slurm.get("settings") if isinstance(slurm.get("settings"), dict) else slurm
        value = settings.get("slurmd_timeout") if isinstance(settings, dict) else None
        sd = None if value is None else float(value) if isinstance(value, (int, float)) else float(parse_duration(value))
        warnings = []
        if sd is not None and sd >= LONG_DETECTION_S:
            warnings.append(f"SlurmdTimeout {sd:g}s (Slurm's default 300 s): a dead node is DOWN only after it")
        return {"SlurmdTimeout": f"{sd:g}s" if sd is not None else "the Slurm lab's (see its result.json)"}, warnings
