"""``kind: ray``: the process lab's nodes joined into a real Ray cluster. See :mod:`chaoskit.lab.ray`.

Faults run through one ChaosAgent actor per node; Ray marking a node DEAD is a
detection source (:class:`~chaoskit.observe.ray_nodes.RayNodeProbe`); the
``ray-train`` workload runs here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from chaoskit.backends.api import (
    LAUNCHES,
    ClusterBackend,
    ClusterHandle,
    ClusterSpec,
    LabStatus,
    Say,
)
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.transports.ray import disconnect_ray
from chaoskit.core.errors import ScenarioError
from chaoskit.lab.process import ProcessLab
from chaoskit.lab.ray import (
    RayLab,
    ray_available,
    ray_nodes_state_path,
    stop_lab_processes,
)
from chaoskit.observe.ray_nodes import RayNodeProbe

__all__ = ["RayBackend", "RaySpec"]


class RaySpec(ClusterSpec):
    """The process lab joined into a Ray cluster: a head holding no CPUs and one 'ray start' per node."""

    kind: Literal["ray"] = Field(..., description=(
        "ray: the process lab's nodes joined into a Ray cluster; faults run through a ChaosAgent actor pinned to "
        "each node, and Ray marking a node DEAD counts as detection. Needs pip install 'chaoskit[ray]'."))


class RayBackend(ClusterBackend):
    name = "ray"
    Spec = RaySpec
    summary = "the process lab joined into a Ray cluster (pip install 'chaoskit[ray]')"
    launches = (*LAUNCHES, "ray-train")

    def preview(self, spec: RaySpec, base: Path) -> ClusterHandle:
        inventory = RayLab(ProcessLab("check", spec.nodes), "127.0.0.1:6379").inventory()
        return ClusterHandle(id="(new Ray lab)", kind=self.name, inventory=inventory, job_nodes=inventory.names(),
                             rdzv_host="127.0.0.1", scope=lambda node: f"<lab>.{node}")

    def open(self, spec: RaySpec, base: Path) -> ClusterHandle:
        """The Ray lab ``lab up --kind ray`` left, or one started for this run."""
        lab = ProcessLab.load(ray_nodes_state_path())
        ray_lab = RayLab.load(lab) if lab is not None and lab.nodes == spec.nodes else None
        ephemeral = ray_lab is None
        if ephemeral:
            lab = ProcessLab.create(spec.nodes)
            try:
                ray_lab = RayLab.start(lab)
            except BaseException:
                lab.kill_all()
                raise
        inventory = ray_lab.inventory()

        def connect() -> None:
            for node in inventory.nodes:
                node.conn.connect()  # start every ChaosAgent now, each bounded by its start timeout

        def teardown() -> None:
            inventory.close()
            disconnect_ray()
            if ephemeral:
                ray_lab.down()
                lab.kill_all()

        return ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=inventory.names(),
            rdzv_host="127.0.0.1", scope=lab.scope, connect=connect, teardown=teardown,
            details={"lab": lab.lab_id, "ephemeral": ephemeral, "ray_address": ray_lab.address,
                     "ray_token_file": ray_lab.token_file, "ray_nodes_run": ray_lab.runs_as},
            probes=lambda bus: [RayNodeProbe(bus, ray_lab.address, inventory.names(), token_file=ray_lab.token_file)],
            job_account=ray_lab.account, job_account_fixed=ray_lab.account is not None,
            job_isolation="a Ray cluster with token authentication (a token per lab, in a 0600 file): no other user joins it",
        )

    def lab_up(self, spec: RaySpec, base: Path, say: Say, rebuild: bool = False) -> str:
        existing = RayLab.load()
        if existing is not None:
            return f"Ray lab {existing.lab.lab_id} is already up at {existing.address}; 'chaoskit lab down' first"
        if not ray_available():
            raise ScenarioError("a Ray lab needs Ray", hint="pip install 'chaoskit[ray]'")
        lab = ProcessLab.create(spec.nodes, persistent=True, state=ray_nodes_state_path())
        t0 = time.time()
        try:
            ray_lab = RayLab.start(lab, persistent=True)
        except BaseException:
            lab.down()
            raise
        return (f"lab {lab.lab_id} up: {spec.nodes} process nodes ({', '.join(lab.node_names())}) "
                f"joined into Ray at {ray_lab.address} in {time.time() - t0:.1f}s; its nodes run {ray_lab.runs_as}, "
                f"and only a client with its token (RAY_AUTH_TOKEN_PATH={ray_lab.token_file}) may join")

    def lab_down(self, compose: Path | None = None) -> list[str]:
        ray_lab = RayLab.load()
        if ray_lab is None:
            lab = ProcessLab.load(ray_nodes_state_path())  # a Ray lab whose start failed half-way
            return [] if lab is None else [f"lab {lab.lab_id} down: {lab.down()} process(es) stopped"]
        n = ray_lab.down() + ray_lab.lab.down()
        return [f"lab {ray_lab.lab.lab_id} down: {n} process(es) stopped"]

    def lab_status(self) -> list[LabStatus]:
        ray_lab = RayLab.load()
        if ray_lab is None:
            return []
        lab = ray_lab.lab
        return [LabStatus(self.name, lab.lab_id, f"lab {lab.lab_id}: {lab.nodes} process nodes, Ray at {ray_lab.address}",
                          lab.node_status(), {"ray_address": ray_lab.address})]

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return ProcessLab(details.get("lab", ""), 0).inventory_of(nodes)

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        if not details.get("ephemeral") or not details.get("lab"):
            return None
        n = stop_lab_processes(details["lab"])
        return f"Ray lab {details['lab']}: {n} process(es) stopped" if n else None
