"""``cluster: {inventory: FILE}``: your own nodes, listed in an inventory file and reached over SSH.

The nodes are the inventory's (:mod:`chaoskit.cluster.inventory_spec` is the format):
SSH with host keys verified, the node's agent, leases armed on the node. chaoskit
never starts a job here: the job is somebody else's (``workload: {launch: attach}``),
found on the nodes by its command line and torchrun's environment, and left running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from chaoskit.backends.api import ClusterBackend, ClusterHandle, ClusterSpec
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.inventory_file import build_inventory, load_inventory, load_inventory_file, preview_inventory
from chaoskit.cluster.transports.ssh import connect_all
from chaoskit.core.errors import ScenarioError
from chaoskit.core.limits import MAX_COUNT
from chaoskit.core.shell import check_path

__all__ = ["InventoryBackend", "InventorySpec"]


class InventorySpec(ClusterSpec):
    """A real cluster: the nodes of an inventory file, reached over SSH."""

    kind: Literal["inventory"] = Field("inventory", description=(
        "inventory: the nodes of an inventory file, over SSH (the default when `inventory:` is given)."))
    inventory: str = Field(..., min_length=1, description="The inventory file (relative to the scenario).")
    nodes: int | None = Field(None, ge=1, le=MAX_COUNT, description=(
        "How many of the inventory's nodes (the first ones) the job runs on; default all."))

    @field_validator("inventory")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_path(v)

    def path(self, base: Path) -> Path:
        p = Path(self.inventory).expanduser()
        return p if p.is_absolute() else base / p


class InventoryBackend(ClusterBackend):
    name = "inventory"
    Spec = InventorySpec
    summary = "your own nodes over SSH, listed in an inventory file; their job is attached to, never started"
    launches = ("attach",)
    has_lab = False

    def preview(self, spec: InventorySpec, base: Path) -> ClusterHandle:
        path = spec.path(base)
        if not path.is_file():
            raise ScenarioError(f"cluster.inventory: no inventory file {path}")
        inventory = preview_inventory(load_inventory_file(path))
        return self._handle(spec, inventory, {"inventory": str(path.resolve())})

    def open(self, spec: InventorySpec, base: Path) -> ClusterHandle:
        path = spec.path(base).resolve()
        inventory = build_inventory(load_inventory_file(path))
        ssh = [n.conn for n in inventory.nodes if n.transport == "ssh"]
        handle = self._handle(spec, inventory, {"inventory": str(path)})
        handle.connect = lambda: connect_all(ssh)
        handle.teardown = inventory.close
        return handle

    def _handle(self, spec: InventorySpec, inventory: Inventory, details: dict[str, Any]) -> ClusterHandle:
        names = inventory.names()
        if spec.nodes is not None and spec.nodes > len(names):
            raise ScenarioError(f"cluster.nodes: {spec.nodes} nodes asked for, the inventory lists {len(names)}")
        return ClusterHandle(
            id=inventory.name, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host="", scope=lambda node: "", details=details,
        )

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return load_inventory(details["inventory"])
