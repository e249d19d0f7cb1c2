"""Inventory files and the network/power fault specs: validation with file:line:col,
and no shell metacharacter anywhere in a value that may reach a shell. No root needed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chaoskit.core.errors import ScenarioError

EXAMPLE = """\
# An inventory: the nodes chaoskit may touch and how to reach them.
name: rack-a
ssh:                              # defaults for every node; a node's own ssh: overrides them
  user: chaos                     # not root: every command runs under `sudo -n`
  key: ~/.ssh/chaoskit_ed25519
  known_hosts: known_hosts        # relative paths are relative to this file
nodes:
  - name: gpu01
    address: 10.20.0.11           # where the controller connects (the mgmt network)
    labels: {rack: r1, role: worker}
    interfaces:
      data: {name: ib0, address: 10.30.0.11}   # the training network: NIC faults land here
      mgmt: eno1                               # shorthand for {name: eno1}
    gpus: 8
    power:                        # run on the controller, without a shell
      off: ipmitool -I lanplus -H bmc-gpu01 -U chaos -f /etc/chaoskit/ipmi.pw chassis power off
      on: ipmitool -I lanplus -H bmc-gpu01 -U chaos -f /etc/chaoskit/ipmi.pw chassis power on
      status: /usr/local/bin/chaoskit-power-status bmc-gpu01
  - name: gpu02
    address: 10.20.0.12
    labels: {rack: r1, role: worker}
    interfaces: {data: {name: ib0, address: 10.30.0.12}, mgmt: eno1}
    gpus: 8
  - name: gpu03
    address: gpu03.cluster.example
    ssh: {port: 2222}
    labels: {rack: r2, role: spare}
    interfaces: {data: ib0, mgmt: eno1}
    gpus: 8
"""

NODE = """\
name: lab
nodes:
  - name: n0
    address: 10.0.0.1
"""


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path: Path, text: str) -> ScenarioError:
    from chaoskit.cluster.inventory_file import load_inventory_file

    with pytest.raises(ScenarioError) as info:
        load_inventory_file(write(tmp_path, text))
    return info.value


def test_the_example_inventory_loads_with_merged_ssh_settings(tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.transports.ssh import SSHTransport

    path = write(tmp_path, EXAMPLE)
    inv = load_inventory(path)
    assert inv.names() == ["gpu01", "gpu02", "gpu03"]
    gpu01, gpu03 = inv["gpu01"], inv["gpu03"]
    assert gpu01.labels == {"rack": "r1", "role": "worker"}
    assert gpu01.interface("data").name == "ib0" and gpu01.interface("data").address == "10.30.0.11"
    assert gpu01.interface("mgmt").name == "eno1"
    assert gpu01.power.off[:2] == ["ipmitool", "-I"] and gpu01.power.on[-1] == "on"
    assert inv["gpu02"].power is None
    conn = gpu03.conn
    assert isinstance(conn, SSHTransport)
    assert (conn.user, conn.port, conn.sudo) == ("chaos", 2222, True)  # port from the node, user from the defaults
    assert conn.known_hosts == str(tmp_path / "known_hosts")
    assert conn.key_file == str(Path("~/.ssh/chaoskit_ed25519").expanduser())
    assert not conn.connected  # nothing connects before it is used


@pytest.mark.parametrize(
    "fragment, where, message",
    [
        ("    interfaces: {data: 'eth0;reboot'}\n", "5:", "invalid interface name 'eth0;reboot'"),
        ("    interfaces: {data: {name: eth0, address: '10.0.0.1 ; ls'}}\n", "5:", "invalid interface address"),
        ("    power: {'off': 'ipmitool power off; reboot'}\n", "5:", "unsafe argument 'off;'"),
        ("    power: {'on': [ipmitool, '$(reboot)']}\n", "5:", "unsafe argument '$(reboot)'"),
        ("    power: {status: 'check `id`'}\n", "5:", "unsafe argument"),
        ("    ssh: {user: 'root;id'}\n", "5:", "invalid user name"),
        ("    ssh: {key: '/keys/a key'}\n", "5:", "invalid path"),
        ("    ssh: {python: 'python3;id'}\n", "5:", "invalid python command"),
        ("    labels: {rack: 'r1|x'}\n", "5:", "invalid label 'r1|x'"),
        ("    workdir: /tmp/$HOME\n", "5:", "invalid path"),
        ("    bogus: 1\n", "5:5", "unknown key 'bogus'"),
        ("    lables: {rack: r1}\n", "5:5", "unknown key 'lables' in nodes.0 (did you mean 'labels'?)"),
        ("    ssh: {usr: chaos}\n", "5:11", "unknown key 'usr' in nodes.0.ssh (did you mean 'user'?)"),
    ],
)
def test_unsafe_or_unknown_values_are_refused_with_their_position(tmp_path, fragment, where, message):
    err = load_error(tmp_path, NODE + fragment)
    text = str(err)
    assert message in text
    assert text.startswith(f"{tmp_path / 'inventory.yaml'}:{where}"), text


def test_a_bad_address_points_at_its_line(tmp_path):
    err = load_error(tmp_path, NODE.replace("10.0.0.1", "10.0.0.1;reboot"))
    assert str(err).startswith(f"{tmp_path / 'inventory.yaml'}:4:14: nodes.0.address: invalid address")


def test_duplicate_node_names_point_at_the_second(tmp_path):
    err = load_error(tmp_path, NODE + "  - name: n0\n    address: h2\n")
    assert "inventory.yaml:5:11:" in str(err) and "duplicate node name 'n0'" in str(err)


def test_bare_yaml_on_off_keys_mean_power_commands(tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory_file

    loaded = load_inventory_file(write(tmp_path, NODE + "    power:\n      off: /bin/false\n      on: [/bin/true]\n"))
    power = loaded.model.nodes[0].power
    assert (power.off, power.on) == (["/bin/false"], ["/bin/true"])


def test_sudo_and_quoting_of_remote_commands():
    from chaoskit.cluster.transports.agent_transport import checked_argv
    from chaoskit.cluster.transports.ssh import SSHTransport

    ops = SSHTransport("n0", "10.0.0.1", user="ops", known_hosts="/nonexistent")
    assert ops.sudo
    assert ops._remote(["ip", "link", "set", "dev", "eth0", "down"]) == "sudo -n ip link set dev eth0 down"
    assert ops._remote(["echo", "a b;reboot"]) == "sudo -n echo 'a b;reboot'"
    root = SSHTransport("n0", "10.0.0.1", user="root", known_hosts="/nonexistent")
    assert root._remote(["ip", "link"]) == "ip link"
    with pytest.raises(ValueError):
        checked_argv(["touch", "a\x00b"])
    with pytest.raises(ValueError):
        checked_argv(["echo", "a\rb"])


def scenario(tmp_path: Path, fault: str) -> Path:
    return write(tmp_path, "name: net\nfaults:\n" + textwrap.indent(textwrap.dedent(fault), "  "), "scenario.yaml")


@pytest.mark.parametrize(
    "fault, where, message",
    [
        ("- kind: network.link_down\n  interface: eth0;reboot\n  duration: 5s\n", "4:16", "invalid interface name 'eth0;reboot'"),
        ("- kind: network.blackhole\n  duration: 5s\n  interface: 'eth0 $(id)'\n", "5:16", "invalid interface name"),
        ("- kind: network.link_down\n  interface: data\n", "3:5", "missing required key 'duration'"),
        ("- kind: network.degrade\n  duration: 5s\n  rate: '10mbit; reboot'\n", "5:11", "invalid rate"),
        ("- kind: network.degrade\n  duration: 5s\n", "3:5", "give at least one of rate, delay, loss, corrupt"),
        ("- kind: network.degrade\n  duration: 5s\n  loss: 150\n", "5:11", "less than or equal to 100"),
        ("- kind: network.partition\n  duration: 5s\n  peers: {ranks: [1]}\n", "5:12", "peers selects nodes"),
        ("- kind: network.partition\n  duration: 5s\n  peers: {nodes: ['n1;id']}\n", "5:20", "invalid node name"),
        ("- kind: node.poweroff\n  target: {nodes: [n1]}\n", "3:5", "allow_irreversible: true"),
    ],
)
def test_network_and_power_specs_are_validated_in_scenarios(tmp_path, fault, where, message):
    from chaoskit.scenario import validate_file

    path = scenario(tmp_path, fault)
    result = validate_file(path)
    assert isinstance(result, list), "expected a validation error"
    text = str(result[0])
    assert message in text
    assert text.startswith(f"{path}:{where}"), text


def test_valid_network_and_power_specs(tmp_path):
    from chaoskit.scenario import validate_file

    path = scenario(tmp_path, """\
        - kind: network.link_down
          target: {nodes: [n0]}
          duration: 10s
        - kind: network.degrade
          interface: eth0
          rate: 100mbit
          duration: 10s
        - kind: network.partition
          target: {labels: {rack: r0}}
          peers: {labels: {rack: r1}}
          duration: 10s
        - kind: node.poweroff
          target: {nodes: [n1]}
          allow_irreversible: true
    """)
    loaded = validate_file(path)
    assert not isinstance(loaded, list), [str(e) for e in loaded]
    kinds = [f.kind for f in loaded.model.faults]
    assert kinds == ["network.link_down", "network.degrade", "network.partition", "node.poweroff"]


def test_degrade_plans_tbf_without_netem_and_netem_otherwise():
    from chaoskit.faults.network import DegradeFault, DegradeSpec

    tbf = DegradeFault(DegradeSpec(kind="network.degrade", duration=5, rate="8mbit"), "f0")
    assert tbf.qdisc() == ["tbf", "rate", "8mbit", "burst", "16384", "latency", "50ms"]
    netem = DegradeFault(DegradeSpec(kind="network.degrade", duration=5, delay=0.1, jitter=0.01, loss=1, rate="1gbit"), "f0")
    assert netem.qdisc() == ["netem", "delay", "100ms", "10ms", "loss", "1%", "rate", "1gbit"]


def test_rollback_of_an_empty_or_missing_journal_does_nothing(tmp_path):
    from chaoskit.cluster.inventory import Inventory
    from chaoskit.safety.rollback import find_crashed_runs, rollback_journal

    assert rollback_journal(tmp_path / "none.jsonl", Inventory("x", [])) == []
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1.json").write_text('{"pid": 999999999, "run_dir": "/tmp/r1"}')
    crashed = find_crashed_runs(tmp_path)
    # the journal rollback trusts is chaoskit's own, beside the marker, not the run folder's copy
    assert [c.run_id for c in crashed] == ["r1"] and crashed[0].journal == tmp_path / "runs" / "r1" / "journal.jsonl"
    assert crashed[0].run_dir == Path("/tmp/r1")


def test_dry_run_plans_show_the_exact_commands_without_connecting(tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.selectors import TargetSpec, resolve_nodes
    from chaoskit.faults.network import (
        LinkDownFault,
        LinkDownSpec,
        PartitionFault,
        PartitionSpec,
    )
    from chaoskit.faults.power import PowerOffFault, PowerOffSpec
    from chaoskit.runner import RunContext

    inv = load_inventory(write(tmp_path, EXAMPLE))
    ctx = RunContext(inv)
    link = LinkDownFault(LinkDownSpec(kind="network.link_down", target=TargetSpec(nodes=["gpu01"]), duration=30), "f0")
    actions = link.plan(ctx, resolve_nodes(inv, link.spec.target))
    assert [a.command for a in actions] == [
        "arm lease: watchdog runs 'ip link set dev ib0 up' after 30s or a stale lease",
        "ip link set dev ib0 down",
        "after 30s: ip link set dev ib0 up",
    ]

    class Placeholder:  # what the runner's dry run passes: only .node
        node = "gpu01"

    assert [a.command for a in link.plan(ctx, [Placeholder()])] == [a.command for a in actions]
    part = PartitionFault(PartitionSpec(kind="network.partition", target=TargetSpec(nodes=["gpu01"]),
                                        peers=TargetSpec(nodes=["gpu02"]), duration=10), "f1")
    inject = part.plan(ctx, resolve_nodes(inv, part.spec.target))[1].command
    assert "ip saddr { 10.30.0.12 } drop" in inject and "table inet chaoskit_f1_0" in inject
    power = PowerOffFault(PowerOffSpec(kind="node.poweroff", target=TargetSpec(nodes=["gpu01"]), duration=60), "f2")
    assert power.lasting
    assert power.plan(ctx, resolve_nodes(inv, power.spec.target))[1].command.endswith("chassis power off")
    assert not any(n.conn.connected for n in inv.nodes)


def test_ray_inventories_are_checked_before_anything_connects(tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory_file

    assert "transport: ray" in str(load_error(tmp_path, NODE + "    transport: ray\n"))  # no ray: at the top
    assert "ray: auto" in str(load_error(tmp_path, "name: lab\nnodes: []\n"))  # neither nodes nor ray
    assert "neither auto nor HOST:PORT" in str(load_error(tmp_path, "name: lab\nray: head;reboot\n"))
    assert "invalid address" in str(load_error(tmp_path, "name: lab\nray: 'a;b:6379'\n"))
    assert load_inventory_file(write(tmp_path, "name: lab\nray: auto\n")).model.nodes == []
    assert load_inventory_file(write(tmp_path, "name: lab\nray: 10.0.0.1:6379\n" + NODE[len("name: lab\n"):])).model.ray == "10.0.0.1:6379"
