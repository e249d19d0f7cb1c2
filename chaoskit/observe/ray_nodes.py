"""A probe over Ray's node table: Ray declaring a node DEAD is a detection.

:class:`RayNodeProbe` polls the GCS (no driver needed) and publishes one
``detect`` event (``who: ray``, ``why: node DEAD``) the first time a Ray node
that was alive is marked dead. Ray nodes are mapped to chaoskit nodes by the
custom resource each carries (``chaoskit_node_<name>``), so a node that comes
back under a new Ray node id is tracked again from its new id.
"""

from __future__ import annotations

import threading
import time

from chaoskit.cluster.transports.ray import node_resource, node_table
from chaoskit.core.errors import InfraError
from chaoskit.observe.events import EventBus, make_event

__all__ = ["RayNodeProbe"]


class RayNodeProbe(threading.Thread):
    def __init__(self, bus: EventBus, address: str, nodes: list[str], interval: float = 0.2,
                 token_file: str | None = None) -> None:
        """``token_file``: the cluster's token (:func:`~chaoskit.cluster.transports.ray.ray_auth_env`), if it has one."""
        super().__init__(daemon=True, name="chaoskit-raynodes")
        self.bus, self.address, self.nodes, self.interval = bus, address, list(nodes), interval
        self.token_file = token_file
        self.stop_event = threading.Event()
        self.alive: dict[str, str] = {}
        """Ray node id -> chaoskit node, for every Ray node seen alive and not yet seen dead."""

    def poll(self) -> list[dict]:
        """One look at the node table; return the events it published."""
        try:
            table = node_table(self.address, self.token_file)
        except InfraError:
            return []  # the head is unreachable: no verdict on any node
        ts = time.time()
        out = []
        for entry in table:
            resources = entry.get("Resources") or {}
            node_id = entry.get("NodeID")
            # A dead node's entry lists no resources any more: name it from when it was alive.
            name = self.alive.get(node_id) or next((n for n in self.nodes if resources.get(node_resource(n))), None)
            if name is None or node_id is None:
                continue
            if entry.get("Alive"):
                self.alive[node_id] = name
            elif node_id in self.alive:
                del self.alive[node_id]
                event = make_event("detect", ts, node=name, who="ray", why="node DEAD", ray_node_id=node_id,
                                   source="ray", reason=entry.get("DeathReasonMessage") or None)
                self.bus.publish(event)
                out.append(event)
        return out

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll()
            self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)
