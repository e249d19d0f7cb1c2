"""The cluster a run acts on: its inventory plus how the job is started on each node.

:func:`open_cluster` turns a scenario's ``cluster:`` into a :class:`ClusterHandle`:
the process lab (nodes are local process scopes; with ``ray: true`` joined into a
Ray cluster whose ChaosAgent actors carry the faults) or the network-namespace lab
(each node a namespace with its own NICs and sshd, reached over SSH). A lab
that ``chaoskit lab up`` made is reused; otherwise the run makes its own and
tears it down at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from chaoskit.cluster.inventory import Inventory

__all__ = ["ClusterHandle", "open_cluster", "preview_inventory"]


@dataclass
class ClusterHandle:
    """What the runner needs of a cluster; every field is plain data or a plain callable."""

    id: str
    kind: str
    inventory: Inventory
    job_nodes: list[str]
    """Nodes whose agents form the job's world (spares are in the inventory, not here)."""
    rdzv_host: str
    scope: Callable[[str], str]
    """The CHAOSKIT_SCOPE token of a node: every process the job starts there carries it."""
    launch_prefix: Callable[[str], list[str]] = lambda node: []
    launch_env: Callable[[str], dict[str, str]] = lambda node: {}
    agent_args: Callable[[str], list[str]] = lambda node: []
    connect: Callable[[], None] = lambda: None
    teardown: Callable[[], None] = lambda: None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def agent_nodes(self) -> list[str]:
        """Every node that runs a torchrun agent: the job's nodes, then the spares."""
        return self.job_nodes + [n for n in self.inventory.names() if n not in self.job_nodes]

    def info(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "id": self.id,
            "nodes": [{"name": n.name, "labels": n.labels} for n in self.inventory.nodes],
            "job_nodes": self.job_nodes, **self.details,
        }


def preview_inventory(spec) -> Inventory:
    """The inventory a lab spec would have, built without touching anything (for validation)."""
    from chaoskit.cluster.inventory import Node
    from chaoskit.lab.process import ProcessLab

    if spec.kind == "process":
        if getattr(spec, "ray", False):
            from chaoskit.lab.ray import RayLab

            return RayLab(ProcessLab("check", spec.nodes), "127.0.0.1:6379").inventory()
        return ProcessLab("check", spec.nodes).inventory()
    nodes = []
    for i in range(spec.nodes + spec.spare):
        role = "worker" if i < spec.nodes else "spare"
        nodes.append(Node(f"n{i}", labels={"rack": f"r{i // 2}", "role": role, "lab": "netns"}))
    return Inventory("check", nodes)


def open_cluster(spec) -> ClusterHandle:
    """Attach to the lab ``spec`` asks for, making one when none is up (needs root for netns)."""
    if spec.kind == "netns":
        return _netns(spec)
    return _process(spec)


def _process(spec) -> ClusterHandle:
    from chaoskit.lab.process import ProcessLab

    lab = ProcessLab.load()
    ephemeral = lab is None or lab.nodes != spec.nodes
    if ephemeral:
        lab = ProcessLab.create(spec.nodes)
    if getattr(spec, "ray", False):
        return _ray(lab, ephemeral)
    inventory = lab.inventory()
    return ClusterHandle(
        id=lab.lab_id, kind="process-lab", inventory=inventory, job_nodes=inventory.names(),
        rdzv_host="127.0.0.1", scope=lab.scope,
        teardown=(lambda: lab.kill_all()) if ephemeral else (lambda: None),
        details={"ephemeral": ephemeral},
    )


def _ray(lab, lab_ephemeral: bool) -> ClusterHandle:
    """The process lab joined into Ray: the one ``lab up --ray`` left, or one started for this run."""
    from chaoskit.lab.ray import RayLab

    ray_lab = None if lab_ephemeral else RayLab.load(lab)
    ray_ephemeral = ray_lab is None
    if ray_ephemeral:
        try:
            ray_lab = RayLab.start(lab)
        except BaseException:
            if lab_ephemeral:
                lab.kill_all()
            raise
    inventory = ray_lab.inventory()

    def connect() -> None:
        for node in inventory.nodes:
            node.conn.connect()  # start every ChaosAgent now, each bounded by its start timeout

    def teardown() -> None:
        import ray

        for node in inventory.nodes:
            node.conn.close()
        ray.shutdown()
        if ray_ephemeral:
            ray_lab.down()
        if lab_ephemeral:
            lab.kill_all()

    return ClusterHandle(
        id=lab.lab_id, kind="ray-lab", inventory=inventory, job_nodes=inventory.names(),
        rdzv_host="127.0.0.1", scope=lab.scope, connect=connect, teardown=teardown,
        details={"ephemeral": lab_ephemeral, "ray_address": ray_lab.address, "ray_ephemeral": ray_ephemeral},
    )


def _netns(spec) -> ClusterHandle:
    from chaoskit.cluster.transports.ssh import connect_all
    from chaoskit.lab.netns import NetnsLab, require_netns_tools

    require_netns_tools()
    lab = NetnsLab.load()
    ephemeral = lab is None or lab.nodes != spec.nodes or lab.spare != spec.spare
    if ephemeral:
        from chaoskit.state import state_dir

        lab = NetnsLab.create(spec.nodes, spare=spec.spare, directory=state_dir() / "lab" / f"netns-run-{_token()}")
    inventory = lab.inventory()
    names = lab.node_names()

    def scope(node: str) -> str:
        return f"{lab.lab_id}.{node}"

    def teardown() -> None:
        for node in inventory.nodes:
            close = getattr(node.conn, "close", None)
            if close:
                close()
        if ephemeral:
            lab.down()

    return ClusterHandle(
        id=lab.lab_id, kind="netns-lab", inventory=inventory, job_nodes=names[: spec.nodes],
        # The rendezvous runs over the management network, the collectives over the data NICs:
        # a dropped data NIC then stalls training without cutting the agents off from each other.
        rdzv_host=lab.mgmt_address(names[0]),
        scope=scope,
        launch_prefix=lambda node: lab.exec_argv(node, []),
        launch_env=lambda node: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
        agent_args=lambda node: ["--local-addr", lab.data_address(node)],
        connect=lambda: connect_all([n.conn for n in inventory.nodes]),
        teardown=teardown,
        details={"inventory": str(lab.inventory_path), "directory": str(lab.directory), "ephemeral": ephemeral},
    )


def _token() -> str:
    import secrets

    return secrets.token_hex(3)


def preview_cluster(spec) -> ClusterHandle:
    """A handle for ``--dry-run``: the inventory and commands a run would use, nothing created."""
    inventory = preview_inventory(spec)
    names = inventory.names()
    if spec.kind == "process":
        return ClusterHandle(id="(new process lab)", kind="ray-lab" if getattr(spec, "ray", False) else "process-lab",
                             inventory=inventory, job_nodes=names, rdzv_host="127.0.0.1", scope=lambda node: f"<lab>.{node}")
    return ClusterHandle(
        id="(new netns lab)", kind="netns-lab", inventory=inventory, job_nodes=names[: spec.nodes],
        rdzv_host=f"<mgmt address of {names[0]}>", scope=lambda node: f"<lab>.{node}",
        launch_prefix=lambda node: ["ip", "netns", "exec", f"<namespace of {node}>"],
        agent_args=lambda node: ["--local-addr", f"<data address of {node}>"],
    )
