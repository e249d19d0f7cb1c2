"""End-to-end drills: the shipped scenarios against a real torchrun job on the process lab.

kill-rank is run here as a new user runs it (``chaoskit run``, to the end of training). hang-rank and
kill-uninstrumented are drilled once for the session, in the game day of tests/drill_fixtures.py, and the tests here
read their run folders (a game day stops each drill once recovery is measured: what needs a run to its end is
kill-rank's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.cluster.transports.local import read_proc
from chaoskit.core.accounts import LAB_ACCOUNT
from tests.conftest import ROOT, SCENARIOS, need_torch, proc_state, run_cli, lab_fixture

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.drill_fixtures"]


def lab_processes(result: dict) -> list:
    """Live processes of the lab the run used (other runs may be going on beside this one)."""
    prefix = result["cluster"]["id"] + "."
    return [p for p in read_proc() if p.env.get("CHAOSKIT_SCOPE", "").startswith(prefix) and p.state != "Z"]


@lab_fixture(scope="module")
def kill_rank(tmp_path_factory):
    """kill-rank as a new user runs it: from a folder of their own, no --out (reports/<time>-kill-rank/).

    The shipped file as written, to its 200th step: the one drill of kill-rank's own form (tests/test_repeat.py and
    tests/test_job_isolation.py drill short forms of it, saying so); its time is mostly the DDP workers' start-ups."""
    need_torch()
    home = tmp_path_factory.mktemp("user")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)
        res = run_cli("run", SCENARIOS / "kill-rank.yaml", "--json")
    [out] = (home / "reports").iterdir()
    assert out.name.endswith("-kill-rank") and res.json["run_dir"] == str(out)
    return res, out


def test_kill_rank_measures_every_phase(kill_rank):
    res, out = kill_rank
    assert res.code == 0, res.stderr
    r = res.json
    assert r["verdict"] == "pass"
    p = r["phases"]
    for key in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert p[key] is not None and p[key] >= 0, key
    assert p["detection_s"] + p["reallocation_s"] + p["checkpoint_load_s"] <= p["recovery_s"]
    assert 0 <= p["lost_steps"] <= r["workload"]["checkpoint_every"]
    assert r["final_step"] == r["workload"]["steps"]  # training reached its last step
    assert all(v["pass"] for v in r["slo"].values())
    assert r["faults"][0]["kind"] == "process.kill" and r["faults"][0]["targets"] == ["n1/rank1"]


def test_kill_rank_writes_the_run_directory(kill_rank):
    _, out = kill_rank
    result = json.loads((out / "result.json").read_text())
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    kinds = {e["kind"] for e in events}
    assert {"fault.injected", "worker.start", "worker.exit", "ckpt.load.end", "step", "process.gone"} <= kinds
    assert all({"ts", "kind"} <= e.keys() for e in events)
    journal = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    assert [j["action"] for j in journal] == ["inject", "injected"]
    assert abs(journal[1]["t_fault"] - result["faults"][0]["t_fault"]) < 1e-6
    assert sorted(x.name for x in (out / "logs").iterdir()) == ["n0.log", "n1.log", "n2.log"]
    # torch's compile cache (made when DDP imports torch._dynamo) is the run's, not /tmp/torchinductor_<user>,
    # a guessable name in a world-writable folder that another user could have made first; a job of the lab's
    # account keeps it in its own folder beside the run's (RUN.job), removed with its checkpoints at the end
    if result["cluster"].get("job_user", "root") == "root":
        assert (out / "torchinductor").is_dir() and not (out / "torchinductor").is_symlink()
    else:
        assert not (out / "torchinductor").exists() and not out.with_name(out.name + ".job").exists()


def _ran_as_a_lab_account(result: dict, what: str) -> None:
    """As root, the drill's job ran as a lab account, by what its processes were when it trained (issue 48):
    pytest's folders are the lab accounts' group's (tests/conftest.py), so nothing kept it root."""
    if os.geteuid() != 0:
        pytest.skip("not root: the job is this user's own")
    cluster = result["cluster"]
    assert cluster["job_user"].startswith(LAB_ACCOUNT) and "job_user_why" not in cluster, (what, cluster)
    assert cluster["job_process_users"] == [cluster["job_user"]], (what, cluster)


def test_kill_rank_job_ran_as_the_lab_account(kill_rank):
    _ran_as_a_lab_account(kill_rank[0].json, "kill-rank")


def test_the_game_days_jobs_ran_as_the_lab_account(recorded_gameday):
    for name in ("hang-rank", "kill-uninstrumented"):
        _ran_as_a_lab_account(recorded_gameday.result(name), name)


ADDED_SINCE = (
    ".goodput",  # issue 50 item 6: the run's lost time in ml-goodput-measurement's buckets
    ".cluster.job_user", ".cluster.job_isolation", ".cluster.netns",  # issue 48: whom the job ran as, and where
    ".workload.env",  # issue 51: the variables a scenario sets or unsets
    ".phases.restored_from", ".per_fault[].restored_from", ".per_fault[].reallocation_from",  # issue 51: sources
    ".checks.steady_state.restarts",  # issue 51: restarts before the first fault (and restarts_allowed)
    ".blame", ".per_fault[].blame",  # issue 50 item 3: whom the stack named as failed, against the truth
    ".cluster.job_process_users",  # issue 48: whom the job's processes ran as, read off the nodes
)
"""Key paths added on purpose since the recordings (prefixes), each with the issue that added it."""


def test_kill_rank_gives_the_result_json_recorded_before_the_house_was_rebuilt(kill_rank):
    """No behaviour change: the same scenario gives a result.json of the same shape (every key path, and whether an
    object, an array or a value is there) as the one recorded at 983eff0, before the Job contract, the launch table
    and the transports' split (``tests/data/result-shape/kill-rank.json``, made with ``tests/result_shape.py``).
    A key added on purpose since is named here."""
    from tests.result_shape import shape_json

    _, out = kill_rank
    recorded = json.loads((ROOT / "tests" / "data" / "result-shape" / "kill-rank.json").read_text())
    now = shape_json(json.loads((out / "result.json").read_text()))
    assert {k: v for k, v in now.items() if not k.startswith(ADDED_SINCE)} == recorded


def test_kill_rank_writes_its_keys_in_the_order_of_the_run_recorded_before_the_result_model(kill_rank):
    """No behaviour change from ``core/result.RunResult``: the same scenario's result.json has the keys, in the same
    order, of a real kill-rank run recorded with the runner before the model (``tests/data/result/kill-rank.json``,
    recorded at 524fc79); and it reads back into the model and writes out byte for byte."""
    from chaoskit.core.result import RunResult
    from tests.result_shape import key_order, shape_json

    _, out = kill_rank
    text = (out / "result.json").read_text()
    before = json.loads((ROOT / "tests" / "data" / "result" / "kill-rank.json").read_text())
    assert [k for k in key_order(json.loads(text)) if not k.startswith(ADDED_SINCE)] == key_order(before)
    assert {k: v for k, v in shape_json(json.loads(text)).items() if not k.startswith(ADDED_SINCE)} == shape_json(before)
    assert RunResult.model_validate(json.loads(text)).text() == text


def test_a_run_leaves_no_process_behind(kill_rank):
    assert lab_processes(kill_rank[0].json) == []


def test_hang_rank_is_detected_at_the_collective_timeout(recorded_gameday):
    assert recorded_gameday.record("hang-rank")["exit_code"] == 0, recorded_gameday.res.stdout[-3000:]
    r, out = recorded_gameday.result("hang-rank"), recorded_gameday.run_dir("hang-rank")
    timeout = r["workload"]["collective_timeout"]
    assert abs(r["phases"]["detection_s"] - timeout) <= 0.25 * timeout
    assert r["phases"]["recovery_s"] is not None
    assert r["checks"]["faults_reverted"]["pass"]
    journal = [json.loads(x)["action"] for x in (out / "journal.jsonl").read_text().splitlines()]
    assert journal.index("armed") < journal.index("injected") < journal.index("reverted")
    assert lab_processes(r) == []


def test_uninstrumented_job_is_measured_from_logs_alone(recorded_gameday):
    assert recorded_gameday.record("kill-uninstrumented")["exit_code"] == 0, recorded_gameday.res.stdout[-3000:]
    r, out = recorded_gameday.result("kill-uninstrumented"), recorded_gameday.run_dir("kill-uninstrumented")
    for key in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s", "lost_steps"):
        assert r["phases"][key] is not None, key
    assert not (out / "sdk-events.jsonl").exists()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert {e["source"] for e in events if e["kind"] != "process.gone"} <= {"log", "torchrun", "chaoskit"}
    assert "torchrun agent" in r["phases"]["detected_by"]


# A job under torchrun whose workers step with chaoskit's SDK and never import torch: the job of the drills below,
# which hang rank 2 for 5 minutes and end the run before the hang does (abort_after, Ctrl-C, a killed controller).
# What they prove is chaoskit's (the revert, the exit, the teardown, nothing left), not the job's recovery; a DDP
# worker's start-up (importing torch, and torch._dynamo when DDP wraps the model: 5.8 s alone at load 18) would be
# most of their time.
STEPPER = """\
import time
from chaoskit import probe
probe.worker_start()
step = 0
while True:
    step += 1
    time.sleep(0.05)
    probe.step(step)
"""

HANG = """\
name: hang
cluster: lab
workload:
  launch: command
  command: [stepper.py]
faults:
  - kind: process.hang
    target: {{ranks: [2]}}
    duration: 5m
    at: {{step: 5}}
safety:
  max_nodes: 1
  abort_after: {abort_after}
  lease_ttl: {lease_ttl}
"""


def _hang_scenario(folder: Path, abort_after: str = "4m", lease_ttl: str = "15s") -> Path:
    """A scenario hanging rank 2 of the stepper job (above) for 5 minutes from its step 5, written in ``folder``."""
    need_torch()  # torchrun
    (folder / "stepper.py").write_text(STEPPER)
    scenario = folder / "hang.yaml"
    scenario.write_text(HANG.format(abort_after=abort_after, lease_ttl=lease_ttl))
    return scenario


def test_abort_after_reverts_and_exits_4(tmp_path):
    """abort_after counts from the run's start, so it must outlast the job's start-up and its first 5 steps on a
    loaded machine for the abort to come while the hang (5 minutes) lasts. The job is a real torchrun job on the
    process lab whose workers never import torch: a DDP worker's start-up (importing torch, and torch._dynamo when
    DDP wraps the model) took 21.7 s to the injection at load 14 on 2 cores (40 s: 1.8 times that), this one's 7-9 s
    at load 13-25 and 15.7 s at load 30; so 30 s holds the property at least as widely as 40 s did (issue 52)."""
    res = run_cli("run", _hang_scenario(tmp_path, abort_after="30s"), "--out", tmp_path / "run", "--json")
    assert res.code == 4, res.stderr
    r = res.json
    assert r["verdict"] == "aborted"
    assert any("abort_after" in n for n in r["notes"])
    journal = [json.loads(x)["action"] for x in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    assert "injected" in journal and "reverted" in journal
    assert lab_processes(r) == []


def test_ctrl_c_reverts_before_exit_and_a_second_one_waits_for_the_teardown(tmp_path):
    scenario = _hang_scenario(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(scenario), "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    journal = run_dir / "journal.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (journal.exists() and "injected" in journal.read_text()):
        time.sleep(0.2)
    assert "injected" in journal.read_text()
    entries = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [e["action"] for e in entries] == ["inject", "armed", "injected"]
    proc.send_signal(signal.SIGINT)
    # Ctrl-C again as soon as the revert is journaled: it lands in the teardown (stopping the job, the lab),
    # which must finish before the run stops, or the job's processes are left behind
    while proc.poll() is None and '"reverted"' not in journal.read_text():
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: finishing the teardown first (2 more to abandon it)" in out
    actions = [json.loads(x)["action"] for x in journal.read_text().splitlines()]
    assert actions[-1] == "reverted"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["verdict"] == "interrupted"
    assert lab_processes(result) == []


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path):
    before = {p.pid for p in read_proc()}
    res = run_cli("run", SCENARIOS / "kill-rank.yaml", "--dry-run", "--out", tmp_path / "run")
    assert res.code == 0, res.stderr
    assert "kill -s KILL <pid of rank 1>" in res.stdout
    assert "torch.distributed.run" in res.stdout
    assert not (tmp_path / "run").exists()
    assert [p for p in read_proc() if p.pid not in before and "torch" in p.cmdline] == []
    res = run_cli("run", SCENARIOS / "hang-rank.yaml", "--dry-run", "--json")
    plan = res.json["plan"][0]
    assert plan["kind"] == "process.hang" and plan["nodes"] == ["n0", "n1", "n2"]
    assert [a["command"] for a in plan["actions"]][1] == "kill -s STOP <pid of rank 2>"


def test_rollback_after_the_controller_is_killed(tmp_path):
    """SIGKILL chaoskit mid-hang: `chaoskit rollback` reverts the fault and stops the lab it left."""
    scenario = _hang_scenario(tmp_path, lease_ttl="2m")  # rollback, not the lease, must be what reverts it
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(scenario), "--out", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    journal = run_dir / "journal.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (journal.exists() and "injected" in journal.read_text()):
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    armed = next(json.loads(x) for x in journal.read_text().splitlines() if '"armed"' in x)
    pid = int(armed["revert"][-2])  # python3 -I -c CONT_IF_SAME PID START_TIME
    state = lambda: proc_state(pid)  # noqa: E731
    assert state() == "T"
    [marker] = (Path(os.environ["CHAOSKIT_STATE_DIR"]) / "runs").glob("*.json")
    lab = {"cluster": {"id": json.loads(marker.read_text())["lab"]}}
    assert lab_processes(lab) != []  # the crashed run left its job running
    res = run_cli("rollback", "--json")
    assert res.code == 0, res.stderr
    [run] = res.json["runs"]
    assert [f["ok"] for f in run["faults"]] == [True]
    assert run["lab"] and "stopped" in run["lab"]
    assert state() != "T"
    actions = [json.loads(x)["action"] for x in journal.read_text().splitlines()]
    assert actions[-1] == "reverted"
    assert lab_processes(lab) == []
    assert not marker.exists()
    assert run_cli("rollback").stdout.startswith("nothing to roll back")

