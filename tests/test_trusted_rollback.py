"""``chaoskit rollback`` runs only what chaoskit armed, and no password is written down.

Real processes (a process lab's worker, frozen by a real ``process.hang``), real files, the real
CLI. The journal rollback trusts is chaoskit's own (0600, in a 0700 folder of its state); the run
folder's copy is for people, and whatever is written there is never run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.cluster.inventory import Inventory, Node, PowerCommands
from chaoskit.cluster.selectors import NodeTarget, TargetSpec, resolve_processes
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.state import private_dir, state_dir
from chaoskit.faults.memory import MEMORY_TOOL
from chaoskit.faults.network import QDISC_HANDLE
from chaoskit.faults.power import PowerOffFault, PowerOffSpec
from chaoskit.faults.process import CONT_IF_SAME, HangFault, HangSpec
from chaoskit.faults.registry import get_fault
from chaoskit.lab.process import ProcessLab
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal, read_journal
from chaoskit.safety.lease import LeaseManager
from chaoskit.safety.rollback import rollback_journal
from tests.conftest import run_cli, wait_exec, wait_state


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def crashed(tmp_path):
    """A run that froze a real worker (process.hang) and died: its marker, its trusted journal, its run folder."""
    lab = ProcessLab.create(1)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # worker"],
                              env=dict(os.environ, CHAOSKIT_SCOPE=lab.scope("n0"), RANK="0", TORCHELASTIC_RUN_ID="t"))
    wait_exec(worker)
    time.sleep(0.2)
    run_id, run_dir = "r-crashed", tmp_path / "run"
    run_dir.mkdir(mode=0o750)
    journal = Journal(private_dir("runs", run_id) / "journal.jsonl", copy=run_dir / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", run_id, ttl=120)
    inventory = lab.inventory()
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(ranks=[0]), duration=300), "f0")
    fault.inject(RunContext(inventory, journal, leases), resolve_processes(inventory, fault.spec.target))
    journal.close()
    _controller_dies(leases)
    assert wait_state(worker.pid, lambda s: s == "T")
    marker = state_dir() / "runs" / f"{run_id}.json"
    marker.write_text(json.dumps({"pid": _dead_pid(), "run_dir": str(run_dir), "lab": lab.lab_id, "kind": "process"}))
    yield run_id, run_dir, worker
    worker.kill()
    worker.wait()
    leases.close()


def _controller_dies(leases: LeaseManager) -> None:
    """Nothing renews the leases any more, and their files stay: the watchdogs wait out the (long) TTL."""
    leases._stop.set()
    if leases._thread:
        leases._thread.join(timeout=2)


def _evil(canary: Path, fault_id: str = "evil", kind: str = "process.hang") -> str:
    return json.dumps({"ts": time.time(), "action": "armed", "fault_id": fault_id, "kind": kind, "node": "n0",
                       "revert": ["sh", "-c", f"touch {canary}"], "on": "controller"}) + "\n"


def test_the_trusted_journal_is_private_and_the_run_folder_keeps_a_copy(crashed):
    run_id, run_dir, _ = crashed
    trusted = state_dir() / "runs" / run_id / "journal.jsonl"
    assert stat.S_IMODE(os.stat(trusted.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(trusted).st_mode) == 0o600
    # the copy is the journal less its private fields (the armed command's digest)
    private = [{k: v for k, v in e.items() if k != "revert_sha256"} for e in read_journal(trusted)]
    assert private == read_journal(run_dir / "journal.jsonl")
    assert [e["action"] for e in read_journal(trusted)] == ["armed"] and "revert_sha256" in read_journal(trusted)[0]


def test_a_tampered_run_folder_journal_runs_nothing_and_the_real_fault_is_still_rolled_back(crashed, tmp_path):
    run_id, run_dir, worker = crashed
    canary = tmp_path / "injected-argv-ran"
    copy = run_dir / "journal.jsonl"
    entries = copy.read_text().splitlines()
    real = json.loads(entries[0])
    real["revert"] = ["sh", "-c", f"touch {canary}"]  # the real fault's revert rewritten
    copy.write_text(json.dumps(real) + "\n" + _evil(canary))
    res = run_cli("rollback", "--json")
    assert res.code == 0, res.stderr
    [run] = res.json["runs"]
    assert [(f["fault_id"], f["ok"]) for f in run["faults"]] == [("f0.0", True)]
    assert wait_state(worker.pid, lambda s: s in ("S", "R"))  # thawed by chaoskit's own revert
    assert not canary.exists()
    assert json.loads(copy.read_text().splitlines()[-1])["action"] == "reverted"  # people see it in the copy
    assert not (state_dir() / "runs" / run_id).exists()  # done: nothing left to roll back
    assert run_cli("rollback").stdout.startswith("nothing to roll back")


def test_a_run_folder_journal_with_no_trusted_journal_runs_nothing(tmp_path):
    canary = tmp_path / "injected-argv-ran"
    run_dir = tmp_path / "someone-elses-run"
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text(_evil(canary))
    (state_dir() / "runs").mkdir(parents=True, exist_ok=True)
    (state_dir() / "runs" / "r-forged.json").write_text(json.dumps({"pid": _dead_pid(), "run_dir": str(run_dir), "lab": "lab-x", "kind": "process"}))
    res = run_cli("rollback", "--json")
    assert res.code == 0, res.stderr
    assert [r["faults"] for r in res.json["runs"]] == [[]]
    assert not canary.exists()


def test_a_trusted_journal_others_could_write_is_refused_whole(crashed, tmp_path):
    run_id, _, worker = crashed
    canary = tmp_path / "injected-argv-ran"
    trusted = state_dir() / "runs" / run_id / "journal.jsonl"
    with open(trusted, "a") as fh:
        fh.write(_evil(canary))
    os.chmod(trusted, 0o666)
    res = run_cli("rollback")
    assert res.code == 3, res.stderr
    assert "can be written by others" in res.stderr
    assert not canary.exists()
    assert wait_state(worker.pid, lambda s: s == "T", timeout=1)  # nothing ran from it


def test_an_unknown_kind_in_the_journal_is_not_run(crashed, tmp_path):
    run_id, _, worker = crashed
    canary = tmp_path / "injected-argv-ran"
    with open(state_dir() / "runs" / run_id / "journal.jsonl", "a") as fh:
        fh.write(_evil(canary, kind="shell.anything"))
    res = run_cli("rollback", "--json")
    assert res.code == 3
    [run] = res.json["runs"]
    outcome = {f["fault_id"]: f for f in run["faults"]}
    assert outcome["f0.0"]["ok"] and not outcome["evil"]["ok"]
    assert "not a fault kind chaoskit knows" in outcome["evil"]["problem"]
    assert not canary.exists()
    assert wait_state(worker.pid, lambda s: s in ("S", "R"))


BMC = """#!/bin/sh
# A stand-in BMC (no BMC here): `bmc -U admin -P PASSWORD on|off|status` against a state file.
[ "$4" = "s3cret-pw" ] || { echo "bad password $4" >&2; exit 1; }
case "$5" in
  on|off) echo "$5" > "$(dirname "$0")/power" ;;
  status) [ "$(cat "$(dirname "$0")/power")" = on ] ;;
esac
"""


def _powered_off_by_a_dead_run(tmp_path):
    """n0 powered off through the stand-in BMC by a run whose controller then died: what rollback finds."""
    bmc = tmp_path / "bmc"
    bmc.write_text(BMC)
    bmc.chmod(0o755)
    (tmp_path / "power").write_text("on\n")
    argv = [str(bmc), "-U", "admin", "-P", "s3cret-pw"]
    power = PowerCommands(off=argv + ["off"], on=argv + ["on"], status=argv + ["status"])
    node = Node("n0", "127.0.0.1", "local", {}, 0, LocalTransport("n0"), power=power)
    inventory = Inventory("bmc-lab", [node])
    state = private_dir("runs", "r-power")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal = Journal(state / "journal.jsonl", copy=run_dir / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", "r-power", ttl=120)
    fault = PowerOffFault(PowerOffSpec(kind="node.poweroff", target=TargetSpec(nodes=["n0"]), duration=300), "f0")
    ctx = RunContext(inventory, journal, leases)
    plan = " ".join(a.command for a in fault.plan(ctx, [NodeTarget(node)]))
    assert "-P '***'" in plan or "-P ***" in plan, plan
    fault.inject(ctx, [NodeTarget(node)])
    journal.close()
    _controller_dies(leases)
    assert (tmp_path / "power").read_text() == "off\n"
    return inventory, state, run_dir, leases


def test_power_passwords_are_redacted_and_rollback_rebuilds_power_on_from_the_inventory(tmp_path):
    inventory, state, run_dir, leases = _powered_off_by_a_dead_run(tmp_path)
    for path in (state / "journal.jsonl", run_dir / "journal.jsonl"):
        text = path.read_text()
        assert "s3cret-pw" not in text and '"-P", "***"' in text, text
    # the armed command's digest is in the private journal only
    assert "revert_sha256" in (state / "journal.jsonl").read_text()
    assert "revert_sha256" not in (run_dir / "journal.jsonl").read_text()
    [outcome] = rollback_journal(state / "journal.jsonl", inventory, run_id="r-power", copy=run_dir / "journal.jsonl")
    assert outcome.ok, outcome.problem
    assert (tmp_path / "power").read_text() == "on\n"  # the inventory's power.on, password and all, ran
    assert "s3cret-pw" not in json.dumps(outcome.__dict__)
    assert "s3cret-pw" not in (run_dir / "journal.jsonl").read_text()
    leases.close()


def test_a_power_on_changed_in_the_inventory_since_the_fault_is_not_run_at_rollback(tmp_path):
    """The revert is rebuilt from the inventory as it reads at rollback (the journal's copy is redacted): an
    inventory whose power.on was changed since the fault (another program, other arguments) is refused, and
    nothing runs; the node stays off for a person to look at."""
    inventory, state, run_dir, leases = _powered_off_by_a_dead_run(tmp_path)
    canary = tmp_path / "ran"
    other = tmp_path / "other-power-on"
    other.write_text(f"#!/bin/sh\ntouch {canary}\n")
    other.chmod(0o755)
    node = inventory["n0"]
    changed = PowerCommands(off=node.power.off, on=[str(other), "on"], status=node.power.status)
    edited = Inventory("bmc-lab", [Node("n0", "127.0.0.1", "local", {}, 0, LocalTransport("n0"), power=changed)])
    [outcome] = rollback_journal(state / "journal.jsonl", edited, run_id="r-power", copy=run_dir / "journal.jsonl")
    assert not outcome.ok and "not the command armed at the fault" in outcome.problem, outcome.problem
    assert not canary.exists() and (tmp_path / "power").read_text() == "off\n"
    # the inventory as it was armed still rolls it back
    [outcome] = rollback_journal(state / "journal.jsonl", inventory, run_id="r-power", copy=run_dir / "journal.jsonl")
    assert outcome.ok and (tmp_path / "power").read_text() == "on\n"
    leases.close()


def test_a_failing_power_command_does_not_put_its_password_in_the_error(tmp_path):
    from chaoskit.core.errors import InfraError

    bmc = tmp_path / "bmc"
    bmc.write_text("#!/bin/sh\necho \"login failed for $1 with -P $4\" >&2\nexit 1\n")
    bmc.chmod(0o755)
    power = PowerCommands(off=[str(bmc), "-U", "admin", "-P", "s3cret-pw", "off"], on=[str(bmc), "-P", "s3cret-pw", "on"])
    node = Node("n0", "127.0.0.1", "local", {}, 0, LocalTransport("n0"), power=power)
    journal = Journal(tmp_path / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", "r-fail", ttl=120)
    fault = PowerOffFault(PowerOffSpec(kind="node.poweroff", target=TargetSpec(nodes=["n0"]), duration=300), "f0")
    with pytest.raises(InfraError) as info:
        fault.inject(RunContext(Inventory("x", [node]), journal, leases), [NodeTarget(node)])
    journal.close()
    leases.close()
    assert "s3cret-pw" not in str(info.value) and "***" in str(info.value)
    assert "s3cret-pw" not in (tmp_path / "journal.jsonl").read_text()


@pytest.mark.parametrize("argv, shown", [
    (["ipmitool", "-I", "lanplus", "-H", "bmc1", "-U", "admin", "-P", "pw1", "-p", "623", "chassis", "power", "on"],
     ["ipmitool", "-I", "lanplus", "-H", "bmc1", "-U", "admin", "-P", "***", "-p", "623", "chassis", "power", "on"]),
    (["ipmitool", "-Ppw1", "power", "on"], ["ipmitool", "-P***", "power", "on"]),
    (["sshpass", "-p", "pw1", "ssh", "pdu", "on", "3"], ["sshpass", "-p", "***", "ssh", "pdu", "on", "3"]),
    (["env", "IPMI_PASSWORD=pw1", "pdu-ctl", "--password=pw1", "--token", "pw1", "on"],
     ["env", "IPMI_PASSWORD=***", "pdu-ctl", "--password=***", "--token", "***", "on"]),
    (["/usr/local/bin/is-powered-on", "-f", "/etc/chaoskit/ipmi.pw", "gpu01"],
     ["/usr/local/bin/is-powered-on", "-f", "/etc/chaoskit/ipmi.pw", "gpu01"]),
])
def test_password_like_arguments_are_redacted(argv, shown):
    from chaoskit.core.secrets import redact_argv, redact_text
    from chaoskit.core.shell import shell_quote

    assert redact_argv(argv) == shown
    assert "pw1" not in redact_text(f"power command did not finish: {shell_quote(argv)}")


def test_events_are_written_redacted(tmp_path):
    from chaoskit.observe.events import EventBus

    bus = EventBus(tmp_path / "events.jsonl")
    bus.publish({"ts": 1.0, "kind": "log", "line": "connecting with --password hunter2 to bmc", "argv": ["x", "-P", "hunter2"]})
    bus.close()
    text = (tmp_path / "events.jsonl").read_text()
    assert "hunter2" not in text and "***" in text


def test_redaction_of_a_hostile_64_kib_line_is_linear():
    """Events carry the job's lines: redacting one must not backtrack (a quadratic pattern took 17 s on this one)."""
    from chaoskit.core.secrets import redact_argv, redact_text

    start = time.monotonic()
    for text in ("password" * 8192, "ab " * 21845, "-P" * 32768, "x=" * 32768):
        redact_text(text)
        redact_argv([text])
    assert time.monotonic() - start < 5


def test_a_known_kind_with_a_forged_revert_in_the_trusted_journal_is_not_run(crashed, tmp_path):
    """Even the trusted journal is no free-form command line: each kind rebuilds its revert from the values of
    the forms it arms, and a record of a known kind with any other argv is refused, the real fault still undone."""
    run_id, _, worker = crashed
    canary = tmp_path / "injected-argv-ran"
    with open(state_dir() / "runs" / run_id / "journal.jsonl", "a") as fh:
        for kind in ("process.hang", "network.link_down", "network.partition", "gpu.fail", "mem.oom", "storage.corrupt"):
            fh.write(_evil(canary, fault_id=f"forged-{kind}", kind=kind).replace('"on": "controller"', '"on": "node"'))
    res = run_cli("rollback", "--json")
    assert res.code == 3, res.stdout + res.stderr
    [run] = res.json["runs"]
    outcome = {f["fault_id"]: f for f in run["faults"]}
    assert outcome["f0.0"]["ok"]
    forged = [f for fid, f in outcome.items() if fid.startswith("forged-")]
    assert len(forged) == 6 and not any(f["ok"] for f in forged)
    assert all("not a" in f["problem"] and "revert chaoskit" in f["problem"] for f in forged), forged
    assert not canary.exists()
    assert wait_state(worker.pid, lambda s: s in ("S", "R"))


def _node(tmp_path) -> Node:
    return ProcessLab.create(1).inventory()["n0"]


@pytest.mark.parametrize("kind, good, bad", [
    ("process.hang", lambda n: [sys.executable, "-I", "-c", CONT_IF_SAME, "42", "777"],
     lambda n: [sys.executable, "-I", "-c", "import os; os.system('id')", "42", "777"]),
    ("network.link_down", lambda n: ["ip", "link", "set", "dev", "eth0", "up"],
     lambda n: ["ip", "link", "set", "dev", "eth0;reboot", "up"]),
    ("network.blackhole", lambda n: ["tc", "qdisc", "del", "dev", "eth1", "root", "handle", QDISC_HANDLE],
     lambda n: ["tc", "qdisc", "del", "dev", "eth1", "root"]),
    ("network.partition", lambda n: ["nft", "delete", "table", "inet", "chaoskit_f0_0"],
     lambda n: ["nft", "delete", "table", "inet", "filter"]),
    ("gpu.fail", lambda n: ["nvidia-smi", "-i", "0", "-c", "DEFAULT"], lambda n: ["nvidia-smi", "-r"]),
    ("gpu.fail", lambda n: ["touch", f"{n.conn.state_dir}/crashloop-0123456789abcdef/stop"],
     lambda n: ["touch", "/etc/nologin/stop"]),
    ("node.slow", lambda n: ["nvidia-smi", "-i", "1", "-rgc"], lambda n: ["nvidia-smi", "-i", "1", "-lgc", "300,300"]),
    ("mem.oom", lambda n: [sys.executable, "-I", "-c", MEMORY_TOOL,
                           "restore", f"{n.conn.state_dir}/oom-0123456789abcdef.json"],
     lambda n: [sys.executable, "-I", "-c", MEMORY_TOOL,
                "restore", "/tmp/chaoskit-oom-0123456789abcdef.json"]),
])
def test_each_kind_rebuilds_its_own_revert_and_refuses_any_other(kind, good, bad, tmp_path):
    """What a kind arms comes back unchanged from its rebuild; the same tool with another argument, another
    tool, or a state path outside the node's own state folder is refused."""
    node = _node(tmp_path)
    cls = get_fault(kind)
    revert = good(node)
    assert cls.journaled_revert(revert, node) == revert
    with pytest.raises(ValueError):
        cls.journaled_revert(bad(node), node)
