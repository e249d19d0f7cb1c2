"""``workload.slurm_job``: the job is whom Slurm says, not whom a process's environment says (issue 48, finding 8).

On a real Slurm lab, the job user (``ckjobuser``, :data:`tests.conftest.JOB_USER`) runs a real job on n0; a second
local user (``ckslurmlook``, made with ``useradd`` and removed at the end) starts, on the same node, a look-alike:
the same command line, ``RANK=0`` and ``SLURM_JOB_ID=<that job>`` in its environment. Anyone can write those
variables; only Slurm's own record (``squeue``'s ``UserId``) says whose the job is. The look-alike must never be
chosen, not even while it is the only match on the node; the job's own process is, once it runs; a job Slurm does
not know stops the run with one line, nothing injected.

Tests that need root and Slurm's daemons skip outside CI and fail in CI (``require``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import SYSTEM_PYTHON, need_root_tool, run_cli, wait_until, lab_fixture
from tests.test_slurm import may_submit, require_slurm

LOOKALIKE_USER = "ckslurmlook"
MARK = "chaoskit_owner_train"
"""On the command line of the job's worker and of the look-alike alike: what ``workload.process`` matches."""
WORKER = "import time; time.sleep(600)"


@lab_fixture(scope="module")
def lab():
    """A one-node Slurm lab (n0) that other local users can submit to, and a second user for the look-alike."""
    require_slurm()
    need_root_tool("setpriv")
    from chaoskit.lab.slurm import SlurmLab

    subprocess.run(["userdel", "--remove", "--force", LOOKALIKE_USER], capture_output=True)
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", LOOKALIKE_USER], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    root = Path(tempfile.mkdtemp(prefix="ck-slurm-owner-"))
    may_submit(LOOKALIKE_USER)  # the lab's slurm.conf and munge socket: the lab accounts' group's
    made_lab = None
    try:
        made_lab = SlurmLab.create(1, 0, directory=root / "slurm")
        yield made_lab
    finally:
        if made_lab is not None:
            made_lab.down()
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["userdel", "--remove", "--force", LOOKALIKE_USER], capture_output=True)


def _on_n0_as(user: pwd.struct_passwd, lab, *argv: str) -> list[str]:
    """``argv`` as ``user``, logged in on n0 (inside its namespace: the lab's guard keeps this machine's other users
    off the lab's networks), with only their own environment."""
    return lab.net.exec_argv("n0", [
        "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
        "env", "-i", "PATH=/usr/bin:/bin", f"HOME={user.pw_dir}", f"USER={user.pw_name}",
        f"SLURM_CONF={lab.conf_path}", *argv])


def _env_of(pid: int) -> dict[bytes, bytes]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)


def _cluster(lab):
    from chaoskit.backends.inventory import InventoryBackend, InventorySpec

    spec = InventorySpec(inventory=str(lab.inventory_path), scheduler="slurm", slurm={"conf": str(lab.conf_path)})
    handle = InventoryBackend().open(spec, lab.inventory_path.parent)
    handle.connect()
    return handle


def test_a_lookalike_with_the_jobs_slurm_job_id_is_never_chosen_and_the_jobs_own_process_is(lab, job_user, tmp_path):
    from chaoskit.workloads.attach import AttachedJob

    access = lab.access()
    go = Path(job_user.pw_dir) / "go"
    go.unlink(missing_ok=True)
    may_submit(job_user.pw_name)
    # the job user's job: it waits for the test's word, then runs its worker (RANK set; SLURM_JOB_ID set by Slurm)
    res = subprocess.run(_on_n0_as(job_user, lab, "sbatch", "--parsable", "-N1", "-w", "n0", "--oversubscribe",
                                   "-J", "owned", "-o", "/dev/null", "--wrap",
                                   f"while [ ! -e {go} ]; do sleep 0.1; done; export RANK=0 LOCAL_RANK=0; "
                                   f"exec {SYSTEM_PYTHON} -c '{WORKER}' {MARK}"),
                         capture_output=True, text=True, cwd=job_user.pw_dir, timeout=30)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    look = pwd.getpwnam(LOOKALIKE_USER)
    lookalike = cluster = None
    try:
        assert wait_until(lambda: (access.job(job_id) or {}).get("JobState") == "RUNNING", 30), access.job(job_id)
        assert access.job(job_id)["UserId"] == str(job_user.pw_uid)  # Slurm's own word on whose it is
        # the second user's look-alike on the job's node: its command line, RANK and the job's SLURM_JOB_ID
        lookalike = subprocess.Popen(_on_n0_as(look, lab, "RANK=0", "LOCAL_RANK=0", f"SLURM_JOB_ID={job_id}",
                                               SYSTEM_PYTHON, "-c", WORKER, MARK),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        assert wait_until(lambda: os.path.exists(f"/proc/{lookalike.pid}")
                          and _env_of(lookalike.pid).get(b"SLURM_JOB_ID") == job_id.encode(), 10)
        assert os.stat(f"/proc/{lookalike.pid}").st_uid == look.pw_uid

        cluster = _cluster(lab)
        workload = SimpleNamespace(process=MARK, slurm_job=job_id, run_id=None, user=None)
        job = AttachedJob(cluster, workload, tmp_path, "r")
        job.start()
        # the look-alike alone matches on the job's node, look after look, well past CONFIRM_S: never chosen
        for _ in range(6):
            job.scan()
            time.sleep(0.5)
        assert job.scope is None, job.scope
        why = job.diagnosis()
        assert f"uid {look.pw_uid} is not Slurm job {job_id}'s user (uid {job_user.pw_uid}, per Slurm)" in why, why
        assert job.workers == []
        # chaoskit doctor --scenario judges it the same way: the look-alike is not the job's, and says why
        from chaoskit.doctor import job_scope

        seen = job_scope(SimpleNamespace(workload=workload, cluster=SimpleNamespace(), faults=[]), cluster.inventory,
                         [cluster.inventory["n0"]])
        assert seen["chosen"] is None, seen
        assert any(f"uid {look.pw_uid} is not Slurm job {job_id}'s user (uid {job_user.pw_uid}, per Slurm)" in w
                   for j in seen["jobs"] for w in j["not_taken"]), seen

        go.touch()  # the job's own worker starts
        assert wait_until(lambda: job.scan() and job.scope is not None, 30, interval=0.3), job.diagnosis()
        assert (job.scope.uid, job.scope.slurm_job) == (job_user.pw_uid, job_id)
        [worker] = job.workers
        assert worker["node"] == "n0" and worker["pid"] != lookalike.pid
        assert os.stat(f"/proc/{worker['pid']}").st_uid == job_user.pw_uid
        assert _env_of(worker["pid"]).get(b"SLURM_JOB_ID") == job_id.encode()
        assert [(o["uid"], o["slurm_job"]) for o in job.others] == [(look.pw_uid, job_id)]
        # the node's agent, scoped to the job, lists the job's process and not the look-alike
        listed = {p.pid for p in cluster.inventory["n0"].conn.processes()}
        assert worker["pid"] in listed and lookalike.pid not in listed
        assert lookalike.poll() is None
    finally:
        if cluster is not None:
            cluster.teardown()
        if lookalike is not None:
            os.killpg(lookalike.pid, signal.SIGKILL)
            lookalike.wait(timeout=10)
        access.run("scancel", job_id, check=False)
        go.unlink(missing_ok=True)

    # a job Slurm does not know: one line, exit 3, nothing injected
    sc = tmp_path / "s.yaml"
    sc.write_text(f"name: unknown-job\ncluster: {{inventory: {lab.inventory_path}, scheduler: slurm, "
                  f"slurm: {{conf: {lab.conf_path}}}}}\n"
                  f"workload:\n  launch: attach\n  process: {MARK}\n  slurm_job: 987654\n"
                  "faults:\n  - {kind: process.kill, target: {ranks: [0]}, at: {after: 1s}}\n"
                  "probes:\n  log:\n    - {match: 'step (?P<step>\\d+)', event: step}\n"
                  f"  log_files:\n    - {{node: n0, path: {tmp_path / 'train.log'}}}\n"
                  "safety: {max_nodes: 1, abort_after: 1m}\n")
    res = run_cli("run", sc, "--out", tmp_path / "run")
    assert res.code == 3, (res.code, res.stdout, res.stderr)
    assert "workload.slurm_job: Slurm knows no job 987654; nothing was injected" in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.startswith("error")]) == 1, res.stderr
    journal = tmp_path / "run" / "journal.jsonl"
    assert not journal.exists() or '"inject' not in journal.read_text()
