"""The cluster a run acts on: its inventory plus how the job is started on each node.

:func:`open_cluster` turns a scenario's ``cluster:`` into a :class:`ClusterHandle`:
the process lab (nodes are local process scopes; with ``ray: true`` joined into a
Ray cluster whose ChaosAgent actors carry the faults) or the network-namespace lab
(each node a namespace with its own NICs and sshd, reached over SSH) or the
Docker lab (each node a container of ``docker-compose.yml``, reached through the
engine). A lab that ``chaoskit lab up`` made is reused; otherwise the run makes
its own and tears it down at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
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
    python: str | None = None
    """The Python that runs torchrun on the nodes (``None``: this one, ``sys.executable``)."""
    launch_wrap: Callable[[str, list[str], dict[str, str], Path], list[str]] | None = None
    """For nodes that do not inherit the controller's environment: (node, argv, job env, job folder) -> the argv to run here."""
    shared_dir: Path | None = None
    """A folder every node sees at the same path; the job's checkpoints and SDK events go there when set."""
    job_transport: Callable[[str], Any] | None = None
    """How to reach a node's job processes to stop them (default: local process scopes)."""

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


def compose_file(spec, base: Path | None = None) -> Path:
    """The compose file of a docker lab spec: ``compose:`` relative to the scenario, else the nearest one."""
    from chaoskit.lab.docker import find_compose

    if spec.compose:
        path = Path(spec.compose)
        return path if path.is_absolute() else (base or Path.cwd()) / path
    return find_compose(base)


def preview_inventory(spec, base: Path | None = None) -> Inventory:
    """The inventory a lab spec would have, built without touching anything (for validation)."""
    from chaoskit.cluster.inventory import Node
    from chaoskit.lab.process import ProcessLab

    if spec.kind == "docker":
        from chaoskit.errors import ScenarioError
        from chaoskit.lab.docker import load_compose

        project = load_compose(compose_file(spec, base))
        services = project.services
        if spec.nodes + spec.spare > len(services):
            raise ScenarioError(
                f"cluster: {spec.nodes} nodes + {spec.spare} spare, but {project.path} has {len(services)} services",
                hint="add services to the compose file, or ask for fewer nodes",
            )
        from chaoskit.cluster.inventory_file import InterfaceSpec, InventoryNode, PowerCommands
        from chaoskit.cluster.transports.docker import power_argv

        nodes = []
        for s in services[: spec.nodes + spec.spare]:
            container = f"{project.name}-{s.name}-1"
            nodes.append(InventoryNode(
                s.name, address=container, transport="docker", labels={**_service_labels(s), "lab": "docker"},
                interfaces={"data": InterfaceSpec(name="eth0")},
                power=PowerCommands(**{a: power_argv(container, a) for a in ("off", "on", "status")}),
            ))
        return Inventory(f"docker-{project.name}", nodes)
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


def _service_labels(service) -> dict[str, str]:
    return {k.removeprefix("io.chaoskit."): v for k, v in service.labels.items() if k.startswith("io.chaoskit.")}


def open_cluster(spec, base: Path | None = None) -> ClusterHandle:
    """Attach to the lab ``spec`` asks for, making one when none is up (needs root for netns)."""
    if spec.kind == "netns":
        return _netns(spec)
    if spec.kind == "docker":
        return _docker(spec, compose_file(spec, base))
    return _process(spec)


def _docker(spec, compose: Path) -> ClusterHandle:
    """The compose project's containers: the ones already up, or brought up for this run and removed after it."""
    from chaoskit.lab.docker import DockerLab

    lab = DockerLab.load(compose)
    ephemeral = lab is None
    if ephemeral:
        lab = DockerLab.up(compose)
    try:
        return _docker_handle(spec, lab, ephemeral)
    except BaseException:
        if ephemeral:
            lab.down()
        raise


def _docker_handle(spec, lab, ephemeral: bool) -> ClusterHandle:
    import shutil

    from chaoskit.errors import InfraError

    shared = lab.project.shared_dir()
    if shared is None:
        raise InfraError(
            f"{lab.project.path}: no node mounts a host folder at the same path (HOST:HOST), so chaoskit could not "
            "read the job's events",
            hint="keep the shared volume of chaoskit's docker-compose.yml",
        )
    if shutil.which("docker") is None:
        raise InfraError("the docker lab starts the job with the docker CLI, which is not installed",
                         hint="apt-get install docker.io (or docker-ce-cli)")
    inventory = lab.inventory()
    names = inventory.names()
    missing = [s.name for s in lab.project.services[: spec.nodes + spec.spare] if s.name not in names]
    if missing:
        raise InfraError(f"docker lab {lab.project.name}: no container for {', '.join(missing)}",
                         hint="'chaoskit lab down' then 'chaoskit lab up --kind docker'")
    used = names[: spec.nodes + spec.spare]
    from chaoskit.cluster.inventory import Inventory

    inventory = Inventory(inventory.name, [inventory[n] for n in used])
    containers = {n.name: n.address for n in inventory.nodes}
    addresses = {n.name: n.interfaces["data"].address for n in inventory.nodes}
    running = lab.containers()
    for node in used:
        if running[node].status != "running":
            raise InfraError(f"docker lab node {node} ({containers[node]}) is not running",
                             hint="'chaoskit lab down' then 'chaoskit lab up --kind docker'")

    def wrap(node: str, argv: list[str], env: dict[str, str], cwd: Path) -> list[str]:
        flags = [f for k, v in sorted(env.items()) for f in ("-e", f"{k}={v}")]
        return ["docker", "exec", "-i", "-w", str(cwd), *flags, containers[node], *argv]

    def teardown() -> None:
        for node in inventory.nodes:
            node.conn.close()
        if ephemeral:
            lab.down()

    return ClusterHandle(
        id=lab.lab_id, kind="docker-lab", inventory=inventory, job_nodes=used[: spec.nodes],
        rdzv_host=addresses[used[0]], scope=lab.scope,
        # No GLOO_SOCKET_IFNAME: gloo takes the address of the node's host name (the engine writes it
        # into /etc/hosts), which survives a disconnect and reconnect; the NIC's name does not.
        agent_args=lambda node: ["--local-addr", addresses[node]],
        connect=lambda: connect_all_docker(inventory),
        teardown=teardown,
        details={"compose": str(lab.project.path), "project": lab.project.name, "shared": str(shared), "ephemeral": ephemeral},
        python="/opt/chaoskit/bin/python", launch_wrap=wrap, shared_dir=shared,
        job_transport=lambda node: inventory[node].conn,
    )


def connect_all_docker(inventory: Inventory) -> None:
    from chaoskit.cluster.transports.ssh import connect_all

    connect_all([n.conn for n in inventory.nodes])


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


def preview_cluster(spec, base: Path | None = None) -> ClusterHandle:
    """A handle for ``--dry-run``: the inventory and commands a run would use, nothing created."""
    inventory = preview_inventory(spec, base)
    names = inventory.names()
    if spec.kind == "docker":
        from chaoskit.lab.docker import load_compose

        project = load_compose(compose_file(spec, base))
        return ClusterHandle(
            id=f"(docker lab {project.name})", kind="docker-lab", inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host=f"<address of {names[0]}>", scope=lambda node: f"{project.name}.{node}",
            agent_args=lambda node: ["--local-addr", f"<address of {node}>"],
            python="/opt/chaoskit/bin/python", shared_dir=project.shared_dir(),
            launch_wrap=lambda node, argv, env, cwd: ["docker", "exec", "-i", "-w", str(cwd), f"{project.name}-{node}-1", *argv],
        )
    if spec.kind == "process":
        return ClusterHandle(id="(new process lab)", kind="ray-lab" if getattr(spec, "ray", False) else "process-lab",
                             inventory=inventory, job_nodes=names, rdzv_host="127.0.0.1", scope=lambda node: f"<lab>.{node}")
    return ClusterHandle(
        id="(new netns lab)", kind="netns-lab", inventory=inventory, job_nodes=names[: spec.nodes],
        rdzv_host=f"<mgmt address of {names[0]}>", scope=lambda node: f"<lab>.{node}",
        launch_prefix=lambda node: ["ip", "netns", "exec", f"<namespace of {node}>"],
        agent_args=lambda node: ["--local-addr", f"<data address of {node}>"],
    )
