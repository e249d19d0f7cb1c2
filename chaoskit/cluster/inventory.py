"""The nodes a run may touch. Nothing outside the inventory is ever acted on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from chaoskit.cluster.transports.api import Transport

__all__ = ["Node", "Inventory"]


@dataclass
class Node:
    """One node: its name, address, labels and the transport that reaches it."""

    name: str
    address: str = "127.0.0.1"
    transport: str = "local"
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    conn: "Transport | None" = None

    def matches(self, labels: dict[str, str] | None) -> bool:
        return all(self.labels.get(k) == str(v) for k, v in (labels or {}).items())


@dataclass
class Inventory:
    """An ordered set of nodes with unique names."""

    name: str
    nodes: list[Node]

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def __getitem__(self, name: str) -> Node:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def select(self, names: list[str] | None = None, labels: dict[str, str] | None = None) -> list[Node]:
        """Nodes named in ``names`` (all when ``None``) that carry every label in ``labels``."""
        chosen = self.nodes if names is None else [self._by_name[n] for n in names if n in self._by_name]
        return [n for n in chosen if n.matches(labels)]
