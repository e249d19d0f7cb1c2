"""Whom a run's job runs as (:mod:`chaoskit.jobuser`): the cluster's account where it can run the job, root with the
reason where it cannot, a refusal where the cluster's nodes run as the account anyway.

The account here is a record with a uid no user of this machine has (nothing is created: the decision reads file
modes only, as it does before a real run); the folders are real, made with the modes a user would have.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.core.accounts import Account
from chaoskit.core.errors import InfraError
from chaoskit.jobuser import JobUser, decide_job_user, user_name
from chaoskit.scenario import load_scenario

pytestmark = pytest.mark.beside

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT = Account(name="drillacct", uid=4_242_421, gid=4_242_421, home="/nonexistent")


def _cluster(kind: str = "process", **fields) -> ClusterHandle:
    return ClusterHandle(id="jobuser", kind=kind, inventory=Inventory("jobuser", [Node("n0", "127.0.0.1")]),
                         job_nodes=["n0"], rdzv_host="127.0.0.1", scope=lambda node: "jobuser", **fields)


@pytest.fixture(scope="module")
def kill_rank():
    return load_scenario(ROOT / "scenarios" / "kill-rank.yaml")


@pytest.fixture
def closed(tmp_path) -> Path:
    """A folder of this user's that nobody else may search: a run folder under it is out of the account's reach."""
    folder = tmp_path / "closed"
    folder.mkdir(mode=0o700)
    return folder


def test_an_account_that_cannot_reach_the_run_folder_leaves_the_job_root_and_says_why(kill_rank, closed):
    cluster = _cluster(job_account=ACCOUNT)  # judged by the folders' modes, as for a lab on this machine's disk
    decided = decide_job_user(cluster, kill_rank.model, None, kill_rank.path.parent, closed / "run")
    assert decided.owner is None
    assert decided.root_why.startswith("drillacct cannot run the job: ")
    named = Path(decided.root_why.removeprefix("drillacct cannot run the job: ").split(" (mode ")[0])
    assert named in (closed, *closed.parents) and decided.root_why.endswith("is closed to drillacct")
    assert cluster.job_account is None, "nothing is claimed for an account the job does not run as"

    notes: list[str] = []
    line = decided.line(cluster, notes)
    me = user_name(os.geteuid())
    assert line == f"the job runs as {me} ({decided.root_why})"
    assert cluster.details["job_user"] == me and cluster.details["job_user_why"] == decided.root_why
    assert notes == [f"the job ran as root: {decided.root_why}"]


def test_a_cluster_whose_nodes_run_as_the_account_refuses_instead_of_running_the_job_as_root(kill_rank, closed):
    cluster = _cluster("ray", job_account=ACCOUNT, job_account_fixed=True)
    with pytest.raises(InfraError) as caught:
        decide_job_user(cluster, kill_rank.model, None, kill_rank.path.parent, closed / "run")
    assert "this ray cluster's nodes run as drillacct" in str(caught.value)
    assert str(caught.value).endswith("the job was not started")
    assert "drillacct can reach" in caught.value.hint


def test_a_container_cluster_answers_for_its_account_and_the_job_runs_as_it(kill_rank, closed):
    """A cluster whose nodes have file systems of their own (docker) says itself whether the account reaches what
    the job needs; this machine's folders are not asked."""
    asked = []
    cluster = _cluster(job_account=ACCOUNT, account_reaches=lambda account: asked.append(account.name))
    decided = decide_job_user(cluster, kill_rank.model, None, kill_rank.path.parent, closed / "run")
    assert asked == ["drillacct"]
    assert decided == JobUser(ACCOUNT, None)
    cluster.job_isolation = "a network namespace of its own"
    assert decided.line(cluster, []) == "the job runs as drillacct; in a network namespace of its own"


def test_a_launch_that_names_its_user_runs_as_it_whatever_the_cluster_has(kill_rank, closed):
    cluster = _cluster(job_account=ACCOUNT, job_account_fixed=True)
    author = Account(name="author1", uid=4_242_422, gid=4_242_422, home="/nonexistent")
    decided = decide_job_user(cluster, kill_rank.model, author, kill_rank.path.parent, closed / "run")
    assert decided == JobUser(author, None)
    assert cluster.job_account is ACCOUNT


def test_the_in_process_channel_on_a_shared_folder_keeps_the_job_root(tmp_path):
    """The in-process channel's folder is the job's own only where that folder is on the nodes' own disk."""
    scenario = tmp_path / "inproc.yaml"
    scenario.write_text((ROOT / "scenarios" / "inproc-nan.yaml").read_text())
    loaded = load_scenario(scenario)
    cluster = _cluster(job_account=ACCOUNT, shared_dir=tmp_path)
    decided = decide_job_user(cluster, loaded.model, None, scenario.parent, tmp_path / "run")
    assert decided.owner is None
    assert decided.root_why == ("the in-process channel's folder is root's own (the job's folder is not on the nodes' "
                                "disk)")
