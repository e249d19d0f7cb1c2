"""Process faults on real processes: selectors stay inside the node, hangs always end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaoskit.cluster.selectors import TargetSpec, resolve_processes
from chaoskit.core.errors import InfraError
from chaoskit.faults.process import CONT_IF_SAME, HangFault, HangSpec, KillFault, KillSpec
from chaoskit.lab.process import ProcessLab
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal, read_journal
from chaoskit.safety.lease import LeaseManager
from tests.conftest import proc_state, wait_exec, wait_state


@pytest.fixture
def lab_procs():
    """A 2-node process lab with fake workers (sleep loops carrying torchrun's env), and one outsider."""
    lab = ProcessLab.create(2)
    procs = []
    for i, node in enumerate(lab.node_names()):
        for local in range(2):
            env = dict(os.environ, CHAOSKIT_SCOPE=lab.scope(node), RANK=str(i * 2 + local), TORCHELASTIC_RUN_ID="t")
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # worker"], env=env))
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # worker"],
                                env=dict(os.environ, RANK="1", TORCHELASTIC_RUN_ID="t"))
    for p in procs + [outsider]:
        wait_exec(p)
    time.sleep(0.2)
    yield lab, procs, outsider
    for p in procs + [outsider]:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()
    lab.kill_all()


def _pids(targets):
    return [t.pid for t in targets]


def test_selectors(lab_procs):
    lab, procs, outsider = lab_procs
    inv = lab.inventory()
    assert _pids(resolve_processes(inv, TargetSpec(ranks=[1]))) == [procs[1].pid]
    assert _pids(resolve_processes(inv, TargetSpec(nodes=["n1"]))) == [procs[2].pid, procs[3].pid]
    assert _pids(resolve_processes(inv, TargetSpec(labels={"rack": "r0"}, count=3))) == [p.pid for p in procs[:3]]
    assert len(resolve_processes(inv, TargetSpec(percent=50))) == 2
    assert _pids(resolve_processes(inv, TargetSpec(pid=procs[2].pid))) == [procs[2].pid]
    assert resolve_processes(inv, TargetSpec(nodes=["n0"], pid=procs[2].pid)) == []
    matched = resolve_processes(inv, TargetSpec(process=r"time\.sleep\(600\)"))
    assert outsider.pid not in _pids(matched) and len(matched) == 4
    assert resolve_processes(inv, TargetSpec(pid=outsider.pid)) == []


def test_local_transport_refuses_processes_outside_the_node(lab_procs):
    lab, procs, outsider = lab_procs
    transport = lab.inventory()["n0"].conn
    with pytest.raises(InfraError, match="not a process of node n0"):
        transport.signal(outsider.pid, signal.SIGKILL)
    with pytest.raises(InfraError):
        transport.signal(procs[3].pid, signal.SIGKILL)  # a process of n1
    assert outsider.poll() is None and procs[3].poll() is None


def test_kill_with_any_signal(lab_procs, tmp_path):
    lab, procs, _ = lab_procs
    inv = lab.inventory()
    ctx = RunContext(inv)
    fault = KillFault(KillSpec(kind="process.kill", target=TargetSpec(ranks=[2]), signal="TERM"), "f0")
    targets = resolve_processes(inv, fault.spec.target)
    assert [a.command for a in fault.plan(ctx, targets)] == [f"kill -s TERM {procs[2].pid}"]
    before = time.time()
    [inj] = fault.inject(ctx, targets)
    assert before <= inj.t_fault <= time.time()
    assert procs[2].wait(timeout=5) == -signal.SIGTERM
    assert fault.verify(ctx, inj) is None
    assert all(p.poll() is None for i, p in enumerate(procs) if i != 2)


def test_hang_is_reverted_by_the_controller(lab_procs, tmp_path):
    lab, procs, _ = lab_procs
    inv = lab.inventory()
    journal = Journal(tmp_path / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", "run1", ttl=5)
    ctx = RunContext(inv, journal, leases)
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(ranks=[0]), duration=30), "f0")
    [inj] = fault.inject(ctx, resolve_processes(inv, fault.spec.target))
    assert wait_state(procs[0].pid, lambda s: s == "T")
    entries = read_journal(tmp_path / "journal.jsonl")
    # the watchdog's SIGCONT carries the pid's start time: a pid reused by then is left alone
    with open(f"/proc/{procs[0].pid}/stat", "rb") as fh:
        stat = fh.read()
    start = stat[stat.rfind(b")") + 2:].split()[19].decode()
    assert entries[0]["action"] == "armed" and entries[0]["revert"] == [sys.executable, "-I", "-c", CONT_IF_SAME,
                                                                        str(procs[0].pid), start]
    fault.revert(ctx, inj)
    leases.release(inj.fault_id)
    assert wait_state(procs[0].pid, lambda s: s in ("S", "R"))
    assert fault.verify(ctx, inj) is None
    time.sleep(0.3)
    lease_dir = Path(leases.root / inj.fault_id)
    assert not (lease_dir / "fired").exists()  # released: the watchdog stood down
    leases.close()
    journal.close()


def test_hang_ends_at_its_duration_even_without_the_controller(lab_procs, tmp_path):
    lab, procs, _ = lab_procs
    inv = lab.inventory()
    leases = LeaseManager(tmp_path / "leases", "run2", ttl=60)
    ctx = RunContext(inv, Journal(tmp_path / "j.jsonl"), leases)
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(ranks=[3]), duration=1.0), "f0")
    [inj] = fault.inject(ctx, resolve_processes(inv, fault.spec.target))
    assert wait_state(procs[3].pid, lambda s: s == "T")
    assert wait_state(procs[3].pid, lambda s: s in ("S", "R"), timeout=3)  # the watchdog's deadline
    end = time.time() + 2
    while not (leases.root / inj.fault_id / "fired").exists() and time.time() < end:
        time.sleep(0.02)
    fired = (leases.root / inj.fault_id / "fired").read_text()
    assert "deadline" in fired
    leases.close()


CONTROLLER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from chaoskit.cluster.selectors import TargetSpec
    from chaoskit.faults.process import HangFault, HangSpec
    from chaoskit.lab.process import ProcessLab
    from chaoskit.cluster.selectors import resolve_processes
    from chaoskit.session import RunContext  # not the runner's re-export: importing the runner took seconds
    from chaoskit.safety.journal import Journal
    from chaoskit.safety.lease import LeaseManager
    lab = ProcessLab(sys.argv[1], 2)
    inv = lab.inventory()
    leases = LeaseManager(Path(sys.argv[2]), "run3", ttl=1.0)
    ctx = RunContext(inv, Journal(Path(sys.argv[2]) / "j.jsonl"), leases)
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(ranks=[1]), duration=300), "f0")
    fault.inject(ctx, resolve_processes(inv, fault.spec.target))
    print("injected", flush=True)
    time.sleep(600)
""")


def test_hang_ends_when_the_controller_dies(lab_procs, tmp_path):
    """SIGKILL the controller mid-fault: the lease goes stale and the node reverts by itself."""
    lab, procs, _ = lab_procs
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, lab.lab_id, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert ctl.stdout.readline().strip() == "injected"
    assert wait_state(procs[1].pid, lambda s: s == "T")
    time.sleep(0.5)
    assert proc_state(procs[1].pid) == "T"  # still renewed while the controller lives
    ctl.kill()
    ctl.wait()
    killed = time.time()
    assert wait_state(procs[1].pid, lambda s: s in ("S", "R"), timeout=5)
    assert time.time() - killed < 1.0 + 2.0  # TTL + slack
    fired = tmp_path / "run3" / "f0.0" / "fired"
    end = time.time() + 2
    while not fired.exists() and time.time() < end:  # written just after the revert ran
        time.sleep(0.02)
    assert "lease expired" in fired.read_text()
