"""``kind: process``: nodes are scopes of local processes on this machine (no root). See :mod:`chaoskit.lab.process`."""

from __future__ import annotations

import os
import signal
import time
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
from chaoskit.cluster.inventory import Inventory
from chaoskit.lab.checkpoint_fs import TmpfsCheckpoints
from chaoskit.cluster.transports.local import LocalTransport, read_proc
from chaoskit.core.accounts import JOB_GROUP, LAB_ACCOUNT, claim_lab_account
from chaoskit.lab.process import JobNetns, ProcessLab, lab_uids

__all__ = ["ProcessBackend", "ProcessSpec"]


class ProcessSpec(ClusterSpec):
    """The built-in process lab: each node a scope of local processes (the default: ``cluster: lab``)."""

    kind: Literal["process"] = Field("process", description=(
        "process: nodes are local process groups (no root); the lab that 'chaoskit lab up' made is reused."))


class ProcessBackend(ClusterBackend):
    name = "process"
    Spec = ProcessSpec
    summary = "local process groups (no root)"

    def preview(self, spec: ProcessSpec, base: Path) -> ClusterHandle:
        inventory = ProcessLab("check", spec.nodes).inventory()
        handle = ClusterHandle(id="(new process lab)", kind=self.name, inventory=inventory, job_nodes=inventory.names(),
                               rdzv_host="127.0.0.1", scope=lambda node: f"<lab>.{node}", checkpoint_fs=TmpfsCheckpoints())
        if os.geteuid() == 0:  # what open() does, said without doing it (no namespace, no account made)
            handle.launch_prefix = lambda node: ["ip", "netns", "exec", "<the run's own namespace>", "setpriv",
                                                 f"--reuid={LAB_ACCOUNT}", f"--regid={LAB_ACCOUNT}",
                                                 f"--groups={JOB_GROUP}", "--no-new-privs", "--"]
            handle.job_isolation = "a private network namespace made for the run: no other user reaches its stores"
            handle.details.update(job_user=f"{LAB_ACCOUNT} or the first free of {LAB_ACCOUNT}-1... (a lab account "
                                           "of the run's own; root where that account cannot run the job: the run "
                                           "says why)", job_isolation=handle.job_isolation)
        return handle

    def open(self, spec: ProcessSpec, base: Path) -> ClusterHandle:
        lab = ProcessLab.load()
        ephemeral = lab is None or lab.nodes != spec.nodes
        if ephemeral:
            lab = ProcessLab.create(spec.nodes)
        inventory = lab.inventory()
        details: dict[str, Any] = {"lab": lab.lab_id, "ephemeral": ephemeral}
        handle = ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=inventory.names(),
            rdzv_host="127.0.0.1", scope=lab.scope, details=details, checkpoint_fs=TmpfsCheckpoints(),
        )
        if os.geteuid() != 0:  # the job is the invoking user's, on the machine's loopback as any job of theirs
            handle.teardown = lab.kill_all if ephemeral else (lambda: None)
            return handle
        # As root: the job's nodes share a network namespace of their own, so its rendezvous store (which
        # unpickles what a client writes) and its workers' stores are out of every other user's reach, and the
        # job runs as the lab's account (the runner keeps root only where the job cannot run as it).
        netns = JobNetns.create()
        details["netns"] = netns.name
        try:  # a lab account of the run's own: another lab's job runs as another, and cannot reach this one's folders
            claim = claim_lab_account()
        except BaseException:
            netns.remove()
            raise
        handle.job_account = claim.account
        for node in inventory.nodes:  # the node's processes: root's, or this run's account's (no other lab's)
            node.conn.uids = frozenset({os.geteuid(), claim.account.uid})
        handle.job_isolation = f"a private network namespace ({netns.name}): no other user reaches its stores"
        handle.launch_prefix = lambda node: netns.prefix(handle.job_account)

        def teardown() -> None:
            try:
                if ephemeral:
                    lab.kill_all()
            finally:
                netns.remove()
                claim.release()

        handle.teardown = teardown
        return handle

    def lab_up(self, spec: ProcessSpec, base: Path, say: Say, rebuild: bool = False) -> str:
        existing = ProcessLab.load()
        if existing is not None:
            return f"lab {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first"
        lab = ProcessLab.create(spec.nodes, persistent=True)
        return f"lab {lab.lab_id} up: {spec.nodes} process nodes ({', '.join(lab.node_names())})"

    def lab_down(self, compose: Path | None = None) -> list[str]:
        lab = ProcessLab.load()
        if lab is None:
            return []
        return [f"lab {lab.lab_id} down: {lab.down()} process(es) stopped"]

    def lab_status(self) -> list[LabStatus]:
        lab = ProcessLab.load()
        if lab is None:
            return []
        return [LabStatus(self.name, lab.lab_id, f"lab {lab.lab_id}: {lab.nodes} process nodes", lab.node_status())]

    def lab_inventory(self) -> Inventory | None:
        lab = ProcessLab.load()
        return None if lab is None else lab.inventory()

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return ProcessLab(details.get("lab", ""), 0).inventory_of(nodes)

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        gone = JobNetns(str(details["netns"])).remove() if details.get("netns") else False
        said = self._crash_stop(details)
        if gone:
            said = (said + "; " if said else "") + f"the job's network namespace {details['netns']} removed"
        return said

    def _crash_stop(self, details: dict[str, Any]) -> str | None:
        lab = ProcessLab(details.get("lab", ""), 0)
        if not details.get("ephemeral"):
            # A lab that stays up ('lab up', a game day's shared one): the job the dead run started (torchrun with
            # its run id as --rdzv-id, its workers with it as TORCHELASTIC_RUN_ID) would run on there for good.
            # Only that job: an attached job, or anything else in the lab, is not the run's to stop.
            n = _stop_run_job(lab, str(details.get("run_id") or "")) if details.get("lab") else 0
            return f"process lab {details.get('lab')}: {n} job process(es) of the dead run stopped" if n else None
        n = lab.kill_all()
        return f"process lab {details.get('lab')}: {n} process(es) stopped" if n else None



def _stop_run_job(lab: ProcessLab, run_id: str, grace: float = 5.0) -> int:
    """SIGCONT, SIGTERM, then SIGKILL after ``grace`` the processes of ``lab`` that are the job run ``run_id`` started;
    return how many there were."""
    if not run_id:
        return 0
    prefix = lab.lab_id + "."

    def job() -> list[int]:
        out = []
        uids = lab_uids()
        for p in read_proc():
            if not p.env.get(LocalTransport.SCOPE_ENV, "").startswith(prefix) or p.state == "Z" or p.uid not in uids:
                continue
            rid = p.env.get("TORCHELASTIC_RUN_ID", "")
            if rid == run_id or rid.startswith(run_id + "-") or f"--rdzv-id {run_id}" in p.cmdline:
                out.append(p.pid)
        return out

    found = job()
    for sig, wait in ((signal.SIGCONT, 0.0), (signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        for pid in job():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.time() + wait
        while time.time() < end and job():
            time.sleep(0.05)
    return len(found)
