"""Turn a fault's target selectors into concrete nodes and processes.

Static checks (names, labels, rank range, blast radius) run before anything
starts and point at the scenario's line; process resolution runs at injection
time against each node's own process table.
"""

from __future__ import annotations

import math
import re
from typing import Any

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.faults.api import TargetSpec
from chaoskit.faults.process import ProcessTarget

__all__ = ["check_static", "resolve_processes", "resolve_nodes", "select_nodes", "NodeTarget"]


class NodeTarget:
    """One resolved node for a node-level fault (network, power)."""

    def __init__(self, node: Node) -> None:
        self.node = node.name
        self.info = node

    def label(self) -> str:
        return self.node


def select_nodes(inventory: Inventory, spec: TargetSpec) -> list[Node]:
    return inventory.select(spec.nodes, spec.labels)


def check_static(inventory: Inventory, spec: TargetSpec, world_size: int, max_nodes: int, error) -> None:
    """Raise ``error(message, *path)`` for a selector that cannot match or is too wide.

    ``error`` builds a positioned :class:`~chaoskit.errors.ScenarioError`; ``path``
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


def resolve_processes(inventory: Inventory, spec: TargetSpec) -> list[ProcessTarget]:
    """The processes the selectors match now, lowest rank (then pid) first.

    Without ``pid``/``process`` selectors the candidates are the training workers.
    """
    pattern = re.compile(spec.process) if spec.process else None
    found: list[ProcessTarget] = []
    for node in select_nodes(inventory, spec):
        assert node.conn is not None
        for proc in node.conn.processes():
            if proc.state == "Z":
                continue
            if spec.pid is not None and proc.pid != spec.pid:
                continue
            if pattern is not None and not pattern.search(proc.cmdline):
                continue
            if spec.pid is None and pattern is None and not proc.is_worker:
                continue
            if spec.ranks is not None and proc.rank not in spec.ranks:
                continue
            found.append(ProcessTarget(node.name, proc))
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
