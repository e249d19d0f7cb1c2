"""The contract of a drilled job: what the runner asks of every ``workload.launch``, and nothing more.

Each launch's job is a :class:`Job` (:mod:`chaoskit.workloads.registry` says which): torchrun agents started
here (:class:`~chaoskit.workloads.launch.TorchrunJob`), a Ray Train driver
(:class:`~chaoskit.workloads.ray_train.RayTrainJob`), somebody else's job found on the nodes
(:class:`~chaoskit.workloads.attach.AttachedJob`), or a job submitted to Slurm
(:class:`~chaoskit.workloads.slurm.SlurmJob`). The runner builds it as
``cls(cluster, workload, run_dir, run_id, events_path, on_line, base=base)`` (``events_path``: where the SDK's
events go, ``None`` when none are read; ``on_line(node, line, ts)``: where each line of the job's output goes;
``base``: the folder a relative script of the scenario's is taken from) and then never asks which class it
has: what differs is a flag or a method here.

Its recovery model is the scenario's ``workload.recovery``, one of those its launch runs under
(:attr:`~chaoskit.core.launches.LaunchSpec.recoveries`), measured by ``chaoskit.measure``; what "finished"
means is :meth:`Job.finished`.
"""

from __future__ import annotations

import abc
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

from chaoskit.cluster.slurm import SubmitUser
from chaoskit.core.files import copy_regular, make_folder_for
from chaoskit.core.launches import LAUNCHES, LaunchSpec
from chaoskit.faults.api import INPROC_CHANNEL_DIR

__all__ = ["Job", "JobFolders", "job_folder"]

SDK_EVENTS_FILE = "sdk-events.jsonl"


def job_folder(cluster: Any, run_dir: Path, run_id: str, owned: bool = False) -> Path:
    """Where the job's own files go (checkpoints, the SDK's events): the cluster's shared folder
    when its nodes are not this machine, else the run directory. ``owned``: the job runs as another user than
    chaoskit (an author's batch script, submitted as its user; a lab account): then the folder is the job's own,
    never the run folder, whose files are chaoskit's (beside it on this machine: ``RUN.job``)."""
    shared = cluster.shared_dir
    if shared is not None:
        return Path(shared) / run_id
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.name + ".job") if owned else run_dir


@dataclass(frozen=True)
class JobFolders:
    """Where a job keeps its files, as :meth:`Job.folders` says before the job is built: the runner makes them
    (:meth:`make`), hands them to the faults and probes, and keeps what is worth keeping at the end (:meth:`collect`)."""

    root: Path
    """The job's own folder (:func:`job_folder`): the run folder, ``RUN.job`` for a job of another user, or one in
    the cluster's shared folder."""
    checkpoints: str | None
    """Its checkpoint folder as its nodes see it (what storage faults act in); ``None``: the launcher's own storage,
    which no storage fault reaches."""
    sdk_events: Path | None
    """Where the SDK's events go (``None``: none are read)."""
    inproc: Path | None
    """The in-process channel's folder where it is the job's own (a job of another user that takes chaoskit's
    bootstrap: that user cannot reach root's state folder); ``None``: the node's state folder's."""
    owned: bool
    """The job runs as another user than chaoskit: its folder is made new and given to that user."""
    subfolders: tuple[str, ...] = ()
    """Made in a folder given to the job's user (``checkpoints``, ``tmp``, the channel's)."""

    def make(self, owner: Any) -> None:
        """Make the folder before anything of the job's starts: for a job of ``owner`` (uid, gid) new, its folders
        and files in it, then given to them; else as chaoskit, with an empty SDK events file."""
        if owner is not None:
            make_folder_for(self.root, owner.uid, owner.gid, dirs=self.subfolders,
                            files=(SDK_EVENTS_FILE,) if self.sdk_events is not None else ())
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if self.sdk_events is not None:
            self.sdk_events.touch()

    def collect(self, run_dir: Path) -> None:
        """With a folder of its own (the docker lab's shared one, the job user's ``RUN.job``): keep the SDK's events
        with the run, drop the rest (the checkpoints). The folder may be the job's user's: read as data (never
        through a link, never a FIFO)."""
        if self.root == run_dir:
            return
        copy_regular(self.root / SDK_EVENTS_FILE, run_dir / SDK_EVENTS_FILE)
        shutil.rmtree(self.root, ignore_errors=True)


class Job(abc.ABC):
    """One drilled job, as the runner drives it: plan (:meth:`commands`, :meth:`plan_part`, :meth:`scope_note`),
    start (:meth:`start`, later :meth:`start_spares`), watch (:meth:`running`, :meth:`diagnosis`,
    :meth:`scope_chosen`), stop (:meth:`stop`) and report (:meth:`finished`, :meth:`result_part`)."""

    started: ClassVar[bool] = True
    """chaoskit starts the job's processes and stops them at the end; ``False``: somebody else's job, found on the
    nodes and left running."""
    bootstraps: ClassVar[bool] = False
    """chaoskit's bootstrap goes into the job's Python processes (:meth:`use_inproc`): the in-process channel of
    ``inproc.*`` faults and the SDC probe. A job without it takes the channel its own way (an attached job through
    the SDK, ``workload.inproc``) or not at all."""

    cluster: Any
    """The :class:`~chaoskit.backends.api.ClusterHandle` it runs on."""
    workload: Any
    """The scenario's :class:`~chaoskit.scenario.model.Workload`."""
    line_errors: Sequence[str] = ()
    """What went wrong handling a line of the job's output (the line skipped; result.json's notes name them)."""

    @classmethod
    def runs_as(cls, workload: Any, base: Path) -> SubmitUser | None:
        """The user the job runs as when it is not chaoskit's (an author's batch script, submitted as its own
        user), known before the job is built: its folder is made for that user, and checkpoint faults act in it.
        ``None``: as chaoskit. :class:`~chaoskit.core.errors.ScenarioError` where it may not run at all."""
        return None

    @classmethod
    def folders(cls, cluster: Any, workload: Any, run_dir: Path, run_id: str, *, owned: bool, sdk: bool,
                inproc: bool) -> JobFolders:
        """Where this job's files go (:class:`JobFolders`), known before it is built. ``owned``: it runs as another
        user than chaoskit; ``sdk``: the scenario reads the SDK's events; ``inproc``: the run uses the in-process
        channel. Where the checkpoints are is its launch's (:attr:`~chaoskit.core.launches.LaunchSpec.checkpoints`)."""
        run_dir = Path(run_dir).resolve()
        root = job_folder(cluster, run_dir, run_id, owned)
        spec = LAUNCHES[workload.launch]
        checkpoints = (workload.checkpoint_dir if spec.checkpoints == "given"
                       else str(root / "checkpoints") if spec.checkpoints == "job" else None)
        return JobFolders(
            root=root, checkpoints=checkpoints,
            sdk_events=root / SDK_EVENTS_FILE if sdk and spec.sdk_events else None,
            inproc=root / INPROC_CHANNEL_DIR if owned and inproc and cls.bootstraps else None,
            owned=owned, subfolders=("checkpoints", "tmp", *((INPROC_CHANNEL_DIR,) if inproc else ())))

    @property
    def launch_spec(self) -> LaunchSpec:
        """What the scenario's ``workload.launch`` is (:data:`~chaoskit.core.launches.LAUNCHES`)."""
        return LAUNCHES[self.workload.launch]

    # -- planning (``--dry-run`` builds the job and calls only these) ------------------------

    @abc.abstractmethod
    def commands(self) -> dict[str, list[str]]:
        """What starting the job runs, by where it runs (a node, ``controller``, ``driver``); empty when nothing is."""

    def plan_part(self) -> dict[str, Any]:
        """The job's own keys in ``--dry-run``'s output beside its commands (``{"submit": ...}``)."""
        return {}

    def found_where(self) -> str:
        """What the progress line says a job chaoskit does not start (:attr:`started` ``False``) is found in."""
        return f"the job on {', '.join(self.cluster.job_nodes)}"

    def scope_note(self) -> str:
        """What ``--dry-run`` says of the processes a fault may act on."""
        return ("only the processes of the job chaoskit starts are ever acted on: each carries its node's mark "
                "(CHAOSKIT_SCOPE), checked by the node's agent")

    # -- running ---------------------------------------------------------------------------

    def use_inproc(self, folders: dict[str, str], sdc_every: int | None = None, final_checksum: bool = False) -> None:
        """Before :meth:`start`, only where :attr:`bootstraps`: the bootstrap into the job's processes, with the
        in-process channel's folder on each node (``folders``: node -> ``<state folder>/inproc``), the SDC probe's
        interval, and whether the ranks write their checksums at exit."""
        raise NotImplementedError(f"{type(self).__name__} takes no bootstrap (bootstraps is False)")

    def use_watch(self, watcher: Any) -> None:
        """Before :meth:`start`: the run's :class:`~chaoskit.observe.probes.ProcessWatcher`, for a job that reads
        the nodes' process tables itself (it may read a node again only after its stream said something)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the job on its job nodes (or submit it, or look for it); raise :class:`InfraError` when it cannot."""

    def start_spares(self) -> list[str]:
        """Once steady state is reached: start what waits on the spare nodes to take over; the nodes started."""
        return []

    @abc.abstractmethod
    def running(self) -> bool:
        """Whether the job goes on (cheap enough to ask ten times a second)."""

    def scope_chosen(self) -> bool:
        """Whether the processes a fault may act on are known: at once for a job chaoskit starts; an attached job
        once it has chosen which job on the nodes is the drilled one (steady state waits for it)."""
        return True

    def diagnosis(self) -> str | None:
        """Why the run may not see the job advance, in one line, or ``None``."""
        return None

    wait_poll_s: ClassVar[float] = 0.1
    """How often :meth:`wait` asks :meth:`running`."""

    def wait(self, timeout: float) -> bool:
        """Whether the job has ended within ``timeout`` seconds (:meth:`running` asked every :attr:`wait_poll_s`)."""
        deadline = time.time() + timeout
        while self.running() and time.time() < deadline:
            time.sleep(self.wait_poll_s)
        return not self.running()

    @abc.abstractmethod
    def returncodes(self) -> dict[str, int | None]:
        """Exit status by process (agent, driver, Slurm job); ``None`` while it runs."""

    @abc.abstractmethod
    def stop(self) -> None:
        """End whatever chaoskit started of the job, on every node; nothing of a job that is not chaoskit's."""

    # -- results ---------------------------------------------------------------------------

    def finish_step(self) -> int | None:
        """The step at which training is finished: ``workload.steps``, or ``None`` for a job whose own end says so
        (``launch: command`` where the scenario sets no ``steps``: an HF Trainer job that ended at its step 300
        is not held to the reference job's 400)."""
        w = self.workload
        return None if self.launch_spec.ends_itself and "steps" not in w.model_fields_set else w.steps

    def finished(self, final_step: int | None) -> dict[str, Any]:
        """The ``training_finished`` check: the job reached :meth:`finish_step`, and a job whose own end says so
        ended well: an agent exited 0 (one exits 0 only once its workers did; a node the drill killed exits
        otherwise)."""
        expected = self.finish_step()
        reached = expected is None or (final_step is not None and final_step >= expected)
        check: dict[str, Any] = {"final_step": final_step, "expected_step": expected}
        if self.launch_spec.ends_itself:
            codes = self.returncodes()
            check["exit_codes"] = codes
            reached = reached and any(code == 0 for code in codes.values())
        return {"pass": reached, **check}

    def result_part(self) -> dict[str, Any]:
        """The job's own keys in result.json (``{"attached": ...}``, ``{"slurm": ...}``)."""
        return {}
