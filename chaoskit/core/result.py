"""What one run leaves in ``result.json``: :class:`RunResult` and its parts, typed.

The runner fills it (``assembler.assemble``); the reports, the metrics, the game day, the repeat and the
campaign read it. Its JSON Schema is ``chaoskit schema --result`` (``chaoskit.result.schema.json``).

Three rules keep the file what it was before the model existed, byte for byte:

- every field has a default, so a result written by an older chaoskit, or one cut short (an error before any
  fault), still reads;
- a key the model does not know is kept as it came (``extra="allow"``): a job's own part (``attached``,
  ``slurm``), a key a newer chaoskit adds;
- only the keys given are written, in the order they were given (:meth:`ResultPart.dump`): a key the runner
  leaves out stays out, rather than appearing as its default (a key set on a part afterwards comes after the
  given ones).

Numbers keep their JSON type (an ``int`` limit stays ``30``, not ``30.0``): seconds are :data:`Number`.

This module is core: the standard library and pydantic only, so every layer may read a result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    create_model,
    model_serializer,
    model_validator,
)

from chaoskit.core.phases import PHASE_TABLE

__all__ = [
    "Number", "ResultPart", "Detection", "ReallocationStep", "PhaseFigures", "Phases", "TriggerFired", "Incident", "NodeReturns", "FaultMeasure", "InjectedFault",
    "BlameParty", "Blamed", "BlameTruth", "Blame", "SloEntry", "Check", "Slowdown", "CheckpointTimes", "CheckpointIo", "SilentCheckpoint", "Silent", "PresetInfo", "BadputSeconds", "Goodput", "RunResult",
    "REPEAT_KIND", "result_schema_dict", "result_schema_text",
]

Number = Annotated[Union[int, float], WithJsonSchema({"type": "number"})]
"""Seconds, limits, percentages: an ``int`` read stays an ``int`` and a ``float`` a ``float`` (pydantic would
make ``30`` into ``30.0`` for a ``float`` field, and the file would change)."""

REPEAT_KIND = "chaoskit.repeat"
"""``kind`` of the result.json of a ``chaoskit run --repeat`` folder (``chaoskit/repeat.py``): not a
:class:`RunResult`, its samples are."""


class ResultPart(BaseModel):
    """Base of every part of a result: unknown keys kept, only the given keys written, in their order."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        part = handler(data)
        if isinstance(data, dict) and isinstance(part, ResultPart):
            part._keys = tuple(data)
        return part

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if not self._keys or not isinstance(out, dict):
            return out
        rank = {key: i for i, key in enumerate(self._keys)}
        return dict(sorted(out.items(), key=lambda item: rank.get(item[0], len(rank))))

    def dump(self) -> dict[str, Any]:
        """The part as JSON holds it: the keys given, in the order given, each under its own name (``pass``)."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)


class Detection(ResultPart):
    """One source that noticed the fault (``measure.detection_sources``)."""

    source: str = ""
    kind: str = ""
    node: Optional[str] = None
    detail: Optional[str] = None
    latency_s: Number = 0.0
    behind_s: Number = 0.0


class ReallocationStep(ResultPart):
    """One of the scheduler's steps between detection and the new world (``measure.reallocation_steps``)."""

    step: str = ""
    seconds: Number = 0.0
    bound_by: str = ""


PhaseFigures = create_model(
    "PhaseFigures", __base__=ResultPart, __module__=__name__,
    __doc__="One field per row of ``core/phases.PHASE_TABLE``, named by its ``key``: seconds or steps, ``None`` when "
            "not observed.",
    **{p.key: (Optional[Number] if p.unit == "s" else Optional[int], None) for p in PHASE_TABLE},
)
"""The phases' figures, built from the table (a new phase is a row there, not a field here)."""


# its figures (detection_s, reallocation_s, ...) are PhaseFigures': core/phases.PHASE_TABLE's keys
class Phases(PhaseFigures):  # type: ignore[misc,valid-type]
    """A fault's recovery phases, in seconds; ``None`` (with its reason in ``reasons``) when not observed.

    The headline ``phases`` of a run holds these; each entry of ``per_fault`` too, with the instants."""

    model: Optional[str] = None
    """The recovery model that measured it: ``restart``, ``torchft``, ``nvrx``, ``nvrx-inprocess``."""
    restored_step: Optional[int] = None
    restored_from: Optional[str] = None
    """Which line gave ``restored_step``: ``load line`` (the checkpoint load named its step), ``first step after
    the load`` (it named none: the step before the job's first one after it), ``no checkpoint`` (0)."""
    reallocation_from: Optional[str] = None
    """``log line`` when the new world's start was read from the job's own log line: reallocation then includes
    the new workers' start-up (Python and its imports); absent for the SDK's or a callback's start."""
    last_step_before: Optional[int] = None
    detected_by: Optional[str] = None
    detections: list[Detection] = Field(default_factory=list)
    reasons: dict[str, str] = Field(default_factory=dict)
    """Why each phase left ``None`` was not measured (``detection``, ``reallocation``, ``checkpoint_load``,
    ``recovery``)."""
    uncertainty_s: dict[str, Optional[Number]] = Field(default_factory=dict)
    """Per phase, how far it may be off because its ends were read on different machines' clocks."""
    reallocation_steps: list[ReallocationStep] = Field(default_factory=list)
    unseen: dict[str, str] = Field(default_factory=dict)
    """Per phase a drill measured with log presets alone left unmeasured: the signal no preset sees."""
    discarded_steps: list[int] = Field(default_factory=list)
    """torchft: the steps the survivors discarded."""
    catch_up_steps: Optional[int] = None
    """torchft: the steps the healed group did not take part in."""
    healed_group: Optional[str] = None
    rank_monitor: Optional[dict[str, Any]] = None
    """nvrx: the rank monitors' first timeout after the fault."""
    wrapper: Optional[dict[str, Any]] = None
    """nvrx-inprocess: the in-process Wrapper's first interruption after the fault."""
    in_process: Optional[bool] = None
    world_size: Optional[dict[str, Any]] = None


class TriggerFired(ResultPart):
    """``per_fault[].trigger`` of a fault with an event trigger (``at: {event: ...}``, ``at: {during: ...}``): the
    event that fired it, how long the run waited for it, and ``latency_s``: from the event to the fault in effect,
    less the trigger's own ``after`` (``chaoskit/triggers.py``)."""

    at: str = ""
    event: Optional[str] = None
    node: Optional[str] = None
    rank: Optional[int] = None
    step: Optional[int] = None
    ts: Optional[Number] = None
    waited_s: Optional[Number] = None
    latency_s: Optional[Number] = None


class BlameParty(ResultPart):
    """A rank and the node it ran on, as a recovery stack named it or as chaoskit faulted it (``chaoskit/blame.py``);
    either may be ``None``: a node-level fault has no rank, Slurm and Ray name nodes only."""

    rank: Optional[int] = None
    node: Optional[str] = None


class Blamed(BlameParty):
    """What the recovery stack itself named as the failed rank or node: its first naming after the fault."""

    ranks: list[int] = Field(default_factory=list)
    """Every rank one line named, when it named several (NVRx's Wrapper: ``Interruption.SOFT_TIMEOUT on ranks={0, 1}``)."""
    nodes: list[str] = Field(default_factory=list)
    local_rank: Optional[int] = None
    """The agent's local rank, when the timeline could not tell which global rank that worker was."""
    by: str = ""
    """Who named it: ``torchrun agent``, ``NVRx rank monitor``, ``NVRx in-process Wrapper``, ``torchft lighthouse``,
    ``slurmctld``, ``Ray GCS``, ``torchrun root cause``."""
    words: str = ""
    """The stack's own line (its message, without the log's time and level)."""
    via: Optional[str] = None
    """How the rank or node was read where the words give it only indirectly (a pid, the quorum's reconfigurations)."""
    after_s: Optional[Number] = None
    """From the fault to the naming."""


class BlameTruth(BlameParty):
    """What chaoskit faulted (the injection's target); ``targets`` when it struck several."""

    targets: list[str] = Field(default_factory=list)


class Blame(ResultPart):
    """``per_fault[].blame`` and the headline ``blame``: whom the stack blamed, against the truth."""

    blamed: Optional[Blamed] = None
    """``None`` when the stack named nobody."""
    truth: BlameTruth = Field(default_factory=BlameTruth)
    verdict: str = "none"
    """``right`` (every party named was faulted), ``wrong`` (it named another), ``none`` (it named nobody)."""
    note: Optional[str] = None
    """For ``wrong``: which party named was not faulted, and whether it named the faulted one too."""


class Incident(ResultPart):
    """``incident``: several faults the job felt in one run as one incident (``measure.incident``): from the first
    fault to the first step after the last one's recovery, and the work lost over it all."""

    faults: list[str] = Field(default_factory=list)
    during_recovery: list[str] = Field(default_factory=list)
    """The faults that struck before the previous one's recovery resumed training (a cascade's)."""
    t_first_fault: Optional[Number] = None
    t_resumed: Optional[Number] = None
    detection_s: Optional[Number] = None
    recovery_s: Optional[Number] = None
    lost_steps: Optional[int] = None
    reason: Optional[str] = None


class NodeReturns(ResultPart):
    """One entry of ``recurrence``: a fault with ``recur`` (a node that keeps failing), how often the job came back
    to its node, each return's cost, and whether and when something kept the node out (``measure.node_returns``)."""

    fault: str = ""
    nodes: list[str] = Field(default_factory=list)
    returns: int = 0
    times: Optional[int] = None
    each: list[dict[str, Any]] = Field(default_factory=list)
    kept_out: Optional[dict[str, Any]] = None
    """``at``, ``after_s`` (since the first strike) and ``by`` (a drain's who and why, a spare, or the job going on
    without it); ``None`` with ``reason`` when nothing kept it out."""
    reason: Optional[str] = None


class FaultMeasure(Phases):
    """One entry of ``per_fault``: the fault, and its recovery measured with the instants the phases span."""

    fault: str = ""
    kind: str = ""
    node: Optional[str] = None
    targets: list[str] = Field(default_factory=list)
    t_fault: Optional[Number] = None
    t_detect: Optional[Number] = None
    t_realloc: Optional[Number] = None
    t_loaded: Optional[Number] = None
    t_resumed: Optional[Number] = None
    trigger: Optional[TriggerFired] = None
    blame: Optional[Blame] = None
    """Whom the recovery stack named as failed, against the truth (``chaoskit/blame.py``)."""


class InjectedFault(ResultPart):
    """One entry of ``faults``: what was injected where, and for a kind with several mechanisms how it acted."""

    kind: str = ""
    fault: str = ""
    node: Optional[str] = None
    targets: list[str] = Field(default_factory=list)
    t_fault: Optional[Number] = None
    mechanism: Optional[str] = None
    fidelity: Optional[str] = None
    scope: Any = None
    """``gpu.fail``: on one device or the whole node."""
    error: Any = None


class SloEntry(ResultPart):
    """One SLO the scenario sets, judged (``measure.slo_verdict``): ``limit_s``/``measured_s`` for a phase,
    ``limit``/``measured`` for ``lost_steps``; ``reason`` when not measured."""

    passed: bool = Field(False, alias="pass")
    limit_s: Optional[Number] = None
    measured_s: Optional[Number] = None
    limit: Optional[Number] = None
    measured: Optional[Number] = None
    reason: Optional[str] = None


class Check(ResultPart):
    """One check of the run (``steady_state``, ``training_finished``, ``faults_reverted``,
    ``silent_fault_detected``, ``triggered``, ``no_restart``): whether it passed, and what it saw (its own keys)."""

    passed: bool = Field(False, alias="pass")
    step: Optional[int] = None
    """``steady_state``: the step the job had to reach before the first fault."""
    final_step: Optional[int] = None
    """``training_finished``: the last step the job reported."""
    expected_step: Optional[int] = None
    """``training_finished``: the step the job had to reach."""
    exit_codes: Optional[dict[str, Optional[int]]] = None
    """``training_finished`` of a job whose own end says so: each torchrun agent's exit code."""
    reason: Optional[str] = None
    """``silent_fault_detected``: why nothing noticed; ``steady_state``: the restart that made it unsteady;
    ``triggered``: the trigger that never fired; ``no_restart``: the false restart and its cost."""
    false_restart: Optional[dict[str, Any]] = None
    """``no_restart`` that failed: the first sign of the restart (``event``, ``node``, ``after_s``, ``what``,
    ``who``) and its cost (``recovery_s``, ``lost_steps``)."""
    restarts: Optional[int] = None
    """``steady_state``: the workers' restarts seen before the first fault."""
    restarts_allowed: Optional[int] = None
    """``steady_state``: the restarts the scenario accepts (``steady_state.restarts_allowed``)."""


class Slowdown(ResultPart):
    """A straggler's cost (``measure.measure_slowdown``)."""

    step_time_before_s: Optional[Number] = None
    step_time_during_s: Optional[Number] = None
    step_time_after_s: Optional[Number] = None
    throughput_lost_pct: Optional[Number] = None
    recovery_after_revert_s: Optional[Number] = None
    reasons: dict[str, str] = Field(default_factory=dict)


class CheckpointTimes(ResultPart):
    """The checkpoint saves (or loads) that started in one window of a storage fault."""

    count: int = 0
    failed: int = 0
    median_s: Optional[Number] = None
    max_s: Optional[Number] = None


class CheckpointIo(ResultPart):
    """Checkpoint save and load times under a storage fault (``measure.measure_checkpoint_io``): each of ``save`` and
    ``load`` by window, ``before``, ``during`` and ``after`` the fault."""

    fault: Optional[str] = None
    nodes: list[str] = Field(default_factory=list)
    """The nodes whose storage was harmed: only their saves and loads are counted."""
    save: dict[str, CheckpointTimes] = Field(default_factory=dict)
    load: dict[str, CheckpointTimes] = Field(default_factory=dict)
    save_slowdown_x: Optional[Number] = None
    load_slowdown_x: Optional[Number] = None
    reasons: dict[str, str] = Field(default_factory=dict)


class SilentCheckpoint(ResultPart):
    step: int = 0
    ts: Number = 0.0
    corrupt: bool = False


class Silent(ResultPart):
    """A silent fault's own measure (``observe.sdc.silent_summary``)."""

    detected: bool = False
    detection_s: Optional[Number] = None
    detected_by: Optional[str] = None
    fault_step: Optional[int] = None
    detect_step: Optional[int] = None
    corrupt_steps: Optional[int] = None
    recovered: bool = False
    checkpoints: list[SilentCheckpoint] = Field(default_factory=list)
    last_clean_checkpoint: Optional[int] = None
    lost_steps: Optional[int] = None
    disagree_at_end: Optional[bool] = None
    reason: Optional[str] = None


class PresetInfo(ResultPart):
    """What a log preset in use sees, what it cannot, and the verbosity the job needs for it."""

    sees: list[str] = Field(default_factory=list)
    cannot_see: Any = None
    verbosity: Any = None


class BadputSeconds(ResultPart):
    """Seconds lost per bucket of Google's ml-goodput-measurement, named as its ``BadputType`` enum names them, in
    its order; ``None`` where chaoskit cannot tell (its reason in :attr:`Goodput.reasons`), never zero. The mapping
    from chaoskit's phases: ``chaoskit/goodput.py`` and docs/measuring.md."""

    TPU_INITIALIZATION: Optional[Number] = None
    TRAINING_PREP: Optional[Number] = None
    PROGRAM_STARTUP: Optional[Number] = None
    """The job's start to its first step; after a fault, the new workers' start-up and the first step after the
    checkpoint load."""
    DATA_LOADING_SYNC: Optional[Number] = None
    DATA_LOADING_ASYNC: Optional[Number] = None
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME: Optional[Number] = None
    """Every checkpoint save, its start to its end (``ckpt.save.start``/``ckpt.save.end``)."""
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME: Optional[Number] = None
    """Each fault's checkpoint load, less the new workers' start-up (``startup_s``)."""
    WASTED_PROGRESS_FROM_DISRUPTION: Optional[Number] = None
    """Each fault's lost steps times the job's own step time."""
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION: Optional[Number] = None
    """Each fault's detection and reallocation: the fault to every worker of the new world started."""
    CUSTOM_BADPUT_EVENTS: Optional[Number] = None
    OTHER: Optional[Number] = None
    """The wall time no other bucket and no kept step explains."""


class Goodput(ResultPart):
    """The run's time in the words of Google's ml-goodput-measurement (``chaoskit/goodput.py``): the wall time
    (the first worker's start to the last step), the time on kept steps, and the rest per ``BadputType``. The
    buckets that are not ``None`` and ``productive_s`` add up to ``total_elapsed_s``."""

    source: str = ""
    """``ml-goodput-measurement BadputType``: whose bucket names these are."""
    total_elapsed_s: Optional[Number] = None
    productive_s: Optional[Number] = None
    goodput: Optional[Number] = None
    """``productive_s / total_elapsed_s``."""
    badput_s: BadputSeconds = Field(default_factory=BadputSeconds)
    reasons: dict[str, str] = Field(default_factory=dict)
    """Why each bucket left ``None`` was not measured."""
    notes: list[str] = Field(default_factory=list)
    """Where time went that its own bucket could not hold (a start-up inside a checkpoint load, say)."""


class RunResult(ResultPart):
    """One run's ``result.json``, in the order the runner writes it."""

    scenario: str = ""
    scenario_file: Optional[str] = None
    verdict: str = "error"
    """``pass``, ``fail``, ``aborted``, ``interrupted`` or ``error``."""
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    duration_s: Optional[Number] = None
    run_dir: Optional[str] = None
    cluster: dict[str, Any] = Field(default_factory=dict)
    """The cluster as its handle describes it: ``kind``, ``id``, ``nodes``, ``job_nodes`` and the backend's own."""
    workload: dict[str, Any] = Field(default_factory=dict)
    """The scenario's ``workload:`` with its defaults."""
    recovery_model: Optional[str] = None
    faults: list[InjectedFault] = Field(default_factory=list)
    phases: Phases = Field(default_factory=Phases)
    """The headline: the first fault the job felt by itself."""
    slo: dict[str, SloEntry] = Field(default_factory=dict)
    checks: dict[str, Check] = Field(default_factory=dict)
    per_fault: list[FaultMeasure] = Field(default_factory=list)
    blame: Optional[Blame] = None
    """The headline fault's ``blame``: whom the recovery stack named as failed, against the truth."""
    incident: Optional[Incident] = None
    recurrence: list[NodeReturns] = Field(default_factory=list)
    slowdown: Optional[Slowdown] = None
    checkpoint_io: Optional[CheckpointIo] = None
    """Checkpoint save and load times before, during and after a storage fault (``storage.slow``, ``storage.error``)."""
    silent: Optional[Silent] = None
    final_step: Optional[int] = None
    goodput: Optional[Goodput] = None
    """The run's lost time in the buckets of Google's ml-goodput-measurement (``chaoskit/goodput.py``)."""
    notes: list[str] = Field(default_factory=list)
    capabilities: dict[str, Any] = Field(default_factory=dict)
    clocks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    stop_condition: Optional[dict[str, Any]] = None
    presets: dict[str, PresetInfo] = Field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> "RunResult":
        """The result in ``path`` (a ``result.json``). Raises ``OSError``, ``ValueError`` (not JSON, or not a
        result: pydantic's ``ValidationError`` is one)."""
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))

    def text(self) -> str:
        """``result.json``'s text."""
        return json.dumps(self.dump(), indent=2) + "\n"

    @property
    def injected_kinds(self) -> list[str]:
        """The kinds injected, each once, in injection order."""
        return list(dict.fromkeys(f.kind for f in self.faults))


def result_schema_dict() -> dict[str, Any]:
    schema = RunResult.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "chaoskit result"
    return schema


def result_schema_text() -> str:
    return json.dumps(result_schema_dict(), indent=2, sort_keys=True) + "\n"
