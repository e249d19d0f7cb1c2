"""``workload.env``: the environment chaoskit gives a job is shown by ``--dry-run`` and can be changed by the
scenario (set, or unset with null), within bounds and never for what chaoskit owns; the torchrun store is shared
where a recovery stack needs it (torchft's Manager finds it at MASTER_ADDR:MASTER_PORT) and the plan says why."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import need, need_torch, run_cli

SHARE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _scenario(folder: Path, workload: str, name: str = "env-drill") -> Path:
    """A process-lab scenario whose ``workload:`` block is ``workload`` (indented two spaces), with a train.py."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("print('hi')\n")
    path = folder / "drill.yaml"
    path.write_text(f"name: {name}\ncluster: {{kind: process, nodes: 2}}\nworkload:\n{textwrap.indent(workload, '  ')}"
                    "faults:\n  - kind: process.kill\n    target: {nodes: [n1]}\n    at: {step: 20}\n"
                    "probes:\n  log:\n    - {event: step, match: 'step (?P<step>[0-9]+)'}\n")
    return path


def _plan(path: Path) -> dict:
    res = run_cli("run", path, "--dry-run", "--json")
    assert res.code == 0, res.stderr
    return res.json


def test_the_dry_run_shows_the_jobs_environment_and_the_scenarios_changes(tmp_path):
    path = _scenario(tmp_path, "launch: command\ncommand: [train.py]\n"
                               "env: {HF_HUB_OFFLINE: '1', OMP_NUM_THREADS: 4, HTTPS_PROXY: null}\n")
    env = _plan(path)["env"]
    for node in ("n0", "n1"):
        given = env["nodes"][node]
        assert given["HF_HUB_OFFLINE"] == "1" and given["OMP_NUM_THREADS"] == "4"  # a YAML number as written
        assert given["CHAOSKIT_NODE"] == node and given["CHAOSKIT_SCOPE"].endswith(node)
        assert "HTTPS_PROXY" not in given and given[SHARE] == "1"  # plain torchrun: the old, per-round store
    assert env["unset"] == ["HTTPS_PROXY"]
    assert env["why"]["HF_HUB_OFFLINE"] == "workload.env" and env["why"]["OMP_NUM_THREADS"] == "workload.env"
    assert "init_process_group" in env["rdzv_store"] and "torch 2.13" in env["rdzv_store"]
    text = run_cli("run", path, "--dry-run")
    assert text.code == 0, text.stderr
    assert "HF_HUB_OFFLINE=1  (workload.env)" in text.stdout and "HTTPS_PROXY unset" in text.stdout
    assert f"{SHARE}=1" in text.stdout and "rendezvous store:" in text.stdout


def test_torchft_shares_the_store_and_a_scenario_can_undo_the_default(tmp_path):
    ft = _plan(_scenario(tmp_path / "ft", "launch: command\nrecovery: torchft\ncommand: [train.py]\n"))["env"]
    assert all(SHARE not in e for e in ft["nodes"].values())
    assert ft["rdzv_store"].startswith("shared") and "MASTER_ADDR:MASTER_PORT" in ft["rdzv_store"]
    mine = _plan(_scenario(tmp_path / "own", f"launch: command\ncommand: [train.py]\nenv: {{{SHARE}: null}}\n"))["env"]
    assert all(SHARE not in e for e in mine["nodes"].values()) and mine["unset"] == [SHARE]
    assert mine["rdzv_store"].startswith("as workload.env says (unset)")


@pytest.mark.parametrize("env, line, says", [
    ("{CHAOSKIT_SCOPE: mine}", 7, "CHAOSKIT_SCOPE is chaoskit's own"),
    ("{chaoskit_events: /tmp/x}", 7, "is chaoskit's own"),
    ("{'1BAD': x}", 7, "invalid variable name '1BAD'"),
    ("{'A-B': x}", 7, "invalid variable name"),
    ("{LONG: '" + "x" * 4097 + "'}", 7, "at most 4096"),
    ("{FLAG: true}", 7, "quote 'true'"),
    ("{LD_PRELOAD: /tmp/evil.so}", 7, "LD_PRELOAD changes what code the job's processes load"),
    ("{PYTHONPATH: null}", 7, "the site policy's env does not name it"),
])
def test_a_bad_or_forbidden_variable_is_refused_at_its_line(tmp_path, env, line, says):
    path = _scenario(tmp_path, f"launch: command\ncommand: [train.py]\nenv:\n  {env[1:-1]}\n")
    res = run_cli("validate", path)
    assert res.code == 2, res.stdout + res.stderr
    assert f"{path}:{line}:" in res.stderr and says in res.stderr, res.stderr
    res = run_cli("run", path, "--out", tmp_path / "run")
    assert res.code == 2 and not (tmp_path / "run").exists()  # nothing started


def test_a_recovery_stacks_own_variables_are_refused_under_it(tmp_path):
    path = _scenario(tmp_path / "ft", "launch: command\nrecovery: torchft\ncommand: [train.py]\n"
                                      "env:\n  REPLICA_GROUP_ID: '3'\n")
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:8:" in res.stderr and "chaoskit under recovery: torchft" in res.stderr
    nvrx = _scenario(tmp_path / "nvrx", "recovery: nvrx\nenv: {TMPDIR: /tmp}\n")
    res = run_cli("validate", nvrx)
    assert res.code == 2 and "TMPDIR is set by chaoskit under recovery: nvrx" in res.stderr
    assert run_cli("validate", _scenario(tmp_path / "plain", "env: {TMPDIR: /scratch/tmp}\n")).code == 0
    many = "{" + ", ".join(f"V{i}: x" for i in range(65)) + "}"
    res = run_cli("validate", _scenario(tmp_path / "many", f"env: {many}\n"))
    assert res.code == 2 and "64" in res.stderr
    res = run_cli("validate", _scenario(tmp_path / "ray", "launch: ray-train\nenv: {A: b}\n"))
    assert res.code == 2 and "'env' is only used with a job chaoskit starts" in res.stderr


def test_the_site_policy_allows_pythonpath(tmp_path, monkeypatch):
    need(os.geteuid() == 0, "root (a site policy file is root's)")
    folder = tmp_path / "etc-chaoskit"
    folder.mkdir()
    os.chmod(folder, 0o755)
    policy = folder / "policy.yaml"
    policy.write_text("env: [PYTHONPATH]\n")
    os.chmod(policy, 0o644)
    path = _scenario(tmp_path / "s", "env: {PYTHONPATH: /srv/libs, LD_PRELOAD: x.so}\n")
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(policy))
    res = run_cli("validate", path)
    assert res.code == 2 and "LD_PRELOAD" in res.stderr and "it names PYTHONPATH" in res.stderr, res.stderr
    path = _scenario(tmp_path / "s", "env: {PYTHONPATH: /srv/libs}\n")
    assert run_cli("validate", path).code == 0


# torchft's own example (torchft/train_ddp.py): the Manager is given no store, so it connects to MASTER_ADDR:
# MASTER_PORT, which only torchrun's shared rendezvous store hosts. It prints what workload.env gave it.
OWN_STORE = """\
import logging, os, sys, time
from datetime import timedelta
import torch
from torchft import Manager, Optimizer, ProcessGroupGloo

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
print(f"env MY_MARK={os.environ.get('MY_MARK')} CK_GONE={'CK_GONE' in os.environ}", flush=True)
group = int(os.environ["REPLICA_GROUP_ID"])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
inner = torch.optim.SGD(model.parameters(), lr=0.01)
timeout = timedelta(seconds=10)
manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                  load_state_dict=lambda s: (model.load_state_dict(s["model"]), inner.load_state_dict(s["optim"])),
                  state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
                  replica_id=f"train_ddp_{group}", timeout=timeout)
optimizer = Optimizer(manager, inner)
while manager.current_step() < int(sys.argv[1]):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    for p in model.parameters():
        manager.allreduce(p.grad).wait()
    optimizer.step()
    time.sleep(0.1)
manager.shutdown(wait=False)
"""


@pytest.mark.slow
def test_torchfts_own_example_reaches_steady_state_and_recovers(tmp_path, monkeypatch):
    """A real drill (about 15 s): torchft's Manager finds torchrun's store, both groups commit steps, a killed group
    heals; the job got workload.env's variable and not the one it unsets. On the old code it hung 300 s in the
    Manager's store client and the run ended with exit 3 (no steady state)."""
    need_torch()
    need(Path(os.sys.executable).with_name("torchft_lighthouse").exists(), "torchft (pip install 'chaoskit[frameworks]')")
    monkeypatch.setenv("CK_GONE", "inherited")
    (tmp_path / "own_ft.py").write_text(OWN_STORE)
    path = tmp_path / "ft.yaml"
    path.write_text(textwrap.dedent("""\
        name: torchft-own-store
        cluster: {kind: process, nodes: 2}
        workload:
          launch: command
          recovery: torchft
          command: [own_ft.py, "60"]
          env: {MY_MARK: drill-42, CK_GONE: null}
        probes: {presets: [torchrun, torchft]}
        steady_state: {steps: 5, timeout: 60s}
        faults:
          - kind: process.kill
            target: {nodes: [n1]}
            at: {step: 10}
        slo: {detection: 15s, recovery: 30s}
        safety: {max_nodes: 1, abort_after: 3m}
        """))
    res = run_cli("run", path, "--out", tmp_path / "run", "--json")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res.code == 0, res.with_logs(tmp_path / "run")
    assert result["verdict"] == "pass" and result["phases"]["recovery_s"] is not None
    for node in ("n0", "n1"):
        log = (tmp_path / "run" / "logs" / f"{node}.log").read_text()
        assert "env MY_MARK=drill-42 CK_GONE=False" in log and "should_commit=True" in log
