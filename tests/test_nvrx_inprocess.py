"""NVRx's in-process restart as a recovery model (``workload.recovery: nvrx-inprocess``).

tests/data/nvrx-inprocess/*.log is what the reference job printed on this machine (2026-12-02) under torchrun
(torch 2.13.0 CPU, gloo, nvidia-resiliency-ext 0.4.1), run by hand the way ``recovery: nvrx-inprocess`` runs it:
``-m torch.distributed.run --nproc-per-node 2 --max-restarts 0 chaoskit/workloads/plain_train.py --steps 120
--checkpoint-every 25 --nvrx-inprocess --nvrx-soft-timeout 5 --nvrx-hard-timeout 30 --nvrx-heartbeat-timeout 5``,
each line stamped with the Unix time it arrived. The fault came from a ``sitecustomize`` of the recording's own
(not chaoskit's channel) on rank 1 at its 60th optimizer step: ``raise-rank1.log`` (``--collective-timeout 5``)
raised "CUDA error: an illegal memory access was encountered" there, ``hang-rank1.log`` (``--collective-timeout
20``) held the training thread in a Python sleep loop for 60 s (fault-*.txt: the moments). Lines are verbatim;
NVML's deprecation warnings (no GPU here) are left out. The live drill at the end runs the same through chaoskit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.cluster.transports.api import ProcInfo, rank_processes
from chaoskit.core.errors import ScenarioError
from chaoskit.observe.events import EVENT_KINDS, EventBus
from chaoskit.observe.probes import LogRegexProbe
from chaoskit.observe.rules import LogRule
from chaoskit.scenario import load_scenario
from chaoskit.stacks.nvrx_inprocess import measure_nvrx_inprocess
from chaoskit.stacks.registry import log_presets, preset_rules, stack
from tests.conftest import SCENARIOS, need_torch, run_cli, short_form

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

DATA = Path(__file__).parent / "data" / "nvrx-inprocess"
JOB_RULES = [  # the uninstrumented job's own prints (scenarios/kill-uninstrumented.yaml's rules)
    LogRule.of(r"\[rank (?P<rank>\d+)\] worker started pid=(?P<pid>\d+) restart=(?P<restart_count>\d+) "
               r"world_size=(?P<world_size>\d+)", "worker.start"),
    LogRule.of(r"\[rank (?P<rank>\d+)\] Resuming training from snapshot at step (?P<step>\d+)", "ckpt.load.end"),
    LogRule.of(r"\[rank (?P<rank>\d+)\] step (?P<step>\d+) loss", "step"),
]


def recorded(kind: str) -> tuple[list[dict], float]:
    bus = EventBus()
    rules, _ = preset_rules(["torchrun", "nvrx-inprocess"])
    probe = LogRegexProbe(bus, rules + JOB_RULES)
    for line in (DATA / f"{kind}-rank1.log").read_text().splitlines():
        ts, _, text = line.partition(" ")
        probe.feed("n0", text, ts=float(ts))
    return bus.snapshot(), float((DATA / f"fault-{kind}.txt").read_text().split()[-1])


def test_the_preset_reads_the_wrappers_real_lines():
    events, _ = recorded("raise")
    wrapper = [e for e in events if e.get("source") == "nvrx-inprocess"]
    # rank 1's loop raised; each rank's iteration interrupted for rank 1's exception; both restarted
    assert [(e["kind"], e["rank"], e.get("interruption")) for e in wrapper] == [
        ("detect", 1, None), ("detect", 1, "EXCEPTION"), ("inprocess.restart", 1, None),
        ("detect", 0, None), ("detect", 0, "EXCEPTION"), ("inprocess.restart", 0, None)]
    assert "CUDA error: an illegal memory access" in wrapper[0]["error"] and wrapper[1]["ranks"] == 1
    assert set(log_presets()["nvrx-inprocess"].sees) <= set(EVENT_KINDS)


def test_a_cuda_error_measured_with_the_in_process_model():
    events, t_fault = recorded("raise")
    phases = measure_nvrx_inprocess(events, t_fault)
    assert stack("nvrx-inprocess").measure(events, t_fault) == phases and set(stack("nvrx-inprocess").phase_meanings) == {
        "detection", "reallocation", "checkpoint_load", "recovery", "lost_steps"}
    assert phases["model"] == "nvrx-inprocess" and not phases["reasons"]
    # the Wrapper in the raising rank knew at once
    assert phases["detected_by"].startswith("NVRx in-process Wrapper on n0/rank1") and phases["detection_s"] < 0.1
    # rank 0, blocked in the all-reduce, is freed by gloo's 5 s collective timeout; then both loops start again
    assert 4.5 < phases["reallocation_s"] < 7.0, phases["reallocation_s"]
    assert phases["wrapper"]["interruption"] == "EXCEPTION" and phases["wrapper"]["ranks"] == [1]
    assert phases["in_process"] is True  # the same two pids before and after
    assert phases["restored_step"] == 50 and phases["lost_steps"] == phases["last_step_before"] - 50


def test_a_live_hang_is_seen_at_the_soft_timeout_and_the_peer_freed_at_the_collective_timeout():
    """On gloo the Wrapper notices the hang at its soft timeout (5 s, and up to a check later) and restarts the
    hung rank's loop at once, but rank 0, blocked in the all-reduce, takes the Wrapper's restart only when its
    20 s collective timeout frees it: gloo has no abort (NCCL's would free it at once)."""
    events, t_fault = recorded("hang")
    phases = measure_nvrx_inprocess(events, t_fault)
    assert phases["detected_by"].startswith("NVRx in-process Wrapper on n0/rank1")
    assert 5.0 < phases["detection_s"] < 7.0, phases["detection_s"]
    assert phases["wrapper"]["interruption"] == "SOFT_TIMEOUT" and phases["wrapper"]["ranks"] == [0, 1]
    assert 19.0 < phases["recovery_s"] < 23.0, phases["recovery_s"]
    assert phases["in_process"] is True and phases["restored_step"] == 50


def test_a_restart_in_new_processes_is_not_called_in_process():
    """torchrun restarting a worker (its Wrapper gave up) gives the same phases, with in_process False."""
    events, t_fault = recorded("raise")
    moved = [dict(e, pid=e["pid"] + 100000) if e["kind"] == "worker.start" and e["ts"] > t_fault else e for e in events]
    assert measure_nvrx_inprocess(moved, t_fault)["in_process"] is False
    before = [e for e in events if e["ts"] <= t_fault]
    nothing = measure_nvrx_inprocess(before, t_fault)
    assert nothing["in_process"] is None and "in-process Wrapper" in nothing["reasons"]["detection"]


def _scenario(tmp_path: Path, workload: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\ncluster: lab\nworkload: {workload}\n"
                    "faults: [{kind: inproc.raise, target: {ranks: [1]}, cuda: illegal_address, at: {step: 20}}]\n")
    return path


def test_the_wrappers_timeouts_become_the_jobs_options(tmp_path):
    sc = load_scenario(_scenario(tmp_path, "{recovery: nvrx-inprocess, collective_timeout: 5s, "
                                           "nvrx_inprocess: {soft_timeout: 2s, hard_timeout: 20s}}")).model
    assert sc.workload.nvrx_inprocess.job_args() == [
        "--nvrx-inprocess", "--nvrx-soft-timeout", "2", "--nvrx-hard-timeout", "20", "--nvrx-heartbeat-timeout", "5"]
    from chaoskit.scenario.checks import check_scenario
    from chaoskit.workloads.launch import TorchrunJob

    loaded = load_scenario(_scenario(tmp_path, "{recovery: nvrx-inprocess, collective_timeout: 5s}"))
    job = TorchrunJob(check_scenario(loaded), loaded.model.workload, tmp_path / "run", "rid", None)
    argv = job.agent_argv("n0")
    assert "torch.distributed.run" in argv and "--nvrx-inprocess" in argv and "--nvrx-hard-timeout" in argv
    env = job.job_env("n0")
    assert int(env["CHAOSKIT_NVRX_STORE_PORT"]) != job.port


@pytest.mark.parametrize("workload, message", [
    ("{nvrx_inprocess: {soft_timeout: 3s}}", "'nvrx_inprocess' is only used with recovery: nvrx-inprocess"),
    ("{recovery: nvrx-inprocess, launch: command, command: [train.py]}", "not launch: command"),
    ("{recovery: nvrx-inprocess, nvrx_inprocess: {hard_timeout: 20s}}",
     "collective_timeout (30s) must be shorter than nvrx_inprocess.hard_timeout (20s)"),
    ("{recovery: nvrx-inprocess, collective_timeout: 5s, nvrx_inprocess: {soft_timeout: 0s}}", "s.yaml:3"),
])
def test_bad_in_process_settings_are_refused_at_their_line(tmp_path, workload, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_scenario(tmp_path, workload))
    assert message in str(err.value)


def _proc(pid, ppid, rank, start, restart="0", run="r1"):
    return ProcInfo(pid, ppid, "python train.py", {"RANK": str(rank), "TORCHELASTIC_RUN_ID": run,
                                                   "TORCHELASTIC_RESTART_COUNT": restart}, "S", 0, start)


def test_a_ranks_helpers_are_not_the_rank():
    """The Wrapper's monitor process is a daemon (double fork: its parent is init) carrying its rank's RANK, and
    a DataLoader worker is the rank's child with it too: neither is "rank 1" (the live drill below needs it: the
    order went to the monitor process, which has no training step, and the drill was refused)."""
    rank1 = _proc(500, 40, 1, start=1000)
    monitor, loader = _proc(512, 1, 1, start=1003), _proc(530, 500, 1, start=1009)
    rank0 = _proc(501, 40, 0, start=1000)
    other_job = _proc(700, 41, 1, start=900, run="someone-else")
    assert [p.pid for p in rank_processes([monitor, loader, rank1, rank0, other_job])] == [500, 501, 700]
    newer = _proc(800, 40, 1, start=2000, restart="1")  # torchrun's next round, its old rank a zombie
    zombie = ProcInfo(500, 40, "", rank1.env, "Z", 0, 1000)
    assert [p.pid for p in rank_processes([zombie, newer])] == [800]


@pytest.mark.slow
def test_live_cuda_error_restarts_every_rank_in_its_process(tmp_path):
    need_torch()
    # the shipped drill in a short form (issue 52): the CUDA error at step 30 (after the checkpoint of step 25) of
    # 80, not at 60 of 160; the Wrapper's catch, the collective timeout that frees rank 0 and the rerun of both loops
    # in their processes are the same at any step
    scenario = short_form(SCENARIOS / "nvrx-inprocess-cuda-error.yaml", tmp_path, ("steps: 160", "steps: 80"),
                          ("at: {step: 60}", "at: {step: 30}"))
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)
    p = r["phases"]
    assert r["recovery_model"] == "nvrx-inprocess" and p["in_process"] is True
    assert p["detected_by"].startswith("NVRx in-process Wrapper on n1/rank1") and p["detection_s"] < 1.0
    # rank 0 is freed by its 5 s collective timeout (gloo cannot abort), then both loops run again
    assert 4.5 < p["reallocation_s"] < 9.0 and p["lost_steps"] <= 25
    timeline = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    starts = [e for e in timeline if e["kind"] == "worker.start" and e.get("rank") == 1]
    assert [s.get("iteration") for s in starts] == [0, 1] and len({s["pid"] for s in starts}) == 1
    assert [s["restart_count"] for s in starts] == [0, 0] and p["world_size"] == {"before": 2, "after": 2}
    injected = [e for e in timeline if e["kind"] == "fault.injected"]
    assert injected and all(e.get("pid") in (None, starts[0]["pid"]) for e in injected), injected


def test_a_world_that_went_on_without_a_rank_says_so():
    """A dead node's rank is UNRESPONSIVE to the Wrapper, which goes on without it (seen in the scorecard's
    power-off and NIC-down rows): a pass, at half the world, which the phases must not hide."""
    events, t_fault = recorded("raise")
    shrunk = [dict(e, world_size=1) if e["kind"] == "worker.start" and e["ts"] > t_fault else e for e in events]
    assert measure_nvrx_inprocess(shrunk, t_fault)["world_size"] == {"before": 2, "after": 1}
    assert measure_nvrx_inprocess(events, t_fault)["world_size"] == {"before": 2, "after": 2}
