"""What each ``workload.launch`` is, as far as a scenario file goes: one table, :data:`LAUNCHES`.

Per launch: the launch-specific workload fields it takes, the one it cannot do without, its default ``wait``, and
what "finished" means for it. The ``Workload`` model takes its ``launch`` literal and its "'X' is only used with
launch: Y" rules from here (:func:`field_problem`); which recovery stacks run under a launch each stack says
(:mod:`chaoskit.stacks`); :mod:`chaoskit.workloads.registry` maps the same names to the job classes that run
them, and a test keeps the two tables' names equal. Stdlib only, so validating a scenario stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["LaunchSpec", "Needs", "LAUNCHES", "LAUNCH_NAMES", "LAUNCH_FIELDS", "taking", "field_problem"]


@dataclass(frozen=True)
class Needs:
    """The field a launch cannot do without, and how its error shows what to write."""

    field: str
    shape: str
    """What its value looks like in the error (``'process: REGEX'``)."""
    why: str | None = None

    def message(self, launch: str) -> str:
        return f"launch: {launch} needs '{self.field}: {self.shape}'" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class LaunchSpec:
    """One ``workload.launch``."""

    fields: frozenset[str] = frozenset()
    """The fields of :data:`LAUNCH_FIELDS` it takes; any other of them, set, is refused."""
    needs: Needs | None = None
    wait: str = "finish"
    """``workload.wait`` when the scenario sets none."""
    ends_itself: bool = False
    """Finished when its own script ends well (an exit 0), and at ``workload.steps`` only where the scenario sets
    it; otherwise finished at ``workload.steps``."""
    sdk_events: bool = True
    """Its processes write the SDK's events (``CHAOSKIT_EVENTS``), which the run reads when ``probes.sdk``."""
    needs_torch: bool = True
    """``--dry-run`` warns when torch is not installed on this machine."""
    checkpoints: str = "job"
    """Where the job keeps the checkpoints a storage fault acts on: ``job`` (the job folder chaoskit gives it),
    ``given`` (the folder ``workload.checkpoint_dir`` names, the only one chaoskit may touch), or ``ray`` (Ray's
    storage, which no storage fault reaches)."""
    inproc: str = "bootstrap"
    """How an in-process fault reaches the job: ``bootstrap`` (chaoskit's own, on the ``PYTHONPATH`` of a job it
    starts under torchrun), ``sdk`` (only through the SDK or a framework callback in the job, which
    ``workload.inproc: sdk`` says is there), or ``none``."""
    found: bool = False
    """The job is not started but found on the nodes (among those that match ``process``): the scope of the drill
    is chosen there (``doctor`` shows it), and paths the scenario names are on the nodes."""
    restarts_own: bool = True
    """chaoskit starts the job's torchrun itself, so its ``max_restarts`` is what a campaign's faults spend; else
    (a job found, or submitted to a scheduler) its restarts are not chaoskit's to count."""


_STARTED_FIELDS = frozenset({"checkpoint_fs", "env"})
_REFERENCE_FIELDS = _STARTED_FIELDS | {"step_compute"}

LAUNCHES: dict[str, LaunchSpec] = {
    "reference": LaunchSpec(_REFERENCE_FIELDS),
    "uninstrumented": LaunchSpec(_REFERENCE_FIELDS, sdk_events=False),
    "command": LaunchSpec(_STARTED_FIELDS | {"command"}, Needs("command", "[script.py, args...]"),
                          ends_itself=True, needs_torch=False),
    "ray-train": LaunchSpec(checkpoints="ray", inproc="none"),
    "attach": LaunchSpec(frozenset({"process", "inproc", "checkpoint_dir", "run_id", "user", "slurm_job"}),
                         Needs("process", "REGEX", "the job's command line, e.g. 'train\\.py'"),
                         wait="recovered",  # somebody else's job may run for days: stop once it recovered
                         sdk_events=False, needs_torch=False, checkpoints="given", inproc="sdk", found=True,
                         restarts_own=False),
    "sbatch": LaunchSpec(_STARTED_FIELDS | {"script", "user"}, Needs("script", "FILE", "the batch script to submit"),
                         inproc="none", restarts_own=False),
}
"""Every ``workload.launch``, in the order the schema lists them."""

LAUNCH_NAMES = tuple(LAUNCHES)

_PICKS = "launch: {launches} (it picks the job to drill among those that match `process`)"

LAUNCH_FIELDS: dict[str, str] = {
    "command": "launch: {launches}",
    "process": "launch: {launches}",
    "inproc": "launch: {launches} (a job chaoskit starts has its bootstrap)",
    "checkpoint_dir": "launch: {launches} (a job chaoskit starts keeps its checkpoints in <job dir>/checkpoints)",
    "checkpoint_fs": "a job chaoskit starts under torchrun, not launch: {launch}",
    "env": "a job chaoskit starts (launch: {launches}), not launch: {launch}",
    "script": "launch: {launches}",
    "run_id": _PICKS,
    "user": "launch: {launches} (attach: whose job to drill among those that match `process`; sbatch: whom the "
            "batch script is submitted as)",
    "slurm_job": "launch: {launches} (a job already queued or running in Slurm)",
    "step_compute": "the reference job (launch: {launches})",
}
"""The workload fields only some launches take, in the order they are checked, each with what its refusal says
after "'FIELD' is only used with " (``{launches}``: those that take it; ``{launch}``: the scenario's)."""

def taking(field: str) -> tuple[str, ...]:
    """The launches that take ``field`` (one of :data:`LAUNCH_FIELDS`), in table order."""
    return tuple(name for name, spec in LAUNCHES.items() if field in spec.fields)


def field_problem(launch: str, values: Mapping[str, Any]) -> str | None:
    """The first problem of a workload's launch-specific ``values`` (field -> value) for ``launch``, field by
    field in :data:`LAUNCH_FIELDS` order: the field it needs left out, or a field it does not take set; ``None``
    when there is none. A field is set when it is not ``None``, ``""``, ``[]`` or ``{}``."""
    spec = LAUNCHES[launch]
    for field, only in LAUNCH_FIELDS.items():
        given = _given(values.get(field))
        if spec.needs is not None and spec.needs.field == field and not given:
            return spec.needs.message(launch)
        if given and field not in spec.fields:
            return f"'{field}' is only used with " + only.format(launches=_either(taking(field)), launch=launch)
    return None


def _given(value: Any) -> bool:
    return value is not None and not (isinstance(value, (str, list, dict)) and not value)


def _either(names: tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
