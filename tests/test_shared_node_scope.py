"""A job's scope, enforced on the node: another user's job that looks like ours is never touched.

On the ``site`` lab (somebody else's cluster: a non-root login with sudo, through a bastion) the
test plays two users. Ours (root) runs a real 2-node torchrun job with ``--rdzv-id users-own-job``
and a planted secret in its workers' environment (``MY_TOKEN=s3cret``). A second, unprivileged
local user (``ckhostile3``, made with ``useradd`` and removed at the end) runs a decoy on n1, in the
same namespace: the same script name on its command line, ``RANK=1``, a run id of its own. chaoskit
must: list no environment key it does not read; never choose the decoy (another uid, one node of
two, no torchrun agent), not even while our workers are being replaced and the decoy is the only
match on the nodes (issue 31: 10 attaches at random points of our job's restarts); stop with exit 3,
saying what it saw, when only the decoy is named; pick ours by ``workload.run_id`` or
``workload.user``; refuse, in the node's agent, to signal the decoy or a pid whose start time
changed; and kill rank 1 of ours only (one injection, the decoy alive afterwards).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.core.errors import InfraError, TargetGone
from tests.conftest import need_torch, run_cli, wait_until, lab_fixture

pytest_plugins = ["tests.netns_fixtures"]

HOSTILE = "ckhostile3"
OUR_RUN_ID = "users-own-job"
THEIR_RUN_ID = "hostile-run"
SECRET = "s3cret"

DECOY = """\
import os, sys, time
print("decoy", os.getpid(), sys.argv[1:], flush=True)
time.sleep(3600)
"""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {(res.stderr or res.stdout).strip()}")
    return res


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def _alive(pid: int, start: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    rest = stat[stat.rfind(b")") + 2:].split()
    return rest[0] != b"Z" and int(rest[19]) == start


class Shared:
    """Our job and the other user's decoy on the same node."""

    def __init__(self, site, job, decoy: subprocess.Popen, uid: int) -> None:
        self.site, self.job, self.decoy, self.hostile_uid = site, job, decoy, uid
        self.decoy_start = _start_time(decoy.pid)

    def decoy_alive(self) -> bool:
        return self.decoy.poll() is None and _alive(self.decoy.pid, self.decoy_start)

    def our_worker(self, node: str, rank: int) -> int:
        """Our job's worker of ``rank`` on ``node``, found by the test's own eyes (not chaoskit's)."""
        for pid in self.site.lab.pids(node):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
            except OSError:
                continue
            if env.get(b"TORCHELASTIC_RUN_ID") == OUR_RUN_ID.encode() and env.get(b"RANK") == str(rank).encode():
                return pid
        raise AssertionError(f"no worker of rank {rank} of our job on {node}")


@lab_fixture(scope="module")
def shared(site, tmp_path_factory):
    need_torch()
    from tests.test_attach import UserJob

    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    from tests.netns_fixtures import require
    import shutil

    for tool in ("useradd", "userdel", "setpriv"):
        require(shutil.which(tool, path=path) is not None, f"{tool} is not installed (apt-get install passwd util-linux)")
    require(os.path.exists("/usr/bin/python3"), "the decoy needs /usr/bin/python3")
    if _sh("id", "-u", HOSTILE, check=False).returncode == 0:  # a crashed session's leftover
        _sh("userdel", "--remove", "--force", HOSTILE, check=False)
    _sh("useradd", "--create-home", "--shell", "/bin/sh", HOSTILE)
    folder = tmp_path_factory.mktemp("shared")
    decoy = job = None
    saved = os.environ.get("MY_TOKEN")
    try:
        uid = pwd.getpwnam(HOSTILE).pw_uid
        script = Path(f"/home/{HOSTILE}/plain_train.py")
        script.write_text(DECOY)
        os.chown(script, uid, pwd.getpwnam(HOSTILE).pw_gid)
        os.environ["MY_TOKEN"] = SECRET  # our workers inherit it: it must never reach the controller
        try:
            job = UserJob(site.lab, folder, max_restarts=40).start()  # the race test restarts it
        finally:
            if saved is None:
                os.environ.pop("MY_TOKEN", None)
            else:
                os.environ["MY_TOKEN"] = saved
        decoy = subprocess.Popen(site.lab.exec_argv("n1", [
            "setpriv", f"--reuid={uid}", f"--regid={pwd.getpwnam(HOSTILE).pw_gid}", "--clear-groups",
            "env", "-i", "PATH=/usr/bin:/bin", "RANK=1", "LOCAL_RANK=0", "WORLD_SIZE=2",
            f"TORCHELASTIC_RUN_ID={THEIR_RUN_ID}", f"MY_TOKEN={SECRET}",
            "/usr/bin/python3", str(script), "--steps", "100000", "--step-time", "0.05",
        ]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        assert wait_until(lambda: job.steps() >= 5, 180, interval=0.5), "our job never trained"
        assert wait_until(lambda: Path(f"/proc/{decoy.pid}/cmdline").read_bytes().count(b"plain_train.py") == 1, 10)
        assert os.stat(f"/proc/{decoy.pid}").st_uid == uid
        yield Shared(site, job, decoy, uid)
    finally:
        if decoy is not None:
            try:
                os.kill(decoy.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            decoy.wait(timeout=10)
        if job is not None:
            job.stop()
        _sh("userdel", "--remove", "--force", HOSTILE, check=False)


def _attach_scenario(shared: Shared, tmp_path: Path, extra_workload: str, faults: str) -> Path:
    from tests.test_attach import scenario

    sc = scenario(tmp_path, shared.site.inventory_path, shared.job, faults)
    text = sc.read_text().replace("process: 'plain_train\\.py'}", f"process: 'plain_train\\.py'{extra_workload}}}")
    assert extra_workload in text or not extra_workload
    sc.write_text(text)
    return sc


def _cluster(site):
    from chaoskit.backends.inventory import InventoryBackend, InventorySpec

    spec = InventorySpec(inventory=str(site.inventory_path))
    return InventoryBackend().open(spec, site.inventory_path.parent)


def test_procs_answers_carry_only_the_env_keys_chaoskit_reads(shared):
    from chaoskit.nodeside import agent
    from chaoskit.cluster.transports.api import PROC_ENV_KEYS, PROC_ENV_PREFIXES

    assert agent.ENV_KEYS == PROC_ENV_KEYS and agent.ENV_PREFIXES == PROC_ENV_PREFIXES
    ours = shared.our_worker("n1", 1)
    with open(f"/proc/{ours}/environ", "rb") as fh:
        assert f"MY_TOKEN={SECRET}".encode() in fh.read()  # planted: what is not shipped below is filtered
    cluster = _cluster(shared.site)
    try:
        conn = cluster.inventory["n1"].conn
        for workers_only in (False, True):
            procs = conn.processes(workers_only, node_wide=True)
            by_pid = {p.pid: p for p in procs}
            assert ours in by_pid and shared.decoy.pid in by_pid  # both are on the node: the env, not the list, is cut
            assert by_pid[ours].env["TORCHELASTIC_RUN_ID"] == OUR_RUN_ID and by_pid[ours].rank == 1
            for p in procs:
                bad = [k for k in p.env if k not in PROC_ENV_KEYS and not k.startswith(PROC_ENV_PREFIXES)]
                assert not bad, (p.pid, p.cmdline, bad)
            assert SECRET not in json.dumps([p.env for p in procs])
            assert by_pid[shared.decoy.pid].uid == shared.hostile_uid and by_pid[ours].uid == 0
    finally:
        cluster.teardown()


def _kill_our_workers(shared: Shared) -> list[int]:
    """Every worker of our job (both ranks), as a crash does: their torchrun agents start new ones."""
    killed = []
    for node, rank in (("n0", 0), ("n1", 1)):
        try:
            pid = shared.our_worker(node, rank)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (AssertionError, ProcessLookupError):
            pass  # already being replaced
    return killed


def test_ten_attaches_during_our_restarts_never_choose_the_other_users_lookalike(shared):
    """Issue 31's race: attach while our workers are being replaced, when the decoy is the only process on the nodes
    that matches. Each attach (no run_id, no user: only ``process``) either chooses our job or nothing; it never
    chooses the decoy, and the rank-1 target it would kill is ours. (Before the fix the first look chose the decoy,
    so any attach right after a kill catches it: five such, each followed by one between restarts; twenty found the
    same in twice the time, issue 52.)"""
    import random

    from chaoskit.cluster.selectors import TargetSpec, resolve_processes
    from chaoskit.scenario.model import Workload
    from chaoskit.workloads.attach import AttachedJob

    rng = random.Random(31)
    cluster = _cluster(shared.site)
    outcomes = []
    try:
        for i in range(10):
            if i % 2 == 0:
                _kill_our_workers(shared)
            time.sleep(rng.uniform(0, 0.6))
            job = AttachedJob(cluster, Workload(launch="attach", process="plain_train\\.py"), Path("."), "t")
            job.start()
            end = time.monotonic() + 2.5
            while job.scope is None and time.monotonic() < end:
                time.sleep(0.5)
                job.scan()
            if job.scope is None:
                outcomes.append("none")  # a run would exit 3 before injecting
                continue
            assert (job.scope.run_id, job.scope.uid) == (OUR_RUN_ID, 0), (i, job.scope)
            targets = resolve_processes(cluster.inventory, TargetSpec(process="plain_train\\.py", ranks=[1]))
            assert shared.decoy.pid not in [t.pid for t in targets], (i, targets)
            outcomes.append("ours")
    finally:
        cluster.teardown()
    assert shared.decoy_alive()
    print("attach outcomes:", outcomes)
    assert outcomes.count("ours") >= 3, outcomes  # between restarts ours is found
    before = shared.job.steps()
    assert wait_until(lambda: shared.job.steps() > before + 3, 120, interval=0.5), "our job did not train on"


def test_only_the_lookalike_named_is_exit_3_saying_what_was_seen(shared, tmp_path):
    sc = _attach_scenario(shared, tmp_path, f", user: {HOSTILE}",
                          "  - {kind: process.kill, target: {process: 'plain_train\\.py', ranks: [1]}, at: {after: 1s}}\n")
    sc.write_text(sc.read_text().replace("timeout: 90s", "timeout: 6s"))
    out = tmp_path / "run"
    res = run_cli("run", sc, "--out", out)
    assert res.code == 3, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert "so none was chosen" in text and f"run id {THEIR_RUN_ID}, uid {shared.hostile_uid} on n1" in text, text
    assert "no worker on n0" in text and "without their torchrun agent" in text, text
    journal = out / "journal.jsonl"
    assert not journal.exists() or '"inject"' not in journal.read_text()
    assert shared.decoy_alive() and shared.job.alive()


def test_run_id_or_user_picks_one_job_and_the_agent_refuses_everything_outside_it(shared):
    from chaoskit.cluster.transports.api import JobScope
    from chaoskit.scenario.model import Workload
    from chaoskit.workloads.attach import AttachedJob

    cluster = _cluster(shared.site)
    try:
        conn = cluster.inventory["n1"].conn
        ours = shared.our_worker("n1", 1)
        for pick, expected in (({"run_id": OUR_RUN_ID}, JobScope(OUR_RUN_ID, 0)), ({"user": "root"}, JobScope(OUR_RUN_ID, 0)),
                               ({}, JobScope(OUR_RUN_ID, 0)), ({"user": HOSTILE}, None)):
            workload = Workload(launch="attach", process="plain_train\\.py", **pick)
            job = AttachedJob(cluster, workload, Path("."), "t")
            assert conn.processes() == []  # nothing of any job is in scope until the job is chosen
            job.start()
            assert job.scope is None  # one look chooses nothing
            wait_until(lambda: job.scan() is not None and job.scope is not None, 3, interval=0.5)
            assert job.scope == expected, (pick, job.scope)
        # the decoy, named, is still never chosen: one node of two, no torchrun agent
        why = job.diagnosis()
        assert "no worker on n0" in why and "without their torchrun agent" in why, why
        job = AttachedJob(cluster, Workload(launch="attach", process="plain_train\\.py", run_id=OUR_RUN_ID), Path("."), "t")
        job.start()
        assert wait_until(lambda: job.scan() is not None and job.scope is not None, 5, interval=0.5)
        assert sorted((w["node"], w["rank"]) for w in job.workers) == [("n0", 0), ("n1", 1)]
        assert [o["run_id"] for o in job.info()["other_jobs"]] == [THEIR_RUN_ID]
        listed = {p.pid for p in conn.processes()}
        assert ours in listed and shared.decoy.pid not in listed
        assert conn.state(shared.decoy.pid) is None and conn.state(ours) in ("S", "R")
        # the agent itself refuses, whatever the controller asks
        with pytest.raises(InfraError, match=f"pid {shared.decoy.pid} is not a process of the drilled job "
                                             f"\\(run id {OUR_RUN_ID}, uid 0\\)"):
            conn.signal(shared.decoy.pid, signal.SIGKILL)
        start = _start_time(ours)
        with pytest.raises(InfraError, match=f"pid {ours} is not the process that was selected: its start time "
                                             f"changed from {start - 1} to {start}"):
            conn.signal(ours, signal.SIGKILL, start - 1)  # the pid as a reused one looks: another start time
        assert conn.state(ours, start - 1) is None
        assert _alive(ours, start) and shared.decoy_alive()
        conn.signal(ours, 0, start)  # the right start time: signal 0 reaches it (and changes nothing)
    finally:
        cluster.teardown()


def test_doctor_counts_what_matches_outside_the_drilled_job(shared, tmp_path):
    from chaoskit.doctor import diagnose

    faults = "  - {kind: process.kill, target: {process: 'plain_train\\.py', ranks: [1]}, at: {after: 1s}}\n"
    both = diagnose(shared.site.inventory_path, _attach_scenario(shared, tmp_path, "", faults))
    assert both.scope["problem"] is None and both.scope["chosen"]["run_id"] == OUR_RUN_ID
    jobs = {j["run_id"]: j for j in both.scope["jobs"]}
    assert set(jobs) == {OUR_RUN_ID, THEIR_RUN_ID} and jobs[OUR_RUN_ID]["not_taken"] == []
    assert any("no worker on n0" in why for why in jobs[THEIR_RUN_ID]["not_taken"]), jobs
    named = diagnose(shared.site.inventory_path, _attach_scenario(shared, tmp_path, f", user: {HOSTILE}", faults))
    assert named.scope["chosen"] is None and "not taken: no worker on n0" in named.scope["problem"] and not named.ok
    picked = diagnose(shared.site.inventory_path, _attach_scenario(shared, tmp_path, f", run_id: {OUR_RUN_ID}", faults))
    assert picked.scope["problem"] is None and picked.scope["chosen"]["run_id"] == OUR_RUN_ID
    counts = {c["what"]: c for c in picked.scope["outside"]}
    assert counts["workload.process"]["outside"] == 1  # the decoy, on n1
    # inside: the two workers and the two torchrun agents (their command lines name the script too)
    assert counts["workload.process"]["inside"] == 4 and counts["faults.0.target.process"]["outside"] == 1


def test_a_hang_on_the_node_is_continued_by_its_lease_with_the_start_time_checked(shared, tmp_path):
    """process.hang of our rank 1 over SSH, scoped to our job; the controller never reverts: the watchdog armed
    on n1 continues it at the fault's end, through the start-time checked SIGCONT. The decoy is never stopped."""
    from chaoskit.cluster.selectors import TargetSpec, resolve_processes
    from chaoskit.cluster.transports.api import JobScope
    from chaoskit.faults.process import CONT_IF_SAME, HangFault, HangSpec
    from chaoskit.safety.journal import read_journal
    from tests.conftest import fault_context, proc_state

    cluster = _cluster(shared.site)
    try:
        cluster.scope_job(JobScope(OUR_RUN_ID, 0))
        ours = shared.our_worker("n1", 1)
        with fault_context(cluster.inventory, tmp_path, ttl=30) as ctx:
            fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(nodes=["n1"], ranks=[1],
                                                                               process="plain_train"), duration=1.5), "f0")
            targets = resolve_processes(cluster.inventory, fault.spec.target)
            assert [(t.node, t.pid) for t in targets] == [("n1", ours)]  # not the decoy, though it has RANK=1 too
            [inj] = fault.inject(ctx, targets)
            [armed] = [e for e in read_journal(tmp_path / "journal.jsonl") if e["action"] == "armed"]
            assert armed["revert"][2:] == ["-c", CONT_IF_SAME, str(ours), str(_start_time(ours))]
            assert wait_until(lambda: proc_state(ours) == "T", 1, interval=0.02)
            assert shared.decoy_alive() and proc_state(shared.decoy.pid) != "T"
            assert wait_until(lambda: proc_state(ours) in ("S", "R"), 15), proc_state(ours)  # the lease's SIGCONT
            assert fault.verify(ctx, inj) is None
    finally:
        cluster.teardown()


def test_kill_rank_1_signals_only_the_drilled_job(shared, tmp_path):
    """The issue's experiment, end to end: only ``process:`` set, chaoskit started right after our workers were all
    killed (their agents are replacing them: for a while the decoy is the only match on the nodes). The drill must
    attach to ours and kill our rank 1, never the decoy. (Before the fix it chose the decoy and SIGKILLed it.)"""
    sc = _attach_scenario(shared, tmp_path, "",
                          "  - {kind: process.kill, target: {process: 'plain_train\\.py', ranks: [1]}, at: {after: 1s}}\n")
    # the baseline has the restart this test causes on purpose: the scenario says it expects it
    text = sc.read_text()
    assert "steady_state: {steps: 3, timeout: 90s}" in text
    sc.write_text(text.replace("steady_state: {steps: 3, timeout: 90s}",
                               "steady_state: {steps: 3, timeout: 90s, restarts_allowed: 1}"))
    out = tmp_path / "run"
    assert _kill_our_workers(shared)
    res = run_cli("run", sc, "--out", out)
    result = json.loads((out / "result.json").read_text())
    assert res.code == 0, res.stdout + res.stderr + json.dumps(result["notes"])
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    injects = [r for r in records if r["action"] == "inject"]
    assert len(injects) == 1 and injects[0]["pid"] != shared.decoy.pid and injects[0]["target"] == "n1/rank1", injects
    assert [f["targets"] for f in result["faults"]] == [["n1/rank1"]]
    assert shared.decoy_alive()
    assert result["attached"]["scope"]["run_id"] == OUR_RUN_ID
    assert [o["run_id"] for o in result["attached"]["other_jobs"]] == [THEIR_RUN_ID]
    # ours restarted its rank 1 and trains on
    before = shared.job.steps()
    assert wait_until(lambda: shared.job.steps() > before + 3, 60, interval=0.5)


# -- without the lab: the revert's and the local transport's start-time check ------------------------


def test_a_late_sigcont_never_reaches_a_process_that_reused_the_pid(tmp_path):
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.faults.process import CONT_IF_SAME

    token = f"scope-test-{os.getpid()}"
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, LocalTransport.SCOPE_ENV: token})
    try:  # Popen may return while the kernel is still setting up the exec (no command line, no environment yet)
        assert wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"), 5)
        start = _start_time(proc.pid)
        node = LocalTransport("n0", token)
        with pytest.raises(InfraError, match="start time changed: the pid was reused"):
            node.signal(proc.pid, signal.SIGSTOP, start + 1)
        node.signal(proc.pid, signal.SIGSTOP, start)
        assert wait_until(lambda: node.state(proc.pid) == "T", 5)
        # the watchdog's revert with another start time (what a reused pid shows) leaves the process stopped
        res = subprocess.run([sys.executable, "-I", "-c", CONT_IF_SAME, str(proc.pid), str(start + 1)], timeout=30)
        assert res.returncode == 0
        time.sleep(0.2)
        assert node.state(proc.pid) == "T"
        subprocess.run([sys.executable, "-I", "-c", CONT_IF_SAME, str(proc.pid), str(start)], timeout=30, check=True)
        assert wait_until(lambda: node.state(proc.pid) in ("S", "R"), 5)
    finally:
        proc.kill()
        proc.wait()
    # the process gone (reaped): not a refusal of a stranger but a target that is no more, which a trigger's
    # window looks for again (TargetGone)
    with pytest.raises(TargetGone, match="exited before it was signalled"):
        node.signal(proc.pid, signal.SIGKILL, start)


def test_the_hang_revert_armed_on_a_node_carries_the_start_time():
    from chaoskit.faults.process import CONT_IF_SAME, HangFault, HangSpec

    fault = HangFault(HangSpec(kind="process.hang", duration=5, target={"ranks": [1]}), "f0")
    argv = fault.revert_argv(4242, 777, "python3")
    assert argv == ["python3", "-I", "-c", CONT_IF_SAME, "4242", "777"]


def test_the_crash_loop_kills_only_the_drilled_jobs_workers(tmp_path):
    """gpu.fail's emulated mechanism, as the node runs it: two workers with the same node mark and RANK=1, of two
    jobs (run ids); the loop scoped to one job kills only that job's, again and again, never the other."""
    from chaoskit.cluster.transports.api import JobScope
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.faults.gpu import CRASHLOOP

    token = f"scope-loop-{os.getpid()}"

    def worker(run_id: str) -> subprocess.Popen:
        env = {**os.environ, LocalTransport.SCOPE_ENV: token, "RANK": "1", "TORCHELASTIC_RUN_ID": run_id}
        return subprocess.Popen(["sleep", "60"], env=env)

    ours, theirs = worker("ours"), worker("theirs")
    again = None
    scope = {"env": token, "netns": False, "job": JobScope("ours", os.getuid()).wire()}
    loop_dir = tmp_path / "loop"
    loop = subprocess.Popen([sys.executable, "-c", CRASHLOOP, str(loop_dir), "30", "0.05", json.dumps(scope),
                             json.dumps({"ranks": [1], "pid": None, "process": None})])
    try:
        assert wait_until(lambda: ours.poll() is not None, 10), "the loop did not kill the drilled job's rank 1"
        again = worker("ours")  # torchrun restarts it in place: it dies again
        assert wait_until(lambda: again.poll() is not None, 10)
        time.sleep(0.3)  # several polls
        assert theirs.poll() is None
        (loop_dir / "stop").touch()
        assert wait_until((loop_dir / "exited").exists, 10)
        assert (loop_dir / "kills").read_text().count("\n") == 2
        shutil.rmtree(loop_dir)  # what the controller's verify does; else the loop removes it after its grace
        loop.wait(timeout=10)
    finally:
        for p in (ours, theirs, again, loop):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_dry_run_counts_what_matches_outside_every_nodes_scope_and_touches_nothing(tmp_path):
    """Process-lab nodes are processes of this machine: a dry run counts the ones a regex matches outside every
    node's scope (a stranger with the script's name on its command line) without signalling any."""
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "kill-uninstrumented.yaml"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "plain_train.py"])
    try:
        assert wait_until(lambda: b"plain_train.py" in Path(f"/proc/{stranger.pid}/cmdline").read_bytes(), 5)
        res = run_cli("run", scenario, "--dry-run", "--json")
        assert res.code == 0, res.stderr
        scope = json.loads(res.stdout)["scope"]
        [counted] = scope["outside"]
        assert counted["what"] == "faults.0.target.process" and counted["outside"] >= 1
        assert "CHAOSKIT_SCOPE" in scope["note"]
        text = run_cli("run", scenario, "--dry-run")
        assert "process(es) on this machine match outside every node's scope (never touched)" in " ".join(text.stdout.split())
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_an_attach_dry_run_says_the_scope_and_where_the_count_is(tmp_path):
    examples = Path(__file__).resolve().parents[1] / "examples" / "own-cluster"
    res = run_cli("run", examples / "kill-rank-attach.yaml", "--dry-run", "--json")
    assert res.code == 0, res.stderr
    note = json.loads(res.stdout)["scope"]["note"]
    assert "only the drilled job's processes are ever acted on" in note
    assert "the run stops before anything is injected" in note and "chaoskit doctor" in note
