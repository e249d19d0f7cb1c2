"""The scenario format: pydantic models are the single source of truth.

Validation, the JSON Schema (``chaoskit schema``) and the docs all come from here.
Fault specs come from the fault registry, so a plugin's kind is validated and
documented like a built-in one.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from chaoskit.faults.api import NAME_RE, StrictModel
from chaoskit.scenario.durations import Duration, PositiveDuration

__all__ = [
    "LabSpec",
    "Workload",
    "LogRule",
    "Probes",
    "SLO",
    "Safety",
    "SteadyState",
    "ScenarioBase",
    "scenario_model",
    "EVENT_KINDS",
]

EVENT_KINDS = (
    "fault.injected", "fault.reverted", "worker.start", "worker.exit", "detect",
    "rendezvous.done", "ckpt.save.start", "ckpt.save.end", "ckpt.load.start",
    "ckpt.load.end", "step", "heartbeat", "process.gone", "job.end",
)


class LabSpec(StrictModel):
    """A built-in lab cluster that the run uses (``chaoskit lab up``) or brings up and tears down itself."""

    kind: Literal["process", "netns", "docker"] = Field(
        "process",
        description=(
            "process: nodes are local process groups (no root). netns: each node is a network namespace "
            "with its own NICs (data, mgmt) and sshd, reached over SSH (needs root, iproute2, openssh-server). "
            "docker: each node is a container of docker-compose.yml, reached through the docker engine "
            "(needs a docker engine, the node image and pip install 'chaoskit[docker]')."
        ),
    )
    nodes: int = Field(3, ge=1, le=64, description="Nodes the job runs on.")
    spare: int = Field(0, ge=0, le=16, description="netns and docker: idle nodes whose torchrun agents wait to take over.")
    compose: str | None = Field(
        None,
        description=(
            "docker only: the compose file whose services are the nodes, relative to the scenario file "
            "(default: the nearest docker-compose.yml in the scenario's folder or a parent)."
        ),
    )
    ray: bool = Field(
        False,
        description=(
            "process only: join the nodes into a Ray cluster (a head plus one 'ray start' per node); faults then "
            "run through a ChaosAgent actor pinned to each node, and Ray marking a node DEAD counts as detection. "
            "Needs pip install 'chaoskit[ray]'."
        ),
    )

    @model_validator(mode="after")
    def _spare(self) -> "LabSpec":
        if self.spare and self.kind == "process":
            raise ValueError("spare nodes need kind: netns or docker")
        if self.ray and self.kind != "process":
            raise ValueError("ray: true needs kind: process")
        if self.compose is not None and self.kind != "docker":
            raise ValueError("compose: needs kind: docker")
        return self


class Workload(StrictModel):
    """The training job the drill runs against."""

    launch: Literal["reference", "uninstrumented", "command", "ray-train"] = Field(
        "reference",
        description=(
            "reference: the SDK-instrumented PyTorch DDP job; uninstrumented: the same job with no chaoskit "
            "import (measure it with log probes); command: your own script under torchrun; ray-train: a Ray Train "
            "TorchTrainer (one worker per node, FailureConfig(max_failures=max_restarts), checkpoints through "
            "ray.train.report) on a lab with ray: true."
        ),
    )
    command: list[str] | None = Field(None, description="launch: command only: the training script and its arguments.")
    steps: int = Field(400, ge=1, description="Training steps to run.")
    step_time: Duration = Field(0.05, description="Minimum wall time of one step (the reference job sleeps the rest).")
    checkpoint_every: int = Field(25, ge=1, description="Save a checkpoint every N steps.")
    collective_timeout: Duration = Field(30.0, description="Timeout of one collective (torch's default is 30 min).")
    nproc_per_node: int = Field(1, ge=1, le=16, description="Workers per node.")
    max_restarts: int = Field(3, ge=0, description="torchrun --max-restarts.")
    wait: Literal["finish", "recovered"] = Field(
        "finish", description="After the faults: wait for the job to finish, or stop once it recovered."
    )

    @model_validator(mode="after")
    def _command(self) -> "Workload":
        if self.launch == "command" and not self.command:
            raise ValueError("launch: command needs 'command: [script.py, args...]'")
        if self.launch != "command" and self.command:
            raise ValueError("'command' is only used with launch: command")
        return self


class LogRule(StrictModel):
    """Map lines of a job's output to timeline events."""

    match: str = Field(..., description="Regular expression; named groups become event fields (digits become ints).")
    event: str = Field(..., description="Event kind to record, e.g. worker.exit, ckpt.load.end, step.")
    fields: dict[str, Any] = Field(default_factory=dict, description="Constant fields added to the event.")

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from None
        return v

    @field_validator("event")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {v!r}; known: {', '.join(EVENT_KINDS)}")
        return v


class LogFile(StrictModel):
    """A log file to tail; its lines count as output of ``node``."""

    path: str = Field(..., min_length=1, description="Path of the file; relative paths are taken from the run directory.")
    node: str = Field(..., pattern=NAME_RE, description="The node whose output this file is.")


class Probes(StrictModel):
    """Where events come from."""

    sdk: bool = Field(True, description="Read the events the chaoskit SDK writes from inside the job.")
    torchrun: bool = Field(True, description="Built-in patterns for torchrun's own log lines (worker failures).")
    process: bool = Field(True, description="Watch the process table for workers that vanish.")
    log: list[LogRule] = Field(default_factory=list, description="Extra log-regex rules over the job's output.")
    log_files: list[LogFile] = Field(
        default_factory=list, description="Log files the job writes itself, read through the same rules as its output."
    )


class SLO(StrictModel):
    """Recovery objectives; a phase that was not observed fails its SLO."""

    detection: Duration | None = None
    reallocation: Duration | None = None
    checkpoint_load: Duration | None = None
    recovery: Duration | None = None
    lost_steps: int | None = Field(None, ge=0)


class Safety(StrictModel):
    """Blast radius and time limits."""

    max_nodes: int = Field(1, ge=1, description="Refuse a fault that would touch more nodes than this.")
    abort_after: PositiveDuration = Field(300.0, description="Give up, revert everything and exit 4 after this long.")
    lease_ttl: PositiveDuration = Field(15.0, description="A lasting fault reverts by itself if not renewed for this long.")


class SteadyState(StrictModel):
    """Baseline before any fault: the job must be advancing."""

    steps: int = Field(3, ge=1, description="Steps that must complete before faults may fire.")
    timeout: Duration = Field(180.0, description="Fail (exit 3) if the job has not got there by then.")


class ScenarioBase(StrictModel):
    """Common part of every scenario; ``faults`` is added from the registry."""

    name: str = Field(..., pattern=NAME_RE, description="Short identifier, used in report paths.")
    description: str = ""
    cluster: Union[Literal["lab"], LabSpec] = Field(
        "lab", description="'lab' (the built-in process lab, 3 nodes) or a lab spec {kind: process|netns, nodes: N, spare: K}."
    )
    workload: Workload = Field(default_factory=Workload)
    probes: Probes = Field(default_factory=Probes)
    slo: SLO = Field(default_factory=SLO)
    safety: Safety = Field(default_factory=Safety)
    steady_state: SteadyState = Field(default_factory=SteadyState)
    covers: list[str] | None = Field(None, description="Catalog classes this scenario exercises (defaults from its faults).")

    @property
    def lab(self) -> LabSpec | None:
        if self.cluster == "lab":
            return LabSpec()
        return self.cluster if isinstance(self.cluster, LabSpec) else None


@functools.lru_cache(maxsize=1)
def scenario_model() -> type[ScenarioBase]:
    """The full ``Scenario`` model: the base plus a tagged union of every fault kind."""
    from pydantic import create_model

    from chaoskit.faults.registry import fault_kinds

    specs = tuple(cls.Spec for cls in fault_kinds().values())
    fault_union: Any = Annotated[Union[specs], Field(discriminator="kind")] if len(specs) > 1 else specs[0]
    return create_model(
        "Scenario",
        __base__=ScenarioBase,
        faults=(list[fault_union], Field(..., min_length=1, description="Faults to inject, in order.")),
    )


def schema_path() -> Path:
    return Path(__file__).resolve().parents[2] / "chaoskit.schema.json"
