"""``launch: attach``: a training job somebody else started, found on the nodes and never touched.

Its workers are the processes of each job node whose command line matches
``workload.process`` and whose environment carries torchrun's ``RANK`` (read by
the node's agent, with ``LOCAL_RANK`` and ``TORCHELASTIC_RESTART_COUNT``). chaoskit
does not start it, stop it or wait for it to end: the run's faults are reverted and
the job is left as it is. Its progress is seen through the scenario's log probes.

With ``slurm_job: ID`` (on a cluster whose handle has a ``scheduler``) the job is one
that Slurm runs: its nodes are the ones Slurm allocated it (``scontrol show job``, asked
again at every look, since a requeued job moves), the run's Slurm probe follows its
states, and a job Slurm does not know stops the run before anything is injected.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.slurm import JOB_DONE_STATES, node_list
from chaoskit.core.errors import InfraError
from chaoskit.core.patterns import bounded_search, compile_pattern

__all__ = ["AttachedJob", "Worker"]

LineSink = Callable[[str, str, float], None]
POLL_S = 0.5


class Worker(dict):
    """One worker as found: ``node``, ``pid``, ``rank``, ``local_rank``, ``restart_count``."""


class AttachedJob:
    """The job interface of the runner (start, running, stop, ...) for a job chaoskit did not start."""

    def __init__(self, cluster: ClusterHandle, workload: Any, run_dir: Path, run_id: str,
                 events_path: Path | None = None, on_line: LineSink | None = None) -> None:
        self.cluster, self.workload = cluster, workload
        self.pattern = compile_pattern(workload.process)
        self.slurm_job: str | None = getattr(workload, "slurm_job", None)
        self.slurm: dict[str, str] = {}
        """The Slurm job's fields as last read (``slurm_job`` only)."""
        self.found_at: float | None = None
        self.workers: list[Worker] = []
        self._matches = 0
        self._checked = 0.0
        self._lock = threading.Lock()

    def commands(self) -> dict[str, list[str]]:
        """Nothing is started on any node."""
        return {}

    def describe(self) -> str:
        """What ``--dry-run`` says instead of commands."""
        if self.slurm_job is not None:
            return (f"attached, never started or stopped: Slurm job {self.slurm_job}'s processes matching "
                    f"'{self.workload.process}' with torchrun's RANK in their environment, on the nodes Slurm allocated it")
        nodes = self.cluster.job_nodes
        where = ", ".join(nodes) if len(nodes) <= 4 else f"{nodes[0]} .. {nodes[-1]} ({len(nodes)} nodes)"
        return (f"attached, never started or stopped: the processes matching '{self.workload.process}' with torchrun's "
                f"RANK in their environment on {where}")

    def start(self, nodes: list[str] | None = None) -> None:
        """Look for the job once now; it may also start later (``running`` keeps looking).

        :class:`InfraError` when ``slurm_job`` names a job Slurm does not know (nothing was touched)."""
        if self.slurm_job is not None:
            assert self.cluster.scheduler is not None
            if self.cluster.scheduler.job(self.slurm_job) is None:
                raise InfraError(f"workload.slurm_job: Slurm knows no job {self.slurm_job}; nothing was injected",
                                 hint="squeue shows the queued and running jobs (a finished one is forgotten after MinJobAge)")
            self.cluster.scheduler_jobs.add(self.slurm_job)
        self.scan()

    def start_spares(self) -> list[str]:
        return []

    def scan(self) -> list[Worker]:
        """The job's workers on its nodes now (and whether any process of it is there at all)."""
        workers: list[Worker] = []
        matches = 0
        nodes = self._allocation() if self.slurm_job is not None else self.cluster.job_nodes
        for name in nodes:
            conn = self.cluster.inventory[name].conn
            try:
                procs = conn.processes()
            except InfraError:
                continue
            for p in procs:
                if p.state == "Z" or not bounded_search(self.pattern, p.cmdline, "workload.process"):
                    continue
                matches += 1
                if p.rank is None:
                    continue
                workers.append(Worker(
                    node=name, pid=p.pid, rank=p.rank, local_rank=_int(p.env.get("LOCAL_RANK")),
                    restart_count=_int(p.env.get("TORCHELASTIC_RESTART_COUNT")),
                ))
        with self._lock:
            self.workers, self._matches, self._checked = workers, matches, time.monotonic()
            if workers and self.found_at is None:
                self.found_at = time.time()
        return workers

    def _allocation(self) -> list[str]:
        """The Slurm job's nodes now, those of them this inventory lists; none while it waits for an allocation
        (another job's processes on idle nodes are never taken for its workers). The handle's job nodes follow."""
        assert self.cluster.scheduler is not None and self.slurm_job is not None
        try:
            fields = self.cluster.scheduler.job(self.slurm_job)
        except InfraError:
            if not self.slurm:
                return []
            fields = self.slurm  # slurmctld busy: keep the last answer
        if fields is None:
            self.slurm = {**self.slurm, "JobState": "GONE"}
            return []
        self.slurm = fields
        if fields.get("JobState") not in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
            return []
        nodes = [n for n in node_list(fields.get("NodeList")) if n in self.cluster.inventory]
        if nodes:
            self.cluster.job_nodes = nodes
        return nodes

    def running(self) -> bool:
        """True until the job was found and then no process of it is left on any node (checked every 0.5 s);
        a Slurm job: until Slurm says it ended (a requeued job's processes are gone for a while)."""
        if time.monotonic() - self._checked >= POLL_S:
            self.scan()
        if self.slurm_job is not None:
            return self.slurm.get("JobState") not in (*JOB_DONE_STATES, "GONE")
        return self.found_at is None or self._matches > 0

    def diagnosis(self) -> str | None:
        """Why the run may not see the job advance, in one line."""
        nodes = ", ".join(self.cluster.job_nodes)
        if self.slurm_job is not None:
            state, reason = self.slurm.get("JobState", "?"), self.slurm.get("Reason", "?")
            nodes = f"Slurm job {self.slurm_job} ({state}, reason {reason}, nodes {self.slurm.get('NodeList') or 'none'})"
        if self.found_at is None:
            return (f"no process matching '{self.workload.process}' with torchrun's RANK in its environment on {nodes} "
                    "(attach never starts a job: start it, or fix workload.process)")
        ranks = sorted({w["rank"] for w in self.workers})
        return (f"the job's workers are there (ranks {ranks}) but no step was seen: probes.log must map its step lines "
                "to `step` events, and probes.log_files name the files it writes them to")

    def info(self) -> dict[str, Any]:
        slurm = ({"slurm_job": self.slurm_job, "slurm_state": self.slurm.get("JobState"),
                  "slurm_nodes": node_list(self.slurm.get("NodeList"))} if self.slurm_job is not None else {})
        return {"attached": True, "process": self.workload.process, "found_at": self.found_at, **slurm,
                "workers": [dict(w) for w in sorted(self.workers, key=lambda w: (w["rank"], w["node"]))]}

    def returncodes(self) -> dict[str, int | None]:
        return {}

    def wait(self, timeout: float) -> bool:
        return False

    def stop(self, grace: float = 0.0) -> None:
        """Nothing: the job is not chaoskit's; it is left running."""


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
