"""What every fault kind provides, and the models scenarios use to describe one.

A fault kind is one class with a pydantic ``Spec`` (its scenario syntax, with a
``kind`` literal) and the four verbs ``plan``, ``inject``, ``revert``, ``verify``.
Built-in kinds register through the ``chaoskit.faults`` entry-point group exactly
as a plugin would (see :mod:`chaoskit.faults.registry`).
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaoskit.scenario.durations import Duration

if TYPE_CHECKING:  # pragma: no cover
    from chaoskit.runner import RunContext

__all__ = [
    "StrictModel",
    "TargetSpec",
    "Trigger",
    "FaultSpec",
    "Action",
    "Injection",
    "Fault",
    "NAME_RE",
    "signal_number",
]

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Node names, label keys and values: safe to reach a shell unquoted, still quoted anyway."""


class StrictModel(BaseModel):
    """Base of every scenario model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class TargetSpec(StrictModel):
    """Which processes or nodes a fault lands on. Selectors combine with AND.

    ``nodes``/``labels`` narrow the nodes; ``ranks``, ``pid`` and ``process`` pick
    processes on them; ``count`` or ``percent`` then keep a subset (lowest first, so
    a drill is repeatable).
    """

    nodes: list[str] | None = Field(None, description="Node names from the inventory.")
    labels: dict[str, str] | None = Field(None, description="Node labels that must all match, e.g. {rack: r1}.")
    ranks: list[int] | None = Field(None, description="Global ranks of the training job.")
    pid: int | None = Field(None, gt=1, description="One process id (on the selected node).")
    process: str | None = Field(None, description="Regular expression matched against a process's command line.")
    count: int | None = Field(None, ge=1, description="Keep at most this many of the matches.")
    percent: float | None = Field(None, gt=0, le=100, description="Keep this share of the matches (rounded up).")

    @field_validator("nodes")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if not re.match(NAME_RE, name):
                raise ValueError(f"invalid node name {name!r}: letters, digits, '.', '_', '-' only")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (v or {}).items():
            for item in (key, str(value)):
                if not re.match(NAME_RE, item):
                    raise ValueError(f"invalid label {item!r}: letters, digits, '.', '_', '-' only")
        return v

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("ranks must not be empty")
            if any(r < 0 for r in v):
                raise ValueError("ranks must be >= 0")
        return v

    @field_validator("process")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _one_subset(self) -> "TargetSpec":
        if self.count is not None and self.percent is not None:
            raise ValueError("give count or percent, not both")
        return self

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.model_dump(exclude_none=True).items()]
        return ", ".join(parts) or "any"


class Trigger(StrictModel):
    """When to inject: at a training step, or a time after the baseline ends."""

    step: int | None = Field(None, ge=0, description="Inject once the job reports this step.")
    after: Duration | None = Field(None, description="Inject this long after the steady-state baseline.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "Trigger":
        if (self.step is None) == (self.after is None):
            raise ValueError("give exactly one of 'step' or 'after'")
        return self

    def describe(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.after:g}s after baseline"


class FaultSpec(StrictModel):
    """Fields every fault kind shares. Subclasses add a ``kind`` literal and their own."""

    kind: str
    target: TargetSpec = Field(default_factory=TargetSpec)
    at: Trigger = Field(default_factory=lambda: Trigger(after=0))


def signal_number(name: str | int) -> int:
    """``SIGKILL``/``KILL``/``9`` -> 9; ``ValueError`` for anything else."""
    if isinstance(name, int) and not isinstance(name, bool):
        return _signal.Signals(name).value
    text = str(name).upper()
    if text.isdigit():
        return _signal.Signals(int(text)).value
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return _signal.Signals[text].value
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


@dataclass
class Action:
    """One concrete thing a fault does on one node; ``--dry-run`` prints these."""

    node: str
    command: str
    target: str = ""


@dataclass
class Injection:
    """What an injected fault left in effect, enough to revert and verify it."""

    fault_id: str
    kind: str
    node: str
    targets: list[str]
    t_fault: float
    detail: dict[str, Any] = field(default_factory=dict)
    reverted: bool = False


class Fault:
    """One kind of harm. Subclasses set ``kind``, ``Spec`` and implement the verbs."""

    kind: ClassVar[str]
    Spec: ClassVar[type[FaultSpec]]
    lasting: ClassVar[bool] = False
    """True when the harm persists until reverted; such faults arm a lease first."""
    target_type: ClassVar[str] = "process"
    """What ``inject`` receives: ``"process"`` (ProcessTarget: node, pid, rank) or ``"node"`` (NodeTarget)."""

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        self.spec = spec
        self.fault_id = fault_id

    def plan(self, ctx: "RunContext", targets: list[Any]) -> list[Action]:
        raise NotImplementedError

    def inject(self, ctx: "RunContext", targets: list[Any]) -> list[Injection]:
        raise NotImplementedError

    def revert(self, ctx: "RunContext", injection: Injection) -> None:
        """Undo ``injection``. Idempotent: reverting twice is harmless."""

    def verify(self, ctx: "RunContext", injection: Injection) -> str | None:
        """Return ``None`` when the node is back to normal, else what is still wrong."""
        return None

    @property
    def duration(self) -> float | None:
        return getattr(self.spec, "duration", None)
