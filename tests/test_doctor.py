"""``chaoskit doctor`` against real sshd nodes (the netns lab, used as somebody else's cluster).

Each node is reached over SSH with its host key verified, and every check runs on the node
itself: privileges, tools, netem (this kernel has none), the clock offset, GPUs (none here).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, wait_until

pytest_plugins = ["tests.netns_fixtures"]


def _copy_inventory(lab, tmp_path: Path) -> Path:
    """The lab's inventory with its key and known_hosts beside it, in a folder the test may change."""
    for name in ("inventory.yaml", "id_ed25519", "known_hosts"):
        shutil.copy(lab.directory / name, tmp_path / name)
    return tmp_path / "inventory.yaml"


def _scenario(tmp_path: Path, fault: str) -> Path:
    path = tmp_path / "drill.yaml"
    path.write_text(f"name: drill\ncluster: {{kind: netns, nodes: 2}}\nworkload: {{steps: 100}}\nfaults:\n  - {fault}\n")
    return path


def test_every_node_is_checked_and_ready(netns_lab, tmp_path):
    res = run_cli("doctor", netns_lab.inventory_path, "--json")
    assert res.code == 0, res.stdout + res.stderr
    report = res.json
    assert report["ok"] and [n["node"] for n in report["nodes"]] == netns_lab.node_names()
    for node in report["nodes"]:
        assert node["reachable"] and node["host_key"] == "known" and node["privilege"] == "root" and node["agent"]
        assert node["tools"] == {"ip": True, "tc": True, "nft": True, "kill": True, "python3": True}
        assert node["python"].startswith("Python 3.")
        # one machine, one clock: the offset is within its own uncertainty (a few ms at most)
        assert abs(node["clock_offset_s"]) <= node["clock_uncertainty_s"] + 0.005
        assert node["gpus_seen"] is None and node["problems"] == []
    table = run_cli("doctor", netns_lab.inventory_path)
    assert "ready" in table.stdout and "n1" in table.stdout


def test_a_scenario_whose_fault_needs_netem_is_not_ready(netns_lab, tmp_path):
    """This kernel has no sch_netem: a delay cannot run, a link-down can."""
    inv = netns_lab.inventory_path
    delay = _scenario(tmp_path, "{kind: network.degrade, target: {nodes: [n1]}, interface: data, delay: 50ms, duration: 10s}")
    res = run_cli("doctor", inv, "--scenario", delay, "--json")
    assert res.code == 3
    [fault] = res.json["faults"]
    assert fault["kind"] == "network.degrade" and fault["needs"] == ["ip", "tc", "netem"]
    assert fault["missing"] == ["n1: no netem"]
    link = _scenario(tmp_path, "{kind: network.link_down, target: {nodes: [n1]}, interface: data, duration: 10s}")
    res = run_cli("doctor", inv, "--scenario", link, "--json")
    assert res.code == 0 and res.json["faults"][0]["missing"] == []


def test_a_changed_host_key_is_named_with_both_fingerprints(netns_lab, tmp_path):
    inv = _copy_inventory(netns_lab, tmp_path)
    lines = (tmp_path / "known_hosts").read_text().splitlines()
    n1 = netns_lab.mgmt_address("n1")
    n0_key = next(line for line in lines if line.startswith(netns_lab.mgmt_address("n0")))
    # n1's entry now holds n0's key: what a reinstalled (or impersonated) node looks like
    lines = [line for line in lines if not line.startswith(n1)] + [n1 + " " + n0_key.split(" ", 1)[1]]
    (tmp_path / "known_hosts").write_text("\n".join(lines) + "\n")
    res = run_cli("doctor", inv, "--json")
    assert res.code == 3
    nodes = {n["node"]: n for n in res.json["nodes"]}
    assert nodes["n0"]["problems"] == []
    assert not nodes["n1"]["reachable"]
    assert "does not match" in nodes["n1"]["host_key"] and nodes["n1"]["host_key"].count("SHA256:") == 2


def test_a_node_that_does_not_answer_and_gpus_that_are_missing(netns_lab, tmp_path):
    inv = _copy_inventory(netns_lab, tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["ssh"]["connect_timeout"] = "2s"
    doc["nodes"][0]["gpus"] = 8
    # a node at an address of the lab's own management network where nothing listens
    doc["nodes"].append({**doc["nodes"][1], "name": "ghost", "address": netns_lab.mgmt_address("n1").rsplit(".", 1)[0] + ".200"})
    inv.write_text(yaml.safe_dump(doc))
    res = run_cli("doctor", inv, "--json")
    assert res.code == 3
    nodes = {n["node"]: n for n in res.json["nodes"]}
    assert nodes["n0"]["problems"] == ["the inventory says 8 GPUs, no nvidia-smi"]
    assert nodes["ghost"]["problems"][0].startswith("unreachable: cannot reach node ghost")
    assert nodes["n1"]["problems"] == []


def test_a_bad_inventory_is_bad_input(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("name: x\nnodes:\n  - {name: a, address: 'eth0;reboot'}\n")
    res = run_cli("doctor", inv)
    assert res.code == 2 and f"{inv}:3:" in res.stderr and "invalid address" in res.stderr


@pytest.fixture
def n1_without_tc(netns_lab):
    """n1's sshd restarted in a mount namespace of its own where /usr/sbin/tc is covered by /dev/null:
    a node whose image lacks iproute2's tc. Its normal sshd comes back after the test."""
    node_dir = netns_lab.node_dir("n1")

    def restart(argv_prefix: list[str]) -> None:
        os.kill(int((node_dir / "sshd.pid").read_text().split()[0]), signal.SIGTERM)
        assert wait_until(lambda: not netns_lab._sshd_alive("n1"), 5)
        (node_dir / "sshd.pid").unlink(missing_ok=True)
        sshd = [*netns_lab.exec_argv("n1", [netns_lab.sshd, "-f", str(node_dir / "sshd_config"), "-E", str(node_dir / "sshd.log")])]
        subprocess.run([*argv_prefix, *sshd] if argv_prefix else sshd, check=True, capture_output=True, timeout=10)
        netns_lab._wait_ssh(["n1"])

    hide = "mount --bind /dev/null /usr/sbin/tc && exec \"$@\""
    restart(["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh"])
    try:
        yield
    finally:
        restart([])


@pytest.mark.slow
def test_a_node_without_tc_is_named_and_a_fault_that_needs_it_is_not_ready(netns_lab, n1_without_tc, tmp_path):
    link = _scenario(tmp_path, "{kind: network.link_down, target: {nodes: [n1]}, interface: data, duration: 10s}")
    res = run_cli("doctor", netns_lab.inventory_path, "--scenario", link, "--json")
    nodes = {n["node"]: n for n in res.json["nodes"]}
    assert nodes["n1"]["tools"]["tc"] is False and nodes["n1"]["tools"]["ip"] is True
    assert nodes["n0"]["tools"]["tc"] is True
    degrade = _scenario(tmp_path, "{kind: network.blackhole, target: {nodes: [n1]}, interface: data, duration: 10s}")
    res = run_cli("doctor", netns_lab.inventory_path, "--scenario", degrade, "--json")
    assert res.code == 3
    assert "n1: no tc" in res.json["faults"][0]["missing"]
    table = run_cli("doctor", netns_lab.inventory_path, "--scenario", degrade)
    assert "tc" in table.stdout and "n1" in table.stdout
