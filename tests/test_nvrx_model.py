"""The NVRx recovery model (``measure.measure_nvrx``) and the ``nvrx`` preset, on ft_launcher's real output.

tests/data/nvrx/hang-rank1.log is what a real ``ft_launcher`` (nvidia-resiliency-ext 0.4.1, torch 2.13.0 CPU,
gloo) printed on this machine (2026-12-02), run by hand the way ``workload.recovery: nvrx`` runs it:
``--ft-rank-heartbeat-timeout 5 --ft-initial-rank-heartbeat-timeout 60 --ft-workload-check-interval 0.5
--nproc-per-node 2 ... -m chaoskit.workloads.plain_train --steps 200`` (the job sending a heartbeat a step), its
rank 1 SIGSTOPped after step 60 (tests/data/nvrx/fault.txt: the moment). Each line carries the Unix time it
arrived at, as chaoskit's launcher stamps it; NVML's tracebacks (no GPU here) are left out, every line kept
is verbatim.
"""

from __future__ import annotations

import shutil

from pathlib import Path

import pytest

from chaoskit.core.errors import ScenarioError
from chaoskit.measure import measure_fault
from chaoskit.observe.events import EVENT_KINDS, EventBus
from chaoskit.observe.probes import LogRegexProbe
from chaoskit.observe.rules import LogRule
from chaoskit.scenario import load_scenario
from chaoskit.stacks.nvrx import measure_nvrx
from chaoskit.stacks.registry import log_presets, preset_rules, stack

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

DATA = Path(__file__).parent / "data" / "nvrx"
T_FAULT = float((DATA / "fault.txt").read_text().split()[-1])
# the uninstrumented job's own prints (scenarios/kill-uninstrumented.yaml's rules)
JOB_RULES = [
    LogRule.of(r"\[rank (?P<rank>\d+)\] worker started pid=(?P<pid>\d+) restart=(?P<restart_count>\d+)", "worker.start"),
    LogRule.of(r"\[rank (?P<rank>\d+)\] process group ready", "rendezvous.done"),
    LogRule.of(r"\[rank (?P<rank>\d+)\] Resuming training from snapshot at step (?P<step>\d+)", "ckpt.load.end"),
    LogRule.of(r"\[rank (?P<rank>\d+)\] step (?P<step>\d+) loss", "step"),
]


def _recorded_timeline() -> list[dict]:
    bus = EventBus()
    rules, _ = preset_rules(["torchrun", "nvrx"])
    probe = LogRegexProbe(bus, rules + JOB_RULES)
    for line in (DATA / "hang-rank1.log").read_text().splitlines():
        ts, _, text = line.partition(" ")
        probe.feed("n0", text, ts=float(ts))
    return bus.snapshot()


def test_the_nvrx_preset_reads_the_rank_monitors_real_lines():
    events = _recorded_timeline()
    monitors = [e for e in events if e.get("source") == "nvrx"]
    assert [(e["kind"], e["rank"], e["timeout_s"]) for e in monitors] == [("detect", 0, "5.00"), ("detect", 1, "5.00")]
    assert all(e["who"] == "NVRx rank monitor" and "heartbeat" in e["why"] for e in monitors)
    assert set(log_presets()["nvrx"].sees) <= set(EVENT_KINDS)
    # ft_launcher's agent reports the worker its monitor killed in torchrun's words
    exits = [e for e in events if e["kind"] == "worker.exit"]
    assert [(e["exitcode"], e["local_rank"]) for e in exits] == [(-9, 0)]


def test_a_hung_rank_measured_with_the_nvrx_model():
    events = _recorded_timeline()
    phases = measure_nvrx(events, T_FAULT)
    assert phases["model"] == "nvrx" and stack("nvrx").measure(events, T_FAULT) == phases
    # rank 0's monitor, 5 s after the last heartbeat before the hang (it blocked in the all-reduce with rank 1)
    assert phases["detected_by"].startswith("NVRx rank monitor on n0/rank0")
    assert 5.0 <= phases["detection_s"] <= 6.0, phases["detection_s"]
    assert phases["rank_monitor"]["rank"] == 0 and phases["rank_monitor"]["timeout_s"] == 5.0
    # the restarted world: both workers started again (restart=1), then loaded step 50 and trained on
    assert 0 < phases["reallocation_s"] < 2.0
    assert phases["restored_step"] == 50 and phases["last_step_before"] >= 60
    assert phases["lost_steps"] == phases["last_step_before"] - 50
    assert phases["checkpoint_load_s"] > 0 and phases["recovery_s"] > phases["detection_s"] + phases["reallocation_s"]
    assert not phases["reasons"]


def test_without_the_rank_monitors_lines_the_hang_is_seen_only_when_the_launcher_kills_a_worker():
    """The restart model on the same output, the nvrx preset left out: detection is then the worker's exit (the
    monitor's kill), a few ms later, and nobody is named a rank monitor."""
    events = [e for e in _recorded_timeline() if e.get("source") != "nvrx"]
    plain, nvrx = measure_fault(events, T_FAULT), measure_nvrx(events, T_FAULT)
    assert plain["detected_by"] == nvrx["detected_by"] and plain["detected_by"].startswith("torchrun agent")
    assert nvrx["rank_monitor"] is None and nvrx["detection_s"] == plain["detection_s"]


def test_nothing_noticed_is_not_observed_with_a_reason():
    events = [e for e in _recorded_timeline() if e["ts"] <= T_FAULT]
    phases = measure_nvrx(events, T_FAULT)
    assert phases["detection_s"] is None and "rank monitor" in phases["reasons"]["detection"]


def _scenario(tmp_path: Path, workload: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\ncluster: lab\nworkload: {workload}\n"
                    "faults: [{kind: process.hang, target: {ranks: [1]}, duration: 10s, at: {step: 20}}]\n")
    return path


def test_nvrx_settings_become_ft_launcher_options(tmp_path):
    sc = load_scenario(_scenario(tmp_path, "{recovery: nvrx, nvrx: {heartbeat_timeout: 3s, section_timeouts: "
                                           "{step: 2s, checkpointing: 30s}, out_of_section_timeout: 1m}}")).model
    assert sc.workload.nvrx.launcher_args() == [
        "--ft-rank-heartbeat-timeout", "3", "--ft-initial-rank-heartbeat-timeout", "60",
        "--ft-workload-check-interval", "0.5", "--ft-rank-section-timeouts", "step:2,checkpointing:30",
        "--ft-rank-out-of-section-timeout", "60"]
    default = load_scenario(_scenario(tmp_path, "{recovery: nvrx}")).model
    assert default.workload.nvrx.heartbeat_timeout == 5.0


@pytest.mark.parametrize("workload, message", [
    ("{nvrx: {heartbeat_timeout: 3s}}", "'nvrx' is only used with recovery: nvrx"),
    ("{recovery: nvrx, launch: ray-train}", "not launch: ray-train"),
    ("{recovery: nvrx, nvrx: {section_timeouts: {'a;b': 2s}}}", "invalid section name"),
    ("{recovery: nvrx, nvrx: {heartbeat_timeout: 0s}}", "s.yaml:3"),
])
def test_bad_nvrx_settings_are_refused_at_their_line(tmp_path, workload, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_scenario(tmp_path, workload))
    assert message in str(err.value)


def test_ft_launcher_starts_in_place_of_torchrun_with_private_sockets(tmp_path):
    """The agent's command line on the process lab and in the Slurm lab's batch job: ft_launcher with the
    scenario's timeouts, its Unix sockets in a folder of the job's own (0700), never /tmp's guessable names."""
    import dataclasses
    import stat

    from chaoskit.scenario.checks import check_scenario
    from chaoskit.stacks.nvrx import NVRX_LAUNCHER
    from chaoskit.workloads.launch import TorchrunJob
    from chaoskit.workloads.slurm import SlurmJob

    loaded = load_scenario(_scenario(tmp_path, "{recovery: nvrx, nvrx: {heartbeat_timeout: 3s}}"))
    job = TorchrunJob(check_scenario(loaded), loaded.model.workload, tmp_path / "run", "rid", None)
    argv = job.agent_argv("n0")
    assert argv[1:3] == list(NVRX_LAUNCHER) and "torch.distributed.run" not in argv
    assert argv[argv.index("--ft-rank-heartbeat-timeout") + 1] == "3"
    sockets = Path(job.job_env("n0")["TMPDIR"])
    try:
        assert sockets == tmp_path / "run" / "nvrx" or sockets.name.startswith("chaoskit-nvrx-")
        assert stat.S_IMODE(sockets.stat().st_mode) == 0o700 and len(str(sockets)) <= 60
    finally:  # the job never started, so its stop(), which removes a folder made in /tmp, never runs
        if sockets.name.startswith("chaoskit-nvrx-"):
            shutil.rmtree(sockets, ignore_errors=True)
    path = tmp_path / "slurm.yaml"
    path.write_text("name: s\ncluster: {kind: slurm, nodes: 2}\nworkload: {recovery: nvrx}\n"
                    "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 20}}]\n")
    loaded = load_scenario(path)
    handle = check_scenario(loaded)
    script = SlurmJob(dataclasses.replace(handle, scheduler=handle.scheduler or object()), loaded.model.workload,
                      tmp_path / "slurm-run", "rid").agent_script()
    assert "TMPDIR=$(mktemp -d -t chaoskit-nvrx-XXXXXXXX) || exit 1; export TMPDIR" in script
    assert "nvidia_resiliency_ext.fault_tolerance.launcher" in script and "--ft-rank-heartbeat-timeout 5" in script


def _slurm_agent(tmp_path: Path, launcher: str) -> tuple[Path, dict[str, str]]:
    """The Slurm lab's generated agent script for ``recovery: nvrx``, with ``launcher`` (a bash stand-in for the
    Python that runs ft_launcher: no Slurm allocation here) in the python's place, and the variables srun sets."""
    import dataclasses

    from chaoskit.scenario.checks import check_scenario
    from chaoskit.workloads.slurm import SlurmJob

    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n" + launcher)
    fake.chmod(0o755)
    path = tmp_path / "slurm.yaml"
    path.write_text("name: s\ncluster: {kind: slurm, nodes: 2}\nworkload: {recovery: nvrx}\n"
                    "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 20}}]\n")
    loaded = load_scenario(path)
    handle = check_scenario(loaded)
    job = SlurmJob(dataclasses.replace(handle, scheduler=handle.scheduler or object(), python=str(fake)),
                   loaded.model.workload, tmp_path / "slurm-run", "rid")
    job.log_dir.mkdir(parents=True, exist_ok=True)
    agent = tmp_path / "agent.sh"
    agent.write_text(job.agent_script())
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n0", "SLURM_JOB_ID": "7", "SLURM_NODEID": "0",
           "CHAOSKIT_RDZV_HOST": "127.0.0.1", "TMPDIR": str(tmp_path)}
    return agent, env


def test_the_slurm_agent_removes_ft_launchers_socket_folder_when_the_launcher_ends(tmp_path):
    """The folder the agent script makes for ft_launcher's sockets is gone after the launcher exits (its exit
    code passed on) and after Slurm's SIGTERM (passed on to the launcher, which is waited for); the script used to
    exec the launcher, and every run left one chaoskit-nvrx-* folder per node."""
    import subprocess
    import time

    seen = tmp_path / "tmpdir"
    agent, env = _slurm_agent(tmp_path, f'echo "$TMPDIR" > {seen}; exit 7\n')
    assert subprocess.run(["bash", str(agent)], env=env, timeout=30).returncode == 7
    folder = Path(seen.read_text().strip())
    assert folder.name.startswith("chaoskit-nvrx-") and folder.parent == tmp_path and not folder.exists()

    seen.unlink()
    ended = tmp_path / "ended"
    agent, env = _slurm_agent(tmp_path, f'trap "echo term > {ended}; exit 143" TERM\necho "$TMPDIR" > {seen}\n'
                                        "sleep 60 & wait\n")
    proc = subprocess.Popen(["bash", str(agent)], env=env)
    deadline = time.time() + 10
    while not (seen.exists() and seen.read_text().strip()) and time.time() < deadline:
        time.sleep(0.02)
    folder = Path(seen.read_text().strip())
    assert folder.is_dir()
    proc.terminate()  # what Slurm sends the step's script first (scancel, requeue)
    assert proc.wait(timeout=10) == 143
    assert ended.read_text().strip() == "term" and not folder.exists()


def test_heartbeat_timeouts_switched_off_reach_ft_launcher_as_null(tmp_path):
    """NVRx's sections example sets both heartbeat timeouts to null; ft_launcher's options take numbers only (and
    one not given is NVRx's 45/60 min), so chaoskit writes them into its --ft-cfg-path file, which NVRx's own
    parser reads as None (never checked). The plan shows it, and the scorecard's timeouts say "off"."""
    from chaoskit.scenario.checks import check_scenario
    from chaoskit.scorecard import stack_timeouts
    from chaoskit.workloads.launch import TorchrunJob
    from tests.conftest import run_cli

    path = _scenario(tmp_path, "{recovery: nvrx, nvrx: {heartbeat_timeout: null, initial_heartbeat_timeout: null, "
                               "section_timeouts: {step: 10s}}}")
    loaded = load_scenario(path)
    job = TorchrunJob(check_scenario(loaded), loaded.model.workload, tmp_path / "run", "rid", None)
    argv = job.agent_argv("n0")
    assert "--ft-rank-heartbeat-timeout" not in argv and "--ft-initial-rank-heartbeat-timeout" not in argv
    config = argv[argv.index("--ft-cfg-path") + 1]
    (tmp_path / "run").mkdir()
    assert job.stack_run.write_config() == config
    nvrx = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.launcher")
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

    args = nvrx.get_args_parser().parse_args([*argv[argv.index("--ft-cfg-path"):argv.index("--nproc-per-node")],
                                              "train.py"])
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.rank_heartbeat_timeout is None and cfg.initial_rank_heartbeat_timeout is None
    assert cfg.rank_section_timeouts == {"step": 10.0} and cfg.workload_check_interval == 0.5
    plan = run_cli("run", path, "--dry-run", "--json")
    assert plan.code == 0 and "--ft-cfg-path" in plan.json["job"]["n0"], plan.stderr
    doc = {"workload": {"recovery": "nvrx", "nvrx": {"heartbeat_timeout": None, "initial_heartbeat_timeout": None}}}
    timeouts, warnings = stack_timeouts("nvrx", doc, {})
    assert timeouts["NVRx heartbeat timeout"] == "off (null)" and timeouts["NVRx initial heartbeat timeout"] == "off (null)"
    assert not any("heartbeat" in w for w in warnings)


def test_a_worker_killed_by_its_rank_monitor_before_the_fault_makes_the_baseline_unsteady(tmp_path):
    """Issue 51, item 4: ft_launcher's rank monitor killed a worker 16.9 s before the injected fault (the recorded
    exit, the fault put after it): one restart before the first fault, said with who and when; none before the
    recording's real fault. A scenario says how many it accepts (``steady_state.restarts_allowed``, default 0,
    never negative: refused at its line); the run's ``steady_state`` check fails past it, with the reason."""
    from chaoskit.measure import baseline_restarts

    events = _recorded_timeline()
    exit_ts = next(e["ts"] for e in events if e["kind"] == "worker.exit")
    restarts, first = baseline_restarts(events, exit_ts + 16.9)
    assert restarts == 1 and "exit code -9" in first and first.endswith("16.9s before the first fault")
    t_fault = float((DATA / "fault.txt").read_text().split()[-1])
    assert baseline_restarts(events, t_fault) == (0, None)
    # a restarted world's starts say it too, and two of them are two restarts
    starts = [{"ts": 5.0, "kind": "worker.start", "node": "n0", "rank": 0, "restart_count": 2}]
    assert baseline_restarts(starts, 10.0) == (2, "workers started again on n0 (restart 2), 5.0s before the first fault")

    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: lab\nsteady_state: {steps: 3, restarts_allowed: 1}\n"
                    "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 20}}]\n")
    assert load_scenario(path).model.steady_state.restarts_allowed == 1
    assert load_scenario(_scenario(tmp_path, "{}")).model.steady_state.restarts_allowed == 0
    path.write_text("name: s\ncluster: lab\nsteady_state:\n  restarts_allowed: -1\n"
                    "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 20}}]\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert "s.yaml:4" in str(err.value) and "restarts_allowed" in str(err.value)
