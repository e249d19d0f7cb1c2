"""After a crash: find what a dead run left and put the cluster back.

``chaoskit rollback`` reverts every fault a crashed run left armed (through
:mod:`chaoskit.safety.rollback`) and then tears down the lab that run made for
itself, if it made one.
"""

from __future__ import annotations

from typing import Any

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.safety.journal import read_journal
from chaoskit.safety.rollback import CrashedRun

__all__ = ["inventory_for", "teardown_lab"]


def inventory_for(run: CrashedRun) -> Inventory:
    """The inventory to revert a crashed run's faults through."""
    from chaoskit.cluster.transports.local import LocalTransport

    if run.info.get("kind") == "docker-lab" and run.info.get("compose"):
        return _docker_lab(run.info).inventory()
    inventory_file = run.info.get("inventory")
    if inventory_file:
        from chaoskit.cluster.inventory_file import load_inventory

        return load_inventory(inventory_file)
    lab = run.info.get("lab", "")
    names = sorted({e["node"] for e in read_journal(run.journal) if e.get("node")}) if run.journal.exists() else []
    return Inventory(lab, [Node(n, conn=LocalTransport(n, f"{lab}.{n}")) for n in names])


def teardown_lab(run: CrashedRun) -> str | None:
    """Stop the lab a crashed run made for itself; return what was done, or ``None``."""
    info: dict[str, Any] = run.info
    if not info.get("ephemeral"):
        return None
    if info.get("kind") == "netns-lab" and info.get("directory"):
        from chaoskit.lab.netns import NetnsLab

        lab = NetnsLab.load(info["directory"])
        if lab is None:
            return None
        lab.down()
        return f"netns lab {lab.lab_id} removed"
    if info.get("kind") == "docker-lab" and info.get("compose"):
        lab = _docker_lab(info)
        if not lab.containers():
            return None
        removed = lab.down()
        return f"docker lab {lab.project.name} removed: {', '.join(removed['containers']) or 'no containers'}"
    if info.get("kind") == "ray-lab" and info.get("lab"):
        from chaoskit.lab.ray import stop_lab_processes

        n = stop_lab_processes(info["lab"])
        return f"Ray lab {info['lab']}: {n} process(es) stopped" if n else None
    from chaoskit.lab.process import ProcessLab

    n = ProcessLab(info.get("lab", ""), 0).kill_all()
    return f"process lab {info.get('lab')}: {n} process(es) stopped" if n else None


def _docker_lab(info: dict[str, Any]):
    """The docker lab a run used: its compose file under the project name it ran with."""
    import os

    from chaoskit.cluster.transports.docker import docker_client
    from chaoskit.lab.docker import DockerLab, load_compose

    environ = {**os.environ, **({"COMPOSE_PROJECT_NAME": info["project"]} if info.get("project") else {})}
    return DockerLab(load_compose(info["compose"], environ=environ), docker_client())
