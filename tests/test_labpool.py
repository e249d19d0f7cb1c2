"""A game day's shared labs: same-lab scenarios back to back, a reused lab verified clean, nothing left after.

Real labs (the process lab: a state file and the processes carrying its scope), real
processes; no training job, so these take seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.backends.docker import DockerBackend, DockerSpec
from chaoskit.backends.process import ProcessSpec
from chaoskit.gameday import GAMEDAY_FILE
from chaoskit.lab.process import ProcessLab
from chaoskit.labpool import LabPool, group_order, journal_problems, node_problems
from tests.conftest import run_cli, wait_until


def test_same_lab_scenarios_are_made_adjacent_in_the_order_given() -> None:
    assert group_order(["a", "b", "a", None, "b", "c"]) == [0, 2, 1, 4, 3, 5]
    assert group_order([None, None]) == [0, 1] and group_order([]) == []


def test_reuse_key_is_the_shape_a_run_reuses_and_docker_s_is_its_compose_project(tmp_path: Path) -> None:
    assert LabPool.key(ProcessSpec(kind="process", nodes=3), tmp_path) == LabPool.key(ProcessSpec(nodes=3), tmp_path)
    assert LabPool.key(ProcessSpec(nodes=3), tmp_path) != LabPool.key(ProcessSpec(nodes=2), tmp_path)
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services: {}\n")
    two, spare = DockerSpec(kind="docker", nodes=2), DockerSpec(kind="docker", nodes=2, spare=1)
    assert LabPool.key(two, tmp_path) == LabPool.key(spare, tmp_path) == f"docker:docker:{compose.resolve()}"
    assert DockerBackend().reuse_spec(spare, tmp_path).model_dump(exclude_unset=True) == {"kind": "docker", "compose": str(compose.resolve())}


def test_node_problems_are_read_from_lab_status() -> None:
    assert node_problems([{"name": "n0", "on": True, "processes": 1}, {"name": "n1", "slurm_state": "IDLE"},
                          {"name": "n2", "state": "running"}]) == []
    assert node_problems([{"name": "n0", "on": False}]) == ["n0 is powered off"]
    assert node_problems([{"name": "n1", "state": "exited"}]) == ["n1 is exited"]
    for state in ("DOWN*", "IDLE+DRAIN", "MIXED", "ALLOCATED", "IDLE+NOT_RESPONDING", "?"):
        assert node_problems([{"name": "n2", "slurm_state": state}]) == [f"n2 is {state} in Slurm"], state
    listed = [{"pid": 7, "cmdline": "raylet --node-ip-address=127.0.0.1"},
              {"pid": 8, "cmdline": "python -m torch.distributed.run --nnodes 3"}]
    assert node_problems([{"name": "n0", "processes": listed}]) == ["n0: pid 8 python -m torch.distributed.run --nnodes 3"]


def test_an_unverified_revert_in_the_last_run_s_journal_is_a_leftover(tmp_path: Path) -> None:
    run = tmp_path / "03-nic-drop"
    (run / "sample-02").mkdir(parents=True)
    (run / "journal.jsonl").write_text(json.dumps({"action": "reverted", "kind": "network.link_down", "node": "n1",
                                                   "verified": True, "problem": None}) + "\n")
    assert journal_problems(run) == []
    (run / "sample-02" / "journal.jsonl").write_text("not json\n" + json.dumps(
        {"action": "reverted", "kind": "network.link_down", "node": "n1", "verified": False, "problem": "eth0 still down"}) + "\n")
    assert journal_problems(run) == ["network.link_down on n1: revert not verified (eth0 still down)"]


def _in_scope(lab: ProcessLab, node: str, *argv: str, **env: str) -> subprocess.Popen:
    """A real process on a lab node; with ``argv`` naming the reference job's module, as a job's worker would be."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv],
                            env={**os.environ, "CHAOSKIT_SCOPE": lab.scope(node), **env})


@pytest.mark.slow
def test_a_reused_lab_is_verified_clean_and_rebuilt_when_a_job_process_is_left(tmp_path: Path) -> None:
    said: list[str] = []
    pool = LabPool(said.append, settle_s=0.5)
    spec = ProcessSpec(nodes=3)
    first = pool.before("kill-rank", spec, tmp_path, 2, None)
    lab = ProcessLab.load()
    assert lab is not None and lab.nodes == 3 and first["reused"] is False
    # a clean lab is reused as it is
    assert pool.before("hang-rank", spec, tmp_path, 2, tmp_path / "no-run") == {"kind": "process", "reused": True}
    assert ProcessLab.load().lab_id == lab.lab_id
    # a process that is not the job's (a lab's own daemon) does not make it dirty; a worker left behind does
    daemon = _in_scope(lab, "n0")
    worker = _in_scope(lab, "n1", "chaoskit.workloads.ddp_train", TORCHELASTIC_RUN_ID="r1", RANK="1")
    try:
        third = pool.before("oom-rank", spec, tmp_path, 2, None)
        assert third["reused"] is False and third["not_clean"] == [
            f"n1: pid {worker.pid} {sys.executable} -c import time; time.sleep(60) chaoskit.workloads.ddp_train"[:80 + len(f"n1: pid {worker.pid} ")]]
        assert wait_until(lambda: worker.poll() is not None and daemon.poll() is not None, 10)  # the old lab's down stopped both
        fresh = ProcessLab.load()
        assert fresh is not None and fresh.lab_id != lab.lab_id and fresh.processes() == []
        assert any("not clean after the last drill" in line for line in said)
    finally:
        for p in (daemon, worker):
            p.kill()
            p.wait()
    pool.release()
    pool.release()  # twice is safe
    assert ProcessLab.load() is None
    assert [h.as_dict()["scenarios"] for h in pool.history] == [["kill-rank", "hang-rank"], ["oom-rank"]]


def test_somebody_s_lab_of_that_kind_is_left_alone(tmp_path: Path) -> None:
    theirs = ProcessLab.create(2, persistent=True)
    pool = LabPool(lambda _: None)
    assert pool.before("kill-rank", ProcessSpec(nodes=3), tmp_path, 2, None) is None
    pool.release()
    assert ProcessLab.load().lab_id == theirs.lab_id
    theirs.down()


def test_a_lone_scenario_gets_no_shared_lab(tmp_path: Path) -> None:
    pool = LabPool(lambda _: None)
    assert pool.before("kill-rank", ProcessSpec(nodes=3), tmp_path, 1, None) is None
    assert ProcessLab.load() is None and pool.history == []


NO_SUCH_RANK = """\
name: {name}
cluster: {{kind: process, nodes: {nodes}}}
faults:
  - kind: process.kill
    target: {{ranks: [7]}}
    at: {{step: 10}}
"""


def test_gameday_runs_same_lab_scenarios_back_to_back_and_takes_the_lab_down(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, nodes in (("a-two", 2), ("b-three", 3), ("c-two", 2)):
        (suite / f"{name}.yaml").write_text(NO_SUCH_RANK.format(name=name, nodes=nodes))
    out = tmp_path / "night"
    t0 = time.time()
    res = run_cli("gameday", suite, "--out", out)
    assert res.code == 1, res.stderr  # every run refuses rank 7: the lab, not the drills, is what this is about
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    assert [(r["index"], r["dir"]) for r in summary["scenarios"]] == [(1, "01-a-two"), (2, "02-c-two"), (3, "03-b-three")]
    a, c, b = summary["scenarios"]
    assert a["lab"]["reused"] is False and c["lab"]["reused"] is True and "lab" not in b
    [held] = summary["labs"]
    assert held["kind"] == "process" and held["scenarios"] == ["a-two", "c-two"] and held["down_s"] is not None
    assert ProcessLab.load() is None  # nothing left behind
    assert "process lab up in" in res.stdout and "process lab down in" in res.stdout
    assert time.time() - t0 < 120


SLEEPER = """\
name: {name}
cluster: {{kind: process, nodes: 2}}
workload:
  launch: command
  command: [sleeper.py]           # never trains: the game day is stopped while it waits for steady state
steady_state: {{steps: 1, timeout: 5m}}
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 5}}
probes:
  log: [{{event: step, match: 'step (?P<step>[0-9]+)'}}]
"""


@pytest.mark.slow  # its game day, in a process of its own, starts the jobs' torchrun agents
def test_sigterm_stops_the_gameday_and_takes_its_shared_lab_down(tmp_path: Path) -> None:
    from tests.conftest import need_torch

    need_torch()  # the job's torchrun agents
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    for name in ("a-wait", "b-wait"):
        (suite / f"{name}.yaml").write_text(SLEEPER.format(name=name))
    out = tmp_path / "night"
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "gameday", str(suite), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the shared lab is up and the first run's job is on it
        assert wait_until(lambda: (lab := ProcessLab.load()) is not None and len(lab.processes()) >= 2, 120)
        lab = ProcessLab.load()
        proc.send_signal(15)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert ProcessLab.load() is None and lab.processes() == [], output  # the lab and every process of it are gone
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    assert summary["interrupted"] is True and summary["labs"][0]["down_s"] is not None
    assert [r["status"] for r in summary["scenarios"]] == ["interrupted", None]
