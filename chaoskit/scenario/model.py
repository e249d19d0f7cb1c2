"""The scenario format: pydantic models are the single source of truth.

Validation, the JSON Schema (``chaoskit schema``) and the docs all come from here.
Fault specs come from the fault registry, so a plugin's kind is validated and
documented like a built-in one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Optional, Union

from pydantic import AfterValidator, Field, ValidationInfo, create_model, field_validator, model_validator

from chaoskit.backends.api import ClusterSpec
from chaoskit.backends.registry import CLUSTERS
from chaoskit.core.durations import Duration, PositiveDuration
from chaoskit.core.event_kinds import EventKind
from chaoskit.core.limits import MAX_COUNT, MAX_REPEAT
from chaoskit.core.models import NAME_RE, Regex, StrictModel, check_each, check_http_url, check_match
from chaoskit.core.sizes import ByteSize
from chaoskit.core.shell import USER_RE, check_path
from chaoskit.faults.registry import FAULTS
from chaoskit.observe.rules import LogRule as ObservedRule
from chaoskit.core.launches import LAUNCH_FIELDS, LAUNCH_NAMES, LAUNCHES, field_problem
from chaoskit.core.jobenv import MAX_ENV_VARS, check_env_name, check_env_value
from chaoskit.stacks.registry import STACKS, default_stack, log_presets, preset_rules, settings_keys

__all__ = [
    "Workload",
    "WorkloadBase",
    "workload_model",
    "LogRule",
    "Probes",
    "PrometheusRule",
    "StopCondition",
    "SLO",
    "PhasePercentiles",
    "StepPercentiles",
    "Safety",
    "SteadyState",
    "Expect",
    "ScenarioBase",
    "scenario_model",
    "model_for",
]

_IDS = {  # a workload's field naming a job or a user: its pattern, its name and the pattern in words
    "slurm_job": (r"[0-9]{1,12}(_[0-9]{1,9})?", "Slurm job id", "digits, or JOB_TASK for an array task"),
    "run_id": (r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", "run id",
               "letters, digits and _ . : - (torchrun's --rdzv-id), at most 128"),
    "user": (rf"[0-9]{{1,10}}|{USER_RE}", "user", "a user name (lower-case letters, digits, _ . -) or a numeric uid"),
}


class WorkloadBase(StrictModel):
    """The training job the drill runs against."""

    # ``recovery`` and each recovery stack's settings (``nvrx:``) are added from the stacks' registry
    # (:func:`workload_model`): a stack is one module of chaoskit/stacks/, never a field here

    launch: Literal[LAUNCH_NAMES] = Field(
        "reference",
        description=(
            "reference: the SDK-instrumented PyTorch DDP job; uninstrumented: the same job with no chaoskit "
            "import (measure it with log probes); command: your own script under torchrun; ray-train: a Ray Train "
            "TorchTrainer (one worker per node, FailureConfig(max_failures=max_restarts), checkpoints through "
            "ray.train.report) on a cluster of kind: ray; attach: a job somebody else started (already running, "
            "or started within steady_state.timeout), found on each node by `process` and torchrun's environment, "
            "never started or stopped by chaoskit; sbatch: your own batch script, submitted unmodified to the "
            "cluster's Slurm (kind: slurm). On kind: slurm, reference and uninstrumented run through a generated "
            "batch script too (srun, one torchrun agent per node, --requeue)."
        ),
    )
    script: str | None = Field(None, description=(
        "launch: sbatch only: the batch script to submit (relative to the scenario); chaoskit never edits it. "
        "The job's environment carries CHAOSKIT_EVENTS (where the SDK writes) and CHAOSKIT_CKPT_DIR."))
    command: list[str] | None = Field(None, description=(
        "launch: command only: the training script (relative to the scenario) and its arguments, run under torchrun "
        "(a first item starting with '-' is a torchrun option, e.g. [-m, package.module])."))
    process: Regex | None = Field(None, description=(
        "launch: attach only: a regular expression matched against each process's command line on the nodes; "
        "its workers are those of the matches that carry torchrun's RANK in their environment."))
    slurm_job: str | None = Field(None, description=(
        "launch: attach on a cluster with Slurm only: the id of the job to drill (queued or running); its nodes "
        "are the ones Slurm allocated it, and its state changes join the timeline."))
    run_id: str | None = Field(None, description=(
        "launch: attach only: the torchrun run id (--rdzv-id, TORCHELASTIC_RUN_ID in its workers' environment) of "
        "the job to drill, when more than one job on the nodes matches `process`."))
    user: str | None = Field(None, description=(
        "launch: attach: the user (name or uid) whose job to drill, when more than one job on the nodes matches "
        "`process`. launch: sbatch: the user the batch script is submitted as (default: the script's owner); "
        "chaoskit run as root submits it as that user, never as root."))
    steps: int = Field(400, ge=1, le=MAX_COUNT, description=(
        "Training steps to run; the job finished when it reached them. launch: command: the job finishes when its "
        "script ends with exit 0, and must reach `steps` only where the scenario sets it."))
    step_time: Duration = Field(0.05, description="Minimum wall time of one step (the reference job sleeps the rest).")
    step_compute: Duration | None = Field(None, description=(
        "reference and uninstrumented: CPU time each step spends computing (a busy loop counted in the worker's own "
        "CPU time) before it sleeps the rest of step_time. Default: none, or half of step_time when a fault of the "
        "scenario throttles the CPU (cpu_share), so that the throttle slows the step on an idle machine as on a "
        "loaded one."))
    checkpoint_every: int = Field(25, ge=1, le=MAX_COUNT, description="Save a checkpoint every N steps.")
    collective_timeout: Duration = Field(30.0, description="Timeout of one collective (torch's default is 30 min).")
    nproc_per_node: int = Field(1, ge=1, le=16, description="Workers per node.")
    max_restarts: int = Field(3, ge=0, le=MAX_COUNT, description="torchrun --max-restarts.")
    checkpoint_dir: str | None = Field(None, min_length=2, max_length=4096, pattern=r"^/[^\x00-\x1f\x7f]*$", description=(
        "launch: attach only: the absolute folder the job keeps its checkpoints in on the nodes (storage faults act "
        "inside it). A job chaoskit starts keeps them in <job dir>/checkpoints (CHAOSKIT_CKPT_DIR)."))
    inproc: Literal["sdk", "hf", "lightning"] | None = Field(None, description=(
        "launch: attach only: how the job takes chaoskit's in-process faults (inproc.*): it calls the SDK "
        "(chaoskit.sdk.probe.worker_start) or uses a framework callback, which watch the node's state folder for "
        "orders. Without it an attached job is refused in-process faults (exit 3): nothing reaches inside it. A job "
        "chaoskit starts takes them from chaoskit's bootstrap."))
    checkpoint_fs: ByteSize | None = Field(None, description=(
        "Give the job a file system of its own of this size (e.g. 64MiB) for its checkpoint folder: the process lab "
        "mounts a tmpfs there (root needed) and unmounts it after the run. What storage.full fills."))
    wait: Literal["finish", "recovered"] = Field(
        "finish", description="After the faults: wait for the job to finish, or stop once it recovered (the default with attach)."
    )
    recovery: str = "restart"
    """The recovery stack (:mod:`chaoskit.stacks`); its values are the registry's (:func:`workload_model`)."""
    env: dict[Annotated[str, AfterValidator(check_env_name)], Annotated[Any, AfterValidator(check_env_value)]] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS, description=(
            "Variables of the job's environment, set on every agent and so on its workers: NAME: value sets one, "
            "NAME: null unsets one (one the job would inherit from chaoskit's environment, or one chaoskit sets by "
            "default, e.g. TORCH_DISABLE_SHARE_RDZV_TCP_STORE: null). `chaoskit run --dry-run` shows the "
            "environment the job gets and why chaoskit sets each of its own. Names are a shell's (letters, digits "
            "and _, at most 128), values at most 4096 characters, at most 64 variables. Refused: CHAOSKIT_* "
            "(the job's scope mark and chaoskit's channels), a recovery stack's own (torchft: REPLICA_GROUP_ID, "
            "NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE; nvrx: TMPDIR), and LD_* and PYTHON* (what code a process "
            "loads) unless the site policy's env names them."))

    def command_script(self, base: Path) -> Path | None:
        """The script of ``launch: command`` as torchrun will run it: a relative one is taken from ``base`` (the
        scenario's folder, as ``script:`` is for sbatch), not from the run folder the job works in. ``None`` for
        another launch, or when ``command`` starts with a torchrun option (``-m package.module``: no file)."""
        if self.launch != "command" or not self.command or self.command[0].startswith("-"):
            return None
        path = Path(self.command[0]).expanduser()
        return path if path.is_absolute() else (Path(base) / path).resolve()

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return None if v is None else check_path(v)

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, v: str | None) -> str | None:
        if v is not None and ("//" in v or any(p in (".", "..") for p in v.split("/"))):
            raise ValueError(f"checkpoint_dir {v!r} must be a plain absolute path: no '.', '..' or '//' in it")
        return v

    @field_validator("slurm_job", "run_id", "user", mode="before")
    @classmethod
    def _ids(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # a YAML number: an id written without quotes
        return check_match(v, *_IDS[info.field_name]) if isinstance(v, str) else v

    @field_validator("recovery")
    @classmethod
    def _stack_runs_the_launch(cls, v: str, info: ValidationInfo) -> str:
        """A recovery stack runs under its own launches only: refused at the ``recovery`` line otherwise."""
        launch = info.data.get("launch")
        problem = STACKS.get(v)().launch_problem(launch) if launch is not None and v in STACKS else None
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _launch_rules(self) -> "Workload":
        problem = field_problem(self.launch, {name: getattr(self, name) for name in LAUNCH_FIELDS})
        if problem:
            raise ValueError(problem)
        if self.step_compute is not None and self.step_compute > self.step_time:
            raise ValueError(f"step_compute ({self.step_compute:g}s) is longer than step_time ({self.step_time:g}s)")
        if "recovery" not in self.model_fields_set:  # the launch's own stack (Ray Train's restart); a cluster with
            default = default_stack(self.launch).name  # a scheduler may say more (scenario/checks.py)
            if default != self.recovery:
                self.recovery = default
                self.__pydantic_fields_set__.discard("recovery")  # still the launch's, not the author's choice
        stack = STACKS.get(self.recovery)()
        if stack.settings_key is not None and getattr(self, stack.settings_key) is None:
            setattr(self, stack.settings_key, stack.Settings())
        stack.check(self)
        default_wait = LAUNCHES[self.launch].wait
        if "wait" not in self.model_fields_set and self.wait != default_wait:
            self.wait = default_wait
        return self


_WORKLOADS: dict[int, type[WorkloadBase]] = {}


def workload_model() -> type[WorkloadBase]:
    """The ``Workload`` model: :class:`WorkloadBase` with ``recovery`` one of the registered recovery stacks and each
    stack's settings under its key (``nvrx:``), set only with that stack. Built once per set of registrations (a
    stack registered later, a plugin's, gets a new model)."""
    if STACKS.generation not in _WORKLOADS:
        stacks = [STACKS.get(name)() for name in STACKS.names()]
        recovery_doc = ("How the job recovers, and so how it is measured: its recovery stack (docs/recovery-stacks.md, "
                        "docs/architecture.md \"Recovery models\"). " + "; ".join(
                            f"{s.name}: {s.describe}" + ("" if s.launches == LAUNCH_NAMES else
                                                         f" (launch: {', '.join(s.launches)})") for s in stacks) + ".")
        settings = {s.settings_key: (Optional[s.Settings], Field(None, description=s.settings_doc))
                    for s in stacks if s.settings_key}
        validators = {"_own_settings": field_validator(*settings)(_own_settings)} if settings else {}
        _WORKLOADS[STACKS.generation] = create_model(
            "Workload", __base__=WorkloadBase, __doc__=WorkloadBase.__doc__, __validators__=validators,
            recovery=(Literal[tuple(s.name for s in stacks)], Field("restart", description=recovery_doc)), **settings)
    return _WORKLOADS[STACKS.generation]


def _own_settings(cls: Any, value: Any, info: ValidationInfo) -> Any:
    """A stack's settings go with that stack only: refused at their key's line under another."""
    owner = settings_keys()[info.field_name]
    if value is not None and info.data.get("recovery", owner.name) != owner.name:
        raise ValueError(f"'{info.field_name}' is only used with recovery: {owner.name}")
    return value


Workload = workload_model()
"""The built-in stacks' ``Workload`` (a plugin registered later gets its own from :func:`workload_model`)."""


class LogRule(StrictModel):
    """Map lines of a job's output to timeline events."""

    match: Regex = Field(..., description="Regular expression; named groups become event fields (digits become ints).")
    event: EventKind = Field(..., description="Event kind to record, e.g. worker.exit, ckpt.load.end, step.")
    fields: dict[str, Any] = Field(default_factory=dict, description="Constant fields added to the event.")


class LogFile(StrictModel):
    """A log file to tail; its lines count as output of ``node``."""

    path: str = Field(..., min_length=1, description=(
        "A file the job writes in its own folder: a relative path, read on this machine below the job's folder "
        "(never through a link, and only a file of the job's user). An absolute path only for launch: attach (each "
        "node's agent reads it there) or inside the site policy's log_roots. No '..' in either."))
    node: str = Field(..., pattern=NAME_RE, description="The node whose output this file is.")

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        if ".." in v.split("/"):
            raise ValueError(f"{v!r} climbs out with '..': a log file is a path inside the job's folder (or, read on a "
                             "node, an absolute path inside the site policy's log_roots)")
        return v


MAX_QUERY = 4096
PRESET_NAMES = tuple(log_presets())
"""``probes.presets``' values: the frameworks' log presets and the recovery stacks' own."""


def _check_query(v: str) -> str:
    if not v.strip():
        raise ValueError("the query is empty")
    if any(ord(c) < 0x20 and c not in "\t\n" for c in v) or "\x7f" in v:
        raise ValueError("the query holds a control character")
    return v


class PrometheusRule(StrictModel):
    """A Prometheus query whose change becomes an event on the timeline: a detection by the site's own monitoring
    (a DCGM Xid counter rising, a job's alert) next to torchrun's and the scheduler's."""

    url: str = Field(..., description="The Prometheus server, e.g. http://prometheus:9090 (http or https).")
    query: str = Field(..., min_length=1, max_length=MAX_QUERY, description=(
        "PromQL giving one number (a scalar, or a vector of one sample: aggregate, e.g. max(DCGM_FI_DEV_XID_ERRORS))."))
    event: EventKind = Field("detect", description="The event kind to record (detect, the default, counts as detection).")
    when: Literal["rises"] | None = Field(None, description="rises: an event when the value goes above its previous one.")
    above: float | None = Field(None, description="An event when the value goes above this (instead of when: rises).")

    _url = field_validator("url")(classmethod(lambda cls, v: check_http_url(v, "probes.prometheus url")))
    _query = field_validator("query")(classmethod(lambda cls, v: _check_query(v)))

    @model_validator(mode="after")
    def _one(self) -> "PrometheusRule":
        if (self.when is None) == (self.above is None):
            raise ValueError("give one of 'when: rises' or 'above: X'")
        return self


class SdcProbe(StrictModel):
    """The checksum probe of silent data corruption (a job chaoskit starts, or the SDK / a callback)."""

    every: int = Field(10, ge=1, le=100_000, description=(
        "Every N steps each rank reports a checksum of its parameters (the sum of their bits); DDP replicas must "
        "agree bit for bit, and the first step where they do not is sdc.detected."))


class Probes(StrictModel):
    """Where events come from."""

    sdk: bool = Field(True, description="Read the events the chaoskit SDK writes from inside the job.")
    torchrun: bool = Field(True, description="Built-in patterns for torchrun's own log lines (worker failures).")
    process: bool = Field(True, description="Watch the process table for workers that vanish.")
    presets: list[Literal[PRESET_NAMES]] = Field(default_factory=list, max_length=len(PRESET_NAMES), description=(
        "Log presets: a framework's own lines mapped to events, no regex to write (torchrun adds its --tee "
        "prefixes' ranks). Each sees only what its framework prints, some on rank 0 only, at the verbosity "
        "docs/frameworks.md's table names (e.g. TRANSFORMERS_VERBOSITY=info for hf). Combined with `log`."))
    heartbeat_timeout: PositiveDuration = Field(3.0, description=(
        "A node whose process watch (its agent's heartbeat, or a poll of its process table) has been silent this "
        "long is on the timeline as node.unreachable, and node.reachable once it answers again; its workers are "
        "unknown meanwhile, never reported gone."))
    log: list[LogRule] = Field(default_factory=list, description="Extra log-regex rules over the job's output.")
    log_files: list[LogFile] = Field(
        default_factory=list, description="Log files the job writes itself, read through the same rules as its output."
    )
    sdc: SdcProbe | None = Field(None, description=(
        "Opt-in: compare the ranks' parameter checksums every N steps (silent data corruption, sdc.detected). "
        "Costs one pass over the parameters per N steps (bench/bench_inproc.py)."))
    prometheus: list[PrometheusRule] = Field(default_factory=list, max_length=32, description=(
        "Prometheus queries evaluated every second during the drill; a rise (or a crossing of `above`) is an event."))

    def log_rules(self, stack_presets: Iterable[str] = ()) -> tuple[list[ObservedRule], bool]:
        """What the job's lines are read with: the rules of the presets named here and then of the recovery stack's
        own (``stack_presets``), the launcher's built-in lines unless switched off, then ``log``; and whether the
        lines carry the launcher's ``--tee`` rank prefixes."""
        presets = list(self.presets)
        presets += [p for p in stack_presets if p not in presets]
        rules, tee = preset_rules(presets, torchrun=self.torchrun)
        return rules + [ObservedRule.of(r.match, r.event, r.fields) for r in self.log], tee


class _Percentiles(StrictModel):
    """Limits on percentiles of a phase over repeated drills (``chaoskit run --repeat N``)."""

    @model_validator(mode="after")
    def _one(self) -> "_Percentiles":
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError(f"name at least one of {', '.join(type(self).model_fields)}")
        return self


class PhasePercentiles(_Percentiles):
    """``{p95: 60s}``: the 95th percentile of the samples must be at most 60 s (a single drill is its own every percentile)."""

    p50: Duration | None = None
    p90: Duration | None = None
    p95: Duration | None = None
    p99: Duration | None = None
    max: Duration | None = None


class StepPercentiles(_Percentiles):
    """``{p95: 25}``: lost steps at the 95th percentile of the samples."""

    p50: int | None = Field(None, ge=0, le=MAX_COUNT)
    p90: int | None = Field(None, ge=0, le=MAX_COUNT)
    p95: int | None = Field(None, ge=0, le=MAX_COUNT)
    p99: int | None = Field(None, ge=0, le=MAX_COUNT)
    max: int | None = Field(None, ge=0, le=MAX_COUNT)


_PHASE_SLO = "A duration every sample must meet, or percentiles of the samples ({p95: 60s}) over repeated drills."


class SLO(StrictModel):
    """Recovery objectives; a phase that was not observed fails its SLO. A plain value holds for every sample of
    ``chaoskit run --repeat N``; a mapping names percentiles (p50, p90, p95, p99, max) of the samples."""

    detection: Duration | PhasePercentiles | None = Field(None, description=_PHASE_SLO)
    reallocation: Duration | PhasePercentiles | None = Field(None, description=_PHASE_SLO)
    checkpoint_load: Duration | PhasePercentiles | None = Field(None, description=_PHASE_SLO)
    recovery: Duration | PhasePercentiles | None = Field(None, description=_PHASE_SLO)
    lost_steps: Annotated[int, Field(ge=0, le=MAX_COUNT)] | StepPercentiles | None = Field(
        None, description="Steps of work lost, for every sample, or percentiles of the samples ({p95: 25}).")
    returns: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "At most this many returns of the job to a node that keeps failing (a fault's `recur`) before something "
        "kept it out."))


class StopCondition(StrictModel):
    """Stop the drill when the site's monitoring says so: revert everything and exit 4 (like ``abort_after``)."""

    model_config = {**StrictModel.model_config, "populate_by_name": True}

    prometheus: str = Field(..., description="The Prometheus server, e.g. http://prometheus:9090 (http or https).")
    query: str = Field(..., min_length=1, max_length=MAX_QUERY, description=(
        "PromQL giving one number; checked before the drill (no number: exit 3, nothing injected)."))
    above: float | None = Field(None, description="Fire when the value is above this.")
    below: float | None = Field(None, description="Fire when the value is below this.")
    for_: Duration = Field(0.0, alias="for", description="...for this long without a break (0: at the first evaluation that sees it).")

    _url = field_validator("prometheus")(classmethod(lambda cls, v: check_http_url(v, "safety.stop_when prometheus")))
    _query = field_validator("query")(classmethod(lambda cls, v: _check_query(v)))

    @model_validator(mode="after")
    def _one(self) -> "StopCondition":
        if (self.above is None) == (self.below is None):
            raise ValueError("give one of 'above: X' or 'below: X'")
        return self


class Safety(StrictModel):
    """Blast radius and time limits."""

    max_nodes: int = Field(1, ge=1, le=MAX_COUNT, description="Refuse a fault that would touch more nodes than this.")
    abort_after: PositiveDuration = Field(300.0, description="Give up, revert everything and exit 4 after this long.")
    lease_ttl: PositiveDuration = Field(15.0, description="A lasting fault reverts by itself if not renewed for this long.")
    stop_when: list[StopCondition] = Field(default_factory=list, max_length=32, description=(
        "Prometheus conditions evaluated every second throughout the drill; one that holds (for its `for`) "
        "reverts everything and exits 4, naming the condition and its value."))


class SteadyState(StrictModel):
    """Baseline before any fault: the job must be advancing."""

    steps: int = Field(3, ge=1, le=MAX_COUNT, description="Steps that must complete before faults may fire.")
    timeout: Duration = Field(180.0, description="Fail (exit 3) if the job has not got there by then.")
    restarts_allowed: int = Field(0, ge=0, le=MAX_COUNT, description=(
        "Restarts of the job's workers (a worker exit, a restarted world) the drill accepts before its first fault. "
        "Past it the baseline was not steady: a note, and the drill fails."))


class Expect(StrictModel):
    """What the drill expects of the job: by default that it recovers from the faults; ``restart: false`` for
    disturbances a healthy stack must ride through (a slow checkpoint save, a pause in one rank's loop, a link
    flap shorter than the collective timeout)."""

    restart: bool = Field(True, description=(
        "false: the faults are disturbances, not failures. A restart of the job's workers, a worker exit, a new "
        "rendezvous, a requeue or a detection by the stack from the first fault to the end of the watch is a "
        "false restart: the drill fails, with its cost (recovery time, lost steps) measured."))
    window: PositiveDuration | None = Field(None, description=(
        "With restart: false, how long to keep watching once every fault has ended (until the job ends when "
        "not given: the job must then end by itself, workload.wait: finish)."))

    @model_validator(mode="after")
    def _window_needs_no_restart(self) -> "Expect":
        if self.window is not None and self.restart:
            raise ValueError("'window' is how long a drill with restart: false watches for a false restart; give "
                             "restart: false with it")
        return self


class ScenarioBase(StrictModel):
    """Common part of every scenario; ``cluster`` and ``faults`` are added from the registries."""

    name: str = Field(..., pattern=NAME_RE, description="Short identifier, used in report paths.")
    description: str = ""
    cluster: ClusterSpec
    """The cluster's spec: always one backend's ``Spec`` once validated (``lab`` becomes the process lab's)."""
    workload: WorkloadBase = Field(default_factory=Workload)
    # A section the file leaves out is its model's defaults, which need no validation: model_construct, not the
    # model's own validator, which pydantic would build for it alone (its schema is already the scenario's).
    probes: Probes = Field(default_factory=Probes.model_construct)
    slo: SLO = Field(default_factory=SLO.model_construct)
    safety: Safety = Field(default_factory=Safety.model_construct)
    steady_state: SteadyState = Field(default_factory=SteadyState.model_construct)
    expect: Expect = Field(default_factory=Expect.model_construct, description=(
        "What the drill expects of the job: recovery from its faults (the default), or `{restart: false}`: "
        "disturbances it must ride through without a restart."))
    covers: list[str] | None = Field(None, description="Catalog classes this scenario exercises (defaults from its faults).")
    repeat: int = Field(1, ge=1, le=MAX_REPEAT, description=(
        "Samples to take of this drill, back to back, judged on their distribution (p50, p95, max per phase): "
        "what `chaoskit run` and a game day do unless `--repeat N` says otherwise."))

    def fault_names(self) -> dict[str, int]:
        """Each fault's names, its ``id`` and ``f<index>``, to its index: what a trigger names another fault by
        (``scenario/checks.py`` refuses an id given twice or taken by another fault's ``f<index>``)."""
        names = {f"f{i}": i for i in range(len(getattr(self, "faults", ())))}
        names.update({f.id: i for i, f in enumerate(getattr(self, "faults", ())) if f.id is not None})
        return names

    @model_validator(mode="after")
    def _no_restart_watch_ends(self) -> "ScenarioBase":
        """A drill that must not restart the job watches until the job ends or for its window: a job that runs
        until stopped (wait: recovered) needs the window, or the watch would end at once."""
        if not self.expect.restart and self.expect.window is None and self.workload.wait != "finish":
            raise ValueError(f"expect: restart: false watches until the job ends, and this job is not waited for to "
                             f"its end (workload.wait: {self.workload.wait}); give expect.window (how long to watch "
                             "after the faults end) or workload.wait: finish")
        return self

    @model_validator(mode="after")
    def _compute_when_throttled(self) -> "ScenarioBase":
        """A CPU throttle only shows when the step computes: a step that sleeps fits in any CPU quota."""
        w = self.workload
        if w.step_compute is None and "step_compute" in LAUNCHES[w.launch].fields and any(getattr(f, "cpu_share", None) for f in getattr(self, "faults", ())):
            w.step_compute = w.step_time / 2
        return self


_MODELS: dict[tuple[Any, ...], type[ScenarioBase]] = {}


def scenario_model(clusters: Iterable[str] | None = None, faults: Iterable[str] | None = None) -> type[ScenarioBase]:
    """The ``Scenario`` model: the base plus a tagged union of cluster backends and one of fault kinds.

    Every registered backend and kind by default (the schema); only ``clusters`` and ``faults``
    when given, which is what validating one file needs: a smaller model to build, and no module
    of a kind the file does not name is imported. Built once per set of names and registrations
    (a plugin registered later gets a new model)."""
    cluster_names = tuple(sorted(set(clusters))) if clusters is not None else tuple(CLUSTERS.names())
    fault_names = tuple(sorted(set(faults))) if faults is not None else tuple(FAULTS.names())
    key = (CLUSTERS.generation, FAULTS.generation, STACKS.generation, cluster_names, fault_names)
    if key not in _MODELS:
        _MODELS[key] = _build_model(cluster_names, fault_names)
    return _MODELS[key]


def model_for(data: Any) -> type[ScenarioBase]:
    """The model to validate one file's data with: just the cluster kind and fault kinds it names when
    they are all known, else every one (so that an unknown or missing kind is told what the known ones are)."""
    cluster = data.get("cluster", "lab") if isinstance(data, dict) else None
    if cluster == "lab" or (isinstance(cluster, dict) and "kind" not in cluster):
        cluster_kind = _implied_kind(cluster)
    else:
        cluster_kind = cluster.get("kind") if isinstance(cluster, dict) else None
    items = data.get("faults") if isinstance(data, dict) else None
    fault_kinds = [f.get("kind") if isinstance(f, dict) else None for f in items] if isinstance(items, list) else []
    known = isinstance(cluster_kind, str) and cluster_kind in CLUSTERS and fault_kinds and all(
        isinstance(k, str) and k in FAULTS for k in fault_kinds)
    if not known:
        return scenario_model()
    return scenario_model([cluster_kind], fault_kinds)


def _build_model(cluster_names: tuple[str, ...], fault_names: tuple[str, ...]) -> type[ScenarioBase]:
    faults = tuple(FAULTS.get(name).Spec for name in fault_names)
    clusters = tuple(CLUSTERS.get(name).Spec for name in cluster_names)
    kinds = "|".join(cluster_names)
    return create_model(
        "Scenario",
        __base__=ScenarioBase,
        __validators__={"_cluster_default": field_validator("cluster", mode="before")(_cluster_default)},
        workload=(workload_model(), Field(default_factory=workload_model())),
        cluster=(Union[Literal["lab"], _tagged(clusters)], Field(
            "lab", validate_default=True,
            description=f"'lab' (the built-in process lab, 3 nodes) or a cluster spec {{kind: {kinds}, nodes: N, ...}}; "
                        "a mapping without kind is the process lab, or with inventory: FILE your own nodes.")),
        faults=(list[_tagged(faults)], Field(..., min_length=1, description="Faults to inject, in order.")),
    )


def _tagged(specs: tuple[type, ...]) -> Any:
    return Annotated[Union[specs], Field(discriminator="kind")] if len(specs) > 1 else specs[0]


def _implied_kind(value: Any) -> str:
    """The kind of a ``cluster:`` that names none: an inventory's, or the process lab."""
    return "inventory" if isinstance(value, dict) and "inventory" in value else "process"


def _cluster_default(cls: Any, value: Any) -> Any:
    """``lab`` and a mapping without ``kind`` mean the process lab (``inventory:`` an inventory's); the result is always a spec."""
    if value == "lab":
        return {"kind": "process"}
    if isinstance(value, dict) and "kind" not in value:
        return {"kind": _implied_kind(value), **value}
    return value


def schema_path() -> Path:
    return Path(__file__).resolve().parents[2] / "chaoskit.schema.json"
