"""The cluster-backend contract: what a kind of cluster provides, and the handle a run acts through.

A backend is one class with a pydantic ``Spec`` (its ``cluster:`` syntax, with a
``kind`` literal) and the verbs below. It knows its own clusters: how to preview
one without touching anything (validation, ``--dry-run``), open one for a run,
bring a lab up, show it and take it down, and what a crashed run left of it.
Nothing outside the backend asks which kind a cluster is; it asks the backend
or the :class:`ClusterHandle`. Backends are known by name in
:mod:`chaoskit.backends.registry`: a built-in by its class's ``name = "..."`` in its own module, a plugin
through the entry-point group ``chaoskit.clusters``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

from pydantic import Field

from chaoskit.cluster.inventory import InterfaceSpec, Inventory, Node, PowerCommands
from chaoskit.cluster.slurm import SlurmAccess
from chaoskit.cluster.transports.api import JobScope, Transport
from chaoskit.core.accounts import Account, AccountClaim
from chaoskit.core.errors import ScenarioError
from chaoskit.core.models import StrictModel
from chaoskit.core.state import state_dir
from chaoskit.observe.events import EventBus

__all__ = ["ClusterSpec", "ClusterHandle", "ClusterBackend", "RootLabBackend", "LabStatus", "Probe", "Say", "teardown_of"]

Say = Callable[[str], None]
"""Where a backend reports progress of long work (``lab up``): one line at a time."""

LAUNCHES = ("reference", "uninstrumented", "command")
"""Who starts the job on a backend that runs torchrun agents itself (every built-in)."""


class ClusterSpec(StrictModel):
    """Fields every backend's ``cluster:`` shares. Subclasses add a ``kind`` literal and their own."""

    kind: str
    nodes: int = Field(3, ge=1, le=64, description="Nodes the job runs on.")


class Probe(Protocol):
    """A source of events that runs beside the job (a thread): started before it, stopped after it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class CheckpointFs(Protocol):
    """A small file system of the job's own on its checkpoint folder, made and removed on this machine."""

    def unmount_argv(self, folder: Path) -> list[str]:
        """What removes it (idempotent); the runner arms it as a lease before :meth:`mount`."""

    def mount(self, folder: Path, size: int, owner: tuple[int, int] | None = None) -> None:
        """Make a file system of ``size`` bytes on ``folder``, its root given to ``owner`` (uid, gid) when the job
        runs as another user; :class:`~chaoskit.core.errors.InfraError` if it cannot."""


@dataclass
class ClusterHandle:
    """What the runner needs of a cluster; every field is plain data or a plain callable."""

    id: str
    kind: str
    """The backend's name (``process``, ``ray``, ``netns``, ``docker``, ...)."""
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
    """What the run marker keeps for ``chaoskit rollback`` (:meth:`ClusterBackend.rollback_inventory`), and the report shows."""
    python: str | None = None
    """The Python that runs torchrun on the nodes (``None``: this one, ``sys.executable``)."""
    launch_wrap: Callable[[str, list[str], dict[str, str], Path], list[str]] | None = None
    """For nodes that do not inherit the controller's environment: (node, argv, job env, job folder) -> the argv to run here."""
    shared_dir: Path | None = None
    """A folder every node sees at the same path; the job's checkpoints and SDK events go there when set."""
    job_transport: Callable[[str], Transport] | None = None
    """How to reach a node's job processes to stop them (default: local process scopes)."""
    probes: Callable[[EventBus], list[Probe]] = lambda bus: []
    """Event sources of the cluster itself (Ray's node table), started beside the job's."""
    checkpoint_fs: CheckpointFs | None = None
    """How this cluster gives the job a file system of its own for its checkpoints (``workload.checkpoint_fs``);
    ``None``: it cannot."""
    scheduler: SlurmAccess | None = None
    """The batch scheduler jobs go through (Slurm), or ``None``: the runner then submits the job to it
    (``sbatch``) instead of starting torchrun agents itself."""
    scheduler_jobs: set[str] = field(default_factory=set)
    """The scheduler's jobs this run submitted or attached to (a shared cluster's probe follows only these)."""
    author_files: dict[str, Path] = field(default_factory=dict)
    """Files of the scenario's author that the cluster itself runs, by the ``cluster:`` field that names them
    (docker: ``compose``, its services' images and mounts), each where the file the cluster read and uses really is
    (links resolved when it was opened; never read again by name): the site policy's ``script_roots`` bound them."""
    job_account: Account | None = None
    """The unprivileged account the job chaoskit starts runs as on this cluster (a lab's, when chaoskit is root;
    :mod:`chaoskit.core.accounts`); ``None``: as chaoskit itself."""
    account_reaches: Callable[[Account], str | None] | None = None
    """Why ``job_account`` cannot run the job on this cluster's nodes, or ``None``: a cluster whose nodes have file
    systems of their own says so itself (a docker lab: its shared folder, as its containers see it; their Python is
    the image's). ``None`` here: the runner checks this machine's (the job's Python, its script, the run folder's
    parents)."""
    job_account_fixed: bool = False
    """The cluster's own nodes run as ``job_account`` and write the job's files (a Ray lab's nodes: its Ray Train
    controller and workers write its checkpoints): a job whose folders that account cannot reach cannot fall back
    to running as root; the run refuses it before anything starts."""
    job_isolation: str | None = None
    """What keeps the job's own services (its rendezvous store) out of other users' reach, in words, for the plan
    and the report (``None``: nothing beyond the cluster's own network)."""
    scheduler_options: dict[str, str] = field(default_factory=dict)
    """What a generated batch script needs to know of this cluster: ``partition``, ``local_addr_interface``
    (the NIC whose address a torchrun agent advertises)."""

    def scope_job(self, job: JobScope | None) -> None:
        """Scope every node's transport to the drilled job (its agent enforces it from the next request on):
        an attached job's run id and uid, a Slurm job's id. ``None``: each node's whole scope is the job's."""
        for node in self.inventory.nodes:
            if node.conn is not None and hasattr(node.conn, "job"):
                node.conn.job = job

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


@dataclass
class LabStatus:
    """One lab that is up, as ``chaoskit lab status`` shows it."""

    kind: str
    id: str
    summary: str
    """One line: what the lab is."""
    nodes: list[dict[str, Any]]
    """One entry per node: at least ``name`` and ``detail`` (one line), plus what the backend knows."""
    extra: dict[str, Any] = field(default_factory=dict)


class ClusterBackend:
    """One kind of cluster. Subclasses set ``name``, ``Spec`` and ``summary`` and implement the verbs.

    ``base`` is the folder relative paths in a spec are taken from (the scenario's, or the
    current one for ``lab up``).
    """

    name: ClassVar[str]
    Spec: ClassVar[type[ClusterSpec]]
    summary: ClassVar[str]
    """One line for ``chaoskit lab up --help`` and the scenario schema: what a node is, what it needs."""
    launches: ClassVar[tuple[str, ...]] = LAUNCHES
    """The ``workload.launch`` values a run on this backend can start."""
    has_lab: ClassVar[bool] = True
    """Whether ``chaoskit lab up --kind NAME`` can make one on this machine (a real cluster's backend cannot)."""
    builds_images: ClassVar[bool] = False
    """Whether ``lab up --build`` means something here (its lab runs images it builds)."""

    def preview(self, spec: ClusterSpec, base: Path) -> ClusterHandle:
        """The handle a run would use, built without touching anything (validation and ``--dry-run``).

        Its inventory has every node a selector may name; its commands show placeholders
        where only a live cluster knows the value. Raise :class:`ScenarioError` for a spec
        this backend cannot satisfy."""
        raise NotImplementedError

    def open(self, spec: ClusterSpec, base: Path) -> ClusterHandle:
        """Attach to the cluster ``spec`` asks for (a lab that is up), or make one that ``teardown`` removes."""
        raise NotImplementedError

    # -- labs ----------------------------------------------------------------------------

    def lab_up(self, spec: ClusterSpec, base: Path, say: Say, rebuild: bool = False) -> str:
        """Bring up a lab that later runs reuse; return one line saying what is up (or already was)."""
        raise ScenarioError(f"cluster kind {self.name!r} has no lab to bring up")

    def reuse_key(self, spec: ClusterSpec, base: Path) -> str | None:
        """Which lab a run of ``spec`` can use: runs whose keys are equal can share one lab that
        ``lab_up(self.reuse_spec(spec, base), ...)`` made (a game day runs them back to back on it);
        ``None``: this kind has no lab to share. By default the whole spec: ``open`` reuses a lab of that shape only."""
        return json.dumps(spec.model_dump(mode="json"), sort_keys=True) if self.has_lab else None

    def reuse_spec(self, spec: ClusterSpec, base: Path) -> ClusterSpec:
        """The spec ``lab_up`` makes the shared lab of :meth:`reuse_key` from."""
        return spec

    def lab_down(self, compose: Path | None = None) -> list[str]:
        """Take down every lab of this kind that is up; one line per lab. Safe to run twice."""
        return []

    def lab_status(self) -> list[LabStatus]:
        """The labs of this kind that are up."""
        return []

    def lab_inventory(self) -> Inventory | None:
        """The nodes of the lab of this kind that is up (``chaoskit audit`` reads them; nothing is connected yet),
        or ``None`` when none is."""
        return None

    # -- after a crash -------------------------------------------------------------------

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        """The inventory to revert a crashed run's faults through; ``details`` is what the run's handle recorded,
        ``nodes`` the nodes its journal names."""
        raise NotImplementedError

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        """Remove the cluster a crashed run made for itself (``details["ephemeral"]``), or on one that stays up stop
        the job the run started (``details["run_id"]``); say what was done, or ``None``."""
        return None


class RootLabBackend(ClusterBackend):
    """A backend whose lab only root makes, in a folder of its own (``netns``, ``slurm``): the one lab
    ``lab up`` made, which a run of its shape uses and leaves up, or else one made for the run under the state
    folder, removed by its ``teardown`` or, after a crash, by :meth:`crash_teardown`.

    Subclasses set ``Lab``, the lab's class (``Lab.load(directory=None)``: the lab in ``directory``, default the
    persistent one, or ``None``; a lab has ``lab_id``, ``nodes``, ``spare``, ``node_names()``,
    ``inventory_path``, ``down()``), ``title`` (``"netns lab"``), and :meth:`create_lab`."""

    Lab: ClassVar[Any]
    title: ClassVar[str]
    """What the lab is called in the lines the verbs return."""

    def create_lab(self, spec: Any, directory: Path | None = None) -> Any:
        """Make the lab ``spec`` asks for in ``directory`` (default: the persistent lab's)."""
        raise NotImplementedError

    def fits(self, lab: Any, spec: Any) -> bool:
        """Whether a run of ``spec`` can use ``lab``, the one ``lab up`` made."""
        return lab.nodes == spec.nodes and lab.spare == spec.spare

    def up_notes(self, lab: Any) -> list[str]:
        """The lines ``lab up`` prints after the one saying the lab is up: where its files are."""
        return [f"inventory: {lab.inventory_path}"]

    def open_lab(self, spec: Any) -> tuple[Any, bool]:
        """(the lab a run of ``spec`` uses, whether it was made for this run and is removed after it)."""
        lab = self.Lab.load()
        if lab is not None and self.fits(lab, spec):
            return lab, False
        return self.create_lab(spec, state_dir() / "lab" / f"{self.name}-run-{secrets.token_hex(3)}"), True

    def root_lab(self) -> Any:
        """The persistent lab, or ``None``; only root can have made one (and read its state)."""
        return self.Lab.load() if os.geteuid() == 0 else None

    def lab_up(self, spec: Any, base: Path, say: Say, rebuild: bool = False) -> str:
        existing = self.Lab.load()
        if existing is not None:
            return f"{self.title} {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first"
        lab = self.create_lab(spec)
        return "\n".join([f"{self.title} {lab.lab_id} up: {spec.nodes} nodes + {spec.spare} spare "
                          f"({', '.join(lab.node_names())})", *self.up_notes(lab)])

    def lab_down(self, compose: Path | None = None) -> list[str]:
        lab = self.root_lab()
        if lab is None:
            return []
        lab.down()
        return [f"{self.title} {lab.lab_id} down"]

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        if not details.get("ephemeral") or not details.get("directory"):
            return None
        lab = self.Lab.load(details["directory"])
        if lab is None:
            return None
        lab.down()
        return f"{self.title} {lab.lab_id} removed"

    @staticmethod
    def preview_inventory(document: dict[str, Any], scheduler: SlurmAccess | None = None) -> Inventory:
        """The nodes of an inventory document the lab would write (its ``inventory_document()``), built without
        connecting to anything (``preview``); each node's ``scheduler`` is ``scheduler``."""
        nodes = [
            Node(n["name"], n["address"], "ssh", n["labels"], n["gpus"],
                 interfaces={role: InterfaceSpec(**i) for role, i in n["interfaces"].items()},
                 power=PowerCommands(**n["power"]), processes=n["processes"], workdir=n["workdir"],
                 gpu_pci=tuple(n.get("gpu_pci", ())), scheduler=scheduler)
            for n in document["nodes"]
        ]
        return Inventory("check", nodes)


def teardown_of(inventory: Inventory, remove: Callable[[], Any] | None,
                claim: AccountClaim | None = None) -> Callable[[], None]:
    """A handle's ``teardown``: close ``inventory``'s connections, then ``remove`` the cluster, when the run made
    it (``None``: it stays up); the run's lab account ``claim`` is let go last, whatever failed before."""

    def teardown() -> None:
        try:
            inventory.close()
            if remove is not None:
                remove()
        finally:
            if claim is not None:
                claim.release()

    return teardown
