"""Whom a run's job runs as, and why: the cluster's own account (``job_account``, a lab's) where that account can
run it, an author's batch script's user where the launch says so, else chaoskit's own user (root), with the reason
kept in result.json (``cluster.job_user``, ``job_user_why``) and in the run's notes.

The runner (:mod:`chaoskit.runner`) asks :func:`decide_job_user` once the cluster is open, says
:meth:`JobUser.line` as the job starts, and reads :func:`job_process_users` once it trains (what its processes ran
as, not only what they were told).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.backends.api import ClusterHandle
from chaoskit.core.accounts import nearest_existing, python_paths, unreachable_by
from chaoskit.core.errors import InfraError
from chaoskit.scenario.checks import uses_inproc_channel

__all__ = ["JobUser", "decide_job_user", "job_process_users", "user_name"]


def user_name(uid: int) -> str:
    """``uid``'s login name, or the number where the machine has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class JobUser:
    """``owner``: the user the job runs as when not chaoskit's (an :class:`~chaoskit.core.accounts.Account` or a
    batch script's :class:`~chaoskit.cluster.slurm.SubmitUser`), ``None``: as chaoskit; ``root_why``: why a job on a
    cluster with an account of its own still runs as root (``None``: it does not)."""

    owner: Any = None
    root_why: str | None = None

    def line(self, cluster: ClusterHandle, notes: list[str]) -> str:
        """Whom the job runs as and what keeps its stores from other users, for the run's progress; kept in the
        cluster's details (result.json's ``cluster``) and, where it runs as root for a reason, in ``notes``."""
        user = self.owner.name if self.owner is not None else user_name(os.geteuid())
        details = cluster.details
        details["job_user"] = user
        line = f"the job runs as {user}"
        if self.root_why is not None:
            details["job_user_why"] = self.root_why
            line += f" ({self.root_why})"
            notes.append(f"the job ran as root: {self.root_why}")
        if cluster.job_isolation:
            details["job_isolation"] = cluster.job_isolation
            line += f"; in {cluster.job_isolation}"
        return line


def decide_job_user(cluster: ClusterHandle, sc: Any, owner: Any, base: Path, run_dir: Path) -> JobUser:
    """Whom the job of ``sc`` runs as: ``owner`` where its launch names one (:meth:`Job.runs_as`), else the cluster's
    account (``job_account``) unless the account cannot run the job, else root with the reason. The account needs to
    reach the job's Python and script (``base``: the scenario's folder) and the folder above ``run_dir``, where the
    job's folder goes; the in-process channel is then the job's own folder's (``RUN.job/inproc``), which needs that
    folder on the nodes' own disk. A cluster whose nodes run as the account (``job_account_fixed``) refuses to run
    the job as root instead: :class:`InfraError`, nothing started. Where the job stays root, the cluster's
    ``job_account`` is cleared (nothing is claimed for it)."""
    account = cluster.job_account
    if account is None or owner is not None:
        return JobUser(owner)
    why = None
    if uses_inproc_channel(sc) and cluster.shared_dir is not None:
        why = "the in-process channel's folder is root's own (the job's folder is not on the nodes' disk)"
    else:
        script = sc.workload.command_script(base) if sc.workload.command else None
        needs = [*python_paths(cluster.python), *([script] if script else []), nearest_existing(run_dir.parent)]
        problem = (cluster.account_reaches(account) if cluster.account_reaches is not None  # containers
                   else unreachable_by(account, needs))  # the job's folder goes beside the run folder (missing: made 0755)
        if problem:
            why = f"{account.name} cannot run the job: {problem}"
    if why is None:
        return JobUser(account)
    if cluster.job_account_fixed:  # its nodes write the job's files as the account
        raise InfraError(f"{why}; this {cluster.kind} cluster's nodes run as {account.name} and write the "
                         "job's files (its checkpoints), so the job cannot run as root instead; the job was not started",
                         hint=f"give --out a folder {account.name} can reach (every folder above it open to "
                              "others for search, e.g. mode 0711)")
    cluster.job_account = None
    return JobUser(None, why)


def job_process_users(cluster: ClusterHandle) -> list[str]:
    """Who the job's processes run as, read off its nodes once it trains (as ``ps -o user`` would say), by name;
    a node that cannot be read is left out."""
    uids: set[int] = set()
    for name in cluster.job_nodes:
        try:
            uids.update(p.uid for p in cluster.inventory[name].conn.processes() if p.uid is not None)
        except InfraError:
            continue
    return sorted(user_name(u) for u in uids)
