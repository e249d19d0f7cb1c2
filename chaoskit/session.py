"""What one run holds while it runs, opened before the job starts and closed after it ends: the cluster's lock, the
run folder and the job's folders, the event bus, the journal, the leases, the marker that lets ``chaoskit rollback``
find a run that died, the job's checkpoint file system, and the context a fault acts through (:class:`RunContext`).

The runner (:mod:`chaoskit.runner`) opens a :class:`Session`, drills, and closes it; it never builds a transport or
writes a record of its own. Once :meth:`Session.open` returns, :meth:`Session.close` must run whatever happens: it
unmounts what the session mounted, closes the leases, the bus and the journal, keeps what the job's folder holds
worth keeping, and lets the cluster go (its lab, its lab account).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from rich.markup import escape

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.errors import InfraError
from chaoskit.core.files import make_run_dir
from chaoskit.core.state import private_dir, state_dir
from chaoskit.faults.api import INPROC_CHANNEL_DIR, Leases
from chaoskit.observe.events import EventBus
from chaoskit.safety.journal import Journal, argv_digest
from chaoskit.safety.lease import LeaseManager, default_lease_root
from chaoskit.safety.lock import ClusterLock
from chaoskit.workloads.api import JobFolders

__all__ = ["RunContext", "Session", "RUN_DIR_MODE", "CHECKPOINT_FS_ID"]

RUN_DIR_MODE = 0o750
"""A run folder is its owner's and group's to read (result.json, events, the journal's copy), nobody else's."""

CHECKPOINT_FS_ID = "ckptfs"
"""The journal's and lease's id for ``workload.checkpoint_fs``: armed like a fault, so ``chaoskit rollback`` unmounts it."""


class RunContext:
    """What a fault may use while it acts (:class:`~chaoskit.faults.api.FaultContext`): the inventory's
    transports, the journal, leases. A dry run's has neither journal nor leases."""

    def __init__(self, inventory: Inventory, journal: Journal | None = None, leases: Leases | None = None,
                 bus: EventBus | None = None, checkpoint_dir: str | None = None,
                 scheduler_jobs: set[str] | None = None) -> None:
        self.inventory, self.journal, self.leases, self.bus = inventory, journal, leases, bus
        self.checkpoint_dir = checkpoint_dir
        self.scheduler_jobs = scheduler_jobs if scheduler_jobs is not None else set()
        self.inproc_folders: dict[str, str] = {}
        """The in-process channel's folder by node where it is not the node's state folder's (a job that runs as an
        account of its own has its own, ``RUN.job/inproc``)."""
        self._controller: dict[str, Transport] = {}

    def transport(self, node: str) -> Transport:
        if node not in self.inventory:
            raise InfraError(f"refusing to touch {node!r}: it is not in the inventory")
        return self.inventory[node].conn

    def controller(self, node: str) -> Transport:
        """This machine, acting for ``node``: where a revert that runs on the controller (power, a docker network,
        a scheduler's resume, the job's checkpoint file system) runs, and its watchdog; refuses a node outside the
        inventory."""
        self.transport(node)
        if node not in self._controller:
            self._controller[node] = LocalTransport(node)
        return self._controller[node]

    def inproc_folder(self, node: str) -> str:
        """The in-process channel's folder on ``node``: the job's own (:attr:`inproc_folders`), else the node's
        state folder's."""
        return self.inproc_folders.get(node) or f"{self.transport(node).state_dir}/{INPROC_CHANNEL_DIR}"

    def arm(self, transport: Transport, fault_id: str, kind: str, revert: list[str], duration: float | None,
            target: str = "", on: str = "node") -> None:
        """Journal the fault, then start its watchdog, before it is injected.

        ``on="controller"``: the revert runs on this machine (power, docker network), and so does the watchdog."""
        self.journal.record("armed", fault_id=fault_id, kind=kind, node=transport.node, target=target, revert=revert,
                            duration_s=duration, on=on, private={"revert_sha256": argv_digest(revert)})
        self.leases.arm(transport, fault_id, revert, duration)


class Session:
    """One run's hold on its cluster: :meth:`open`, then :meth:`close` (always), :meth:`release` (the lock) and,
    once result.json is written, :meth:`end` (nothing is left for rollback).

    ``folders_for(run_dir)``: where the job's files go (:meth:`~chaoskit.workloads.api.Job.folders`), asked once the
    run folder is made (a default name taken gets a suffix); ``say``: the run's progress; ``note``: a line for
    result.json's notes."""

    def __init__(self, cluster: ClusterHandle, run_id: str, run_dir: Path, *, default_dir: bool, lease_ttl: float,
                 folders_for: Callable[[Path], JobFolders], say: Callable[..., None],
                 note: Callable[[str], None]) -> None:
        self.cluster, self.run_id, self.run_dir = cluster, run_id, run_dir
        self._default_dir, self._lease_ttl, self._folders_for = default_dir, lease_ttl, folders_for
        self.say, self.note = say, note
        self._checkpoint_fs: tuple[str, list[str]] | None = None
        self._job_folder_made = False

    def open(self) -> None:
        """Take the cluster's lock, make the run folder, open the bus, the journal and the leases, and leave the
        marker; on failure before the records open, let the cluster go (and the lock)."""
        try:
            self._lock = ClusterLock(state_dir(), self.cluster.id).acquire()
        except BaseException:
            self.cluster.teardown()
            raise
        try:  # made now, O_EXCL-like: a default name taken gets a random suffix; never a folder others can write
            self.run_dir = make_run_dir(self.run_dir, RUN_DIR_MODE, default=self._default_dir).resolve()
        except BaseException:
            self._lock.release()
            self.cluster.teardown()
            raise
        self.folders = self._folders_for(self.run_dir)
        self.bus = EventBus(self.run_dir / "events.jsonl")
        # The journal rollback trusts is in chaoskit's own state; the run folder's is a copy for people.
        self.journal = Journal(private_dir("runs", self.run_id) / "journal.jsonl", copy=self.run_dir / "journal.jsonl")
        self.leases = LeaseManager(default_lease_root(), self.run_id, self._lease_ttl)
        self.ctx = RunContext(self.cluster.inventory, self.journal, self.leases, self.bus, self.folders.checkpoints,
                              scheduler_jobs=self.cluster.scheduler_jobs)  # the same set: the job's id joins it at start
        if self.folders.inproc is not None:  # the account's own, which it reaches (root's state folder it does not)
            self.ctx.inproc_folders = {n: str(self.folders.inproc) for n in self.cluster.agent_nodes}
        self._marker = state_dir() / "runs" / f"{self.run_id}.json"
        self._marker.parent.mkdir(parents=True, exist_ok=True)
        self._marker.write_text(json.dumps({"pid": os.getpid(), "run_dir": str(self.run_dir.resolve()), "lab": self.cluster.id,
                                            "kind": self.cluster.kind, **self.cluster.details}))

    def make_job_folder(self, owner: Any) -> JobFolders:
        """The job's own folder, made once (before the job starts, or before its checkpoint file system is mounted
        in it): for a job of ``owner``, another user, made new and given to them (:meth:`JobFolders.make`)."""
        if not self._job_folder_made:
            self.folders.make(owner)
            self._job_folder_made = True
        return self.folders

    def mount_checkpoint_fs(self, size: int | None, owner: Any, ttl: float) -> None:
        """``workload.checkpoint_fs``: the job's own small file system on its checkpoint folder, its removal
        armed as a lease (on this machine, for the first job node) first; ``ttl``: the lease's."""
        fs = self.cluster.checkpoint_fs
        if size is None or fs is None or self.folders.checkpoints is None:
            return
        folder = Path(self.folders.checkpoints)
        if owner is not None:  # the folder is in the job's own, made for its user first (no process of theirs runs yet)
            self.make_job_folder(owner)
        revert = fs.unmount_argv(folder)
        node = self.cluster.job_nodes[0]
        controller = self.ctx.controller(node)
        self.ctx.arm(controller, CHECKPOINT_FS_ID, "workload.checkpoint_fs", revert, ttl, target=str(folder),
                     on="controller")
        try:
            fs.mount(folder, size, (owner.uid, owner.gid) if owner is not None else None)
        except BaseException:
            controller.run(revert, 30.0)
            self.leases.release(CHECKPOINT_FS_ID)
            raise
        self._checkpoint_fs = (node, revert)
        self.say(f"the job's checkpoint folder is a file system of its own: {escape(str(folder))} ({size} bytes)",
                 "checkpoint_fs")

    def close(self) -> None:
        """After the faults are reverted, the job stopped and the probes stopped: unmount the checkpoint file
        system, close the leases, the bus and the journal, keep the job's SDK events, and let the cluster go."""
        self._unmount_checkpoint_fs()
        self.leases.close()
        self.bus.close()
        self.journal.close()
        if self._job_folder_made:
            self.folders.collect(self.run_dir)
        self.cluster.teardown()

    def release(self) -> None:
        """Let the cluster's lock go (after :meth:`close`)."""
        self._lock.release()

    def end(self) -> None:
        """result.json is written: the marker and the trusted journal go, nothing is left for rollback."""
        self._marker.unlink(missing_ok=True)
        shutil.rmtree(private_dir("runs", self.run_id), ignore_errors=True)

    def _unmount_checkpoint_fs(self) -> None:
        if self._checkpoint_fs is None:
            return
        node, revert = self._checkpoint_fs
        res = self.ctx.controller(node).run(revert, 30.0)
        if res.returncode == 0:
            self.leases.release(CHECKPOINT_FS_ID)
            self.journal.record("reverted", fault_id=CHECKPOINT_FS_ID, kind="workload.checkpoint_fs", node=node,
                                verified=True, problem=None)
        else:  # its watchdog unmounts it once the lease goes stale
            self.leases.abandon(CHECKPOINT_FS_ID)
            self.note(f"unmounting the job's checkpoint file system failed: {res.stderr.strip()}")
        self._checkpoint_fs = None
