"""End-to-end network drills as root: the shipped netns scenarios against a real torchrun job.

Each node is a network namespace with its own data and management NICs and an
sshd; faults travel over SSH; the job's collectives run over the data NICs. A spare taking a node's place is
drilled once, by node-poweroff; gpu-fail-spare (the same spare after a GPU failed with scope node) is read from
its recorded drill, tests/data/lemon-node-spare (tests/test_gpu_faults.py, issue 52). The link chaoskit talks over
cut, restored by the node's own watchdog and verified once chaoskit reaches the node again (nic-drop-mgmt), is
silent-node-kill's first fault.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, need_root_tool, need_torch, run_cli, short_form

pytestmark = pytest.mark.slow


def _drill(name: str, out: Path, *edits: tuple[str, str]) -> dict:
    """The shipped scenario ``name`` run on its own netns lab, in a short form where ``edits`` are given
    (tests/conftest.short_form; the scenario file goes beside the run folder)."""
    need_torch()
    for tool in ("ip", "tc", "nft", "sshd"):
        need_root_tool(tool if tool != "sshd" else "/usr/sbin/sshd")
    scenario = SCENARIOS / f"{name}.yaml"
    if edits:
        scenario = short_form(scenario, out.parent, *edits)
    res = run_cli("run", scenario, "--out", out, "--json")
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


# One story, "a dropped link is detected at the collective timeout", drilled once (issue 52): scenarios/partition.yaml
# and nic-blackhole.yaml are detected the same way (the collective timeout); their faults are applied, confined to
# what they cut and reverted on a real netns lab in test_network_faults.py (test_partition_cuts_the_data_network_
# between_groups_only, test_blackhole_drops_egress_until_reverted), and the docker lab's partition drill is
# tests/test_docker_drills.py's.
@pytest.mark.parametrize("name", ["nic-drop"])
def test_network_fault_is_detected_at_the_collective_timeout_and_recovered(name, tmp_path):
    # a short form (issue 52): the link is down 14 s, not 20 s, still 4 s past the 10 s collective timeout (and 1.5 s
    # past the 12.5 s this test allows the detection), so every rank's collective times out as before; 110 steps,
    # not 160, after the fault at step 50
    out = tmp_path / "run"
    r = _drill(name, out, ("steps: 160", "steps: 110"), ("duration: 20s", "duration: 14s"))
    assert r["verdict"] == "pass"
    p = r["phases"]
    timeout = r["workload"]["collective_timeout"]
    assert abs(p["detection_s"] - timeout) <= 0.25 * timeout
    for key in ("reallocation_s", "checkpoint_load_s", "recovery_s", "lost_steps"):
        assert p[key] is not None, key
    assert r["checks"]["faults_reverted"]["pass"] and r["final_step"] == r["workload"]["steps"]
    journal = [json.loads(x)["action"] for x in (out / "journal.jsonl").read_text().splitlines()]
    assert journal.index("armed") < journal.index("injected") < journal.index("reverted")
    _nothing_left(r)


def test_node_poweroff_a_spare_takes_over(tmp_path):
    # a short form (issue 52): 110 steps, not 160; the power-off at step 50 and the spare's new world are the same.
    # Not shorter: at load 24 the power-off landed at step 72, and one that lands after the job's end drills nothing
    out = tmp_path / "run"
    r = _drill("node-poweroff", out, ("steps: 160", "steps: 110"))
    assert r["verdict"] == "pass"
    t_fault = r["faults"][0]["t_fault"]
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    before = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] < t_fault}
    after = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] > t_fault}
    assert before == {"n0", "n1", "n2"}
    assert after == {"n0", "n2", "n3"}  # n1 is off; the spare n3 joined the new world
    assert r["phases"]["reallocation_s"] is not None
    # chaoskit's own heartbeat noticed the dead node: on the timeline, and a detection source with its latency
    [off] = [e for e in events if e["kind"] == "node.unreachable" and e["node"] == "n1"]
    timeout = 3.0  # probes.heartbeat_timeout's default
    assert 0 < off["ts"] - t_fault <= timeout + 1.0
    [source] = [d for d in r["phases"]["detections"] if d["source"] == "chaoskit heartbeat"]
    assert (source["kind"], source["node"]) == ("node.unreachable", "n1")
    assert source["latency_s"] == pytest.approx(off["ts"] - t_fault, abs=1e-3)
    # a node that says nothing has its workers unknown, not gone, until it answers again (file order: arrival)
    order = [(e["kind"], e["node"]) for e in events_in_arrival_order(out)]
    back = order.index(("node.reachable", "n1")) if ("node.reachable", "n1") in order else len(order)
    assert ("process.gone", "n1") not in order[order.index(("node.unreachable", "n1")):back]
    _nothing_left(r)


def events_in_arrival_order(out: Path) -> list[dict]:
    """events.jsonl as written: in the order the events reached the controller's bus."""
    return [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def test_a_silent_node_holds_up_no_kill_on_another_node(tmp_path):
    """silent-node-kill: n2's management NIC is down from step 40 for 12 s; at step 160 rank 1 on n1 is
    SIGKILLed. The kill lands on time (the issue's drill waited for the silent node, then used a stale pid and
    failed), its worker is on the timeline within 1 s, n2 is node.unreachable within the heartbeat timeout,
    and none of n2's workers is reported gone while it is silent."""
    # a short form (issue 52): 200 steps, not 300; the restart after the kill at step 160 loads step 150 and trains
    # 50 steps, not 150 (n2 answers again 12 s after its NIC went down, before the restart's new world has formed)
    out = tmp_path / "run"
    r = _drill("silent-node-kill", out, ("steps: 300", "steps: 200"))
    assert r["verdict"] == "pass"
    # the headline is the kill: the cut management link was felt by nobody, the kill's detection is not its own
    assert r["phases"]["last_step_before"] >= 160 and r["phases"]["detection_s"] <= 1.0, r["phases"]
    events = events_in_arrival_order(out)
    nic, kill = r["faults"]
    assert (nic["kind"], nic["node"], kill["kind"], kill["node"]) == ("network.link_down", "n2", "process.kill", "n1")
    due = min(e["ts"] for e in events if e["kind"] == "step" and e.get("step") == 160)
    assert kill["t_fault"] - due <= 1.0  # on time: nobody waited for n2
    [gone] = [e for e in events if e["kind"] == "process.gone" and e["node"] == "n1" and e["ts"] > kill["t_fault"]][:1]
    assert gone["rank"] == 1 and gone["ts"] - kill["t_fault"] <= 1.0
    [silent] = [e for e in events if e["kind"] == "node.unreachable" and e["node"] == "n2"]
    assert 0 < silent["ts"] - nic["t_fault"] <= 3.0 + 1.0
    [reachable] = [e for e in events if e["kind"] == "node.reachable" and e["node"] == "n2"]
    assert silent["ts"] < kill["t_fault"] < reachable["ts"]  # the kill happened while n2 was known to be silent
    order = [(e["kind"], e["node"]) for e in events]
    first, back = order.index(("node.unreachable", "n2")), order.index(("node.reachable", "n2"))
    assert ("process.gone", "n2") not in order[first:back]
    assert not any(e["kind"] == "node.unreachable" and e["node"] != "n2" for e in events)
    assert r["checks"]["faults_reverted"]["pass"] and r["final_step"] == r["workload"]["steps"]
    # n2's own watchdog brought the link chaoskit talks over back up; chaoskit reconnected and verified the revert
    # (this drill is also nic-drop-mgmt's story, which had a drill of its own until issue 52)
    journal = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    reverted = [e for e in journal if e["action"] == "reverted"]
    assert reverted and all(e["verified"] is True for e in reverted), reverted
    _nothing_left(r)
