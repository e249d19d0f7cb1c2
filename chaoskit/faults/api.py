"""The fault contract: what every fault kind provides, and what it may use while it acts.

A fault kind is one class with a pydantic ``Spec`` (its scenario syntax, with a
``kind`` literal) and the four verbs ``plan``, ``inject``, ``revert``, ``verify``;
the optional ones (``unfit``, ``needs``, ``preflight``, ``check_reverted``,
``journaled_revert``, ``leftovers``, ...) have harmless defaults here. A fault acts
only through the :class:`FaultContext` it is handed, which the runner implements.
A built-in kind is not registered anywhere: its class body says ``kind = "family.name"``
and :mod:`chaoskit.faults.registry` finds it by reading the source of this package's
modules; only another package's kinds declare themselves in the ``chaoskit.faults``
entry-point group.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, model_validator

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.selectors import TargetSpec
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import Duration, PositiveDuration
from chaoskit.core.errors import did_you_mean
from chaoskit.core.event_kinds import EventKind
from chaoskit.core.limits import MAX_COUNT
from chaoskit.core.phases import PHASE_TABLE
from chaoskit.core.models import NAME_RE, StrictModel

__all__ = [
    "Trigger",
    "During",
    "Recur",
    "FAULT_ID_RE",
    "PHASES",
    "TRIGGER_WITHIN_S",
    "FaultSpec",
    "Action",
    "Injection",
    "INPROC_CHANNEL_DIR",
    "Fault",
    "FaultContext",
    "Leases",
    "NodeView",
    "signal_number",
]


class Leases(Protocol):
    """The on-node dead-man switches of one run (:class:`chaoskit.safety.lease.LeaseManager`)."""

    ttl: float

    def arm(self, transport: Transport, fault_id: str, revert: list[str], duration: float | None) -> None: ...

    def release(self, fault_id: str) -> None:
        """The fault was reverted and verified: the watchdog stands down."""

    def abandon(self, fault_id: str) -> None:
        """Stop renewing: the node's watchdog reverts by itself once the lease goes stale."""


class NodeView(Protocol):
    """One node as ``chaoskit audit`` reads it, without a journal (:mod:`chaoskit.audit`): each read is made once
    per node and shared by every kind that asks. Nothing here changes the node."""

    node: Node
    transport: Transport
    reachable: bool
    """Whether the node answered; when not, every read below is empty (a kind that needs nothing of the node, such
    as its power state read on the controller, still answers)."""
    state_dir: str | None
    """The node's state folder (``None`` where it cannot be read)."""

    def run(self, argv: list[str]) -> str | None:
        """The output of a read-only command on the node (once per argv), or ``None`` where it fails there."""

    def ps(self) -> list[tuple[int, str, str]]:
        """``(pid, ps state, command line)`` of every process the node shows."""

    def cgroups(self) -> list[str]:
        """The paths of every cgroup named ``chaoskit-*`` on the node."""

    def state_entries(self) -> list[str]:
        """What is in the node's state folder (relative paths, four levels deep: a lease's
        files, ``leases/<run>/<fault>/fired``, included; a folder ends in ``/``)."""

    def checkpoint_files(self, prefix: str) -> list[str]:
        """The paths of the files and folders named ``prefix*`` in the checkpoint folders audited (links not followed)."""


class FaultContext(Protocol):
    """What a fault may use while it acts (the session's ``RunContext``, :mod:`chaoskit.session`; a dry run's has no journal or leases)."""

    inventory: Inventory
    leases: Leases | None
    checkpoint_dir: str | None
    """The job's checkpoint folder as its nodes see it (``CHAOSKIT_CKPT_DIR`` of a job chaoskit starts,
    ``workload.checkpoint_dir`` of an attached one); ``None`` where no job's is known."""
    scheduler_jobs: set[str]
    """The scheduler's jobs this run submitted or attached to (:attr:`ClusterHandle.scheduler_jobs`, filled as the job
    starts): the only jobs a scheduler fault may act on."""

    def transport(self, node: str) -> Transport:
        """The node's transport; refuses a node outside the inventory."""

    def controller(self, node: str) -> Transport:
        """This machine, acting for ``node`` (commands run here, the lease names the node): where a revert that runs
        on the controller (power, a docker network, Slurm's resume) runs, and its watchdog."""

    def inproc_folder(self, node: str) -> str:
        """The in-process channel's folder on ``node``: the job's own (``RUN.job/inproc``, the account's it runs as)
        where the run gave one, else :data:`INPROC_CHANNEL_DIR` in the node's state folder."""

    def arm(self, transport: Transport, fault_id: str, kind: str, revert: list[str], duration: float | None,
            target: str = "", on: Literal["node", "controller"] = "node") -> None:
        """Journal the fault, then start its watchdog, before it is injected."""


FAULT_ID_RE = r"^[A-Za-z][A-Za-z0-9_-]{0,39}$"
"""A fault's ``id``: what another fault's trigger names it by (``at: {during: {fault: ID}}``)."""

PHASES = tuple(p.name for p in PHASE_TABLE if p.cascade)
"""The phases of a recovery a cascade's second fault can strike in (``at: {during: {phase: ...}}``)."""

TRIGGER_WITHIN_S = 300.0
"""How long an event trigger waits for its event when ``within`` is not given."""

_FILTERS = ("node", "rank", "restart_count", "fault")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class During(StrictModel):
    """A cascade: strike while another fault's recovery is in a given phase."""

    fault: str = Field(..., pattern=FAULT_ID_RE, description=(
        "The earlier fault of this scenario whose recovery is struck: its `id`, or `f<index>` (f0 is the first)."))
    phase: Literal[PHASES] = Field(..., description=(  # type: ignore[valid-type]
        "detection: as soon as that fault is in effect, before anything noticed it; reallocation: at its "
        "detection (the first worker exit, detect or drain after it), while the job tears down and gathers a new "
        "world (a rendezvous); checkpoint_load: when a rank starts loading a checkpoint after it."))


class Trigger(StrictModel):
    """When to inject: at a training step, a time after the baseline ends, an event on the timeline, or during
    another fault's recovery."""

    step: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "Alone: inject once the job reports this step. With `event`: only an event of this step or later counts."))
    after: Duration | None = Field(None, description=(
        "Alone: inject this long after the steady-state baseline. With `event` or `during`: wait this long after "
        "the event before injecting."))
    event: EventKind | None = Field(None, description=(
        "Inject when this event shows on the run's timeline (rendezvous.done, worker.start, ckpt.save.start, "
        "ckpt.load.start, inprocess.restart, fault.injected, ...), counting the events since the previous fault "
        "was injected (since the baseline, for the first). The filters node, rank, step, restart_count and fault "
        "narrow which events count."))
    node: str | None = Field(None, pattern=NAME_RE, description="With `event`: only an event on this node counts.")
    rank: int | None = Field(None, ge=0, le=MAX_COUNT, description="With `event`: only an event of this rank counts.")
    restart_count: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "With `event`: only an event of this restart of the workers or a later one counts (a worker start's "
        "TORCHELASTIC_RESTART_COUNT, a scheduler's requeue count)."))
    fault: str | None = Field(None, pattern=FAULT_ID_RE, description=(
        "With `event`: only an event of this fault of the scenario counts (fault.injected, fault.reverted): "
        "its `id`, or `f<index>`."))
    nth: int | None = Field(None, ge=1, le=MAX_COUNT, description=(
        "With `event`: inject at this occurrence of the matching event (1, the first, when not given)."))
    during: During | None = Field(None, description=(
        "A cascade: strike during another fault's recovery, `{fault: ID, phase: detection|reallocation|"
        "checkpoint_load}`."))
    within: PositiveDuration | None = Field(None, description=(
        f"With `event` or `during`: how long to wait for it ({TRIGGER_WITHIN_S:g}s when not given). A trigger that "
        "does not fire in time fails the drill, says which event it waited for and how long, and injects nothing "
        "more."))

    @model_validator(mode="after")
    def _one_kind(self) -> "Trigger":
        filters = [name for name in (*_FILTERS, "nth") if getattr(self, name) is not None]
        if self.event is not None and self.during is not None:
            raise ValueError("give 'event' or 'during', not both")
        if self.event is None and filters:
            raise ValueError(f"'{filters[0]}' narrows an event trigger: give 'event' with it")
        if self.event is None and self.during is None:
            if self.within is not None:
                raise ValueError("'within' bounds the wait of an event trigger: give 'event' or 'during' with it")
            if (self.step is None) == (self.after is None):
                raise ValueError("give exactly one of 'step', 'after', 'event' or 'during'")
        elif self.during is not None and self.step is not None:
            raise ValueError("'step' narrows an event trigger; 'during' takes none")
        return self

    @property
    def waits_for_event(self) -> bool:
        """An event trigger or a cascade: it fires on the timeline, not on a step or the clock."""
        return self.event is not None or self.during is not None

    def describe(self) -> str:
        then = f", then {self.after:g}s" if self.after and self.waits_for_event else ""
        if self.during is not None:
            return f"{self.during.fault}'s {self.during.phase.replace('_', ' ')} (a cascade){then}"
        if self.event is not None:
            narrow = [f"{name} {getattr(self, name)}" + ("+" if name in ("step", "restart_count") else "")
                      for name in ("node", "rank", "step", "restart_count", "fault") if getattr(self, name) is not None]
            return (f"the {_ordinal(self.nth or 1)} {self.event}" + (f" ({', '.join(narrow)})" if narrow else "")
                    + then)
        return f"step {self.step}" if self.step is not None else f"{self.after:g}s after baseline"

    def matches(self, event: dict[str, Any], fault_ids: dict[str, str]) -> bool:
        """Whether ``event`` is one this event trigger counts; ``fault_ids``: a fault's name (``id`` or
        ``f<index>``) to the id its injections carry (``f<index>``, ``f<index>.<n>``)."""
        if event.get("kind") != self.event:
            return False
        if self.node is not None and event.get("node") != self.node:
            return False
        if self.rank is not None and event.get("rank") != self.rank:
            return False
        for name in ("step", "restart_count"):
            limit, value = getattr(self, name), event.get(name)
            if limit is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= limit):
                return False
        if self.fault is not None:
            base, got = fault_ids.get(self.fault, self.fault), str(event.get("fault") or "")
            if got != base and not got.startswith(base + "."):
                return False
        return True


class Recur(StrictModel):
    """A bad node that comes back: the fault fires again whenever the job runs there again."""

    times: int | None = Field(None, ge=1, le=MAX_COUNT, description=(
        "How many returns it fires on, at most (for the whole run when not given)."))
    after: Duration = Field(0.0, description=(
        "How long after the job's worker starts again on the node it fires (0: at once, a crash at start-up)."))

    def describe(self) -> str:
        return ("again each time the job comes back to its node" + (f", {self.times} times" if self.times else "")
                + (f", {self.after:g}s after its worker starts" if self.after else ", as its worker starts"))


class FaultSpec(StrictModel):
    """Fields every fault kind shares. Subclasses add a ``kind`` literal and their own."""

    kind: str
    id: str | None = Field(None, pattern=FAULT_ID_RE, description=(
        "A name for this fault, unique in the scenario, that another fault's trigger names it by "
        "(`at: {during: {fault: ID}}`); `f<index>` names it when not given (f0 is the first)."))
    target: TargetSpec = Field(default_factory=TargetSpec)
    at: Trigger = Field(default_factory=lambda: Trigger(after=0))
    recur: Recur | None = Field(None, description=(
        "A node that keeps failing (a lemon): after the fault, whenever a worker of the job starts again on a node "
        "it struck (a restart, a requeue), it strikes there again: `{times: N, after: 2s}`. Measured: how often "
        "the job came back, each return's cost, and whether and when something kept the node out (slo.returns)."))

    def catalog_tag(self) -> str:
        """What the catalog knows this fault by (:func:`chaoskit.coverage.classes_exercised_by`): its kind, or
        ``kind:variant`` where the variant decides the class (``gpu.xid:79``)."""
        return self.kind


def signal_number(name: str | int) -> int:
    """``SIGKILL``/``KILL``/``9`` -> 9; ``ValueError`` for anything else (ASCII digits only: ``"٩"`` is no number)."""
    if isinstance(name, int) and not isinstance(name, bool):
        return _by_number(name, name)
    text = str(name).upper()
    if text.isascii() and text.isdigit():
        return _by_number(int(text) if len(text) <= 3 else -1, name)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return _signal.Signals[text].value
    except KeyError:
        shown = repr(name) if len(str(name)) <= 40 else repr(str(name)[:37] + "...")
        raise ValueError(f"unknown signal {shown}{did_you_mean(text, _signal.Signals.__members__)}") from None


def _by_number(number: int, given: object) -> int:
    try:
        return _signal.Signals(number).value
    except ValueError:
        top = max(s.value for s in _signal.Signals)
        huge = isinstance(given, int) and given.bit_length() > 40  # str() of a 5,000-digit int raises
        shown = "(a huge number)" if huge else str(given) if len(str(given)) <= 12 else f"{str(given)[:9]}..."
        raise ValueError(f"unknown signal number {shown}: signals are numbered 1 to {top}") from None


@dataclass
class Action:
    """One concrete thing a fault does on one node; ``--dry-run`` prints these."""

    node: str
    command: str
    target: str = ""


INPROC_CHANNEL_DIR = "inproc"
"""The in-process channel's folder (:attr:`Fault.uses_inproc_channel`), by this name in a node's state folder, or in
the job's own folder where the job runs as an account of its own."""


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
    oom_cgroup: str | None = None
    """A memory cgroup this injection made (``mem.oom``'s): an OOM kill in it is this run's, which the kernel-log
    probe is told once the fault is in."""

    def mechanism(self) -> dict[str, Any]:
        """How a fault with several mechanisms acted (``gpu.fail``: nvidia, real; crashloop, emulated; on a device or
        the whole node), for the timeline and the report; ``{}`` for one with a single mechanism."""
        return {k: self.detail[k] for k in ("mechanism", "fidelity", "scope", "error") if k in self.detail}


class Fault:
    """One kind of harm. Subclasses set ``kind``, ``Spec`` and implement the verbs."""

    kind: ClassVar[str]
    Spec: ClassVar[type[FaultSpec]]
    covers: ClassVar[tuple[str, ...]] = ()
    """The catalog classes (:mod:`chaoskit.coverage`) this kind reproduces as the job sees them, by id: a claim about
    fidelity, reviewed with the kind. A built-in writes it on one line of its class body, next to ``kind``: the
    registry reads it from the source (:func:`chaoskit.faults.registry.fault_covers`)."""
    lasting: ClassVar[bool] = False
    """True when the harm persists until reverted; such faults arm a lease first."""
    target_type: ClassVar[Literal["process", "node"]] = "process"
    """What ``inject`` receives: ``"process"`` (ProcessTarget: node, pid, rank) or ``"node"`` (NodeTarget)."""
    primes: ClassVar[bool] = False
    """True when the job sees no harm from this fault until a later one makes it restart (a corrupted checkpoint is
    read only then): the run's phases are measured from the first fault that does not prime."""
    revert_runs_on: ClassVar[Literal["node", "controller"]] = "node"
    """Where the revert command runs (rollback reads it): on the node, or on the controller (power, engine)."""
    measures_slowdown: ClassVar[bool] = False
    """True when the harm is a slowdown, not a failure: the run measures step time before, during and after
    (``result.json["slowdown"]``) rather than expecting a restart."""
    measures_checkpoint_io: ClassVar[bool] = False
    """True when the harm is to the checkpoint storage (slow or failing I/O): the run measures checkpoint save and
    load times before, during and after it (``result.json["checkpoint_io"]``)."""

    silent: ClassVar[bool] = False
    """True when the harm raises no error by itself (numbers gone wrong: a flipped bit, a NaN): the run measures
    whether anything noticed it (``result.json["silent"]``), and nothing noticing is a FAIL with :meth:`describe`."""
    uses_inproc_channel: ClassVar[bool] = False
    """True when the fault acts inside the job's processes through the in-process channel: the job is started with
    chaoskit's bootstrap and a channel folder per node (``inproc/``)."""
    needs_final_checksum: ClassVar[bool] = False
    """True when the job's ranks must compare a checksum of their parameters as they exit: a harm nothing noticed
    shows as ranks that disagree at the end (``result.json["silent"]``)."""

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        self.spec = spec
        self.fault_id = fault_id

    def unfit(self, node: Node) -> str | None:
        """Why this fault can never act on ``node``, judged from the inventory alone (``validate`` refuses
        the scenario then, before anything starts), or ``None``. What only the live node can tell is
        :meth:`preflight`'s."""
        return None

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        """What in this fault does not fit the scenario's ``workload`` (judged before anything starts, as
        :meth:`unfit` is): ``(field of the fault, message)``, or ``None``."""
        return None

    def needs(self) -> tuple[str, ...]:
        """What a target node must have for this fault (``chaoskit doctor --scenario`` checks): the names
        of commands on its PATH, or ``netem`` for the kernel's network emulator."""
        return ()

    def preflight(self, ctx: FaultContext, targets: list[Any]) -> None:
        """Raise before anything is armed when a target cannot take this fault (unreachable, missing tool)."""

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        raise NotImplementedError

    def inject(self, ctx: FaultContext, targets: list[Any]) -> list[Injection]:
        raise NotImplementedError

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        """Undo ``injection``. Idempotent: reverting twice is harmless."""

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        """Return ``None`` when the node is back to normal, else what is still wrong."""
        return None

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        """After a crash (``chaoskit rollback``): what is still in effect given the journal's revert argv, or ``None``.

        ``transport`` runs where the revert ran (the node, or the controller); ``node`` is the inventory's node.
        The default trusts the revert, which is idempotent, once it ran."""
        return None

    revert_from_inventory: ClassVar[bool] = False
    """The revert is rebuilt from the inventory at rollback (its journaled copy is redacted): rollback runs it only
    when it is the command armed at the fault (``revert_sha256`` in the private journal)."""

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The revert ``chaoskit rollback`` runs for this kind, rebuilt from the trusted journal's ``revert``
        argv (``node``: the inventory's node): each kind checks that the argv has exactly the shape it arms
        (its own tool, values of the forms it makes) and builds it anew from those values, so a journal is
        never a free-form command line; a kind whose revert the inventory knows rebuilds it from there, so
        nothing secret need be journaled. Raises ``ValueError`` when it is not a revert this kind makes;
        a kind that says nothing here has nothing ``rollback`` may run."""
        raise ValueError(f"{cls.kind} does not say how to rebuild its revert; not run")

    def describe(self, injection: Injection) -> str:
        """What ``injection`` did, in one line for people (a silent fault's FAIL reason)."""
        return f"{self.kind} on {', '.join(injection.targets)}"

    state_prefixes: ClassVar[tuple[str, ...]] = ()
    """The names this kind gives what it keeps in a node's state folder (``oom-``): ``audit`` names a leftover
    there after the kind; one nobody claims is still reported, as a state file. A prefix ending in ``/`` is that
    folder exactly (``inproc/``)."""

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """What of this kind is still in effect on the node, found from the node alone (by the names, handles and
        tables the kind makes, not from a journal): one line each, empty when nothing is. ``chaoskit audit``
        asks every kind; the lines must be the same whichever kind of a family finds them (they are merged)."""
        return []

    @property
    def duration(self) -> float | None:
        return getattr(self.spec, "duration", None)
