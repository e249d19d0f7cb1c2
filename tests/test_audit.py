"""``chaoskit audit``: a clean lab exits 0; one planted leftover of each kind is named, and the audit exits 1.

Everything planted is real: a SIGSTOPped process in a process-lab node's scope, cgroups made in this machine's
cgroup hierarchy, files in the node state folder, a real lease with its real watchdog running, a crashed run's
trusted journal; on the netns lab, a link down, a qdisc with chaoskit's handle and an nft table in a node's
namespace, a lease folder in a node's state folder, and a node powered off.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need, proc_state, run_cli, wait_until

pytest_plugins = ["tests.netns_fixtures"]


@pytest.fixture
def process_lab():
    res = run_cli("lab", "up", "--nodes", "2")
    assert res.code == 0, res.stderr
    from chaoskit.lab.process import ProcessLab

    lab = ProcessLab.load()
    yield lab
    run_cli("lab", "down")


def _audit(*args: str) -> tuple[int, dict]:
    res = run_cli("audit", *args, "--json")
    assert res.code in (0, 1), res.stderr
    return res.code, json.loads(res.stdout)


def _lines(report: dict) -> list[str]:
    return [f"{x['node']} {x['kind']}: {x['what']}" for x in report["leftovers"]]


def _has(report: dict, node: str, kind: str, text: str) -> bool:
    return any(x["node"] == node and x["kind"] == kind and text in x["what"] for x in report["leftovers"])


def test_a_clean_process_lab_audits_clean(process_lab):
    code, report = _audit("process")
    assert code == 0 and report["clean"], _lines(report)
    assert report["nodes"] == ["n0", "n1"]


def test_a_job_namespace_left_by_a_dead_run_is_named_and_fixed(process_lab):
    """A process-lab job's own network namespace (root's runs: ``ckjob-*``) that no live run holds is a leftover
    (a dead run's is removed by ``rollback`` from its marker; one no marker names is left for a person)."""
    need(os.geteuid() == 0, "root (network namespaces)")
    subprocess.run(["ip", "netns", "add", "ckjob-0123456789ab"], check=True)
    try:
        code, report = _audit("process")
        assert code == 1 and _has(report, "controller", "lab", "network namespace ckjob-0123456789ab"), _lines(report)
    finally:
        subprocess.run(["ip", "netns", "del", "ckjob-0123456789ab"])
    code, report = _audit("process")
    assert code == 0 and report["clean"], _lines(report)


def test_audit_of_no_lab_is_bad_input():
    res = run_cli("audit", "process")
    assert res.code == 2 and "no process lab is up" in res.stderr
    res = run_cli("audit", "/nonexistent/inventory.yaml")
    assert res.code == 2 and "neither a lab kind" in res.stderr


def test_a_process_lab_with_one_leftover_of_each_kind_names_each(process_lab, tmp_path, _private_state):
    need(os.geteuid() == 0, "root (the node state folder /run/chaoskit, cgroups)")
    from chaoskit.nodeside.nodefs import default_state_dir
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.safety.journal import Journal
    from chaoskit.safety.lease import LeaseManager, default_lease_root

    token = secrets.token_hex(8)
    node_state = default_state_dir()
    planted: list[Path] = []
    procs: list[subprocess.Popen] = []
    leases = LeaseManager(default_lease_root(), "deadrun", ttl=600)
    cgroup_root = next((p for p in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup") if os.access(p, os.W_OK)), None)
    need(cgroup_root is not None, "a writable cgroup hierarchy")
    try:
        # process.hang: a job process of node n0 (its scope in the environment), stopped and never continued.
        job = subprocess.Popen(["sleep", "300"], env={**os.environ, "CHAOSKIT_SCOPE": process_lab.scope("n0")})
        procs.append(job)
        os.kill(job.pid, signal.SIGSTOP)
        assert wait_until(lambda: proc_state(job.pid) == "T", 5)
        # mem.oom and node.slow: their cgroups and state files.
        oom_cg = Path(cgroup_root) / f"chaoskit-oom-n0-{token}"
        slow_cg = Path(cgroup_root) / f"chaoskit-{token}"
        for d in (oom_cg, slow_cg):
            d.mkdir()
            planted.append(d)
        for name in (f"oom-{token}.json", f"slow-{token}.json", f"inproc-{token}.json"):
            (Path(node_state) / name).write_text("{}")
            planted.append(Path(node_state) / name)
        # inproc.*: an order its fault's end never took back (the channel folder is chaoskit's own, 0700).
        channel = Path(node_state) / "inproc"
        made_channel = not channel.exists()
        channel.mkdir(mode=0o700, exist_ok=True)
        order = channel / f"order-{job.pid}.json"
        order.write_text("{}")
        planted.append(order)
        if made_channel:
            planted.append(channel)
        # gpu.fail: a crash loop's folder, and its loop still running (its folder on the command line).
        loop = Path(node_state) / f"crashloop-{token}"
        loop.mkdir()
        planted.append(loop)
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(loop)]))
        # storage.corrupt and storage.full: an aside and a fill file in the checkpoint folder.
        ckpt = tmp_path / "ckpt"
        (ckpt / f".chaoskit-aside-{token}").mkdir(parents=True)
        (ckpt / f".chaoskit-fill-{token}").write_bytes(b"\0" * 1024)
        # A lease whose controller is gone: its folder, and its watchdog still waiting to revert.
        leases.arm(LocalTransport("n0"), "f1.0", ["true"], 600)
        leases._stop.set()  # the controller died: nobody renews (its watchdog reverts after the TTL)
        # A crashed run: its marker names a pid that is gone, its trusted journal a fault armed and not reverted.
        dead = subprocess.Popen(["true"])
        dead.wait()
        runs = _private_state / "runs"
        (runs / "deadrun").mkdir(parents=True, mode=0o700)
        (runs / "deadrun.json").write_text(json.dumps({"pid": dead.pid, "run_dir": "", "kind": "process",
                                                       "lab": process_lab.lab_id, "ephemeral": False}))
        journal = Journal(runs / "deadrun" / "journal.jsonl")
        journal.record("armed", fault_id="f1.0", kind="process.hang", node="n0",
                       revert=["kill", "-s", "CONT", str(job.pid)])
        journal.close()

        code, report = _audit("process", "--checkpoint-dir", str(ckpt))
        assert code == 1 and not report["clean"]
        lines = _lines(report)
        assert _has(report, "n0", "process.hang", f"pid {job.pid} is stopped"), lines
        assert _has(report, "n0", "mem.oom", f"cgroup {oom_cg}"), lines
        assert _has(report, "n0", "mem.oom", f"state oom-{token}.json"), lines
        assert _has(report, "n0", "node.slow", f"cgroup {slow_cg}"), lines
        assert _has(report, "n0", "node.slow", f"state slow-{token}.json"), lines
        assert _has(report, "n0", "gpu.fail", f"state crashloop-{token}/"), lines
        assert _has(report, "n0", "gpu.fail", f"crash loop running: pid {procs[-1].pid}"), lines
        assert _has(report, "n0", "state", f"state inproc-{token}.json"), lines  # nobody's: still named
        orders = [x for x in report["leftovers"] if f"inproc/order-{job.pid}.json" in x["what"]]
        assert len(orders) == 1 and orders[0]["kind"].startswith("inproc.") and "order" in orders[0]["what"], lines
        assert _has(report, "n0", "storage.corrupt", f".chaoskit-aside-{token}"), lines
        assert _has(report, "n0", "storage.corrupt", f".chaoskit-fill-{token}"), lines
        assert _has(report, "controller", "lease", "lease deadrun/f1.0 of a run that is gone"), lines
        assert _has(report, "controller", "watchdog", "watchdog running"), lines
        assert _has(report, "controller", "journal", "run deadrun died with process.hang armed on n0"), lines
        oom = next(x for x in report["leftovers"] if f"cgroup {oom_cg}" in x["what"])
        assert oom["also_on"] == ["n1"]  # both nodes share this machine's cgroups: listed once
        assert proc_state(job.pid) == "T"  # the audit changed nothing

        # --fix: the crashed run's journal allows its SIGCONT; the rest is still named.
        code, report = _audit("process", "--fix", "--checkpoint-dir", str(ckpt))
        assert code == 1
        assert [f["kind"] for f in report["fixed"] if f.get("kind")] == ["process.hang"] and report["fixed"][0]["ok"]
        assert wait_until(lambda: proc_state(job.pid) in ("S", "R"), 5)
        assert not _has(report, "n0", "process.hang", "stopped") and not _has(report, "controller", "journal", "deadrun")
        assert _has(report, "n0", "mem.oom", f"cgroup {oom_cg}")
    finally:
        (default_lease_root() / "deadrun" / "f1.0" / "released").touch()  # the planted watchdog stands down
        leases.close()
        for p in procs:
            p.kill()
            p.wait()
        for path in planted:
            (path.rmdir if path.is_dir() else path.unlink)()
    assert wait_until(lambda: _audit("process")[0] == 0, 10), _lines(_audit("process")[1])


@pytest.mark.slow
def test_a_netns_lab_with_one_leftover_of_each_kind_names_each(netns_lab, tmp_path):
    from tests.netns_fixtures import ns_run

    lab = netns_lab
    inventory = str(lab.inventory_path)
    code, report = _audit(inventory)
    assert code == 0 and report["clean"], _lines(report)
    token = secrets.token_hex(8)
    work = lab.node_dir("n0") / "work"
    lease = work / "leases" / "deadrun" / "f2.0"
    orphan = _orphan_agent(lab, "n0")
    try:
        assert ns_run(lab, "n1", "ip", "link", "set", "dev", "eth0", "down").returncode == 0
        assert ns_run(lab, "n0", "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "c4a0:",
                      "blackhole").returncode == 0
        assert ns_run(lab, "n1", "nft", f"add table inet chaoskit_f{token}").returncode == 0
        lease.mkdir(parents=True, mode=0o700)
        (work / f"inproc-{token}.json").write_text("{}")
        code, report = _audit(inventory)
        lines = _lines(report)
        assert code == 1, lines
        assert _has(report, "n1", "network.link_down", "link eth0 is down"), lines
        assert not _has(report, "n0", "network.link_down", "eth0"), lines
        assert _has(report, "n0", "network.blackhole", "qdisc c4a0: on eth0"), lines
        assert _has(report, "n1", "network.partition", f"nft table inet chaoskit_f{token}"), lines
        assert _has(report, "n0", "lease", "lease deadrun/f2.0: no watchdog waits on it"), lines
        assert _has(report, "n0", "state", f"state inproc-{token}.json"), lines
        agents = [x for x in report["leftovers"] if x["kind"] == "agent"]
        assert len(agents) == 1 and f"agent pid {orphan.pid}: its controller (pid " in agents[0]["what"], lines
        assert len(report["leftovers"]) == 6, lines
        # the agents this audit itself runs on the nodes are a live controller's: never counted
        orphan.kill()
        orphan.wait()
        assert not any(x["kind"] == "agent" for x in _audit(inventory)[1]["leftovers"])

        assert lab.power("n1", "off") is False
        code, report = _audit(inventory)
        assert code == 1
        assert _has(report, "n1", "node.poweroff", "powered off"), _lines(report)
        assert "n1" in report["unreadable"]
    finally:
        lab.power("n1", "on")
        ns_run(lab, "n1", "ip", "link", "set", "dev", "eth0", "up")
        ns_run(lab, "n0", "tc", "qdisc", "del", "dev", "eth0", "root", "handle", "c4a0:")
        ns_run(lab, "n1", "nft", f"delete table inet chaoskit_f{token}")
        for path in (lease, lease.parent):
            if path.exists():
                path.rmdir()
        (work / f"inproc-{token}.json").unlink(missing_ok=True)
        orphan.kill()
        orphan.wait()
    assert wait_until(lambda: _audit(inventory)[0] == 0, 20), _lines(_audit(inventory)[1])


def _orphan_agent(lab, node: str) -> subprocess.Popen:
    """A real agent in ``node``'s namespace whose controller is gone: its command line names a process that
    ran and was killed; its stdin stays open, as an SSH channel's does behind a connection that never closed."""
    from chaoskit.nodeside.agent import BOOT
    from chaoskit.cluster.transports.channel import AGENT_TAG, agent_program, controller_tag

    gone = subprocess.Popen(["sleep", "30"])
    tag = controller_tag(gone.pid)
    gone.kill()
    gone.wait()
    program = agent_program(str(lab.node_dir(node) / "work"))
    agent = subprocess.Popen(lab.exec_argv(node, ["python3", "-I", "-u", "-c", BOOT, AGENT_TAG, tag]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    agent.stdin.write(f"{len(program)}\n".encode() + program)
    agent.stdin.flush()
    assert json.loads(agent.stdout.readline())["hello"] == 1
    return agent


def test_rollback_of_a_dead_run_on_a_lab_that_stays_up_stops_the_runs_job(process_lab, _private_state):
    """A game day's shared lab (or 'lab up') outlives a controller SIGKILLed mid-drill: the dead run's torchrun
    agents and workers went on running there, and the audit named them (found by bench/soak.py --soak). Rollback
    stops the job of the run it recovers; the lab itself stays up for the next run."""
    job = subprocess.Popen(["sleep", "300"], env={**os.environ, "CHAOSKIT_SCOPE": process_lab.scope("n1"),
                                                  "TORCHELASTIC_RUN_ID": "deadrun"})
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, "CHAOSKIT_SCOPE": process_lab.scope("n1"),
                                                    "TORCHELASTIC_RUN_ID": "attached-job"})
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        runs = _private_state / "runs"
        runs.mkdir(mode=0o700, exist_ok=True)
        (runs / "deadrun.json").write_text(json.dumps({"pid": dead.pid, "run_dir": "", "kind": "process",
                                                       "lab": process_lab.lab_id, "ephemeral": False}))
        res = run_cli("rollback")
        assert res.code == 0, res.stdout + res.stderr
        assert "1 job process(es) of the dead run stopped" in res.stdout, res.stdout
        assert wait_until(lambda: job.poll() is not None, 10)
        assert other.poll() is None  # another job in the lab (an attached one) is not the dead run's to stop
        assert process_lab.load() is not None  # the lab is still up
    finally:
        for p in (job, other):
            p.kill()
            p.wait()
