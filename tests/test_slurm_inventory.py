"""``cluster: {inventory: FILE, scheduler: slurm}``: somebody else's Slurm cluster, driven through its own commands.

A Slurm lab stands in for the site's cluster: chaoskit is pointed at the lab's inventory
and its slurm.conf as it would be at a real site's, never at the lab itself. A job the
"site" queued is attached to by its Slurm job id, a user's batch script is submitted with
``launch: sbatch``, and a drained node is resumed by its lease when chaoskit is SIGKILLed.

Tests that need root and Slurm's daemons skip outside CI and fail in CI (``require``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import SYSTEM_PYTHON, run_cli, wait_until, lab_fixture
from tests.test_slurm import events_of, may_submit, require_slurm

TTL_S = 2.0

INVENTORY = """name: site
ssh: {user: root}
nodes:
  - {name: n0, address: 10.0.0.10}
  - {name: n1, address: 10.0.0.11}
"""

STEP_RULES = """probes:
  log:
    - {match: 'step (?P<step>\\d+)', event: step}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def scenario(folder: Path, inventory: Path, conf: Path | str | None, workload: str, faults: str, extra: str = "") -> Path:
    slurm = f", slurm: {{conf: {conf}}}" if conf is not None else ""
    return write(folder, "s.yaml", f"name: site-drill\ncluster: {{inventory: {inventory}, scheduler: slurm{slurm}}}\n"
                                   f"workload:\n{workload}faults:\n{faults}{extra}")


DRAIN_N0 = "  - {kind: slurm.drain, target: {nodes: [n0]}, duration: 2s, at: {step: 5}}\n"


# -- without a cluster: what validate can tell --------------------------------------------------


def test_an_inventory_with_slurm_validates_and_refuses_what_it_cannot_do(tmp_path):
    inv = write(tmp_path, "inv.yaml", INVENTORY)
    conf = write(tmp_path, "slurm.conf", "ClusterName=site\n")
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    sbatch = "  launch: sbatch\n  user: nobody\n  script: train.sbatch\n"  # a root's script names its user
    ok = run_cli("validate", scenario(tmp_path, inv, conf, sbatch, DRAIN_N0, STEP_RULES))
    assert ok.code == 0, ok.stderr
    # slurm.conf named but missing: the scenario's cluster: line
    res = run_cli("validate", scenario(tmp_path, inv, tmp_path / "nope.conf", sbatch, DRAIN_N0, STEP_RULES))
    assert res.code == 2 and "s.yaml:2" in res.stderr and "no slurm.conf" in res.stderr
    # no scheduler: the Slurm faults, sbatch and slurm_job are refused, each at its line
    plain = write(tmp_path, "p.yaml", f"name: x\ncluster: {{inventory: {inv}}}\nworkload:\n  launch: sbatch\n"
                                      f"  script: train.sbatch\nfaults:\n{DRAIN_N0}")
    res = run_cli("validate", plain)
    assert res.code == 2 and "not managed by Slurm" in res.stderr
    attach = "  launch: attach\n  process: train\\.py\n  slurm_job: 42\n"
    plain.write_text(f"name: x\ncluster: {{inventory: {inv}}}\nworkload:\n{attach}faults:\n"
                     "  - {kind: process.kill, target: {process: 'train', ranks: [0]}, at: {step: 5}}\n" + STEP_RULES)
    res = run_cli("validate", plain)
    assert res.code == 2 and "p.yaml:6" in res.stderr and "workload.slurm_job" in res.stderr and "no Slurm" in res.stderr
    # slurm_job only with attach; slurm: only with scheduler: slurm
    res = run_cli("validate", scenario(tmp_path, inv, conf, "  launch: reference\n  slurm_job: 42\n", DRAIN_N0))
    assert res.code == 2 and "s.yaml:" in res.stderr and "only used with launch: attach" in res.stderr
    plain.write_text(f"name: x\ncluster: {{inventory: {inv}, slurm: {{conf: {conf}}}}}\nworkload:\n{attach}faults:\n{DRAIN_N0}")
    res = run_cli("validate", plain)
    assert res.code == 2 and "only used with scheduler: slurm" in res.stderr
    # with Slurm, slurm_job and attach validate; --dry-run shows scontrol with the site's slurm.conf
    sc = scenario(tmp_path, inv, conf, attach, DRAIN_N0, STEP_RULES)
    assert run_cli("validate", sc).code == 0
    dry = run_cli("run", sc, "--dry-run")
    assert dry.code == 0, dry.stderr
    assert f"SLURM_CONF={conf}" in dry.stdout and "state=drain" in dry.stdout


def test_an_attached_slurm_job_is_looked_for_only_on_its_allocation():
    """Pending: no node is looked at (another job's processes on idle nodes are not its workers); running: its
    nodes are Slurm's; requeued elsewhere: they follow; forgotten by Slurm: the job is over."""
    from types import SimpleNamespace

    from chaoskit.backends.api import ClusterHandle
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.slurm import SlurmAccess
    from chaoskit.workloads.attach import AttachedJob

    class FakeSlurm(SlurmAccess):
        answer: dict | None = None

        def job(self, job_id):
            return type(self).answer

    class FakeConn:
        def __init__(self, name):
            self.name, self.asked = name, 0

        def processes(self, workers_only=False, *, node_wide=False):
            self.asked += 1
            return []

    conns = {n: FakeConn(n) for n in ("n0", "n1", "n2")}
    inventory = Inventory("site", [Node(n, n, "ssh", {}, 0, conn=c) for n, c in conns.items()])
    handle = ClusterHandle(id="site", kind="inventory", inventory=inventory, job_nodes=["n0", "n1", "n2"],
                           rdzv_host="", scope=lambda node: "", scheduler=FakeSlurm())
    job = AttachedJob(handle, SimpleNamespace(process="train", slurm_job="7"), Path("."), "r")
    # Slurm's record names the job's user (squeue's UserId): a process of another uid is never the job's
    FakeSlurm.answer = {"JobId": "7", "UserId": "alice(1001)", "JobState": "PENDING", "Reason": "Resources",
                        "NodeList": "(null)"}
    job.start()
    assert handle.scheduler_jobs == {"7"} and sum(c.asked for c in conns.values()) == 0 and job.running()
    assert "PENDING" in job.diagnosis()
    FakeSlurm.answer = {"JobId": "7", "UserId": "alice(1001)", "JobState": "RUNNING", "NodeList": "n[1-2],gpu9"}
    job.scan()
    assert handle.job_nodes == ["n1", "n2"] and conns["n0"].asked == 0
    FakeSlurm.answer = {"JobId": "7", "UserId": "alice(1001)", "JobState": "RUNNING", "NodeList": "n0"}
    job.scan()
    assert handle.job_nodes == ["n0"] and job.info()["slurm_nodes"] == ["n0"]
    FakeSlurm.answer = None
    job.scan()
    assert not job.running()


def test_a_node_slurm_does_not_know_is_refused_before_anything_is_armed():
    from chaoskit.cluster.inventory import Node
    from chaoskit.cluster.selectors import NodeTarget
    from chaoskit.cluster.slurm import SlurmAccess
    from chaoskit.core.errors import InfraError
    from chaoskit.faults.slurm import DrainFault, DrainSpec, RequeueFault, RequeueSpec

    class FakeSlurm(SlurmAccess):
        def nodes(self):
            return {"gpu01": {"NodeName": "gpu01", "State": "IDLE"}}

    known, unknown = (NodeTarget(Node(n, n, "ssh", {}, 0, scheduler=FakeSlurm())) for n in ("gpu01", "node-a"))
    for fault in (DrainFault(DrainSpec(kind="slurm.drain"), "f0"), RequeueFault(RequeueSpec(kind="slurm.requeue"), "f1")):
        fault.preflight(None, [known])
        with pytest.raises(InfraError, match="Slurm knows no node 'node-a' \\(its nodes: gpu01\\)"):
            fault.preflight(None, [known, unknown])


# -- a Slurm lab as somebody else's cluster -------------------------------------------------------


@lab_fixture(scope="module")
def site_slurm(tmp_path_factory):
    """A 2-node Slurm lab; the tests only use its inventory file and its slurm.conf."""
    require_slurm()
    from chaoskit.lab.slurm import SlurmLab

    root = Path(tempfile.mkdtemp(prefix="ck-site-slurm-"))
    root.chmod(0o711)  # a job's own user reaches its folders; slurm.conf and munge's socket are the group's
    lab = SlurmLab.create(2, 0, {"requeue_hold": 5.0, "sched_interval": 2.0}, directory=root / "slurm")
    try:
        yield lab
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)


def submit(lab, folder: Path, script: str) -> str:
    path = write(folder, f"job{time.monotonic_ns()}.sbatch", script)
    res = lab.access().run("sbatch", "--parsable", "--chdir", str(folder), str(path))
    return res.stdout.strip().split(";")[0]


def fake_train(log: Path, node: str, python: str = sys.executable) -> str:
    """A job on ``node`` whose one process looks like a torchrun worker (RANK in its environment) and logs steps."""
    return (f"#!/bin/bash\n#SBATCH -N1 -w {node} -o {log} -J fake-train\nexport RANK=0 LOCAL_RANK=0\n"
            f"exec {python} -u -c 'import time\nfor i in range(100000): print(f\"step {{i}}\", flush=True); "
            f"time.sleep(0.2)' chaoskit_fake_train\n")


def cancel(lab, *jobs: str) -> None:
    lab.access().run("scancel", *jobs, check=False)


def test_a_running_slurm_job_is_attached_by_its_id_and_its_node_drained_and_resumed(site_slurm, tmp_path, monkeypatch):
    lab = site_slurm
    log = tmp_path / "train.log"
    mine = submit(lab, tmp_path, fake_train(log, "n0"))
    other = submit(lab, tmp_path, "#!/bin/bash\n#SBATCH -N1 -w n1 -J somebody-else\nsleep 600\n")
    try:
        assert wait_until(lambda: log.exists() and "step 3" in log.read_text(), 30), lab.access().job(mine)
        # chaoskit with no slurm: option: SLURM_CONF says which cluster (as on a site's login node)
        sc = scenario(tmp_path, lab.inventory_path, None,
                      f"  launch: attach\n  process: chaoskit_fake_train\n  slurm_job: {mine}\n", DRAIN_N0,
                      STEP_RULES + f"  log_files:\n    - {{node: n0, path: {log}}}\n"
                      "steady_state: {steps: 3, timeout: 60s}\nexpect: {restart: false, window: 2s}\n"
                      "safety: {max_nodes: 1, abort_after: 2m}\n")
        # a drain stops nothing: the job trains on through it (no restart, expect: restart: false), and the run ends
        # 2 s after n0 is resumed; the NOT_RESPONDING slurmctld shows for ~1 s after the resume is no node.down
        # (chaoskit/observe/slurm.py), or the no-restart check would fail on it
        monkeypatch.setenv("SLURM_CONF", str(lab.conf_path))
        res = run_cli("run", sc, "--out", tmp_path / "run", "--json")
        r = res.json
        assert r is not None, res.stderr
        assert r["attached"]["slurm_job"] == mine and r["attached"]["slurm_nodes"] == ["n0"]
        assert [w["rank"] for w in r["attached"]["workers"]] == [0]
        assert r["checks"]["faults_reverted"]["pass"], r["checks"]
        assert r["verdict"] == "pass" and res.code == 0, (r["verdict"], r["notes"])
        assert r["checks"]["no_restart"]["pass"], r["checks"]["no_restart"]  # drained, the job never restarted
        ev = events_of(tmp_path / "run")
        assert any(e["kind"] == "fault.injected" for e in ev)
        assert not [e for e in ev if e["kind"] == "node.down"]  # n0 resumed: its slurmd never stopped answering
        jobs = {e.get("job") for e in ev if e["kind"].startswith("job.")}
        assert jobs == {mine}, jobs  # somebody else's job is not on the timeline
        assert "DRAIN" not in lab.access().nodes()["n0"]["State"]
        assert lab.access().job(mine)["JobState"] == "RUNNING"  # drained, not stopped; and attach never stops it
    finally:
        cancel(lab, mine, other)


def test_a_slurm_job_that_is_not_there_is_exit_3_with_nothing_injected(site_slurm, tmp_path):
    sc = scenario(tmp_path, site_slurm.inventory_path, site_slurm.conf_path,
                  "  launch: attach\n  process: train\n  slurm_job: 987654\n", DRAIN_N0, STEP_RULES)
    res = run_cli("run", sc, "--out", tmp_path / "run")
    assert res.code == 3, res.stderr
    assert "Slurm knows no job 987654" in res.stderr and "nothing was injected" in res.stderr
    journal = tmp_path / "run" / "journal.jsonl"
    assert not journal.exists() or '"injected"' not in journal.read_text()


def test_a_drain_is_resumed_by_its_lease_when_chaoskit_is_sigkilled(site_slurm, job_user, job_user_folders):
    """A user's batch script through ``launch: sbatch`` on the site's Slurm, submitted as the script's owner (a
    user of its own, never root); chaoskit dies (SIGKILL, no revert of its own) while n0 is drained; the watchdog
    armed on the controller resumes n0 once the lease goes stale."""
    lab = site_slurm
    may_submit(job_user.pw_name)  # the lab's slurm.conf and munge socket: the lab accounts' group's (issue 48)
    base, own = job_user_folders
    log = own / "train.log"
    script = write(own, "train.sbatch", fake_train(log, "n0", SYSTEM_PYTHON))
    os.chown(script, job_user.pw_uid, job_user.pw_gid)
    sc = scenario(own, lab.inventory_path, lab.conf_path, "  launch: sbatch\n  script: train.sbatch\n",
                  "  - {kind: slurm.drain, target: {nodes: [n0]}, duration: 5m, at: {step: 3}}\n",
                  STEP_RULES + "steady_state: {steps: 2, timeout: 60s}\n"
                  f"safety: {{max_nodes: 1, abort_after: 10m, lease_ttl: {TTL_S:g}s}}\n")
    out = base / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(sc), "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    journal = out / "journal.jsonl"

    def drained() -> bool:
        return "DRAIN" in lab.access().nodes()["n0"]["State"]

    try:
        injected = wait_until(lambda: journal.exists() and '"injected"' in journal.read_text(), 90, interval=0.2)
        assert injected, proc.stderr.read() if proc.poll() is not None else "no injection within 90s"
        assert drained(), lab.access().nodes()["n0"]
        (job,) = lab.access().run("squeue", "-h", "-n", "fake-train", "-o", "%i").stdout.split()
        assert lab.access().job(job)["UserId"] == str(job_user.pw_uid)  # the script's user's job, not root's
        assert (base / "run.job").stat().st_uid == job_user.pw_uid and (base / "run").stat().st_uid == 0
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.time()
        assert wait_until(lambda: not drained(), TTL_S + 8), lab.access().nodes()["n0"]
        assert time.time() - killed <= TTL_S + 8
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # the job is chaoskit's, but chaoskit died before it could cancel it
        jobs = lab.access().run("squeue", "-h", "-n", "fake-train", "-o", "%i", check=False).stdout.split()
        if jobs:
            cancel(lab, *jobs)
        lab.access().run("scontrol", "update", "nodename=n0", "state=resume", check=False)


def test_audit_of_a_site_inventory_through_its_slurm_conf_names_a_drain_left_with_chaoskits_reason(site_slurm, tmp_path):
    """``chaoskit audit INVENTORY --slurm-conf CONF``: a node left drained with chaoskit's reason is residue (exit 1,
    named); the same node drained by an administrator's reason is theirs, not chaoskit's; resumed, it is gone."""
    import json

    lab = site_slurm
    access = lab.access()

    def drains() -> list[str]:
        res = run_cli("audit", lab.inventory_path, "--slurm-conf", lab.conf_path, "--json")
        assert res.code in (0, 1), res.stderr
        return [f"{x['node']}: {x['what']}" for x in json.loads(res.stdout)["leftovers"] if x["kind"] == "slurm.drain"]

    try:
        access.run("scontrol", "update", "nodename=n0", "state=drain", "reason=chaoskit slurm.drain 0123abcd")
        found = drains()
        assert len(found) == 1 and found[0].startswith("n0: Slurm drain with chaoskit's reason"), found
        res = run_cli("audit", lab.inventory_path, "--slurm-conf", lab.conf_path)
        assert res.code == 1 and "chaoskit slurm.drain 0123abcd" in res.stdout, res.stdout
        access.run("scontrol", "update", "nodename=n0", "state=drain", "reason=disk replaced by ops")
        assert drains() == []
    finally:
        access.run("scontrol", "update", "nodename=n0", "state=resume", check=False)
    assert drains() == []
    res = run_cli("audit", lab.inventory_path, "--slurm-conf", tmp_path / "nope.conf")
    assert res.code == 2 and "--slurm-conf" in res.stderr and "no such file" in res.stderr
