"""``cluster: {inventory: FILE}``: your own nodes, listed in an inventory file and reached over SSH.

The nodes are the inventory's (:mod:`chaoskit.cluster.inventory_spec` is the format):
SSH with host keys verified, the node's agent, leases armed on the node. chaoskit
never starts a job here itself: the job is somebody else's (``workload: {launch: attach}``),
found on the nodes by its command line and torchrun's environment, and left running.

With ``scheduler: slurm`` the cluster's own Slurm is used, through its client commands
on this machine (the controller or a login node: ``slurm: {conf: FILE, bin: DIR}``, by
default ``SLURM_CONF`` and ``PATH``). Every node then carries a
:class:`~chaoskit.cluster.slurm.SlurmAccess` as its ``scheduler`` (its Slurm node name is
its inventory name), so Slurm's node and job states join the timeline, ``slurm.drain`` and
``slurm.requeue`` act through ``scontrol``, a job may be submitted (``launch: sbatch``) and
an attached job may be named by its Slurm job id (``slurm_job``). Only this run's jobs are
followed: a real cluster's other jobs are none of its business.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.backends.api import ClusterBackend, ClusterHandle, ClusterSpec
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.inventory_file import build_inventory, load_inventory, load_inventory_file, preview_inventory
from chaoskit.cluster.slurm import SlurmAccess
from chaoskit.cluster.transports.ssh_many import connect_all
from chaoskit.core.errors import ScenarioError
from chaoskit.core.trusted import untrusted_file
from chaoskit.core.limits import MAX_COUNT
from chaoskit.core.models import StrictModel
from chaoskit.core.shell import check_path
from chaoskit.observe.slurm import SlurmProbe

__all__ = ["InventoryBackend", "InventorySpec", "SlurmClient"]

SLURM_TOOLS = ("scontrol", "squeue", "sbatch")


class SlurmClient(StrictModel):
    """Where this machine finds the cluster's Slurm client commands and configuration."""

    conf: str | None = Field(None, min_length=1, description=(
        "The cluster's slurm.conf (relative to the scenario); default SLURM_CONF, else Slurm's own default."))
    bin: str | None = Field(None, min_length=1, description=(
        "The folder holding scontrol, squeue, sinfo, sbatch (relative to the scenario); default PATH."))

    @field_validator("conf", "bin")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else check_path(v)


class InventorySpec(ClusterSpec):
    """A real cluster: the nodes of an inventory file, reached over SSH."""

    kind: Literal["inventory"] = Field("inventory", description=(
        "inventory: the nodes of an inventory file, over SSH (the default when `inventory:` is given)."))
    inventory: str = Field(..., min_length=1, description="The inventory file (relative to the scenario).")
    nodes: int | None = Field(None, ge=1, le=MAX_COUNT, description=(
        "How many of the inventory's nodes (the first ones) the job runs on; default all."))
    scheduler: Literal["slurm"] | None = Field(None, description=(
        "slurm: the cluster runs Slurm; its own scontrol/squeue/sbatch are used from this machine (the controller "
        "or a login node), and each node is the Slurm node of its inventory name."))
    slurm: SlurmClient | None = Field(None, description="scheduler: slurm only: where Slurm's commands and slurm.conf are.")

    @field_validator("inventory")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_path(v)

    @model_validator(mode="after")
    def _slurm_needs_scheduler(self) -> "InventorySpec":
        if self.slurm is not None and self.scheduler != "slurm":
            raise ValueError("'slurm' is only used with scheduler: slurm")
        return self

    def path(self, base: Path) -> Path:
        return _resolve(base, self.inventory)

    def access(self, base: Path) -> SlurmAccess | None:
        """How to reach the cluster's Slurm (``None`` without ``scheduler``); touches nothing.

        The configuration is resolved now (``slurm.conf``, else ``SLURM_CONF``) so that what a
        lease's watchdog or ``chaoskit rollback`` runs later names the same cluster."""
        if self.scheduler is None:
            return None
        client = self.slurm or SlurmClient()
        conf = str(_resolve(base, client.conf)) if client.conf else os.environ.get("SLURM_CONF") or None
        bin_dir = str(_resolve(base, client.bin)) if client.bin else None
        if client.conf and not Path(conf or "").is_file():
            raise ScenarioError(f"cluster.slurm.conf: no slurm.conf {conf}")
        if client.conf:  # read by root's Slurm commands: the system's, or one only root can change
            problem = untrusted_file(conf or "")
            if problem:
                raise ScenarioError(f"cluster.slurm.conf: {problem}")
        if bin_dir is not None:
            missing = [t for t in SLURM_TOOLS if not os.access(os.path.join(bin_dir, t), os.X_OK)]
            if missing:
                raise ScenarioError(f"cluster.slurm.bin: no {', '.join(missing)} in {bin_dir}")
            for tool in SLURM_TOOLS:  # run as root: only programs root alone can change (an author's squeue is not)
                problem = untrusted_file(os.path.join(bin_dir, tool))
                if problem:
                    raise ScenarioError(f"cluster.slurm.bin: {problem}")
        return SlurmAccess(conf=conf, bin_dir=bin_dir)


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


class InventoryBackend(ClusterBackend):
    name = "inventory"
    Spec = InventorySpec
    summary = "your own nodes over SSH, listed in an inventory file; their job is attached to, never started"
    launches = ("attach", "sbatch")
    has_lab = False

    def preview(self, spec: InventorySpec, base: Path) -> ClusterHandle:
        path = spec.path(base)
        if not path.is_file():
            raise ScenarioError(f"cluster.inventory: no inventory file {path}")
        access = spec.access(base)
        inventory = preview_inventory(load_inventory_file(path))
        return self._handle(spec, inventory, access, {"inventory": str(path.resolve())})

    def open(self, spec: InventorySpec, base: Path) -> ClusterHandle:
        path = spec.path(base).resolve()
        access = spec.access(base)
        inventory = build_inventory(load_inventory_file(path))
        ssh = [n.conn for n in inventory.nodes if n.transport == "ssh"]
        handle = self._handle(spec, inventory, access, {"inventory": str(path)})
        handle.connect = lambda: connect_all(ssh)
        handle.teardown = inventory.close
        return handle

    def _handle(self, spec: InventorySpec, inventory: Inventory, access: SlurmAccess | None,
                details: dict[str, Any]) -> ClusterHandle:
        names = inventory.names()
        if spec.nodes is not None and spec.nodes > len(names):
            raise ScenarioError(f"cluster.nodes: {spec.nodes} nodes asked for, the inventory lists {len(names)}")
        handle = ClusterHandle(
            id=inventory.name, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host="", scope=lambda node: "", details=details,
        )
        if access is not None:
            _with_scheduler(inventory, access)
            handle.scheduler = access
            handle.details["slurm"] = access.describe()
            handle.probes = lambda bus: [SlurmProbe(bus, access, only_jobs=lambda: set(handle.scheduler_jobs))]
        return handle

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        inventory = load_inventory(details["inventory"])
        slurm = details.get("slurm")
        if slurm is not None:
            _with_scheduler(inventory, SlurmAccess(conf=slurm.get("conf"), bin_dir=slurm.get("bin_dir")))
        return inventory


def _with_scheduler(inventory: Inventory, access: SlurmAccess) -> Inventory:
    """Every node is the Slurm node of its own name, reached through ``access``."""
    for node in inventory.nodes:
        node.scheduler = access
    return inventory
