"""An inventory file's nodes with their transports (SSH, Ray); the format is :mod:`chaoskit.cluster.inventory_spec`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoskit.cluster.inventory import Inventory, Node, SshSettings
from chaoskit.cluster.ssh_paths import ssh_roots
from chaoskit.cluster.inventory_spec import (
    InventoryFile,
    LoadedInventory,
    NodeSpec,
    load_inventory_file,
    looks_like_inventory,
    validate_inventory_data,
)
from chaoskit.cluster.transports.ray import discover_nodes
from chaoskit.cluster.transports.ssh import SSHTransport
from chaoskit.cluster.transports.ssh_route import Bastions

__all__ = [
    "InventoryFile",
    "NodeSpec",
    "LoadedInventory",
    "load_inventory",
    "load_inventory_file",
    "looks_like_inventory",
    "validate_inventory_data",
    "build_inventory",
    "preview_inventory",
]


def build_inventory(loaded: LoadedInventory, *, trust_on_first_use: bool | None = None) -> Inventory:
    """Nodes with their SSH transports (not connected yet: each connects on first use;
    :func:`chaoskit.cluster.transports.ssh_many.connect_all` connects them all at once).

    With ``ray:`` the live Ray nodes are discovered too (a GCS query, no driver):
    listed ``transport: ray`` nodes take theirs, and unlisted ones are added."""
    base = loaded.path.resolve().parent
    nodes: list[Node] = []
    bastions = Bastions()
    roots = ssh_roots(loaded.policy.ssh_roots if loaded.policy is not None else None, base)
    for spec in loaded.model.bastions:  # jumps name bastions listed anywhere in the file: make them all, then link
        ssh = loaded.model.ssh_for_bastion(spec)
        ssh = ssh.model_copy(update={"jump": None}) if ssh.jump is not None else ssh
        bastions.add(spec.name, _transport(spec.name, spec.address, ssh, base, bastions, trust_on_first_use,
                                           role="bastion", use_agent=False, ssh_roots=roots))
    for spec in loaded.model.bastions:
        if spec.ssh is not None and spec.ssh.jump not in (None, "none"):
            bastions[spec.name].jump = bastions[spec.ssh.jump]
    discovered: dict[str, tuple[dict[str, str], Any]] = {}
    if loaded.model.ray is not None:
        discovered = {name: (labels, conn) for name, labels, conn in discover_nodes(loaded.model.ray)}
    for i, spec in enumerate(loaded.model.nodes):
        if spec.transport == "ray":
            if spec.name not in discovered:
                raise loaded.error(f"nodes.{i}.name: no live Ray node is named {spec.name!r} (found: "
                                   f"{', '.join(sorted(discovered)) or 'none'})", "nodes", i, "name")
            labels, conn = discovered.pop(spec.name)
            nodes.append(Node(
                name=spec.name, address=spec.address, transport="ray", labels={**labels, **spec.labels}, gpus=spec.gpus,
                gpu_pci=tuple(spec.gpu_pci), conn=conn, interfaces=dict(spec.interfaces), power=spec.power, processes=spec.processes, workdir=spec.workdir,
            ))
            continue
        ssh = loaded.model.ssh_for(spec)
        conn = _transport(spec.name, spec.address, ssh, base, bastions, trust_on_first_use,
                          workdir=spec.workdir, process_scope=spec.processes,
                          vet_python=bool(loaded.policy is not None and loaded.policy.python), ssh_roots=roots)
        nodes.append(Node(
            name=spec.name, address=spec.address, transport=spec.transport, labels=dict(spec.labels),
            gpus=spec.gpus, gpu_pci=tuple(spec.gpu_pci), conn=conn, interfaces=dict(spec.interfaces), power=spec.power, ssh=ssh,
            processes=spec.processes, workdir=spec.workdir,
        ))
    for name, (labels, conn) in discovered.items():  # Ray's nodes the file does not list
        if name not in {n.name for n in nodes}:
            nodes.append(Node(name=name, address="", transport="ray", labels=labels, conn=conn))
    return Inventory(loaded.model.name, nodes, shared=[bastions], policy=loaded.policy)


def load_inventory(path: str | Path, **kwargs: Any) -> Inventory:
    """:func:`load_inventory_file` then :func:`build_inventory`."""
    return build_inventory(load_inventory_file(path), **kwargs)


def _transport(name: str, address: str, ssh: SshSettings, base: Path, bastions: Bastions,
               trust_on_first_use: bool | None, **kwargs: Any) -> SSHTransport:
    """The SSH transport of one node or bastion from its effective settings; what the inventory
    set itself (``model_fields_set``) is what the ssh config may not override."""
    if ssh.config is None:
        default = Path("~/.ssh/config").expanduser()
        config = str(default) if default.is_file() else None
    else:
        config = None if ssh.config == "none" else _resolve(base, ssh.config)
    jump = None if ssh.jump in (None, "none") else bastions[ssh.jump]
    return SSHTransport(
        name,
        address,
        user=ssh.user,
        port=ssh.port,
        key_file=_resolve(base, ssh.key),
        known_hosts=_resolve(base, ssh.known_hosts),
        trust_on_first_use=ssh.trust_on_first_use if trust_on_first_use is None else trust_on_first_use,
        become=ssh.become,
        jump=jump,
        ssh_config=config,
        config_named=ssh.config is not None,
        explicit=ssh.model_fields_set & {"user", "port", "key", "jump"},
        bastions=bastions,
        python=ssh.python,
        connect_timeout=ssh.connect_timeout,
        command_timeout=ssh.command_timeout,
        **kwargs,
    )


def _resolve(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def preview_inventory(loaded: LoadedInventory) -> Inventory:
    """The inventory's listed nodes without transports: what validation and ``--dry-run`` need, touching nothing
    (Ray nodes an inventory would discover are not listed, so they are not here)."""
    nodes = [
        Node(name=spec.name, address=spec.address, transport=spec.transport, labels=dict(spec.labels), gpus=spec.gpus,
             gpu_pci=tuple(spec.gpu_pci), interfaces=dict(spec.interfaces), power=spec.power,
             ssh=loaded.model.ssh_for(spec) if spec.transport == "ssh" else None,
             processes=spec.processes, workdir=spec.workdir)
        for spec in loaded.model.nodes
    ]
    return Inventory(loaded.model.name, nodes, policy=loaded.policy)
