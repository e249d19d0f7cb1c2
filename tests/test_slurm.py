"""Slurm: a real slurmctld and one real slurmd per network-namespace node; jobs through sbatch; Slurm's
states on the timeline; scheduler faults; the three Slurm drills.

Tests that need root and Slurm's daemons skip outside CI and fail in CI (``require``).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import shutil
import subprocess
from pathlib import Path

import pytest

from chaoskit.cluster.slurm import SlurmAccess, node_list, parse_show
from chaoskit.core.accounts import JOB_GROUP, claim_lab_account, job_group, setpriv_argv
from chaoskit.measure import measure_fault, reallocation_steps
from chaoskit.observe.events import make_event
from tests.conftest import ROOT, SCENARIOS, need_torch, run_cli, short_form, wait_until
from tests.netns_fixtures import netns_problem, require

SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "nsenter", "scontrol", "sbatch", "srun")


def require_slurm() -> None:
    problem = netns_problem()
    if problem is None:
        path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
        missing = [t for t in SLURM_TOOLS if shutil.which(t, path=path) is None]
        if missing:
            problem = f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    require(problem is None, problem or "")


def may_submit(user: str) -> int:
    """Let ``user`` submit to the Slurm labs (which only root and the lab accounts' group reach: issue 48): put them
    in that group, as an operator would (``usermod --append --groups chaoskit-jobs USER``); its gid."""
    gid = job_group()
    res = subprocess.run(["usermod", "--append", "--groups", JOB_GROUP, user], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return gid


def leftovers(lab_id: str, directory: Path) -> list[str]:
    """What the lab could leave: its namespaces, a daemon naming its folder, the folder."""
    found = [f"netns: {line}" for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
             if line.startswith(f"{lab_id}-")]
    procs = subprocess.run(["pgrep", "-af", str(directory)], capture_output=True, text=True).stdout
    found += [f"process: {line}" for line in procs.splitlines()]
    for pid in subprocess.run(["pgrep", "-x", "slurmd|slurmctld|munged"], capture_output=True, text=True).stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline:
            found.append(f"daemon {pid}: {cmdline!r}")
    if directory.exists():
        found.append(f"directory: {directory}")
    public = Path("/run/chaoskit-slurm") / lab_id
    if public.exists():
        found.append(f"directory: {public}")
    return found


# -- without a lab: parsing, measuring, bad input -------------------------------------------------


def test_scontrol_lines_and_node_lists_parse():
    f = parse_show("NodeName=n1 Arch=x86_64 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-01T00:00:00] "
                   "NodeAddr=10.77.1.2")
    assert f["State"] == "DOWN+NOT_RESPONDING" and f["Reason"].startswith("Not responding [") and f["NodeAddr"] == "10.77.1.2"
    assert node_list("n[0-1],n3") == ["n0", "n1", "n3"]
    assert node_list("gpu[08-10]") == ["gpu08", "gpu09", "gpu10"]
    assert node_list("(null)") == []


def test_reallocation_is_split_into_slurm_steps_each_with_its_bound():
    t = 1000.0
    ev = [make_event("step", t - 1, step=40),
          make_event("node.down", t + 8, node="n1", state="NOT_RESPONDING", who="slurmctld", why="slurmd not responding"),
          make_event("node.down", t + 14, node="n1", state="DOWN"),
          make_event("job.requeued", t + 14.2, job="7", restart_count=1),
          make_event("job.pending", t + 14.4, job="7", reason="BeginTime"),
          make_event("job.pending", t + 19.5, job="7", reason="None"),
          make_event("job.allocated", t + 20.0, job="7", nodes=["n0", "n2"]),
          make_event("job.running", t + 20.0, job="7"),
          make_event("worker.start", t + 25.0, rank=0), make_event("worker.start", t + 25.5, rank=1),
          make_event("ckpt.load.end", t + 27.0, rank=0, step=40), make_event("ckpt.load.end", t + 27.1, rank=1, step=40),
          make_event("step", t + 28.0, step=41)]
    m = measure_fault(ev, t)
    assert m["detection_s"] == 8.0 and "slurmctld" in m["detected_by"]
    steps = reallocation_steps(ev, m["t_detect"], m["t_realloc"], {"slurmd_timeout": 6.0, "requeue_hold": 5.0, "sched_interval": 2.0})
    assert [s["step"] for s in steps] == [
        "detected -> node DOWN", "node DOWN -> job requeued", "job requeued -> held (BeginTime)",
        "held (BeginTime) -> eligible again", "eligible again -> allocated n0,n2", "allocated n0,n2 -> workers started"]
    assert "SlurmdTimeout=6s" in steps[0]["bound_by"]
    assert "KillWait" in steps[2]["bound_by"]
    assert "cred_expire=5s" in steps[3]["bound_by"] and steps[3]["seconds"] == pytest.approx(5.1)
    assert "sched_interval=2s" in steps[4]["bound_by"]
    assert sum(s["seconds"] for s in steps) == pytest.approx(m["reallocation_s"])
    # torchrun restarting in place: no scheduler event, no steps
    assert reallocation_steps([e for e in ev if not e["kind"].startswith(("job.", "node."))], t + 1, t + 25.5) == []


def test_a_health_checks_drain_is_the_detection_of_an_injected_xid_and_bounds_the_requeue():
    """An injected Xid line is the fault, never its detection; the health check's drain is, and the requeue
    after it is named after the health check. Without the drain the reason says nothing drained the node."""
    t = 1000.0
    xid = make_event("gpu.xid", t + 0.01, node="n1", code=79, pci="c4a0:01:00", injected=True, source="kmsg")
    ev = [make_event("step", t - 1, step=40), xid,
          make_event("node.drain", t + 4.2, node="n1", reason="healthcheck: Xid 79 on PCI:c4a0:01:00: GPU has fallen "
                     "off the bus.", why="node drained (healthcheck: Xid 79 on PCI:c4a0:01:00)", who="slurmctld", injected=False),
          make_event("job.requeued", t + 4.4, job="7", restart_count=1),
          make_event("job.pending", t + 4.6, job="7", reason="BeginTime"),
          make_event("job.pending", t + 9.7, job="7", reason="None"),
          make_event("job.allocated", t + 10.0, job="7", nodes=["n0", "n2"]),
          make_event("worker.start", t + 14.0, rank=0), make_event("worker.start", t + 14.5, rank=1),
          make_event("ckpt.load.end", t + 16.0, rank=0, step=40), make_event("ckpt.load.end", t + 16.1, rank=1, step=40),
          make_event("step", t + 17.0, step=41)]
    m = measure_fault(ev, t)
    assert m["detection_s"] == 4.2 and "Xid 79" in m["detected_by"]
    steps = reallocation_steps(ev, m["t_detect"], m["t_realloc"], {"health_check_interval": 5.0, "requeue_hold": 5.0})
    assert steps[0]["step"] == "detected -> job requeued" and "HealthCheckInterval=5s" in steps[0]["bound_by"]
    alone = measure_fault([ev[0], xid, make_event("step", t + 5, step=45)], t)
    assert alone["detection_s"] is None
    assert "injected Xid 79 line was seen in the kernel log of n1, but nothing drained the node" in alone["reasons"]["detection"]
    # the kernel stamps the line while chaoskit's write is in flight: a hair before the fault's own time
    early = measure_fault([ev[0], {**xid, "ts": t - 0.0002}, make_event("step", t + 5, step=45)], t)
    assert "injected Xid 79 line was seen in the kernel log of n1" in early["reasons"]["detection"]
    old_line = measure_fault([ev[0], {**xid, "ts": t - 30}, make_event("step", t + 5, step=45)], t)
    assert "no worker.exit" in old_line["reasons"]["detection"]  # a line from long before is not this fault's


def test_the_slurm_probe_reports_a_drain_with_its_reason_and_marks_chaoskits_own():
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.slurm import SlurmProbe

    probe = SlurmProbe(EventBus(), SlurmAccess())
    probe._nodes({"n1": {"State": "IDLE"}, "n2": {"State": "IDLE"}}, 1.0)
    out = probe._nodes({"n1": {"State": "ALLOCATED+DRAIN", "Reason": "healthcheck: Xid 79 on PCI:0000:3b:00"},
                        "n2": {"State": "IDLE+DRAIN", "Reason": "chaoskit slurm.drain 0a1b2c3d"}}, 2.0)
    assert [(e["kind"], e["node"], e["injected"]) for e in out] == [("node.drain", "n1", False), ("node.drain", "n2", True)]
    assert out[0]["reason"] == "healthcheck: Xid 79 on PCI:0000:3b:00" and "Xid 79" in out[0]["why"]
    assert probe._nodes({"n1": {"State": "ALLOCATED+DRAIN"}, "n2": {"State": "IDLE+DRAIN"}}, 3.0) == []


def recorded_node_states(name: str) -> list[dict[str, str]]:
    """The ``scontrol -o show node`` lines of a recording in tests/data/slurm-resume (made on the Slurm lab: see
    the file's head), parsed as the probe reads them."""
    text = (ROOT / "tests" / "data" / "slurm-resume" / name).read_text()
    return [parse_show(line) for line in text.splitlines() if line.startswith("NodeName=")]


def test_the_slurm_probe_takes_a_resumed_nodes_not_responding_for_no_failure_and_a_dead_slurmd_for_one():
    """Slurm 22.05 marks a node it resumes NOT_RESPONDING (BootTime cleared) until its slurmd registers again, ~1 s
    in the lab: chaoskit's own revert of slurm.drain did that, and the probe reported node.down 0.01 s after
    fault.reverted. A slurmd that is gone (the lab's power off) still gives NOT_RESPONDING, then DOWN."""
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.slurm import SlurmProbe

    def replay(name: str) -> list[tuple[str, str]]:
        probe = SlurmProbe(EventBus(), SlurmAccess())
        return [(e["kind"], e["state"]) for i, fields in enumerate(recorded_node_states(name))
                for e in probe._nodes({"n0": fields}, float(i))]

    states = [f["State"] for f in recorded_node_states("drain-resume.txt")]
    assert states == ["ALLOCATED", "ALLOCATED+DRAIN", "ALLOCATED+NOT_RESPONDING", "ALLOCATED"]  # the recording
    assert replay("drain-resume.txt") == [("node.drain", "ALLOCATED+DRAIN")]
    assert replay("slurmd-killed.txt") == [("node.down", "NOT_RESPONDING"), ("node.down", "DOWN")]


def test_a_requeue_that_lands_while_squeue_runs_is_stamped_after_it_not_before():
    """The Slurm probe's poll began, then chaoskit requeued the job (its fault's time), then squeue answered
    with the requeue in it: the event may not precede the fault, or the drill sees no detection. Slurm's answers
    come from a stand-in here (what they say is the point, not how slurmctld says it)."""
    import time as _time

    from chaoskit.observe.events import EventBus
    from chaoskit.observe.slurm import SlurmProbe

    class Access:
        restarts, t_fault = "0", None

        def nodes(self):
            return {"n0": {"State": "ALLOCATED"}}

        def jobs(self, wanted=None):
            if self.restarts == "1":
                self.t_fault = _time.time()  # the requeue, injected while this squeue runs
                _time.sleep(0.05)
            return [{"JobId": "7", "JobState": "RUNNING", "Restarts": self.restarts, "NodeList": "n0"}]

    access = Access()
    probe = SlurmProbe(EventBus(), access)  # type: ignore[arg-type]
    probe.poll()
    access.restarts = "1"
    (requeued,) = [e for e in probe.poll() if e["kind"] == "job.requeued"]
    assert requeued["ts"] >= access.t_fault


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SBATCH = """name: mine
cluster: {kind: slurm, nodes: 2}
workload:
  launch: sbatch
%s
faults:
  - kind: slurm.requeue
    target: {nodes: [n0]}
    at: {step: 10}
"""


def test_sbatch_without_a_script_or_with_a_missing_one_is_a_positioned_error(tmp_path):
    res = run_cli("validate", write(tmp_path, SBATCH % ""))
    assert res.code == 2 and "s.yaml:4" in res.stderr and "needs 'script: FILE'" in res.stderr
    res = run_cli("run", write(tmp_path, SBATCH % "  script: jobs/train.sbatch", "t.yaml"))
    assert res.code == 2, res.stderr
    assert "t.yaml:5" in res.stderr and "no batch script" in res.stderr and "nothing was submitted" in res.stderr
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    # an author's batch script runs as its user, never as root: this one is root's, and names no user
    res = run_cli("validate", tmp_path / "t.yaml")
    assert res.code == 2 and "t.yaml:4" in res.stderr and "never submits a batch script as root" in res.stderr, res.stderr
    for user, why in (("root", "never submits a batch script as root"), ("nosuch-user", "no user nosuch-user")):
        res = run_cli("validate", write(tmp_path, SBATCH % f"  user: {user}\n  script: jobs/train.sbatch", "u.yaml"))
        assert res.code == 2 and "u.yaml:5" in res.stderr and why in res.stderr, res.stderr
    assert run_cli("validate", write(tmp_path, SBATCH % "  user: nobody\n  script: jobs/train.sbatch", "u.yaml")).code == 0
    os.chown(tmp_path / "jobs" / "train.sbatch", pwd.getpwnam("nobody").pw_uid, -1)  # by default: the script's owner
    assert run_cli("validate", tmp_path / "t.yaml").code == 0
    dry = run_cli("run", "--dry-run", tmp_path / "t.yaml")
    assert dry.code == 0 and "runuser -u nobody -- " in dry.stdout, dry.stdout
    res = run_cli("validate", write(tmp_path, SBATCH.replace("kind: slurm, ", "") % "  script: jobs/train.sbatch", "p.yaml"))
    assert res.code == 2 and "kind: slurm" in res.stderr


def test_scheduler_faults_refuse_nodes_without_slurm(tmp_path):
    res = run_cli("validate", write(tmp_path, "name: x\ncluster: {kind: netns, nodes: 2}\nfaults:\n"
                                              "  - {kind: slurm.drain, target: {nodes: [n0]}, duration: 5s}\n"))
    assert res.code == 2 and "not managed by Slurm" in res.stderr


def test_a_slurm_lab_needs_root_and_slurm_with_a_clear_error(monkeypatch, _private_state):
    from chaoskit.lab import slurm

    os.chown(_private_state, 1000, 1000)  # the state folder of the user the test plays (issue 51: per user)
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 1000)
    res = run_cli("lab", "up", "--kind", "slurm")
    assert res.code == 3 and "needs root" in res.stderr and "apt-get install" in res.stderr
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm.shutil, "which", lambda name, path=None: None if name in ("slurmctld", "munged") else f"/usr/bin/{name}")
    res = run_cli("lab", "up", "--kind", "slurm")
    assert res.code == 3 and "needs slurmctld, munged" in res.stderr
    assert "apt-get install -y slurmctld slurmd slurm-client munge" in res.stderr


# -- a real Slurm lab --------------------------------------------------------------------------


@pytest.mark.slow
def test_lab_up_status_down_leaves_no_daemon_namespace_or_folder(_private_state):
    require_slurm()
    from chaoskit.lab.slurm import SlurmLab, slurm_lab_dir

    res = run_cli("lab", "up", "--kind", "slurm", "--nodes", "2", "--spare", "1")
    assert res.code == 0, res.stderr
    lab = SlurmLab.load()
    try:
        assert "Slurm lab" in res.stdout and str(lab.conf_path) in res.stdout
        status = run_cli("lab", "status", "--json").json
        [entry] = [x for x in status["labs"] if x["kind"] == "slurm"]
        assert [n["slurm_state"] for n in entry["nodes"]] == ["IDLE"] * 3
        # What a lab account needs to submit and run a job, in root's folders of the lab accounts' group (0710):
        # slurm.conf, munge's socket, the spool where slurmstepd puts the batch script; no one else enters them.
        group = grp.getgrnam("chaoskit-jobs").gr_gid
        for path, mode in ((Path(lab.public), 0o710), (lab.munge_socket.parent, 0o710), (lab.conf_path, 0o640),
                           (lab.spool_dir("n0").parent, 0o710)):  # slurmd makes its spool 0755, inside
            st = os.lstat(path)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, group, mode), (path, st)
        assert Path(lab.public).parent == Path("/run/chaoskit-slurm") and not (Path(lab.public) / "munge" / "munge.key").exists()
        assert stat.S_IMODE(os.stat(lab.directory).st_mode) == 0o700  # the rest (its state, the munge key): root's alone
        claim = claim_lab_account()
        try:
            env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(lab.conf_path), "HOME": "/"}
            ours = subprocess.run([*setpriv_argv(claim.account), "sinfo", "-h", "-o", "%D"], capture_output=True,
                                  text=True, env=env, timeout=30, cwd="/")
            assert ours.returncode == 0 and ours.stdout.split() == ["3"], ours  # a lab account submits
            nobody = pwd.getpwnam("nobody")  # anyone else: no slurm.conf, no munge socket (sinfo would retry)
            for check in (["cat", str(lab.conf_path)], ["test", "-e", str(lab.munge_socket)]):
                other = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                                        *check], capture_output=True, text=True, env=env, timeout=30, cwd="/")
                assert other.returncode != 0, (check, other)
            assert subprocess.run([*setpriv_argv(claim.account), "test", "-S", str(lab.munge_socket)]).returncode == 0
        finally:
            claim.release()
        # The lab's Slurm works with its own commands: a 2-node job runs one task in each node's namespace.
        env = {**os.environ, "SLURM_CONF": str(lab.conf_path)}
        out = subprocess.run(["srun", "-N2", "bash", "-c", "echo $SLURMD_NODENAME $(ip -o -4 addr show dev eth1 | awk '{print $4}')"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.split("\n")[:2]) == sorted([f"n0 {lab.net.mgmt_address('n0')}/24", f"n1 {lab.net.mgmt_address('n1')}/24"])
        # Power: off kills slurmd with the node, on starts it again and Slurm takes the node back.
        assert subprocess.run(lab.power_argv("n2", "off"), capture_output=True).returncode == 0
        assert subprocess.run(lab.power_argv("n2", "status"), capture_output=True).returncode == 1
        assert subprocess.run(lab.power_argv("n2", "on"), capture_output=True).returncode == 0
        assert wait_until(lambda: lab.access().nodes()["n2"]["State"] == "IDLE", 20), lab.access().nodes()["n2"]
    finally:
        down = run_cli("lab", "down")
    assert down.code == 0 and f"Slurm lab {lab.lab_id} down" in down.stdout
    assert wait_until(lambda: not leftovers(lab.lab_id, slurm_lab_dir()), 10), leftovers(lab.lab_id, slurm_lab_dir())
    assert run_cli("lab", "down").stdout == "no lab is up\n"


@pytest.mark.slow
def test_drain_is_reverted_by_its_lease_when_the_controller_stops_renewing(tmp_path):
    require_slurm()
    from chaoskit.backends.slurm import SlurmBackend, SlurmSpec
    from chaoskit.cluster.selectors import NodeTarget
    from chaoskit.faults.slurm import DrainFault, DrainSpec
    from tests.conftest import fault_context

    handle = SlurmBackend().open(SlurmSpec(kind="slurm", nodes=1, spare=1), tmp_path)
    try:
        access = handle.scheduler
        fault = DrainFault(DrainSpec(kind="slurm.drain", duration=60), "f0")
        with fault_context(handle.inventory, tmp_path, ttl=2.0) as ctx:
            [inj] = fault.inject(ctx, [NodeTarget(handle.inventory["n1"])])
            assert "DRAIN" in access.nodes()["n1"]["State"]
            ctx.leases.abandon(inj.fault_id)  # the controller "dies": nobody renews the lease
            assert wait_until(lambda: "DRAIN" not in access.nodes()["n1"]["State"], 20), access.nodes()["n1"]
        assert fault.verify(ctx, inj) is None
    finally:
        handle.teardown()


# -- the drills ---------------------------------------------------------------------------------


def drill(name: str, out: Path, *edits: tuple[str, str]):
    """``chaoskit run scenarios/NAME.yaml``, in a short form when ``edits`` are given (:func:`short_form`, written
    beside ``out``)."""
    require_slurm()
    need_torch()
    scenario = short_form(SCENARIOS / f"{name}.yaml", out.parent, *edits) if edits else SCENARIOS / f"{name}.yaml"
    res = run_cli("run", scenario, "--out", out, "--json")
    assert res.stdout, res.stderr
    return res, res.json


def events_of(out: Path) -> list[dict]:
    from chaoskit.observe.events import read_events

    return read_events(out / "events.jsonl")


@pytest.mark.slow
def test_slurm_kill_rank_recovers_in_place_without_slurm_noticing(tmp_path):
    # 80 steps, not 160 (issue 52): the kill at step 40 and the restart in place are the same; the 80 steps after
    # it drilled nothing more
    res, r = drill("slurm-kill-rank", tmp_path / "run", ("steps: 160", "steps: 80"))
    assert res.code == 0, (res.stderr, r["slo"], r["notes"])
    assert r["slurm"]["job_id"] and r["slurm"]["restarts"] == 0 and r["slurm"]["generated"]
    assert r["slurm"]["outputs"] and Path(r["slurm"]["outputs"][0]).exists()
    kinds = {e["kind"] for e in events_of(tmp_path / "run")}
    assert "job.running" in kinds and not kinds & {"job.requeued", "node.down", "job.node_fail"}
    if os.geteuid() == 0:  # the generated batch script was submitted as the run's lab account (issue 48), not root
        job_user = r["cluster"]["job_user"]
        assert job_user.startswith("chaoskit-lab") and r["cluster"]["job_process_users"] == [job_user], r["cluster"]
        assert sorted(p.name for p in (tmp_path / "run" / "logs").glob("n*.log")), "the agents' logs were not kept"
    assert "reallocation_steps" not in r["phases"]


def test_a_recorded_preemption_requeued_the_job_and_it_resumed_from_its_checkpoint():
    """scenarios/slurm-preempt.yaml's drill, recorded (tests/data/slurm-preempt/README.md): the job requeued at step
    40 (slurm.requeue), held for the requeue hold, allocated again and resumed from its checkpoint. Its live drill
    was one of this module's (issue 52: each story drilled once): slurm.requeue through the CLI, requeueing only the
    drill's own job, is drilled by tests/test_shared_slurm.py::test_slurm_requeue_requeues_this_drill_s_job_and_no_other,
    a requeued job held, allocated again and resumed from its checkpoint by the Xid drain below."""
    from chaoskit.observe.events import read_events

    data = ROOT / "tests" / "data" / "slurm-preempt"
    r = json.loads((data / "result.json").read_text())
    assert r["verdict"] == "pass" and r["slurm"]["restarts"] == 1
    steps = [s["step"] for s in r["phases"]["reallocation_steps"]]
    # the requeue hold is a step of its own; whether Slurm shows the job pending for another reason after it
    # ("eligible again") or allocates it at once depends on when its scheduler runs
    assert any(step.startswith("held (BeginTime) -> ") for step in steps), steps
    ev = read_events(data / "events.jsonl")
    assert any(e["kind"] == "job.pending" and e.get("reason") == "BeginTime" for e in ev)
    assert r["phases"]["restored_step"] > 0


def test_a_recorded_slurm_power_off_requeued_the_job_onto_the_spare(tmp_path):
    """scenarios/slurm-node-poweroff.yaml's drill, recorded (tests/data/slurm-node-poweroff/README.md): n1 powered
    off at step 40, slurmctld set it DOWN after SlurmdTimeout and requeued the job, Slurm allocated the spare n2 and
    the job resumed from its checkpoint; the report shows the reallocation step by step. Its live drill was one of
    this module's (issue 52: each story drilled once): a node powered off and a spare taking over is drilled on the
    netns lab (tests/test_network_drills.py::test_node_poweroff_a_spare_takes_over), Slurm requeueing a job off a
    failed node onto the spare by the Xid drain below, the Slurm probe's DOWN line in tests/test_blame.py."""
    from chaoskit.observe.events import read_events

    data = ROOT / "tests" / "data" / "slurm-node-poweroff"
    r = json.loads((data / "result.json").read_text())
    assert r["verdict"] == "pass" and r["cluster"]["kind"] == "slurm", r["notes"]
    ev = read_events(data / "events.jsonl")
    assert any(e["kind"] == "node.down" and e["node"] == "n1" for e in ev)
    assert any(e["kind"] == "job.requeued" for e in ev)
    allocated = [e["nodes"] for e in ev if e["kind"] == "job.allocated"]
    assert allocated[0] == ["n0", "n1"] and allocated[-1] == ["n0", "n2"]
    steps = r["phases"]["reallocation_steps"]
    assert any("SlurmdTimeout" in s["bound_by"] for s in steps) or r["phases"]["detected_by"].startswith("slurmctld")
    assert r["checks"]["faults_reverted"]["pass"]
    for name in ("result.json", "events.jsonl", "journal.jsonl"):
        shutil.copy(data / name, tmp_path / name)
    assert run_cli("report", tmp_path).code == 0
    assert "reallocation, step by step" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_slurm_xid_drain_the_health_check_drains_n1_and_the_job_moves_to_the_spare(tmp_path):
    """The detection chain: Xid 79 in n1's kernel log -> the lab's health check (examples/slurm/healthcheck.sh)
    drains n1 with a reason naming the Xid and requeues the job -> Slurm allocates the spare -> the job resumes
    from its checkpoint; every step named. After the run n1 is in service again, as before."""
    from chaoskit.lab.slurm import DEFAULT_SETTINGS, SlurmLab

    require_slurm()
    need_torch()
    # the lab the scenario asks for, made up front so that it outlives the run and n1 can be looked at after it
    lab = SlurmLab.create(2, 1, {**DEFAULT_SETTINGS, "requeue_hold": 5.0, "sched_interval": 2.0, "health_check_interval": 5.0})
    try:
        before = lab.access().node_state("n1")[0]
        # as shipped (issue 52): the Xid stops nothing, so the job must still be training when the health check
        # drains n1 and requeues it. At 80 steps the drill failed once here (load 21): its 40 steps after the Xid
        # last 2 s, less than the health check's 5 s interval
        res, r = drill("slurm-xid-drain", tmp_path / "run")
        assert res.code == 0, (res.stderr[-2000:], r["slo"], r["notes"])
        ev = events_of(tmp_path / "run")
        [xid] = [e for e in ev if e["kind"] == "gpu.xid"]
        assert (xid["node"], xid["code"], xid["injected"]) == ("n1", 79, True)
        [drain] = [e for e in ev if e["kind"] == "node.drain"]
        assert drain["node"] == "n1" and "Xid 79" in drain["reason"] and not drain["injected"]
        assert "Xid 79" in r["phases"]["detected_by"] and r["phases"]["detection_s"] <= 15
        allocated = [e["nodes"] for e in ev if e["kind"] == "job.allocated"]
        assert allocated[0] == ["n0", "n1"] and allocated[-1] == ["n0", "n2"]
        assert r["phases"]["restored_step"] is not None and r["phases"]["checkpoint_load_s"] is not None
        steps = [s["step"] for s in r["phases"]["reallocation_steps"]]
        assert steps[0] == "detected -> job requeued" and steps[-1].endswith("-> workers started")
        assert "HealthCheckInterval=5s" in r["phases"]["reallocation_steps"][0]["bound_by"]
        assert r["checks"]["faults_reverted"]["pass"]
        state, reason, _ = lab.access().node_state("n1")
        assert "DRAIN" not in state.split("+") and state.split("+")[0] == before.split("+")[0], (state, reason)
    finally:
        lab.down()
