"""Slurm on a shared cluster: only our job, and the node as we found it (issue 19, item 4).

Another local user (``ckhostile4``, made with ``useradd`` and removed at the end: munge and slurmd need the
user to exist on the machine) submits jobs to the same Slurm lab, on the same node as ours, whose job name,
``--comment``, ``--chdir`` and ``--output`` hold ``NodeList=...``, ``JobState=...`` and, after a newline, a
whole forged ``JobId=...`` line. chaoskit must read Slurm's own fields, requeue only the drilled job, and
leave a node an administrator drained as it was.

Tests that need root and Slurm's daemons skip outside CI and fail in CI (``require``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from chaoskit.cluster.slurm import NODE_FREE_TEXT, job_ids, node_reason, parse_jobs, parse_show
from tests.conftest import SYSTEM_PYTHON, run_cli, wait_until, lab_fixture
from tests.test_slurm import may_submit, require_slurm

USER = "ckhostile4"
HOSTILE_NAME = "j NodeList=n9 JobState=PENDING UserId=root(0)"
HOSTILE_COMMENT = "x NodeList=n9 JobState=COMPLETED Restarts=7 BatchHost=n9\nJobId=77 JobName=forged JobState=RUNNING NodeList=n2"
HOSTILE_DIR = "d NodeList=n9 JobState=COMPLETED"
ADMIN_REASON = "admin: bad DIMM NodeName=n9 State=IDLE Reason=none"


# -- without a cluster: the parsers, with hostile text --------------------------------------------


def test_a_node_line_whose_reason_and_comment_hold_key_text_keeps_the_node_s_own_fields():
    line = ("NodeName=n2 Arch=x86_64 NodeAddr=10.77.1.3 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC RealMemory=100 "
            "State=IDLE+DRAIN Weight=1 Partitions=chaoskit ExtSensorsTemp=n/s "
            f"Reason={ADMIN_REASON} [root@2026-12-01T08:37:53] Comment=c NodeName=n7 State=IDLE Extra=e State=DOWN")
    f = parse_show(line)
    assert f["NodeName"] == "n2" and f["State"] == "IDLE+DRAIN" and f["NodeAddr"] == "10.77.1.3"
    assert f["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC"
    assert f["Reason"] == f"{ADMIN_REASON} [root@2026-12-01T08:37:53]"
    assert f["Comment"] == "c NodeName=n7 State=IDLE" and f["Extra"] == "e State=DOWN"
    assert node_reason(f) == (ADMIN_REASON, "root")
    # a reason Slurm prints before other fields ends at its [user@time] stamp
    f = parse_show("NodeName=n1 State=DOWN+NOT_RESPONDING Reason=Not responding State=IDLE [slurm@2026-01-01T00:00:00] "
                   "NodeAddr=10.77.1.2")
    assert f["State"] == "DOWN+NOT_RESPONDING" and f["NodeAddr"] == "10.77.1.2"
    assert node_reason(f) == ("Not responding State=IDLE", "slurm")
    assert node_reason({"State": "IDLE"}) == ("", None) and "Reason" in NODE_FREE_TEXT


def test_squeue_lines_are_read_only_in_slurm_s_own_form():
    out = ("1|RUNNING|n0|n0|1|0|1001|chaoskit|1|N/A|None|\n"
           "3|FAILED|n2|n2|0|768|0|chaoskit|3|N/A|NonZeroExitCode|\n"
           "4|CANCELLED||n/a|0|9|0|chaoskit|4|N/A|ReqNodeNotAvail, UnavailableNodes:n1 | held|\n"
           "7|RUNNING|n1|n1|0|0|0|chaoskit|5|2|None|\n"
           # what a job's own text would look like if a field that holds it were ever asked for: not a job
           "JobId=78 NodeList=n1|\n" "nl\n" "77|RUNNING|n2|n2|0|0|0|chaoskit\n" "x|RUNNING|n0|n0|0|0|0|p|1|N/A|None|\n"
           "79|RUNNING|n0 NodeList=n9|n0|0|0|0|p|79|N/A|None|\n")
    jobs = parse_jobs(out)
    assert [j["JobId"] for j in jobs] == ["1", "3", "4", "7"]
    assert jobs[0] == {"JobId": "1", "JobState": "RUNNING", "NodeList": "n0", "BatchHost": "n0", "Restarts": "1",
                       "ExitCode": "0:0", "UserId": "1001", "Partition": "chaoskit", "ArrayJobId": "1",
                       "ArrayTaskId": "N/A", "Reason": "None"}
    assert jobs[1]["ExitCode"] == "3:0" and jobs[2]["ExitCode"] == "0:9"  # wait status -> scontrol's exit:signal
    assert jobs[2]["NodeList"] == jobs[2]["BatchHost"] == "(null)"
    assert job_ids(jobs[0]) == {"1"} and job_ids(jobs[3]) == {"7", "5_2"}  # an array task answers to both
    assert jobs[2]["Reason"] == "ReqNodeNotAvail, UnavailableNodes:n1 | held"  # the last field may hold '|'


def test_slurm_requeue_of_an_attached_job_without_its_slurm_id_is_refused_at_its_line(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("name: site\nssh: {user: root}\nnodes:\n  - {name: n0, address: 10.0.0.10}\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=site\n")
    sc = tmp_path / "s.yaml"
    sc.write_text(f"name: x\ncluster: {{inventory: {inv}, scheduler: slurm, slurm: {{conf: {conf}}}}}\n"
                  "workload:\n  launch: attach\n  process: train\\.py\nfaults:\n"
                  "  - {kind: slurm.requeue, target: {nodes: [n0]}, at: {step: 5}}\n"
                  "probes:\n  log:\n    - {match: 'step (?P<step>\\d+)', event: step}\n")
    res = run_cli("validate", sc)
    assert res.code == 2 and "s.yaml:7" in res.stderr and "set workload.slurm_job" in res.stderr, res.stderr
    sc.write_text(sc.read_text().replace("  process: train\\.py\n", "  process: train\\.py\n  slurm_job: 42\n"))
    assert run_cli("validate", sc).code == 0


# -- a Slurm lab shared with another user ---------------------------------------------------------


@lab_fixture(scope="module")
def shared_lab():
    """A Slurm lab (2 nodes + 1 spare) that another local user can submit to, and that user."""
    require_slurm()
    from chaoskit.lab.slurm import SlurmLab

    subprocess.run(["userdel", "-r", USER], capture_output=True)
    made = subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    root = Path(tempfile.mkdtemp(prefix="ck-shared-slurm-"))
    may_submit(USER)  # the lab's slurm.conf and munge socket: the lab accounts' group's
    lab = None
    try:
        lab = SlurmLab.create(2, 1, {"requeue_hold": 5.0, "sched_interval": 2.0}, directory=root / "slurm")
        yield lab
    finally:
        if lab is not None:
            lab.access().run("scancel", "-u", USER, check=False)
            lab.down()
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["userdel", "-f", "-r", USER], capture_output=True)


def as_other_user(lab, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command as the other user, from their home."""
    pw = pwd.getpwnam(USER)
    env = {"PATH": os.environ["PATH"], "HOME": pw.pw_dir, "USER": USER, "SLURM_CONF": str(lab.conf_path)}
    return subprocess.run(list(argv), capture_output=True, text=True, user=pw.pw_uid, group=pw.pw_gid,
                          extra_groups=[g for g in os.getgrouplist(USER, pw.pw_gid) if g != pw.pw_gid],
                          cwd=pw.pw_dir, env=env, timeout=30)


def hostile_job(lab, node: str) -> str:
    """A job of the other user on ``node``, sharing it, with Key= text (and a forged line) in every field it may write."""
    home = Path(pwd.getpwnam(USER).pw_dir)
    res = as_other_user(lab, "mkdir", "-p", str(home / HOSTILE_DIR))
    assert res.returncode == 0, res.stderr
    res = as_other_user(lab, "sbatch", "--parsable", "--oversubscribe", "--requeue", "-w", node, "--job-name", HOSTILE_NAME,
                        "--comment", HOSTILE_COMMENT, "--chdir", str(home / HOSTILE_DIR),
                        "--output", str(home / "o NodeList=n9 JobState=COMPLETED %j.out"), "--wrap", "sleep 600")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def our_job(lab, folder: Path, node: str, log: Path | None = None) -> str:
    out = log or folder / "ours.out"
    res = lab.access().run("sbatch", "--parsable", "--oversubscribe", "--requeue", "-w", node, "-J", "ours",
                           f"--chdir={folder}", f"--output={out}", "--wrap", "sleep 600")
    return res.stdout.strip().split(";")[0]


def running(lab, job: str) -> bool:
    f = lab.access().job(job)
    return f is not None and f["JobState"] == "RUNNING"


def test_another_user_s_job_fields_cannot_pass_for_slurm_s(shared_lab, tmp_path):
    lab = shared_lab
    access = lab.access()
    theirs = hostile_job(lab, "n0")
    try:
        assert wait_until(lambda: running(lab, theirs), 30), access.job(theirs)
        # what scontrol -o prints for it: the forged fields and a forged line of their own
        shown = access.run("scontrol", "-o", "show", "job", theirs).stdout
        assert "NodeList=n9" in shown and "\nJobId=77 " in shown
        f = access.job(theirs)
        assert f["NodeList"] == "n0" and f["BatchHost"] == "n0" and f["JobState"] == "RUNNING"
        assert f["Restarts"] == "0" and f["UserId"] == str(pwd.getpwnam(USER).pw_uid)
        assert "77" not in {j["JobId"] for j in access.jobs()}
        assert access.job("77") is None
        assert [j["JobId"] for j in access.jobs_on("n0")] == [theirs] and access.jobs_on("n2") == []
        # a field the owner wrote is read whole, on its own
        assert access.job_field(theirs, "Comment") == HOSTILE_COMMENT
        assert access.job_field(theirs, "Name") == HOSTILE_NAME
    finally:
        access.run("scancel", theirs, check=False)


def test_slurm_requeue_requeues_this_drill_s_job_and_no_other(shared_lab, job_user, job_user_folders):
    """Through the CLI, as a site runs it: ``launch: sbatch`` of a user's script on n0, where the other user's job runs
    too; ``slurm.requeue`` on n0 requeues ours only. Then, with the fault alone: a node that runs only the other
    user's job is an error, and nothing is requeued."""
    lab = shared_lab
    access = lab.access()
    theirs = hostile_job(lab, "n0")
    theirs_n1 = hostile_job(lab, "n1")
    base, folder = job_user_folders  # our job's own user's folder: its script, its output
    may_submit(job_user.pw_name)
    log = folder / "train.log"
    (folder / "train.sbatch").write_text(
        f"#!/bin/bash\n#SBATCH -N1 -w n0 --oversubscribe --requeue -o {log} -J ours\nexport RANK=0 LOCAL_RANK=0\n"
        f"exec {SYSTEM_PYTHON} -u -c 'import time\nfor i in range(100000): print(f\"step {{i}}\", flush=True); "
        "time.sleep(0.2)' chaoskit_fake_train\n")
    os.chown(folder / "train.sbatch", job_user.pw_uid, job_user.pw_gid)  # submitted as its owner, never as root
    sc = folder / "s.yaml"
    sc.write_text(f"name: shared-requeue\ncluster: {{inventory: {lab.inventory_path}, scheduler: slurm, "
                  f"slurm: {{conf: {lab.conf_path}}}}}\n"
                  "workload:\n  launch: sbatch\n  script: train.sbatch\n  wait: recovered\n"
                  "faults:\n  - {kind: slurm.requeue, target: {nodes: [n0]}, at: {step: 3}}\n"
                  "probes:\n  log:\n    - {match: 'step (?P<step>\\d+)', event: step}\n"
                  "steady_state: {steps: 2, timeout: 60s}\nsafety: {max_nodes: 1, abort_after: 3m}\n")
    try:
        assert wait_until(lambda: running(lab, theirs) and running(lab, theirs_n1), 30)
        res = run_cli("run", sc, "--out", base / "run", "--json")
        assert res.stdout, res.stderr
        r = res.json
        ours = r["slurm"]["job_id"]
        assert ours and ours not in (theirs, theirs_n1)
        assert r["slurm"]["restarts"] >= 1, r["slurm"]
        assert r["recovery_model"] == "slurm-requeue"  # an sbatch job's stack: Slurm's requeue (issue 50 item 1)
        assert r["slurm"]["user"] == job_user.pw_name and access.job(ours)["UserId"] == str(job_user.pw_uid)
        injected = [e for e in (base / "run" / "journal.jsonl").read_text().splitlines() if '"injected"' in e]
        assert len(injected) == 1 and f"n0/job{ours}" in injected[0], injected
        for job in (theirs, theirs_n1):  # the other user's jobs: never requeued, still running as they were
            f = access.job(job)
            assert f["Restarts"] == "0" and f["JobState"] == "RUNNING", f
        assert access.job(theirs)["NodeList"] == "n0"
        events = (base / "run" / "events.jsonl").read_text()
        assert f'"job": "{theirs}"' not in events  # nor on the timeline

        # the fault alone: n1 runs only the other user's job
        from chaoskit.cluster.inventory import Inventory, Node
        from chaoskit.cluster.selectors import NodeTarget
        from chaoskit.core.errors import InfraError
        from chaoskit.faults.slurm import RequeueFault, RequeueSpec
        from chaoskit.runner import RunContext

        inventory = Inventory("lab", [Node(n, n, "ssh", {}, 0, scheduler=access) for n in ("n0", "n1", "n2")])
        fault = RequeueFault(RequeueSpec(kind="slurm.requeue"), "f0")
        ctx = RunContext(inventory, scheduler_jobs={ours})
        with pytest.raises(InfraError, match=f"node n1 runs none of this drill's Slurm jobs \\({ours}\\); the 1 other "
                                             "job\\(s\\) there are left alone; nothing was requeued"):
            fault.inject(ctx, [NodeTarget(inventory["n1"])])
        with pytest.raises(InfraError, match="none known"):
            fault.inject(RunContext(inventory), [NodeTarget(inventory["n0"])])
        for job in (theirs, theirs_n1):
            f = access.job(job)
            assert f["Restarts"] == "0" and f["JobState"] == "RUNNING", f
    finally:
        access.run("scancel", theirs, theirs_n1, check=False)
        access.run("scancel", "-n", "ours", check=False)


def test_a_user_outside_the_labs_group_is_refused_before_sbatch(shared_lab, job_user, job_user_folders):
    """The lab's slurm.conf is the lab accounts' group's only (issue 48): an author's script whose user is not in it
    is refused with the reason and the fix, and nothing is submitted (not sbatch's own retries and error)."""
    lab = shared_lab
    base, folder = job_user_folders
    subprocess.run(["gpasswd", "--delete", job_user.pw_name, "chaoskit-jobs"], capture_output=True)  # if an earlier test's
    assert "chaoskit-jobs" not in subprocess.run(["id", "-nG", job_user.pw_name], capture_output=True, text=True).stdout
    (folder / "train.sbatch").write_text("#!/bin/bash\n#SBATCH -N1 -J refused\nsleep 60\n")
    os.chown(folder / "train.sbatch", job_user.pw_uid, job_user.pw_gid)
    sc = folder / "s.yaml"
    sc.write_text(f"name: outside\ncluster: {{inventory: {lab.inventory_path}, scheduler: slurm, "
                  f"slurm: {{conf: {lab.conf_path}}}}}\n"
                  "workload:\n  launch: sbatch\n  script: train.sbatch\n"
                  "faults:\n  - {kind: slurm.requeue, target: {nodes: [n0]}, at: {step: 3}}\n"
                  "probes:\n  log:\n    - {match: 'step (?P<step>\\d+)', event: step}\n"
                  "steady_state: {steps: 2, timeout: 30s}\nsafety: {max_nodes: 1, abort_after: 1m}\n")
    before = {j["JobId"] for j in lab.access().jobs()}
    res = run_cli("run", sc, "--out", base / "run", "--json")
    assert res.code == 3, (res.code, res.stderr)
    assert f"{job_user.pw_name} cannot submit to this cluster: /run/chaoskit-slurm (mode 0710, root's) is closed to" \
        in res.stderr, res.stderr
    assert "usermod --append --groups chaoskit-jobs" in res.stderr, res.stderr
    assert {j["JobId"] for j in lab.access().jobs()} == before  # nothing was submitted


def test_a_node_drained_before_the_drill_stays_drained_with_its_reason(shared_lab, tmp_path):
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.selectors import NodeTarget
    from chaoskit.core.errors import InfraError
    from chaoskit.faults.slurm import DrainFault, DrainSpec
    from tests.conftest import fault_context

    lab = shared_lab
    access = lab.access()
    inventory = Inventory("lab", [Node(n, n, "ssh", {}, 0, scheduler=access) for n in ("n0", "n1", "n2")])

    def state(node: str) -> tuple[str, str, str | None]:
        return access.node_state(node)

    access.run("scontrol", "update", "nodename=n2", "state=drain", f"reason={ADMIN_REASON}")
    try:
        before = state("n2")
        assert "DRAIN" in before[0] and before[1] == ADMIN_REASON
        fault = DrainFault(DrainSpec(kind="slurm.drain", duration=60), "f0")
        with fault_context(inventory, tmp_path, ttl=2.0) as ctx:
            with pytest.raises(InfraError, match=f"node n2 is already IDLE\\+DRAIN \\(reason '{ADMIN_REASON}', set by root\\)"):
                fault.preflight(ctx, [NodeTarget(inventory["n2"])])
            with pytest.raises(InfraError, match="already IDLE\\+DRAIN"):  # an administrator's drain between preflight and inject
                fault.inject(ctx, [NodeTarget(inventory["n2"])])
            assert not (tmp_path / "journal.jsonl").exists() or '"armed"' not in (tmp_path / "journal.jsonl").read_text()

            # drained by the drill, then by an administrator too: the revert (and the watchdog's command) leaves it
            [inj] = fault.inject(ctx, [NodeTarget(inventory["n1"])])
            assert inj.detail["before"] == {"state": "IDLE", "reason": None}
            assert "DRAIN" in state("n1")[0] and state("n1")[1] == fault.reason
            access.run("scontrol", "update", "nodename=n1", "state=drain", f"reason={ADMIN_REASON}")
            fault.revert(ctx, inj)
            assert "left drained" in inj.detail["revert"]
            assert fault.verify(ctx, inj) is None  # nothing of the drill's is left
            watchdog = subprocess.run(fault.resume_argv(inventory["n1"]), capture_output=True, text=True, timeout=30)
            assert watchdog.returncode == 0 and "left drained" in watchdog.stdout, watchdog
            ctx.leases.release(inj.fault_id)
        assert "DRAIN" in state("n1")[0] and state("n1")[1] == ADMIN_REASON
        assert state("n2") == before
    finally:
        for node in ("n1", "n2"):
            access.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_the_drill_s_own_drain_is_resumed_and_a_drain_through_the_cli_refuses_a_drained_node(shared_lab, tmp_path):
    """The revert of a drain the drill made resumes the node; ``chaoskit run`` on a node an administrator drained
    is exit 3 with nothing armed, and the node keeps its administrator's reason."""
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.selectors import NodeTarget
    from chaoskit.faults.slurm import DrainFault, DrainSpec
    from tests.conftest import fault_context

    lab = shared_lab
    access = lab.access()
    inventory = Inventory("lab", [Node(n, n, "ssh", {}, 0, scheduler=access) for n in ("n0", "n1", "n2")])
    fault = DrainFault(DrainSpec(kind="slurm.drain", duration=60), "f0")
    with fault_context(inventory, tmp_path, ttl=2.0) as ctx:
        [inj] = fault.inject(ctx, [NodeTarget(inventory["n2"])])
        assert fault.verify(ctx, inj) is not None  # drained
        fault.revert(ctx, inj)
        assert inj.detail["revert"] == "node n2 resumed" and fault.verify(ctx, inj) is None
        ctx.leases.release(inj.fault_id)
    assert "DRAIN" not in access.node_state("n2")[0].split("+")  # (NOT_RESPONDING may come and go on a busy machine)

    access.run("scontrol", "update", "nodename=n2", "state=drain", f"reason={ADMIN_REASON}")
    try:
        sc = tmp_path / "s.yaml"
        sc.write_text(f"name: shared-drain\ncluster: {{inventory: {lab.inventory_path}, scheduler: slurm, "
                      f"slurm: {{conf: {lab.conf_path}}}}}\n"
                      "workload:\n  launch: attach\n  process: chaoskit_fake_train\n"
                      "faults:\n  - {kind: slurm.drain, target: {nodes: [n2]}, duration: 5s}\n"
                      "probes:\n  log:\n    - {match: 'step (?P<step>\\d+)', event: step}\n"
                      f"  log_files:\n    - {{node: n0, path: {tmp_path / 'train.log'}}}\n"
                      "safety: {max_nodes: 1, abort_after: 1m}\n")
        res = run_cli("run", sc, "--out", tmp_path / "run")
        assert res.code == 3, (res.code, res.stderr)
        assert "node n2 is already IDLE+DRAIN" in res.stderr and "nothing was drained" in res.stderr
        journal = tmp_path / "run" / "journal.jsonl"
        assert not journal.exists() or '"armed"' not in journal.read_text()
        state, reason, user = access.node_state("n2")
        # NOT_RESPONDING is slurmctld's view of a slurmd slow to answer its ping on a busy machine: not ours to judge
        assert set(state.split("+")) - {"NOT_RESPONDING"} == {"IDLE", "DRAIN"}, state
        assert (reason, user) == (ADMIN_REASON, "root")
    finally:
        access.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
