"""How ``launch: attach`` chooses the drilled job (issue 31), on process tables given to it.

The nodes' transports are stood in here (a table of :class:`ProcInfo` per node and ``id -u`` answers), since
what is judged is the choice itself; the same rules against real processes of a second, real user run on
the netns lab in ``tests/test_shared_node_scope.py``. Each case is one the old choice got wrong or one a user
relies on: a job is chosen only from two looks alike, with its torchrun agents, on every node the scenario
names, of a uid chaoskit acts as unless the operator named it; two plausible jobs stop the run."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.transports.api import CommandResult, ProcInfo
from chaoskit.core.errors import InfraError
from chaoskit.workloads import attach
from chaoskit.workloads.attach import AttachedJob

OURS, THEIRS = 0, 1001


class Node_:
    """A node's transport as attach sees it: its process table, and ``id -u``."""

    def __init__(self, name: str, agent_uid: int = OURS) -> None:
        self.name, self.agent_uid, self.table, self.job, self.user = name, agent_uid, [], None, None
        self.asked: list[list[str]] = []

    def processes(self, workers_only=False, *, node_wide=False):
        return [p for p in self.table if node_wide or self.job is None or self.job.select([p])]

    def run(self, argv, timeout):
        self.asked.append(list(argv))
        return CommandResult(tuple(argv), 0, f"{self.agent_uid}\n", "")


def agent(pid: int, uid: int = OURS, start: int = 100) -> ProcInfo:
    return ProcInfo(pid, 1, "/usr/bin/python3 -m torch.distributed.run --nnodes 2 train.py", {}, "S", uid, start)


def worker(pid: int, ppid: int, rank: int, run_id: str | None = "ours", uid: int = OURS, start: int = 200) -> ProcInfo:
    env = {"RANK": str(rank), "LOCAL_RANK": "0"} | ({"TORCHELASTIC_RUN_ID": run_id} if run_id else {})
    return ProcInfo(pid, ppid, "/usr/bin/python3 -u train.py --steps 100", env, "S", uid, start)


def our_job(nodes: dict[str, Node_], restarted: int = 0) -> None:
    for i, node in enumerate(nodes.values()):
        node.table = [p for p in node.table if p.uid != OURS]
        node.table += [agent(10 + i), worker(20 + i + 100 * restarted, 10 + i, i, start=200 + restarted)]


def lookalike(node: Node_, uid: int = THEIRS, run_id: str = "theirs") -> None:
    """Another user's process on one node: the script's name, RANK=1, a run id, no torchrun agent (a shell)."""
    node.table += [ProcInfo(900, 899, "/bin/sh", {}, "S", uid, 5), worker(901, 899, 1, run_id, uid, 6)]


def handle(names=("n0", "n1"), **workload):
    nodes = {n: Node_(n) for n in names}
    inventory = Inventory("site", [Node(n, n, "ssh", {}, 0, conn=c) for n, c in nodes.items()])
    cluster = ClusterHandle(id="site", kind="inventory", inventory=inventory, job_nodes=list(names), rdzv_host="",
                            scope=lambda node: "")
    wl = SimpleNamespace(**{"process": r"train\.py", "slurm_job": None, "run_id": None, "user": None, **workload})
    return nodes, AttachedJob(cluster, wl, Path("."), "r")


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(attach, "CONFIRM_S", 0.05, raising=False)


def looks(job: AttachedJob, n: int = 3) -> None:
    for _ in range(n):
        job.scan()
        time.sleep(0.06)


def test_the_other_users_lookalike_seen_alone_while_ours_restarts_is_never_chosen():
    nodes, job = handle()
    our_job(nodes)
    lookalike(nodes["n1"])
    for node in nodes.values():  # our workers are being replaced: only the agents and the look-alike are there
        node.table = [p for p in node.table if p.rank is None or p.uid != OURS]
    looks(job)
    assert job.scope is None
    why = job.diagnosis()
    assert "uid 1001" in why and "no worker on n0" in why and "without their torchrun agent" in why, why
    our_job(nodes, restarted=1)  # the agents started new workers
    job.scan()
    assert job.scope is None  # seen once: not yet
    looks(job)
    assert (job.scope.run_id, job.scope.uid) == ("ours", OURS)
    assert [o["run_id"] for o in job.others] == ["theirs"]
    assert sorted((w["node"], w["rank"]) for w in job.workers) == [("n0", 0), ("n1", 1)]


def test_a_job_of_another_uid_is_chosen_only_when_named():
    nodes, job = handle()
    for i, node in enumerate(nodes.values()):  # a whole 2-node torchrun job, of another user
        node.table = [agent(10 + i, THEIRS), worker(20 + i, 10 + i, i, "theirs", THEIRS)]
    looks(job)
    assert job.scope is None and "uid 1001 is not one chaoskit acts as on n0, n1" in job.diagnosis()
    nodes, named = handle(run_id="theirs")
    for i, node in enumerate(nodes.values()):
        node.table = [agent(10 + i, THEIRS), worker(20 + i, 10 + i, i, "theirs", THEIRS)]
    looks(named)
    assert named.scope is not None and named.scope.uid == THEIRS


def test_a_one_node_lookalike_with_our_run_id_is_not_taken_for_the_two_node_job():
    nodes, job = handle(run_id="ours")
    nodes["n1"].table = [agent(10, THEIRS), worker(20, 10, 1, "ours", THEIRS)]  # copies our run id, and an agent
    looks(job)
    assert job.scope is None and "no worker on n0 (the job runs on n0, n1)" in job.diagnosis()


def test_a_job_whose_agents_changed_between_looks_is_looked_at_again():
    nodes, job = handle()
    our_job(nodes)
    job.scan()
    for i, node in enumerate(nodes.values()):  # another pair of agents by the second look (a relaunch)
        node.table = [agent(50 + i, start=300), worker(60 + i, 50 + i, i, start=301)]
    time.sleep(0.06)
    job.scan()
    assert job.scope is None
    looks(job)
    assert job.scope is not None and job.scope.run_id == "ours"


def test_two_plausible_jobs_stop_the_run_listing_both():
    nodes, job = handle()
    our_job(nodes)
    for i, node in enumerate(nodes.values()):
        node.table += [agent(30 + i), worker(40 + i, 30 + i, i, "second")]
    with pytest.raises(InfraError, match="matches the workers of 2 jobs on the nodes: run id ours, uid 0 on n0, n1 .*"
                                         "run id second, uid 0 on n0, n1"):
        job.scan()
    assert job.scope is None


def test_workers_no_torchrun_started_are_taken_only_under_a_slurm_job():
    nodes, job = handle()
    for i, node in enumerate(nodes.values()):
        node.table = [worker(20 + i, 1, i, run_id=None)]
    looks(job)
    assert job.scope is None and "no torchrun run id" in job.diagnosis()


def test_the_login_users_uid_counts_as_the_operators():
    nodes, job = handle()
    for node in nodes.values():
        node.user = "alice"
    our_job(nodes)
    looks(job)
    assert job.scope is not None
    assert ["id", "-u", "--", "alice"] in nodes["n0"].asked and ["id", "-u"] in nodes["n0"].asked


def test_the_site_policys_jobs_users_bound_whose_job_is_chosen():
    """A policy with jobs: {users: [alice]}: the operator's own job (uid 0) is not alice's, so it is not chosen, and
    naming it does not help; a Slurm job of another account is refused before anything is injected."""
    from chaoskit.cluster.policy import JobsRule, SitePolicy

    nodes, job = handle(run_id="ours")
    job.cluster.inventory.policy = SitePolicy(jobs=JobsRule(users=["1001"]))
    our_job(nodes)
    looks(job)
    assert job.scope is None and "is not one of the site policy's jobs.users (1001)" in job.diagnosis()
    rule = JobsRule(accounts=["ml"], partitions=["gpu"])
    assert rule.refuses_slurm({"UserId": "bob(1002)", "Account": "ml", "Partition": "gpu"}) is None
    assert "account physics" in rule.refuses_slurm({"UserId": "bob(1002)", "Account": "physics", "Partition": "gpu"})
    assert "user bob(1002)" in JobsRule(users=["alice"]).refuses_slurm({"UserId": "bob(1002)"})
