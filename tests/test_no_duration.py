"""Faults given no duration (issue 49, item 0): a scenario that validates must not end in an internal error.

``inproc.hang`` without ``duration`` ("for good when not given") ended every run in exit 70, ``TypeError`` at the
lease (``time.time() + None``). A lasting fault with no duration lasts until the run reverts it (recovery
measured, the job ended, ``abort_after``, Ctrl-C); its lease has no deadline and is renewed meanwhile, so its
watchdog reverts only when the controller stops renewing it.

Every kind that takes no duration is driven here without one: the in-process kinds on a real training process
through a real FaultContext (a journal, leases, the node's channel folder), ``node.poweroff`` with real power
commands; and once end to end, ``inproc.hang`` for good on the process lab.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.faults.registry import fault_kinds, get_fault
from tests.conftest import ROOT, fault_context, need_torch, run_cli, wait_exec, wait_until

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

BOOT = ROOT / "chaoskit" / "sdk" / "_boot"

DRIVEN = {"inproc.hang", "inproc.slow", "node.poweroff"}

JOB = r'''
import sys, time, torch
from chaoskit.sdk import probe
probe.worker_start()
probe.start_heartbeat(0.1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 100000):
    x = torch.randn(4, 8)
    loss = ((model(x) - 1) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    probe.step(step, loss=loss.item())
    time.sleep(0.02)
'''


def _takes_no_duration(kind: str) -> bool:
    field = get_fault(kind).Spec.model_fields.get("duration")
    return field is not None and not field.is_required() and field.default is None


def test_every_kind_that_takes_no_duration_is_driven_here():
    """A new kind whose duration may be left out must be driven without one below."""
    assert {k for k in fault_kinds() if _takes_no_duration(k)} == DRIVEN


def test_a_lease_without_a_deadline_is_renewed_until_released_and_reverts_once_stale(tmp_path):
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.safety.lease import LeaseManager

    transport = LocalTransport("n0", state_dir=str(tmp_path / "node-state"))  # not root's, which audits read
    marker = tmp_path / "reverted"
    leases = LeaseManager(tmp_path / "leases", "run-no-duration", ttl=0.5)
    try:
        kept = leases.arm(transport, "f0.0", ["/bin/sh", "-c", f"echo kept >> {marker}"], None)
        stale = leases.arm(transport, "f1.0", ["/bin/sh", "-c", f"echo stale >> {marker}"], None)
        assert kept.deadline == math.inf and stale.deadline == math.inf
        time.sleep(2.0)  # four TTLs: renewed all along, and no deadline to pass
        assert kept.fired is None and stale.fired is None and not marker.exists()
        leases.abandon("f1.0")  # the controller stops renewing it: its watchdog reverts within the TTL
        assert wait_until(lambda: stale.fired is not None, 5.0)
        assert "lease expired" in stale.fired and marker.read_text() == "stale\n"
        leases.release("f0.0")
        assert wait_until(lambda: not _watchdogs(tmp_path / "leases"), 5.0)
        assert kept.fired is None and marker.read_text() == "stale\n"
    finally:
        leases.close()


def _watchdogs(root: Path) -> list[int]:
    """The watchdogs still waiting on a lease folder under ``root``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "watchdog" in cmdline and str(root) in cmdline:
                out.append(int(entry.name))
    return out


def _steps(events: Path) -> int:
    return events.read_text().count('"kind":"step"') if events.exists() else 0


@pytest.mark.parametrize("kind,fields", [("inproc.hang", {}), ("inproc.slow", {"share": 0.5})],
                         ids=["inproc.hang", "inproc.slow"])
def test_an_in_process_fault_without_a_duration_lasts_until_the_run_reverts_it(kind, fields, tmp_path):
    """Injected without a duration, it lasts (its lease renewed, never past a deadline) until the run reverts it.
    The process cannot end a fault that has no end by itself, so the revert's end (the lease's own) kills it, its
    start time checked, and the journal says so; nothing is left in the node's channel folder nor of the lease."""
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.selectors import ProcessTarget
    from chaoskit.cluster.transports.local import LocalTransport, proc_info

    need_torch()
    transport = LocalTransport("n1", state_dir=str(tmp_path / "node-state"))
    folder = Path(transport.state_dir) / "inproc"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    script, events = tmp_path / "job.py", tmp_path / "events.jsonl"
    script.write_text(JOB)
    env = dict(os.environ, RANK="1", CHAOSKIT_EVENTS=str(events), CHAOSKIT_INPROC_DIR=str(folder),
               PYTHONPATH=os.pathsep.join([str(BOOT), str(ROOT)]), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    job = subprocess.Popen([sys.executable, str(script)], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_exec(job)
        assert wait_until(lambda: _steps(events) >= 20, 60), "the job never trained"
        fault = get_fault(kind)(get_fault(kind).Spec(kind=kind, **fields), "f0")
        assert fault.duration is None and fault.lasting
        inventory = Inventory("site", [Node("n1", conn=transport)])
        with fault_context(inventory, tmp_path, ttl=1.0) as ctx:
            [inj] = fault.inject(ctx, [ProcessTarget("n1", proc_info(job.pid))])
            lease = ctx.leases.leases[inj.fault_id]
            assert lease.deadline == math.inf
            at_fault = _steps(events)
            time.sleep(3.0)  # three TTLs
            assert lease.fired is None and job.poll() is None
            if kind == "inproc.hang":  # held for good: not one step since
                assert _steps(events) <= at_fault + 1
            else:  # slowed for good: it trains on
                assert _steps(events) > at_fault + 10
            fault.revert(ctx, inj)
            assert fault.verify(ctx, inj) is None
            ctx.leases.release(inj.fault_id)
            assert inj.detail["killed"] is True and job.wait(timeout=10) < 0
            assert lease.fired is None
        journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
        armed = [e for e in journal if e["action"] == "armed"]
        assert [(e["fault_id"], e["duration_s"]) for e in armed] == [(inj.fault_id, None)]
        assert [e["pid"] for e in journal if e["action"] == "lease.kill"] == [job.pid]
        assert sorted(os.listdir(folder)) == []
        assert wait_until(lambda: not _watchdogs(tmp_path / "leases"), 5.0)
    finally:
        if job.poll() is None:
            job.kill()
        job.wait(timeout=10)


def test_a_poweroff_without_a_duration_is_irreversible_and_arms_nothing(tmp_path):
    """node.poweroff takes no duration only with allow_irreversible: the node stays off (its power.on, which it
    has, is never run by the fault), and no lease is armed to bring it back."""
    from chaoskit.cluster.inventory import Inventory, Node, PowerCommands
    from chaoskit.cluster.selectors import resolve_nodes
    from chaoskit.cluster.transports.local import LocalTransport

    off = tmp_path / "off"  # the node is off while this file is there
    power = PowerCommands(off=[shutil.which("touch"), str(off)], on=[shutil.which("rm"), "-f", str(off)], timeout=10)
    node = Node("n1", conn=LocalTransport("n1", state_dir=str(tmp_path / "node-state")), power=power)
    inventory = Inventory("site", [node])
    fault = get_fault("node.poweroff")(get_fault("node.poweroff").Spec(
        kind="node.poweroff", target={"nodes": ["n1"]}, allow_irreversible=True), "f0")
    assert fault.duration is None and not fault.lasting
    with fault_context(inventory, tmp_path, ttl=1.0) as ctx:
        targets = resolve_nodes(inventory, fault.spec.target)
        assert "irreversible" in fault.plan(ctx, targets)[0].command
        fault.preflight(ctx, targets)
        [inj] = fault.inject(ctx, targets)
        assert ctx.leases.leases == {} and off.exists()
        assert inj.detail["on"] == power.on  # what a person runs to bring it back; nothing runs it for them
    assert not any(json.loads(line)["action"] == "armed" for line in (tmp_path / "journal.jsonl").read_text().splitlines())
    assert off.exists()


HANG_FOR_GOOD = """\
name: hang-for-good
cluster: {kind: process, nodes: 2}
workload:
  launch: reference
  steps: 130
  step_time: 50ms
  checkpoint_every: 25
  collective_timeout: 10s
faults:
  - {kind: inproc.hang, target: {ranks: [1]}, at: {step: 30}}
slo:
  detection: 12.5s
  recovery: 90s
safety: {abort_after: 4m, lease_ttl: 15s}
"""


@pytest.mark.slow
def test_inproc_hang_without_a_duration_on_the_process_lab_passes_and_leaves_nothing(tmp_path):
    """As a new user tries it: rank 1 held for good at step 30. Its peer's all-reduce times out, torchrun restarts
    the world, the job trains to its end; the fault is reverted once the job ended, verified, its lease released.
    (The hang at step 30, after the checkpoint of step 25, not at 60 of 160: issue 52. The 100 steps after the
    hang's step are kept: the order must reach rank 1 while the job still runs, and at 60 steps the job ended
    before it did on a loaded machine.)"""
    from chaoskit.safety.lease import default_lease_root
    from tests.test_drills import lab_processes

    need_torch()
    scenario = tmp_path / "hang-for-good.yaml"
    scenario.write_text(HANG_FOR_GOOD)
    out = tmp_path / "run"
    res = run_cli("run", scenario, "--out", out, "--json")
    assert res.code == 0, res.with_logs(out)
    r = res.json
    assert r["verdict"] == "pass", res.with_logs(out)
    assert r["faults"][0]["kind"] == "inproc.hang" and r["final_step"] == 130
    assert r["phases"]["detection_s"] is not None and r["phases"]["recovery_s"] is not None
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    [armed] = [e for e in journal if e["action"] == "armed"]
    assert armed["duration_s"] is None
    [reverted] = [e for e in journal if e["action"] == "reverted"]
    assert reverted["verified"] is True and reverted["problem"] is None
    assert lab_processes(r) == []
    # the hung rank's order and answer are gone from the node's channel folder; no lease, no watchdog is left
    [inject] = [e for e in journal if e["action"] == "inject"]
    folder = Path(armed["revert"][5])
    assert not [p for p in ("order", "status") if (folder / f"{p}-{inject['pid']}.json").exists()]
    leases = default_lease_root()
    assert not [p for p in leases.glob("*/*") if p.is_dir()] and not _watchdogs(leases)
