"""Network and power faults on the netns lab, through the SSH transport: each one
takes effect, is reverted (by the controller, by the deadline or by a stale
lease), is verified, and leaves the node clean; rollback undoes a crashed run."""

from __future__ import annotations

import time

import pytest

from chaoskit.core.errors import InfraError

pytest_plugins = ["tests.netns_fixtures"]


def fx():
    from tests import (
        netns_fixtures,  # imported by pytest as a plugin first, so its asserts are rewritten
    )

    return netns_fixtures


def make(kind: str, **fields):
    from chaoskit.faults.registry import get_fault

    cls = get_fault(kind)
    spec = cls.Spec.model_validate({"kind": kind, **fields})
    return cls(spec, f"f{time.time_ns() % 10**6}")


def targets(ctx, fault):
    from chaoskit.cluster.selectors import resolve_nodes

    return resolve_nodes(ctx.inventory, fault.spec.target)


def tcp(lab, src: str, address: str, port: int = 22) -> bool:
    """Can ``src`` open a TCP connection to ``address`` (checked from inside its namespace)?"""
    code = f"import socket; socket.create_connection(({address!r}, {port}), 1).close()"
    return fx().ns_run(lab, src, "python3", "-c", code).returncode == 0


def inject_and_revert(ctx, fault):
    ts = targets(ctx, fault)
    fault.preflight(ctx, ts)
    [inj] = fault.inject(ctx, ts)
    assert fault.check_reverted(ctx.transport(inj.node), inj.detail["revert"]) is not None, "the fault is not in effect"
    return inj


def finish(ctx, fault, inj):
    fault.revert(ctx, inj)
    ctx.leases.release(inj.fault_id)
    assert fault.verify(ctx, inj) is None
    fault.revert(ctx, inj)  # idempotent
    assert fault.verify(ctx, inj) is None


def test_link_down_on_data_cuts_the_data_network_but_not_ssh(netns_lab, fault_ctx, clean_lab):
    lab = netns_lab
    fault = make("network.link_down", target={"nodes": ["n0"]}, duration="30s")
    assert tcp(lab, "n1", lab.data_address("n0"))
    inj = inject_and_revert(fault_ctx, fault)
    assert inj.targets == ["n0:eth0"] and abs(inj.t_fault - time.time()) < 5
    assert not tcp(lab, "n1", lab.data_address("n0"))
    assert fault_ctx.transport("n0").ping() > 0  # the mgmt NIC still carries the controller
    entries = [line for line in (fault_ctx.journal.path.read_text().splitlines())]
    assert '"action": "armed"' in entries[0] and '"revert": ["ip", "link", "set", "dev", "eth0", "up"]' in entries[0]
    finish(fault_ctx, fault, inj)
    assert tcp(lab, "n1", lab.data_address("n0"))


def test_a_fault_on_two_nodes_lands_on_both_at_once_each_armed_and_journaled(netns_lab, fault_ctx, clean_lab):
    """One fault, two nodes: the nodes are injected in one fan-out; each gets its own lease and journal
    record (written from two threads, whole lines), in target order, and each is reverted."""
    import json

    lab = netns_lab
    fault = make("network.link_down", target={"nodes": ["n0", "n1"]}, duration="30s")
    ts = targets(fault_ctx, fault)
    fault.preflight(fault_ctx, ts)
    injs = fault.inject(fault_ctx, ts)
    assert [(i.node, i.fault_id) for i in injs] == [("n0", f"{fault.fault_id}.0"), ("n1", f"{fault.fault_id}.1")]
    assert abs(injs[0].t_fault - injs[1].t_fault) < 5
    assert not tcp(lab, "n1", lab.data_address("n0"))
    armed = [json.loads(line) for line in fault_ctx.journal.path.read_text().splitlines()]
    assert sorted((e["action"], e["node"]) for e in armed) == [("armed", "n0"), ("armed", "n1")]
    for inj in injs:
        finish(fault_ctx, fault, inj)
    assert tcp(lab, "n1", lab.data_address("n0"))


def test_blackhole_drops_egress_until_reverted(netns_lab, fault_ctx, clean_lab):
    lab = netns_lab
    fault = make("network.blackhole", target={"nodes": ["n1"]}, interface="data", duration="30s")
    inj = inject_and_revert(fault_ctx, fault)
    assert "blackhole c4a0:" in fx().ns_run(lab, "n1", "tc", "qdisc", "show", "dev", "eth0").stdout
    assert not tcp(lab, "n0", lab.data_address("n1"))
    finish(fault_ctx, fault, inj)
    assert tcp(lab, "n0", lab.data_address("n1"))


def test_degrade_rate_uses_tbf(netns_lab, fault_ctx, clean_lab):
    fault = make("network.degrade", target={"nodes": ["n0"]}, rate="20mbit", duration="30s")
    inj = inject_and_revert(fault_ctx, fault)
    assert "tbf c4a0:" in fx().ns_run(netns_lab, "n0", "tc", "qdisc", "show", "dev", "eth0").stdout
    finish(fault_ctx, fault, inj)


def test_degrade_with_delay_needs_netem(netns_lab, fault_ctx, clean_lab):
    from chaoskit.cluster.kernel import netem_available

    fault = make("network.degrade", target={"nodes": ["n0"]}, delay="50ms", loss=1, duration="30s")
    if netem_available(fault_ctx.transport("n0")):
        inj = inject_and_revert(fault_ctx, fault)
        assert "netem c4a0:" in fx().ns_run(netns_lab, "n0", "tc", "qdisc", "show", "dev", "eth0").stdout
        finish(fault_ctx, fault, inj)
        return
    with pytest.raises(InfraError) as info:
        fault.preflight(fault_ctx, targets(fault_ctx, fault))
    assert str(info.value).startswith("netem is not available on node n0")
    assert info.value.exit_code == 3
    with pytest.raises(InfraError, match="netem is not available"):
        fault.inject(fault_ctx, targets(fault_ctx, fault))
    assert '"armed"' not in fault_ctx.journal.path.read_text()  # refused before anything was armed


def test_partition_cuts_the_data_network_between_groups_only(netns_lab, fault_ctx, clean_lab):
    lab = netns_lab
    fault = make("network.partition", target={"nodes": ["n0"]}, peers={"nodes": ["n1"]}, duration="30s")
    inj = inject_and_revert(fault_ctx, fault)
    assert inj.targets == ["n0|n1"]
    assert not tcp(lab, "n0", lab.data_address("n1")) and not tcp(lab, "n1", lab.data_address("n0"))
    assert tcp(lab, "n1", lab.mgmt_address("n0"))  # only the data addresses are cut
    assert "chaoskit_" in fx().ns_run(lab, "n0", "nft", "list", "tables").stdout
    assert "chaoskit_" not in fx().ns_run(lab, "n1", "nft", "list", "tables").stdout  # rules on the target side only
    finish(fault_ctx, fault, inj)
    assert tcp(lab, "n0", lab.data_address("n1"))


def test_the_node_reverts_by_itself_when_the_lease_goes_stale_or_the_duration_ends(netns_lab, fault_ctx, clean_lab):
    lab = netns_lab
    stale = make("network.link_down", target={"nodes": ["n0"]}, duration="60s")
    timed = make("network.blackhole", target={"nodes": ["n1"]}, duration="1s")
    [a] = stale.inject(fault_ctx, targets(fault_ctx, stale))
    [b] = timed.inject(fault_ctx, targets(fault_ctx, timed))
    fault_ctx.leases.leases.pop(a.fault_id)  # the controller stops renewing this one, as if it died
    start = time.time()
    assert fx().wait_until(lambda: fx().node_clean(lab, "n1") is None, 3), "the 1s blackhole outlived its duration"
    assert fx().wait_until(lambda: fx().node_clean(lab, "n0") is None, fault_ctx.leases.ttl + 3)
    assert time.time() - start < fault_ctx.leases.ttl + 3
    fired = fault_ctx.transport("n0").lease_fired(fault_ctx.transport("n0").lease_dir(f"{fault_ctx.leases.run_id}/{a.fault_id}"))
    assert fired and "lease expired" in fired
    for fault, inj in ((stale, a), (timed, b)):
        assert fault.verify(fault_ctx, inj) is None


def test_dropping_the_controllers_own_nic_still_ends_restored(netns_lab, fault_ctx, clean_lab):
    fault = make("network.link_down", target={"nodes": ["n1"]}, interface="mgmt", duration="2s")
    start = time.time()
    [inj] = fault.inject(fault_ctx, targets(fault_ctx, fault))  # the answer comes once the node restored itself
    assert inj.targets == ["n1:eth1"]
    assert fault.verify(fault_ctx, inj) is None
    assert time.time() - start < 15
    fault_ctx.leases.release(inj.fault_id)
    assert fault_ctx.transport("n1").ping() > 0


def test_power_off_kills_the_node_and_power_on_brings_it_back(netns_lab, lab_inventory, fault_ctx, clean_lab):
    lab = netns_lab
    fault = make("node.poweroff", target={"nodes": ["n1"]}, duration="30s")
    ts = targets(fault_ctx, fault)
    fault.preflight(fault_ctx, ts)
    [inj] = fault.inject(fault_ctx, ts)
    assert lab.pids("n1") == [] and not lab.power("n1", "status")
    with pytest.raises(InfraError):
        fault.preflight(fault_ctx, ts)  # already off
    fault.revert(fault_ctx, inj)
    fault_ctx.leases.release(inj.fault_id)
    assert fault.verify(fault_ctx, inj) is None
    assert lab_inventory["n1"].conn.run(["true"], 5).returncode == 0


def test_power_off_reverts_from_the_controller_when_its_lease_goes_stale(netns_lab, lab_inventory, fault_ctx, clean_lab):
    lab = netns_lab
    fault = make("node.poweroff", target={"nodes": ["n1"]}, duration="60s")
    [inj] = fault.inject(fault_ctx, targets(fault_ctx, fault))
    fault_ctx.leases.leases.pop(inj.fault_id)  # stop renewing: the controller-side watchdog powers it on
    assert not lab.power("n1", "status")
    assert fx().wait_until(lambda: lab.power("n1", "status"), fault_ctx.leases.ttl + 5)
    assert fault.verify(fault_ctx, inj) is None


def test_power_off_without_power_on_needs_allow_irreversible(fault_ctx, lab_inventory):
    from chaoskit.core.errors import ScenarioError

    node = lab_inventory["n0"]
    saved = node.power
    node.power = saved.model_copy(update={"on": None})
    try:
        fault = make("node.poweroff", target={"nodes": ["n0"]}, duration="5s")
        with pytest.raises(ScenarioError, match="no power.on command"):
            fault.preflight(fault_ctx, targets(fault_ctx, fault))
        irreversible = make("node.poweroff", target={"nodes": ["n0"]}, allow_irreversible=True)
        assert not irreversible.lasting
        assert "irreversible" in irreversible.plan(fault_ctx, targets(fault_ctx, irreversible))[0].command
    finally:
        node.power = saved


def test_rollback_undoes_what_a_crashed_run_left(netns_lab, lab_inventory, tmp_path, clean_lab):
    from chaoskit.runner import RunContext
    from chaoskit.safety.journal import Journal, read_journal
    from chaoskit.safety.lease import LeaseManager
    from chaoskit.safety.rollback import rollback_journal

    run_dir = tmp_path / "crashed-run"
    journal = Journal(run_dir / "journal.jsonl")
    leases = LeaseManager(tmp_path / "leases", "crashed-run", ttl=600)  # long TTL: only rollback can help
    ctx = RunContext(lab_inventory, journal, leases)
    faults = [make("network.partition", target={"nodes": ["n0"]}, duration="10m"),
              make("network.blackhole", target={"nodes": ["n1"]}, duration="10m")]
    for f in faults:
        f.inject(ctx, targets(ctx, f))
    leases._stop.set()  # the controller "crashes": nothing renews, nothing releases
    journal.close()
    assert fx().node_clean(netns_lab, "n0") and fx().node_clean(netns_lab, "n1")
    outcomes = rollback_journal(run_dir / "journal.jsonl", lab_inventory)
    assert [(o.kind, o.ok, o.problem) for o in outcomes] == [("network.partition", True, None), ("network.blackhole", True, None)]
    assert fx().node_clean(netns_lab, "n0") is None and fx().node_clean(netns_lab, "n1") is None
    assert [e["by"] for e in read_journal(run_dir / "journal.jsonl") if e["action"] == "reverted"] == ["rollback", "rollback"]
    assert rollback_journal(run_dir / "journal.jsonl", lab_inventory) == []  # nothing left to do
    # Rollback released the leases, so the watchdogs stood down.
    t = lab_inventory["n0"].conn
    assert fx().wait_until(lambda: not any("watchdog" in p.cmdline for p in t.processes()), 3)
    leases.close()
