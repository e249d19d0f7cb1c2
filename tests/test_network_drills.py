"""End-to-end network drills as root: the shipped netns scenarios against a real torchrun job.

Each node is a network namespace with its own data and management NICs and an
sshd; faults travel over SSH; the job's collectives run over the data NICs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, need_root_tool, need_torch, run_cli
from tests.netns_fixtures import require_netns

pytestmark = pytest.mark.slow


def _drill(name: str, out: Path) -> dict:
    need_torch()
    for tool in ("ip", "tc", "nft", "sshd"):
        need_root_tool(tool if tool != "sshd" else "/usr/sbin/sshd")
    res = run_cli("run", SCENARIOS / f"{name}.yaml", "--out", out, "--json")
    assert res.code == 0, res.stderr + res.stdout[-2000:]
    return res.json


def _nothing_left(result: dict) -> None:
    """The run's own lab is gone: no namespace, link, nft table of it (other labs may be up beside it)."""
    lab = result["cluster"]["id"]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab not in netns, netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert lab not in links, links
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "chaoskit" not in tables, tables
    procs = subprocess.run(["pgrep", "-af", lab], capture_output=True, text=True).stdout
    assert [line for line in procs.splitlines() if "pgrep" not in line] == []


# scenarios/nic-blackhole.yaml is detected the same way as nic-drop (the collective timeout); its fault is applied
# and reverted on a real netns lab in test_network_faults.py, so one drill of the two keeps CI time for others.
@pytest.mark.parametrize("name", ["nic-drop", "partition"])
def test_network_fault_is_detected_at_the_collective_timeout_and_recovered(name, tmp_path):
    r = _drill(name, tmp_path)
    assert r["verdict"] == "pass"
    p = r["phases"]
    timeout = r["workload"]["collective_timeout"]
    assert abs(p["detection_s"] - timeout) <= 0.25 * timeout
    for key in ("reallocation_s", "checkpoint_load_s", "recovery_s", "lost_steps"):
        assert p[key] is not None, key
    assert r["checks"]["faults_reverted"]["pass"] and r["final_step"] == r["workload"]["steps"]
    journal = [json.loads(x)["action"] for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert journal.index("armed") < journal.index("injected") < journal.index("reverted")
    _nothing_left(r)


def test_node_poweroff_a_spare_takes_over(tmp_path):
    r = _drill("node-poweroff", tmp_path)
    assert r["verdict"] == "pass"
    t_fault = r["faults"][0]["t_fault"]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    before = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] < t_fault}
    after = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] > t_fault}
    assert before == {"n0", "n1", "n2"}
    assert after == {"n0", "n2", "n3"}  # n1 is off; the spare n3 joined the new world
    assert r["phases"]["reallocation_s"] is not None
    assert any(e["kind"] == "process.gone" and e["node"] == "n1" for e in events)
    _nothing_left(r)


def test_gpu_fail_scope_node_moves_the_job_onto_the_spare(tmp_path):
    """gpu-fail-spare: n1's GPU fails with scope node (the crash loop, emulated: no GPU here). Its agent dies
    with its worker, so torchrun cannot restart in place; the spare n2 joins the new world and the drill passes."""
    require_netns()
    r = _drill("gpu-fail-spare", tmp_path)
    assert r["verdict"] == "pass"
    [fault] = r["faults"]
    assert (fault["kind"], fault["mechanism"], fault["fidelity"], fault["scope"]) == ("gpu.fail", "crashloop", "emulated", "node")
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    before = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] < fault["t_fault"]}
    after = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] > fault["t_fault"]}
    assert before == {"n0", "n1"} and after == {"n0", "n2"}  # the job moved off n1, onto the spare
    assert r["phases"]["reallocation_s"] is not None and r["checks"]["faults_reverted"]["pass"]
    assert r["final_step"] == r["workload"]["steps"]
    _nothing_left(r)


def test_dropping_the_controllers_own_link_still_ends_restored(tmp_path):
    r = _drill("nic-drop-mgmt", tmp_path)
    assert r["verdict"] == "pass"
    assert r["checks"]["faults_reverted"]["pass"]
    entries = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    reverted = [e for e in entries if e["action"] == "reverted"]
    assert reverted and reverted[0]["verified"] is True
    assert r["phases"]["detection_s"] is None  # training runs on the data network: it never noticed
    assert any("no sign of the fault" in n for n in r["notes"])
    _nothing_left(r)
