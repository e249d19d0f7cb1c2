"""Slurm as a probe: its node and job states, polled, become timeline events.

:class:`SlurmProbe` asks slurmctld (``scontrol -o show node`` and ``squeue``, see
:mod:`chaoskit.cluster.slurm`) every
``interval`` seconds (0.25 by default, well under the 0.5 s a step needs) and publishes
a change as one event, stamped with the time of the poll that saw it:

- ``node.drain`` (a detection): the node was drained, with its reason (a site's health check that found a failed
  GPU; chaoskit's own ``slurm.drain`` is marked ``injected``);
- ``node.down`` (a detection): a node's slurmd stopped answering (``state: NOT_RESPONDING``,
  after a missed ping) and then the node is DOWN (``state: DOWN``, after ``SlurmdTimeout``); the NOT_RESPONDING
  a resume sets while slurmctld waits for the node to register again (its ``BootTime`` cleared) is none;
- ``job.node_fail``: a job lost a node (seen as ``NODE_FAIL``, or inferred when a job is
  requeued while a node it ran on is DOWN: the state lasts less than a poll);
- ``job.requeued`` with ``restart_count``; ``job.pending`` with Slurm's ``reason``
  (``BeginTime`` is the requeue hold, ``Resources`` no free node, ``Priority`` the queue);
- ``job.allocated`` with its ``nodes``; ``job.running``.

A job first seen already finished is left out (the lab keeps finished jobs for a while);
``only_jobs`` narrows the jobs further, in the query itself (a shared cluster's other users': every
backend passes the run's own jobs).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from chaoskit.cluster.slurm import JOB_DONE_STATES, SlurmAccess, job_ids, node_list
from chaoskit.core.errors import InfraError
from chaoskit.observe.events import Event, EventBus, make_event

__all__ = ["SlurmProbe"]

RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING")


class SlurmProbe(threading.Thread):
    def __init__(self, bus: EventBus, access: SlurmAccess, interval: float = 0.25,
                 only_jobs: Callable[[], set[str] | None] | None = None) -> None:
        super().__init__(daemon=True, name="chaoskit-slurm")
        self.bus, self.access, self.interval, self.only_jobs = bus, access, interval, only_jobs
        self.stop_event = threading.Event()
        self.node_state: dict[str, set[str]] = {}
        self.job_state: dict[str, dict[str, Any]] = {}
        self.finished_before: set[str] = set()
        self.errors = 0

    def poll(self) -> list[Event]:
        """One look at the nodes and the jobs; return the events it published."""
        wanted = self.only_jobs() if self.only_jobs is not None else None
        try:
            nodes = self.access.nodes()
            jobs = self.access.jobs(wanted)
        except InfraError:
            self.errors += 1  # slurmctld busy or restarting: no verdict this round
            return []
        # stamped when Slurm's answer is in: a change that came while squeue ran (a requeue chaoskit injected a
        # moment after the poll began) is never stamped before it happened
        ts = time.time()
        out = self._nodes(nodes, ts) + self._jobs(jobs, nodes, ts)
        for event in out:
            self.bus.publish(event)
        return out

    def _nodes(self, nodes: dict[str, dict[str, str]], ts: float) -> list[Event]:
        out = []
        for name, fields in nodes.items():
            flags = set(fields.get("State", "").split("+"))
            before = self.node_state.get(name, set())
            self.node_state[name] = flags
            if not before:  # a first sighting sets the state: a node DOWN before the run is no detection
                continue
            reason = fields.get("Reason") or None
            if ("NOT_RESPONDING" in flags and "NOT_RESPONDING" not in before and "DOWN" not in before
                    and not _registration_asked(fields)):
                out.append(make_event("node.down", ts, node=name, state="NOT_RESPONDING", who="slurmctld",
                                      why="slurmd not responding", source="slurm", slurm_state=fields.get("State")))
            if "DRAIN" in flags and "DRAIN" not in before:
                # chaoskit's own slurm.drain is the fault, not a detection of one
                ours = bool(reason) and reason.startswith("chaoskit slurm.drain")
                out.append(make_event("node.drain", ts, node=name, state=fields.get("State"), reason=reason,
                                      who="slurmctld", why=f"node drained ({reason})" if reason else "node drained",
                                      source="slurm", injected=ours))
            if "DOWN" in flags and "DOWN" not in before:
                out.append(make_event("node.down", ts, node=name, state="DOWN", who="slurmctld",
                                      why=f"node DOWN ({reason})" if reason else "node DOWN", source="slurm",
                                      slurm_state=fields.get("State"), reason=reason))
        return out

    def _jobs(self, jobs: list[dict[str, str]], nodes: dict[str, dict[str, str]], ts: float) -> list[Event]:
        wanted = self.only_jobs() if self.only_jobs is not None else None
        out = []
        for fields in jobs:
            job_id = fields.get("JobId", "")
            state = fields.get("JobState", "")
            if job_id not in self.job_state and state in JOB_DONE_STATES:
                self.finished_before.add(job_id)  # an earlier run's: no transition of it is this run's
            if job_id in self.finished_before or (wanted is not None and not job_ids(fields) & wanted):
                continue
            restarts = _int(fields.get("Restarts"))
            reason = fields.get("Reason") or None
            alloc = node_list(fields.get("NodeList"))
            prev = self.job_state.get(job_id, {"state": None, "restarts": 0, "reason": None, "nodes": []})
            self.job_state[job_id] = {"state": state, "restarts": restarts, "reason": reason, "nodes": alloc}
            where = {"node": fields.get("BatchHost") if fields.get("BatchHost") not in (None, "", "(null)") else (alloc or [None])[0]}
            common = {"job": job_id, "who": "slurmctld", "source": "slurm", **{k: v for k, v in where.items() if v}}
            if restarts > prev["restarts"]:
                lost = [n for n in prev["nodes"] if "DOWN" in nodes.get(n, {}).get("State", "").split("+")]
                if lost and prev["state"] != "NODE_FAIL":
                    out.append(make_event("job.node_fail", ts, **common, nodes=lost, inferred=True,
                                          why=f"job {job_id} lost node(s) {', '.join(lost)}"))
                out.append(make_event("job.requeued", ts, **common, restart_count=restarts,
                                      why=f"job {job_id} requeued (restart {restarts})"))
            if state == "NODE_FAIL" and prev["state"] != "NODE_FAIL":
                out.append(make_event("job.node_fail", ts, **common, nodes=prev["nodes"] or alloc,
                                      why=f"job {job_id} NODE_FAIL"))
            if state == "PENDING" and (prev["state"] != "PENDING" or reason != prev["reason"]):
                out.append(make_event("job.pending", ts, **common, reason=reason, restart_count=restarts))
            if state in RUNNING[:2] and alloc and (alloc != prev["nodes"] or prev["state"] not in RUNNING):
                out.append(make_event("job.allocated", ts, **common, nodes=alloc, restart_count=restarts))
            if state == "RUNNING" and prev["state"] != "RUNNING":
                out.append(make_event("job.running", ts, **common, nodes=alloc, restart_count=restarts))
            if state in JOB_DONE_STATES and prev["state"] not in JOB_DONE_STATES and prev["state"] is not None:
                out.append(make_event("job.end", ts, **common, state=state, exit_code=fields.get("ExitCode")))
        return out

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def _registration_asked(fields: dict[str, str]) -> bool:
    """Whether slurmctld itself marked the node NOT_RESPONDING to have its slurmd register again: a resume
    (``scontrol update state=resume``, chaoskit's revert of ``slurm.drain`` among others) does so in Slurm 22.05
    (``_require_node_reg`` in ``node_mgr.c``: NOT_RESPONDING, ``BootTime`` cleared, a ping at once) and the flag goes
    with the node's answer, about 1 s later in the lab. A slurmd that really stopped answering keeps its ``BootTime``;
    one that does not answer the resume's ping is DOWN after ``SlurmdTimeout``, and that is still reported."""
    return fields.get("BootTime") == "None"


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0
