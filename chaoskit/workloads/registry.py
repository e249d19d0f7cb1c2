"""Which :class:`~chaoskit.workloads.api.Job` runs each ``workload.launch``: the launch table's job side.

:data:`JOBS` has one entry per name of :data:`chaoskit.core.launches.LAUNCHES` (what a scenario may say
with each launch: its fields, the recovery models it runs under), which it carries as ``spec``; a launch
missing from either table fails at import. The runner builds its job with :func:`make_job` and asks the job,
never its class, what to do with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterHandle
from chaoskit.core.launches import LAUNCHES, LaunchSpec
from chaoskit.workloads.api import Job
from chaoskit.workloads.attach import AttachedJob
from chaoskit.workloads.launch import TorchrunJob
from chaoskit.workloads.ray_train import RayTrainJob
from chaoskit.workloads.slurm import SlurmJob

__all__ = ["Launch", "JOBS", "job_class", "make_job"]


@dataclass(frozen=True)
class Launch:
    """One ``workload.launch``: what a scenario may say with it, and the job that runs it."""

    spec: LaunchSpec
    job: type[Job]
    scheduled: type[Job] | None = None
    """The job on a cluster with a batch scheduler (a handle with a ``scheduler``), where it is another one."""


def _launch(name: str, job: type[Job], scheduled: type[Job] | None = None) -> Launch:
    return Launch(LAUNCHES[name], job, scheduled)


JOBS: dict[str, Launch] = {
    "reference": _launch("reference", TorchrunJob, scheduled=SlurmJob),  # a generated batch script: srun, torchrun
    "uninstrumented": _launch("uninstrumented", TorchrunJob, scheduled=SlurmJob),
    "command": _launch("command", TorchrunJob),
    "ray-train": _launch("ray-train", RayTrainJob),
    "attach": _launch("attach", AttachedJob),
    # only on a cluster with Slurm: scenario/checks.py refuses it elsewhere before any job is built
    "sbatch": _launch("sbatch", SlurmJob),
}
if JOBS.keys() != LAUNCHES.keys():
    raise RuntimeError(f"the launch tables differ: {sorted(JOBS.keys() ^ LAUNCHES.keys())}")


def job_class(launch: str, cluster: ClusterHandle) -> type[Job]:
    """The job class that runs ``launch`` on ``cluster``."""
    entry = JOBS[launch]
    return entry.scheduled if cluster.scheduler is not None and entry.scheduled is not None else entry.job


def make_job(cluster: ClusterHandle, workload: Any, run_dir: Path, run_id: str, events_path: Path | None = None,
             on_line: Callable[[str, str, float], None] | None = None, *, base: Path) -> Job:
    """The job for ``workload.launch`` on ``cluster`` (``base``: the scenario's folder, where a relative script is)."""
    return job_class(workload.launch, cluster)(cluster, workload, run_dir, run_id, events_path, on_line, base=base)
