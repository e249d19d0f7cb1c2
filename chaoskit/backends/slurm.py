"""``kind: slurm``: a Slurm lab (slurmctld, one slurmd per network-namespace node) where Slurm runs the job.

See :mod:`chaoskit.lab.slurm`. The job goes through ``sbatch`` (the reference job's
generated batch script, or the user's own), Slurm allocates its nodes, and Slurm's
own job and node states join the timeline (:class:`chaoskit.observe.slurm.SlurmProbe`),
so reallocation shows in its scheduler steps. Spares are idle Slurm nodes a requeued
job may land on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from chaoskit.backends.api import ClusterHandle, ClusterSpec, LabStatus, RootLabBackend, teardown_of
from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.slurm import SlurmAccess
from chaoskit.cluster.transports.ssh_many import connect_all
from chaoskit.core.accounts import LAB_ACCOUNT, claim_lab_account
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.models import StrictModel
from chaoskit.lab.netns import NetnsLab
from chaoskit.lab.slurm import DEFAULT_SETTINGS, PUBLIC_ROOT, SlurmLab, require_slurm_tools, slurm_lab_dir
from chaoskit.observe.slurm import SlurmProbe

__all__ = ["SlurmBackend", "SlurmSpec", "SlurmSettings"]


class SlurmSettings(StrictModel):
    """The lab's slurm.conf timings. Short by default, so a drill takes seconds; set them to your cluster's to see
    what they cost (each bounds one step of reallocation in the report)."""

    slurmd_timeout: PositiveDuration = Field(DEFAULT_SETTINGS["slurmd_timeout"], description=(
        "SlurmdTimeout: how long slurmctld waits for a silent slurmd before it marks the node DOWN (Slurm's default 300s)."))
    requeue_hold: PositiveDuration = Field(DEFAULT_SETTINGS["requeue_hold"], description=(
        "AuthInfo=cred_expire: how long a requeued job is held (reason BeginTime) before it may start again "
        "(Slurm's default 120s; at least 5s)."))
    sched_interval: PositiveDuration = Field(DEFAULT_SETTINGS["sched_interval"], description=(
        "SchedulerParameters=sched_interval: the main scheduler's period (Slurm's default 60s; it also runs on events)."))
    message_timeout: PositiveDuration = Field(DEFAULT_SETTINGS["message_timeout"], description="MessageTimeout.")
    kill_wait: PositiveDuration = Field(DEFAULT_SETTINGS["kill_wait"], description=(
        "KillWait: from SIGTERM to SIGKILL of a job's processes when it ends or is requeued."))
    health_check_interval: PositiveDuration | None = Field(None, description=(
        "HealthCheckInterval, with HealthCheckProgram the example examples/slurm/healthcheck.sh: every slurmd "
        "checks its node's kernel log this often and drains the node (and requeues its jobs) when one of its GPUs "
        "has a fatal Xid (48, 64, 74, 79, 95). Unset: no health check, as on a cluster without one."))


class SlurmSpec(ClusterSpec):
    """A Slurm lab on this machine: slurmctld, and one slurmd per node, each node a network namespace."""

    kind: Literal["slurm"] = Field(..., description=(
        "slurm: a Slurm lab (slurmctld and one slurmd per network-namespace node) that runs the job through sbatch "
        "(needs root, slurmctld, slurmd, munge, iproute2, nftables, openssh-server)."))
    spare: int = Field(1, ge=0, le=16, description="Idle Slurm nodes a requeued job can be allocated.")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="slurm.conf timings of the lab.")


class SlurmBackend(RootLabBackend):
    name = "slurm"
    Spec = SlurmSpec
    summary = "a Slurm lab: slurmctld + one slurmd per network namespace; jobs through sbatch (root)"
    launches = ("reference", "uninstrumented", "sbatch")
    Lab = SlurmLab
    title = "Slurm lab"

    def create_lab(self, spec: SlurmSpec, directory: Path | None = None) -> SlurmLab:
        return SlurmLab.create(spec.nodes, spec.spare, _settings(spec), directory=directory)

    def fits(self, lab: SlurmLab, spec: SlurmSpec) -> bool:
        return super().fits(lab, spec) and lab.settings == _settings(spec)

    def up_notes(self, lab: SlurmLab) -> list[str]:
        return [f"slurm.conf: {lab.conf_path} (export SLURM_CONF={lab.conf_path} to use sinfo, squeue, sbatch)",
                *super().up_notes(lab)]

    def preview(self, spec: SlurmSpec, base: Path) -> ClusterHandle:
        lab = SlurmLab("(new slurm lab)", slurm_lab_dir(), spec.nodes, spec.spare, _settings(spec),
                       public=str(PUBLIC_ROOT / "(new slurm lab)"))
        net = NetnsLab("(new slurm lab)", slurm_lab_dir() / "netns", spec.nodes, spec.spare)
        inventory = self.preview_inventory(lab.inventory_document(net), lab.access())
        handle = self._handle(spec, lab, inventory, details={})
        if os.geteuid() == 0:  # what open() does, said without doing it (no account made)
            handle.details["job_user"] = (
                f"{LAB_ACCOUNT} or the first free of {LAB_ACCOUNT}-1... (a lab account of the run's own, which "
                "submits chaoskit's batch script; an author's batch script is submitted as its user; root where the "
                "account cannot run the job: the run says why)")
        return handle

    def open(self, spec: SlurmSpec, base: Path) -> ClusterHandle:
        """The lab ``lab up --kind slurm`` made when it has this shape and these settings, else one made for this run."""
        require_slurm_tools()
        lab, ephemeral = self.open_lab(spec)
        try:  # the generated batch script is submitted as this run's own lab account, where it reaches the lab
            claim = claim_lab_account() if lab.reachable else None
        except BaseException:
            if ephemeral:
                lab.down()
            raise
        inventory = _with_scheduler(load_inventory(lab.inventory_path), lab.access())
        handle = self._handle(spec, lab, inventory, details={
            "inventory": str(lab.inventory_path), "directory": str(lab.directory), "ephemeral": ephemeral,
            **(_root_job_why() if not lab.reachable else {}),
        })
        handle.connect = lambda: connect_all([n.conn for n in inventory.nodes])
        teardown = teardown_of(inventory, lab.down if ephemeral else None, claim)

        handle.teardown = teardown
        handle.job_account = claim.account if claim is not None else None
        return handle

    def _handle(self, spec: SlurmSpec, lab: SlurmLab, inventory: Inventory, details: dict[str, Any]) -> ClusterHandle:
        names = [n.name for n in inventory.nodes]
        access = lab.access()
        settings = {**lab.settings, "conf": str(lab.conf_path)}
        handle = ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=names[: spec.nodes],
            rdzv_host="<first node of the allocation>", scope=lambda node: f"{lab.lab_id}.{node}",
            launch_env=lambda node: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
            details={**details, "slurm": settings},
            scheduler=access,
            scheduler_options={"partition": "chaoskit", "local_addr_interface": "eth0"},
        )
        # the run's own jobs only: another user's job on the lab is not on the timeline
        handle.probes = lambda bus: [SlurmProbe(bus, access, only_jobs=lambda: set(handle.scheduler_jobs))]
        return handle

    # -- labs ------------------------------------------------------------------------------

    def lab_inventory(self) -> Inventory | None:
        lab = self.root_lab()
        return None if lab is None else _with_scheduler(load_inventory(lab.inventory_path), lab.access())

    def lab_status(self) -> list[LabStatus]:
        lab = self.root_lab()
        if lab is None:
            return []
        st = lab.status()
        nodes = [{**n, "detail": f"{'on ' if n['on'] else 'OFF'} mgmt {n['address']}, slurm {n['slurm_state']}"}
                 for n in st["nodes"]]
        ctld = "up" if st["slurmctld"] else "NOT RUNNING"
        return [LabStatus(self.name, lab.lab_id, f"Slurm lab {lab.lab_id}: slurmctld {ctld}, SLURM_CONF={lab.conf_path}",
                          nodes, {"directory": st["directory"], "conf": st["conf"], "inventory": st["inventory"]})]

    # -- after a crash -----------------------------------------------------------------------

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        conf = (details.get("slurm") or {}).get("conf")
        return _with_scheduler(load_inventory(details["inventory"]), SlurmAccess(conf=conf))


def _root_job_why() -> dict[str, str]:
    """As root, on a lab made before its ``slurm.conf`` and munge socket had a folder of the lab accounts' group
    (:attr:`~chaoskit.lab.slurm.SlurmLab.public`): whom its job runs as and why it is root (``cluster.job_user``,
    ``job_user_why``): Slurm runs a job as whoever submits it."""
    if os.geteuid() != 0:
        return {}
    return {"job_user": "root", "job_user_why": "this Slurm lab was made before its slurm.conf and munge's socket had a folder "
                            "a lab account reaches ('chaoskit lab down' and up again): the batch script is submitted as root"}


def _settings(spec: SlurmSpec) -> dict[str, float]:
    return {k: float(v or 0.0) for k, v in spec.slurm.model_dump().items()}


def _with_scheduler(inventory: Inventory, access: SlurmAccess) -> Inventory:
    """Every node of the lab is the Slurm node of its own name, reached through ``access``."""
    for node in inventory.nodes:
        node.scheduler = access
    return inventory
