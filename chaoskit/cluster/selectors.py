"""Turn a fault's target selectors into concrete nodes and processes.

Static checks (names, labels, rank range, blast radius) run before anything
starts and point at the scenario's line; process resolution runs at injection
time against each node's own process table, every node asked at once with its own
deadline (a silent node is left out, never waited for).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import Field, field_validator, model_validator

from chaoskit.cluster.fanout import NoAnswer, fan_out
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.transports.api import ProcInfo, rank_processes
from chaoskit.core.errors import InfraError
from chaoskit.core.limits import MAX_COUNT, MAX_PID
from chaoskit.core.models import NAME_RE, NAME_RULE, StrictModel, check_each, check_regex
from chaoskit.core.patterns import bounded_search, compile_pattern

__all__ = [
    "TargetSpec", "ProcessTarget", "NodeTarget",
    "check_static", "resolve_processes", "resolve_nodes", "select_nodes", "node_targets", "subset",
]


class TargetSpec(StrictModel):
    """Which processes or nodes a fault lands on. Selectors combine with AND.

    ``nodes``/``labels`` narrow the nodes; ``ranks``, ``pid`` and ``process`` pick
    processes on them; ``count`` or ``percent`` then keep a subset (lowest first, so
    a drill is repeatable).
    """

    nodes: list[str] | None = Field(None, description="Node names from the inventory.")
    labels: dict[str, str] | None = Field(None, description="Node labels that must all match, e.g. {rack: r1}.")
    ranks: list[int] | None = Field(None, description="Global ranks of the training job.")
    pid: int | None = Field(None, gt=1, le=MAX_PID, description="One process id (on the selected node).")
    process: str | None = Field(None, description="Regular expression matched against a process's command line.")
    count: int | None = Field(None, ge=1, le=MAX_COUNT, description="Keep at most this many of the matches.")
    percent: float | None = Field(None, gt=0, le=100, description="Keep this share of the matches (rounded up).")

    @field_validator("nodes")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        return check_each(v, NAME_RE, "node name", NAME_RULE)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (v or {}).items():
            check_each((key, str(value)), NAME_RE, "label", NAME_RULE)
        return v

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("ranks must not be empty")
            if any(not 0 <= r <= MAX_COUNT for r in v):
                raise ValueError(f"ranks must be between 0 and {MAX_COUNT:,}")
        return v

    @field_validator("process")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            check_regex(v)
        return v

    @model_validator(mode="after")
    def _one_subset(self) -> "TargetSpec":
        if self.count is not None and self.percent is not None:
            raise ValueError("give count or percent, not both")
        return self

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.model_dump(exclude_none=True).items()]
        return ", ".join(parts) or "any"


class ProcessTarget:
    """One resolved process: which node, which pid (and when it started: a signal to a reused pid is refused),
    which rank (if a worker)."""

    def __init__(self, node: str, proc: ProcInfo) -> None:
        self.node, self.pid, self.rank, self.cmdline = node, proc.pid, proc.rank, proc.cmdline
        self.start_time = proc.start_time

    def label(self) -> str:
        return f"{self.node}/rank{self.rank}" if self.rank is not None else f"{self.node}/pid{self.pid}"



class NodeTarget:
    """One resolved node for a node-level fault (network, power)."""

    def __init__(self, node: Node) -> None:
        self.node = node.name
        self.info = node

    def label(self) -> str:
        return self.node


def node_targets(inventory: Inventory, targets: list[Any]) -> list[NodeTarget]:
    """Node targets for ``targets``, which may be placeholders of a dry run that name only their node."""
    return [t if isinstance(t, NodeTarget) else NodeTarget(inventory[t.node]) for t in targets]


def select_nodes(inventory: Inventory, spec: TargetSpec) -> list[Node]:
    return inventory.select(spec.nodes, spec.labels)


def check_static(inventory: Inventory, spec: TargetSpec, world_size: int, max_nodes: int, error) -> None:
    """Raise ``error(message, *path)`` for a selector that cannot match or is too wide.

    ``error`` builds a positioned :class:`~chaoskit.core.errors.ScenarioError`; ``path``
    is relative to the fault's ``target``.
    """
    for name in spec.nodes or []:
        if name not in inventory:
            raise error(f"node {name!r} is not in the inventory ({', '.join(inventory.names())})", "nodes")
    nodes = select_nodes(inventory, spec)
    if not nodes:
        raise error(f"no node matches {spec.describe()} (nodes: {', '.join(inventory.names())})")
    for rank in spec.ranks or []:
        if rank >= world_size:
            raise error(f"rank {rank} does not exist: the job has ranks 0..{world_size - 1}", "ranks")
    if spec.ranks is not None:
        per_node = max(1, world_size // max(1, len(inventory.nodes)))
        touched = {r // per_node for r in spec.ranks}
        if len(touched) > max_nodes:
            raise error(f"ranks {spec.ranks} span {len(touched)} nodes but safety.max_nodes is {max_nodes}", "ranks")
    elif spec.pid is None and spec.process is None and spec.count is None and spec.percent is None:
        if len(nodes) > max_nodes:
            raise error(f"the target selects {len(nodes)} nodes but safety.max_nodes is {max_nodes}; narrow it with nodes, ranks or count")


RESOLVE_DEADLINE_S = 5.0
"""How long resolving a process selector waits for a node's process table: a node silent longer is left out
(its processes are no candidates), so one dead node never delays, or makes stale, a fault on the others."""


def resolve_processes(inventory: Inventory, spec: TargetSpec, *, deadline: float = RESOLVE_DEADLINE_S,
                      on_silent: Callable[[str, str], None] | None = None) -> list[ProcessTarget]:
    """The processes the selectors match now, lowest rank (then pid) first, among each node's processes of the
    drilled job (:attr:`~chaoskit.cluster.transports.api.Transport.job`: the node's agent lists no other).

    Without ``pid``/``process`` selectors the candidates are the training workers. The nodes are asked
    concurrently (:func:`~chaoskit.cluster.fanout.fan_out`), each within ``deadline``; with ``ranks`` the
    answer is final as soon as every rank asked for is found. A node that failed or did not answer is left
    out and named to ``on_silent(node, why)``.
    """
    pattern = compile_pattern(spec.process) if spec.process else None
    nodes = select_nodes(inventory, spec)

    def matches(node: Node, procs: list[ProcInfo]) -> list[ProcessTarget]:
        out = []
        ranks = {p.pid for p in rank_processes(procs)}  # a rank's children (they inherit RANK) are not the rank
        for proc in procs:
            if proc.state == "Z":
                continue
            if spec.pid is not None and proc.pid != spec.pid:
                continue
            if pattern is not None and not bounded_search(pattern, proc.cmdline, "target.process"):
                continue
            if spec.pid is None and pattern is None and proc.pid not in ranks:
                continue
            if spec.ranks is not None and proc.rank not in spec.ranks:
                continue
            out.append(ProcessTarget(node.name, proc))
        return out

    tables: dict[str, Callable[[], list[ProcessTarget]]] = {}
    for node in nodes:
        assert node.conn is not None
        tables[node.name] = (lambda node=node: matches(node, node.conn.processes()))

    def enough(done: dict[str, Any]) -> bool:
        if spec.ranks is None or spec.pid is not None or pattern is not None:
            return False
        ranks = {t.rank for found in done.values() if isinstance(found, list) for t in found}
        return set(spec.ranks) <= ranks

    results = fan_out(tables, deadline, enough=enough)
    satisfied = enough(results)
    found: list[ProcessTarget] = []
    for name, result in results.items():
        if isinstance(result, list):
            found.extend(result)
        elif not isinstance(result, (InfraError, NoAnswer, OSError)):
            raise result  # not the node's silence: a selector's own error (a regex too slow on a command line)
        elif on_silent is not None and not (satisfied and isinstance(result, NoAnswer)):  # unneeded, then
            on_silent(name, getattr(result, "message", None) or str(result) or type(result).__name__)
    found.sort(key=lambda t: (t.rank if t.rank is not None else math.inf, t.pid))
    return subset(found, spec)


def resolve_nodes(inventory: Inventory, spec: TargetSpec) -> list[NodeTarget]:
    """The nodes a node-level fault lands on, in inventory order, after count/percent."""
    return subset([NodeTarget(n) for n in select_nodes(inventory, spec)], spec)


def subset(items: list[Any], spec: TargetSpec) -> list[Any]:
    if spec.count is not None:
        return items[: spec.count]
    if spec.percent is not None:
        return items[: math.ceil(len(items) * spec.percent / 100)]
    return items
