"""An inventory file's nodes with their transports; the format is :mod:`chaoskit.cluster.inventory_spec`.

Each node's ``transport:`` names a class of the transport registry (:mod:`chaoskit.cluster.transports.registry`),
which builds it (``from_inventory``): nothing here knows one transport from another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.ssh_paths import ssh_roots
from chaoskit.cluster.inventory_spec import (
    InventoryFile,
    LoadedInventory,
    NodeSpec,
    load_inventory_file,
    looks_like_inventory,
    validate_inventory_data,
)
from chaoskit.cluster.transports.api import InventorySite
from chaoskit.cluster.transports.registry import takes_ssh, transport_class
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
    """Nodes with their transports, each made by its class (``from_inventory``), not connected yet: each
    connects on first use (:func:`chaoskit.cluster.transports.ssh_many.connect_all` connects them all at once).

    With ``ray:`` the live Ray nodes are discovered too (a GCS query, no driver):
    listed ``transport: ray`` nodes take theirs, and unlisted ones are added."""
    base = loaded.path.resolve().parent
    site = InventorySite(
        base=base, ssh_for=loaded.model.ssh_for, error=loaded.error, bastions=Bastions(),
        ssh_roots=ssh_roots(loaded.policy.ssh_roots if loaded.policy is not None else None, base),
        trust_on_first_use=trust_on_first_use, vet_python=bool(loaded.policy is not None and loaded.policy.python),
    )
    if loaded.model.bastions:  # bastions are SSH hosts: jumps name bastions listed anywhere in the file, so make them all, then link
        ssh_transport = transport_class("ssh")
        for spec in loaded.model.bastions:
            ssh = loaded.model.ssh_for_bastion(spec)
            ssh = ssh.model_copy(update={"jump": None}) if ssh.jump is not None else ssh
            site.bastions.add(spec.name, ssh_transport.from_settings(spec.name, spec.address, ssh, site,
                                                                     role="bastion", use_agent=False))
        for spec in loaded.model.bastions:
            if spec.ssh is not None and spec.ssh.jump not in (None, "none"):
                site.bastions[spec.name].jump = site.bastions[spec.ssh.jump]
    if loaded.model.ray is not None:
        site.discovered = transport_class("ray").discover(loaded.model.ray)
    nodes: list[Node] = []
    for i, spec in enumerate(loaded.model.nodes):
        listed = transport_class(spec.transport).from_inventory(site, i, spec)
        nodes.append(Node(
            name=spec.name, address=spec.address, transport=spec.transport, labels=listed.labels, gpus=spec.gpus,
            gpu_pci=tuple(spec.gpu_pci), conn=listed.conn, interfaces=dict(spec.interfaces), power=spec.power,
            ssh=listed.ssh, processes=spec.processes, workdir=spec.workdir,
        ))
    for name, (labels, conn) in site.discovered.items():  # Ray's nodes the file does not list
        if name not in {n.name for n in nodes}:
            nodes.append(Node(name=name, address="", transport=conn.name, labels=labels, conn=conn))
    return Inventory(loaded.model.name, nodes, shared=[site.bastions], policy=loaded.policy)


def load_inventory(path: str | Path, **kwargs: Any) -> Inventory:
    """:func:`load_inventory_file` then :func:`build_inventory`."""
    return build_inventory(load_inventory_file(path), **kwargs)


def preview_inventory(loaded: LoadedInventory) -> Inventory:
    """The inventory's listed nodes without transports: what validation and ``--dry-run`` need, touching nothing
    (Ray nodes an inventory would discover are not listed, so they are not here)."""
    nodes = [
        Node(name=spec.name, address=spec.address, transport=spec.transport, labels=dict(spec.labels), gpus=spec.gpus,
             gpu_pci=tuple(spec.gpu_pci), interfaces=dict(spec.interfaces), power=spec.power,
             ssh=loaded.model.ssh_for(spec) if takes_ssh(spec.transport) else None,
             processes=spec.processes, workdir=spec.workdir)
        for spec in loaded.model.nodes
    ]
    return Inventory(loaded.model.name, nodes, policy=loaded.policy)
