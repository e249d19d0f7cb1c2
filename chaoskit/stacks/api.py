"""What a recovery stack is: one :class:`Stack` subclass per module of ``chaoskit/stacks/``.

A stack owns everything that depends on how a job recovers: its settings (a model under one workload key, with
its defaults), the launches it runs under, the launcher's argv and environment (:class:`StackRun`, one per job),
its log presets and those a drill under it reads, its steady-state rule, its measurement model and what its phases mean,
its timeouts as the scorecard shows them, and what it needs installed. Code outside ``chaoskit/stacks/`` asks the
stack (:func:`chaoskit.stacks.registry.stack`), never compares its name.

The base class is plain torchrun (``recovery: restart``): a stack overrides what differs. Stdlib, pydantic and
chaoskit's lower layers only, so that validating a scenario stays cheap.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

from chaoskit.core.jobenv import SHARE_STORE_VAR
from chaoskit.core.launches import LAUNCH_NAMES
from chaoskit.core.models import StrictModel
from chaoskit.measure import RESTART_MEANINGS, measure_fault
from chaoskit.observe.presets import Preset

__all__ = ["Stack", "StackRun", "JobView", "Measure", "BlameReader", "CannotRun", "TORCHRUN", "LONG_DETECTION_S", "seconds_text",
           "row_kind", "ranks_to_nodes"]

TORCHRUN = ["-m", "torch.distributed.run"]
"""torchrun, run by the job's Python (a node's own Python is used)."""
LONG_DETECTION_S = 120.0
"""A timeout at or above this makes a hang (or a dead node) take minutes to notice: the scorecard warns."""

BlameReader = Callable[[dict[str, Any], list[dict[str, Any]], int, dict[int, str], dict[tuple[str, int], int]],
                       "dict[str, Any] | None"]
"""``(event, timeline, its index there, rank -> node, (node, pid) -> rank) -> {"by", "words", "parties": [{"rank",
"node"}], "via"?}`` or ``None``: the failed rank or node a stack named in one of its events (:mod:`chaoskit.blame`)."""
Measure = Callable[..., dict[str, Any]]
"""``(events, t_fault, t_fault_uncertainty=0.0, *, node=None, fault_step=None) -> phases`` (:mod:`chaoskit.measure`)."""


class CannotRun(Exception):
    """A (stack, fault) pair of the scorecard that cannot run here; the message is the cell's why."""


class JobView(Protocol):
    """What a :class:`StackRun` sees of the job it starts (:class:`chaoskit.workloads.launch.TorchrunJob`)."""

    cluster: Any
    workload: Any
    job_dir: Path
    run_id: str
    account: Any

    def start_beside(self, node: str, argv: list[str], log: str, only: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``node`` in the job's scope, its output in ``logs/<log>.log`` and to the probes."""
        ...


class StackRun:
    """A stack's part in starting one job: plain torchrun here. Made by :meth:`Stack.for_job`."""

    sets_tmpdir = False
    """The stack sets the job's ``TMPDIR`` itself (``--dry-run`` then says why from :data:`WHY`)."""

    def __init__(self, stack: "Stack", job: JobView) -> None:
        self.stack, self.job = stack, job

    def job_args(self) -> list[str]:
        """Options the stack adds to the reference job's command line."""
        return []

    def world(self, node: str) -> list[str] | None:
        """torchrun's world options for ``node`` when the stack's differ from one world of every node, else ``None``."""
        return None

    def launcher(self, plan: bool = False) -> list[str]:
        """What the job's Python runs as each node's agent (torchrun, or the stack's launcher and its options);
        ``plan``: as ``--dry-run`` shows it (no file written)."""
        return list(TORCHRUN)

    def env_defaults(self) -> dict[str, str]:
        """Variables the stack sets that a scenario's ``workload.env`` may change."""
        return {}

    def env_owned(self, node: str, plan: bool = False) -> dict[str, str]:
        """Variables the stack owns on ``node`` (:attr:`Stack.owned_env`): set last, never the scenario's."""
        return {}

    def side_commands(self) -> dict[str, list[str]]:
        """Processes the stack runs beside the agents (label -> argv), as ``--dry-run`` lists them first."""
        return {}

    def start(self) -> list[subprocess.Popen[bytes]]:
        """Start what the stack needs before the agents (its files, its processes); the processes started."""
        return []

    def cleanup(self) -> None:
        """Remove what :meth:`start` made outside the job's folder."""


class Stack:
    """One recovery stack: plain torchrun, which restarts the world and loads a checkpoint (``recovery: restart``).

    A subclass declares ``name = "..."`` in its body (the registry reads it from the source) and overrides what
    differs."""

    name: ClassVar[str] = "restart"
    describe: ClassVar[str] = "the world stops, restarts and loads a checkpoint"
    launches: ClassVar[tuple[str, ...]] = LAUNCH_NAMES
    """The ``workload.launch`` values it runs under."""
    refusal: ClassVar[str] = "recovery: {name} is only used with launch: {launches}, not launch: {launch}"
    """What refusing it to another launch says (``{name}``, ``{launches}``, ``{launch}``)."""
    settings_key: ClassVar[str | None] = None
    """Its ``workload`` key (``nvrx:``), set only with this stack; ``None``: it has no settings."""
    Settings: ClassVar[type[StrictModel] | None] = None
    settings_doc: ClassVar[str] = ""
    agent: ClassVar[str] = "torchrun"
    """Each node's agent (what ``--dry-run`` names)."""
    owned_env: ClassVar[tuple[str, ...]] = ()
    """Variables chaoskit sets for the stack, which a scenario may not set or unset."""
    log_presets: ClassVar[tuple[Preset, ...]] = ()
    """Its own log presets, defined in its module: the lines it prints, mapped to events (a scenario names them in
    ``probes.presets``; :func:`chaoskit.stacks.registry.log_presets` lists them beside the frameworks')."""
    presets: ClassVar[tuple[str, ...]] = ()
    """Log presets a drill under it always reads (who noticed a fault says so in the stack's own lines)."""
    blame_readers: ClassVar[dict[tuple[str, str], BlameReader]] = {}
    """(event kind, event source) -> how its naming of the failed rank or node is read from such an event: its own
    words, for blame (:mod:`chaoskit.blame` reads every registered stack's, whatever the drill's stack)."""
    every_group_steady: ClassVar[bool] = False
    """Steady state needs every node's group stepping (each node is a world of its own), not the job's step."""
    phase_meanings: ClassVar[dict[str, str]] = RESTART_MEANINGS
    """What each phase spans under its measurement model (the reports' "what it spans" column)."""
    reallocation_label: ClassVar[str] = "new world started"
    """What the run says when the reallocation phase ends."""
    result_keys: ClassVar[tuple[str, ...]] = ()
    """Its own keys in ``result.json``'s phases, beside the phases every model has."""
    extra: ClassVar[str | None] = None
    """The chaoskit extra that installs what it needs, ``None`` when torch alone does."""
    requires: ClassVar[str | None] = None
    """The Python module this machine needs to start a job under it (``None``: torch alone)."""
    install: ClassVar[str | None] = None
    """The install line that brings :attr:`requires` (what ``--dry-run``'s preflight says)."""
    scorecard_column: ClassVar[str | None] = None
    """Its column in ``chaoskit scorecard`` (``None``: none)."""
    scorecard_note: ClassVar[str | None] = None
    """What its column's header says under its name (``None``: nothing)."""
    scorecard_cluster: ClassVar[str | None] = None
    """The cluster kind its column runs every row on (``None``: the row's own): such columns come last."""
    framework: ClassVar[str | None] = None
    """The ``chaoskit init --framework`` whose starter scenario runs under it (``None``: none)."""
    init_lines: ClassVar[tuple[str, ...]] = ()
    """What that starter's ``workload`` says under ``launch: command`` (its ``recovery`` and settings, commented)."""
    run_class: ClassVar[type[StackRun]] = StackRun

    def measure(self, events: Any, t_fault: float, t_fault_uncertainty: float = 0.0, *, node: str | None = None,
                fault_step: int | None = None) -> dict[str, Any]:
        """One fault's recovery measured under this stack's model (``model`` names it in the phases)."""
        return measure_fault(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)

    def default_under(self, launch: str, scheduled: bool) -> bool:
        """Whether it is the stack of a job of ``launch`` whose scenario names none (``scheduled``: on a cluster with
        a batch scheduler); plain torchrun is where no stack claims the launch."""
        return False

    def launch_problem(self, launch: str) -> str | None:
        """Why it does not run under ``launch``, or ``None`` when it does."""
        if launch in self.launches:
            return None
        return self.refusal.format(name=self.name, launches=_either(self.launches), launch=launch)

    def check(self, workload: Any) -> None:
        """Rules of its settings against the rest of the workload (``ValueError``: the workload's error); its
        settings are filled in with their defaults before this."""

    def share_store(self) -> tuple[bool, str]:
        """Whether its workers share torchrun's rendezvous store (torchrun's default), and why, as the plan says."""
        return False, (f"{SHARE_STORE_VAR}=1: each rendezvous round gets a fresh store hosted by rank 0; the store "
                       "shared with the agents mixes rounds when agents restart at different counts and can deadlock "
                       "init_process_group (seen with torch 2.13 on three local agents); a job that needs a store at "
                       f"MASTER_ADDR:MASTER_PORT sets workload.env {SHARE_STORE_VAR}: null")

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        """Its timeouts as the drill ran them (the validated ``workload``), for the scorecard, and a warning for
        each that makes detection take minutes."""
        return {}, []

    def ran_timeouts(self, result: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        """Its timeouts that only the drill's ``result.json`` knows (the cluster's settings), as :meth:`timeouts`."""
        return {}, []

    def bound(self, who: str, detection_s: float, workload: Any) -> str | None:
        """Which of its timeouts a detection by ``who`` after ``detection_s`` came at (``", at its ..."``), or
        ``None`` when none of its own did."""
        return None

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        """A scorecard row (a scenario document written for plain torchrun, from the rows' ``folder``) as this
        stack's column runs it; :class:`CannotRun` with why when it cannot. By default the row's workload under
        this stack, refused where the stack does not run under the row's launch."""
        problem = self.launch_problem(doc["workload"].get("launch", "reference"))
        if problem:
            raise CannotRun(problem)
        doc["workload"]["recovery"] = self.name
        return doc

    def missing(self) -> str | None:
        """What this machine lacks to start a job under it (its :attr:`requires` not importable), with the line
        that installs it; ``None`` when nothing is missing."""
        if self.requires is None or importlib.util.find_spec(self.requires) is not None:
            return None
        return f"{self.requires} is not installed (recovery: {self.name}): {self.install or 'install it'}"

    def cluster_problem(self, handle: Any) -> str | None:
        """Why a scenario that names it cannot run on its cluster ``handle`` (validate's error at the ``recovery``
        line), or ``None`` when it can."""
        return None

    def unfit(self, handle: Any) -> str | None:
        """Why its column cannot run on the scenario's (previewed) cluster ``handle``, or ``None`` when it can."""
        return None

    def lost_work(self, phases: dict[str, Any]) -> str | None:
        """What the lost work of a fault's recorded ``phases`` is made of, in its own terms, or ``None``: the steps
        between the last before the fault and the restored one (the reports say it)."""
        return None

    def for_job(self, job: JobView) -> StackRun:
        return self.run_class(self, job)

    def settings(self, workload: Any) -> Any:
        """Its settings in ``workload`` (``None`` when it has none)."""
        return getattr(workload, self.settings_key) if self.settings_key else None


def seconds_text(value: float) -> str:
    return f"{value:g}s"


def row_kind(doc: dict[str, Any]) -> str:
    """The cluster kind a scorecard row runs on (``lab``: the process lab)."""
    cluster = doc.get("cluster", "lab")
    return cluster.get("kind", "process") if isinstance(cluster, dict) else "process"


def ranks_to_nodes(doc: dict[str, Any], process: str | None = None) -> None:
    """A row's ``target: {ranks: [r]}`` as the node of rank r, for a column where a rank is no torchrun rank (one
    worker per node: node n<r>); ``process``: the process a ``process.*`` fault targets there."""
    for fault in doc.get("faults", []):
        target = fault.get("target") or {}
        if "ranks" in target:
            ranks = target.pop("ranks")
            target.setdefault("nodes", [f"n{r}" for r in ranks])
        if process is not None and str(fault.get("kind", "")).startswith("process."):
            target["process"] = process
        fault["target"] = target


def _either(names: tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
