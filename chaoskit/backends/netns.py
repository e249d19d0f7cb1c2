"""``kind: netns``: each node a network namespace with its own NICs and sshd, reached over SSH (root).

See :mod:`chaoskit.lab.netns`. The rendezvous runs over the management network and
the collectives over the data NICs, so a dropped data NIC stalls training without
cutting the agents off from each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from chaoskit.backends.api import ClusterHandle, ClusterSpec, LabStatus, RootLabBackend, teardown_of
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.transports.ssh_many import connect_all
from chaoskit.core.accounts import claim_lab_account, setpriv_argv
from chaoskit.lab.netns import NetnsLab, netns_lab_dir, require_netns_tools

__all__ = ["NetnsBackend", "NetnsSpec"]


class NetnsSpec(ClusterSpec):
    """Nodes as network namespaces on this machine, each with a data NIC, a mgmt NIC and its own sshd."""

    kind: Literal["netns"] = Field(..., description=(
        "netns: each node is a network namespace with its own NICs (data, mgmt) and sshd, reached over SSH "
        "(needs root, iproute2, nftables, openssh-server)."))
    spare: int = Field(0, ge=0, le=16, description="Idle nodes whose torchrun agents wait to take over.")


class NetnsBackend(RootLabBackend):
    name = "netns"
    Spec = NetnsSpec
    summary = "network namespaces with sshd (root)"
    Lab = NetnsLab
    title = "netns lab"

    def create_lab(self, spec: NetnsSpec, directory: Path | None = None) -> NetnsLab:
        return NetnsLab.create(spec.nodes, spare=spec.spare, directory=directory)

    def preview(self, spec: NetnsSpec, base: Path) -> ClusterHandle:
        # The inventory 'lab up' would write, with the addresses of the first free slot.
        lab = NetnsLab("(new netns lab)", netns_lab_dir(), spec.nodes, spec.spare)
        inventory = self.preview_inventory(lab.inventory_document())
        names = inventory.names()
        return ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host=f"<mgmt address of {names[0]}>", scope=lambda node: f"<lab>.{node}",
            launch_prefix=lambda node: ["ip", "netns", "exec", f"<namespace of {node}>"],
            agent_args=lambda node: ["--local-addr", f"<data address of {node}>"],
        )

    def open(self, spec: NetnsSpec, base: Path) -> ClusterHandle:
        """The lab ``lab up --kind netns`` made when it has this shape, else one made for this run."""
        require_netns_tools()
        claim = claim_lab_account()  # the run's own: another lab's job runs as another account, and cannot reach its folders
        try:
            lab, ephemeral = self.open_lab(spec)
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        inventory = _marked_inventory(lab)
        names = lab.node_names()
        teardown = teardown_of(inventory, lab.down if ephemeral else None, claim)

        handle = ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host=lab.mgmt_address(names[0]),
            scope=lambda node: f"{lab.lab_id}.{node}",
            # the job as the lab's account where it can run as it (the runner decides; root otherwise, and says why)
            launch_prefix=lambda node: lab.exec_argv(node, setpriv_argv(handle.job_account) if handle.job_account else []),
            launch_env=lambda node: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
            agent_args=lambda node: ["--local-addr", lab.data_address(node)],
            connect=lambda: connect_all([n.conn for n in inventory.nodes]),
            teardown=teardown,
            details={"inventory": str(lab.inventory_path), "directory": str(lab.directory), "ephemeral": ephemeral},
            job_account=claim.account if claim is not None else None,
            job_isolation=f"the lab's namespaces: other users of this machine are refused its networks ({lab.guard_table})",
        )
        return handle

    def lab_inventory(self) -> Inventory | None:
        lab = self.root_lab()
        return None if lab is None else _marked_inventory(lab)

    def lab_status(self) -> list[LabStatus]:
        lab = self.root_lab()
        if lab is None:
            return []
        st = lab.status()
        nodes = [{**n, "detail": f"{'on ' if n['on'] else 'OFF'} mgmt {n['address']} data {n['data_address']}, "
                                 f"{n['processes']} process(es)"} for n in st["nodes"]]
        return [LabStatus(self.name, lab.lab_id, f"netns lab {lab.lab_id}: inventory {lab.inventory_path}", nodes,
                          {"directory": st["directory"], "inventory": st["inventory"]})]

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return load_inventory(details["inventory"])


def _marked_inventory(lab: NetnsLab) -> Inventory:
    """The lab's nodes, each scoped to its node's mark: the job chaoskit starts carries it, nothing else is in scope."""
    inventory = lab.inventory()
    for node in inventory.nodes:
        node.conn.node_scope["env"] = f"{lab.lab_id}.{node.name}"
    return inventory
