"""``kind: netns``: each node a network namespace with its own NICs and sshd, reached over SSH (root).

See :mod:`chaoskit.lab.netns`. The rendezvous runs over the management network and
the collectives over the data NICs, so a dropped data NIC stalls training without
cutting the agents off from each other.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from chaoskit.backends.api import (
    ClusterBackend,
    ClusterHandle,
    ClusterSpec,
    LabStatus,
    Say,
)
from chaoskit.cluster.inventory import InterfaceSpec, Inventory, Node, PowerCommands
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.transports.ssh_many import connect_all
from chaoskit.core.state import state_dir
from chaoskit.lab.netns import NetnsLab, netns_lab_dir, require_netns_tools

__all__ = ["NetnsBackend", "NetnsSpec"]


class NetnsSpec(ClusterSpec):
    """Nodes as network namespaces on this machine, each with a data NIC, a mgmt NIC and its own sshd."""

    kind: Literal["netns"] = Field(..., description=(
        "netns: each node is a network namespace with its own NICs (data, mgmt) and sshd, reached over SSH "
        "(needs root, iproute2, nftables, openssh-server)."))
    spare: int = Field(0, ge=0, le=16, description="Idle nodes whose torchrun agents wait to take over.")


class NetnsBackend(ClusterBackend):
    name = "netns"
    Spec = NetnsSpec
    summary = "network namespaces with sshd (root)"

    def preview(self, spec: NetnsSpec, base: Path) -> ClusterHandle:
        # The inventory 'lab up' would write, with the addresses of the first free slot.
        lab = NetnsLab("(new netns lab)", netns_lab_dir(), spec.nodes, spec.spare)
        nodes = [
            Node(n["name"], n["address"], "ssh", n["labels"], n["gpus"],
                 interfaces={role: InterfaceSpec(**i) for role, i in n["interfaces"].items()},
                 power=PowerCommands(**n["power"]), processes=n["processes"], workdir=n["workdir"],
             gpu_pci=tuple(n.get("gpu_pci", ())))
            for n in lab.inventory_document()["nodes"]
        ]
        names = [n.name for n in nodes]
        return ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=Inventory("check", nodes), job_nodes=names[: spec.nodes],
            rdzv_host=f"<mgmt address of {names[0]}>", scope=lambda node: f"<lab>.{node}",
            launch_prefix=lambda node: ["ip", "netns", "exec", f"<namespace of {node}>"],
            agent_args=lambda node: ["--local-addr", f"<data address of {node}>"],
        )

    def open(self, spec: NetnsSpec, base: Path) -> ClusterHandle:
        """The lab ``lab up --kind netns`` made when it has this shape, else one made for this run."""
        require_netns_tools()
        lab = NetnsLab.load()
        ephemeral = lab is None or lab.nodes != spec.nodes or lab.spare != spec.spare
        if ephemeral:
            lab = NetnsLab.create(spec.nodes, spare=spec.spare,
                                  directory=state_dir() / "lab" / f"netns-run-{secrets.token_hex(3)}")
        inventory = lab.inventory()
        names = lab.node_names()
        for node in inventory.nodes:  # the job chaoskit starts carries its node's mark: nothing else is in scope
            node.conn.node_scope["env"] = f"{lab.lab_id}.{node.name}"

        def teardown() -> None:
            inventory.close()
            if ephemeral:
                lab.down()

        return ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host=lab.mgmt_address(names[0]),
            scope=lambda node: f"{lab.lab_id}.{node}",
            launch_prefix=lambda node: lab.exec_argv(node, []),
            launch_env=lambda node: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
            agent_args=lambda node: ["--local-addr", lab.data_address(node)],
            connect=lambda: connect_all([n.conn for n in inventory.nodes]),
            teardown=teardown,
            details={"inventory": str(lab.inventory_path), "directory": str(lab.directory), "ephemeral": ephemeral},
        )

    def lab_up(self, spec: NetnsSpec, base: Path, say: Say, rebuild: bool = False) -> str:
        existing = NetnsLab.load()
        if existing is not None:
            return f"netns lab {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first"
        lab = NetnsLab.create(spec.nodes, spare=spec.spare)
        return (f"netns lab {lab.lab_id} up: {spec.nodes} nodes + {spec.spare} spare ({', '.join(lab.node_names())})\n"
                f"inventory: {lab.inventory_path}")

    def lab_down(self, compose: Path | None = None) -> list[str]:
        lab = _lab_if_root()
        if lab is None:
            return []
        lab.down()
        return [f"netns lab {lab.lab_id} down"]

    def lab_inventory(self) -> Inventory | None:
        lab = _lab_if_root()
        if lab is None:
            return None
        inventory = lab.inventory()
        for node in inventory.nodes:  # the job chaoskit starts carries its node's mark, as in open()
            node.conn.node_scope["env"] = f"{lab.lab_id}.{node.name}"
        return inventory

    def lab_status(self) -> list[LabStatus]:
        lab = _lab_if_root()
        if lab is None:
            return []
        st = lab.status()
        nodes = [{**n, "detail": f"{'on ' if n['on'] else 'OFF'} mgmt {n['address']} data {n['data_address']}, "
                                 f"{n['processes']} process(es)"} for n in st["nodes"]]
        return [LabStatus(self.name, lab.lab_id, f"netns lab {lab.lab_id}: inventory {lab.inventory_path}", nodes,
                          {"directory": st["directory"], "inventory": st["inventory"]})]

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return load_inventory(details["inventory"])

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        if not details.get("ephemeral") or not details.get("directory"):
            return None
        lab = NetnsLab.load(details["directory"])
        if lab is None:
            return None
        lab.down()
        return f"netns lab {lab.lab_id} removed"


def _lab_if_root() -> NetnsLab | None:
    """The persistent netns lab; only root can have made one (and read its state)."""
    return NetnsLab.load() if os.geteuid() == 0 else None
