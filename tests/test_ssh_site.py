"""What a real site needs to reach its nodes: a non-root user with sudo, a bastion, ~/.ssh/config.

The ``site`` fixture treats a netns lab as somebody else's cluster: nodes n0 and n1 are
reachable only through the bastion n2 (nftables here refuses SSH to them), as a user
whose sudo needs no password, or as one whose sudo asks for one. The bad-input tests
need neither root nor a lab.
"""

from __future__ import annotations

import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from chaoskit.core.errors import InfraError
from tests.conftest import run_cli

pytest_plugins = ["tests.netns_fixtures"]


def _fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_commands_run_as_root_through_the_bastion_and_not_directly(site):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.transports.ssh import SSHTransport

    inventory = load_inventory(site.inventory_path)
    try:
        n0, n1 = inventory["n0"].conn, inventory["n1"].conn
        assert n0.jump is n1.jump and n0.jump.role == "bastion"  # one bastion connection for both
        for conn in (n0, n1):
            res = conn.run(["sh", "-c", "id -u; echo $SUDO_USER"])
            assert res.returncode == 0 and res.stdout.split() == ["0", site.user], res
            assert conn.mode == "agent" and conn.sudo
        assert n0.jump.connected and n0.jump.mode == "exec"  # no agent on the bastion
        # direct SSH to a node is refused: the commands above went through the bastion
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((site.address("n0"), 22), timeout=5).close()
        direct = SSHTransport("n0", site.address("n0"), user=site.user, key_file=site.key_path,
                              known_hosts=site.known_hosts, connect_timeout=5)
        with pytest.raises(InfraError, match="cannot reach node n0"):
            direct.connect()
        # the bastion's connection drops: the next command reconnects through a new one
        n0.jump.close()
        assert not n0.jump.connected
        assert n0.run(["id", "-u"]).stdout.strip() == "0"
        assert n0.jump.connected
    finally:
        inventory.close()
    assert not n0.jump.connected


def test_sudo_that_asks_for_a_password_is_a_clear_error_at_once(site):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.transports.ssh import SudoError

    doc = site.inventory(user=site.nosudo_user, key=site.nosudo_key_path.name)
    inventory = load_inventory(site.write(doc, "nosudo.yaml"))
    try:
        conn = inventory["n1"].conn
        started = time.monotonic()
        with pytest.raises(SudoError) as info:
            conn.run(["id", "-u"])
        assert time.monotonic() - started < 5
        text = str(info.value)
        assert f"node n1: sudo -n asks for a password for user {site.nosudo_user}" in text
        assert "NOPASSWD" in text and info.value.exit_code == 3
        assert conn.mode == "agent"  # not counted as a dead agent: fix sudoers and the next call works
    finally:
        inventory.close()


def test_doctor_shows_sudo_and_names_the_node_without_it(site):
    doc = site.inventory()
    doc["nodes"][1]["ssh"] = {"user": site.nosudo_user, "key": site.nosudo_key_path.name}
    res = run_cli("doctor", site.write(doc, "doctor.yaml"), "--json")
    assert res.code == 3, res.stdout + res.stderr
    nodes = {n["node"]: n for n in res.json["nodes"]}
    assert nodes["n0"]["privilege"] == "sudo -n" and nodes["n0"]["agent"] and nodes["n0"]["problems"] == []
    assert nodes["n1"]["reachable"] and nodes["n1"]["privilege"] is None
    assert "node n1: sudo -n asks for a password" in nodes["n1"]["problems"][0]


def test_an_unknown_bastion_host_key_is_refused_with_its_fingerprint(site):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.transports.ssh import HostKeyError

    bastion = site.address(site.bastion)
    lines = [line for line in site.known_hosts.read_text().splitlines() if not line.startswith(bastion + " ")]
    (site.directory / "known_hosts_no_bastion").write_text("\n".join(lines) + "\n")
    inventory = load_inventory(site.write(site.inventory(known_hosts="known_hosts_no_bastion"), "nobastionkey.yaml"))
    try:
        with pytest.raises(HostKeyError) as info:
            inventory["n0"].conn.run(["true"])
    finally:
        inventory.close()
    text = str(info.value)
    assert f"unknown host key for bastion bastion ({bastion})" in text
    assert _fingerprint(site.lab.node_dir(site.bastion) / "ssh_host_ed25519_key.pub") in text


def test_an_ssh_config_alias_gives_address_user_key_and_proxyjump(site):
    from chaoskit.cluster.inventory_file import load_inventory

    (site.directory / "ssh_config").write_text(textwrap.dedent(f"""\
        Host nodeA
            HostName {site.address("n0")}
            User {site.user}
            IdentityFile {site.key_path}
            ProxyJump gw
        Host gw
            HostName {site.address(site.bastion)}
            User {site.user}
            IdentityFile {site.key_path}
    """))
    path = site.write({"name": "aliases", "ssh": {"config": "ssh_config", "known_hosts": site.known_hosts.name},
                       "nodes": [{"name": "a", "address": "nodeA", "processes": "netns",
                                  "workdir": str(site.lab.node_dir("n0") / "work")}]}, "aliases.yaml")
    inventory = load_inventory(path)
    try:
        conn = inventory["a"].conn
        res = conn.run(["sh", "-c", "id -u; echo $SUDO_USER"])  # the config's user is not root: sudo by default
        assert res.stdout.split() == ["0", site.user]
        assert (conn.address, conn.user, conn.key_file) == (site.address("n0"), site.user, str(site.key_path))
        assert conn.jump is not None and conn.jump.address == site.address(site.bastion)
    finally:
        inventory.close()


# -- bad input: refused before anything connects (no root, no lab) --------------------------------

SITE = """\
name: site
ssh: {user: ops, become: sudo, jump: gw}
bastions:
  - {name: gw, address: 10.0.0.1}
nodes:
  - {name: n0, address: 10.0.0.10}
"""


@pytest.mark.parametrize(
    "old, new, where, message",
    [
        ("jump: gw}", "jump: gateway}", "2:", "ssh.jump: no bastion is named 'gateway'; known bastions: gw"),
        ("become: sudo", "become: su", "2:", "ssh.become: only 'sudo' (or 'none') is supported"),
        ("{name: gw,", "{name: n0,", "4:", "bastions.0.name: 'n0' is also the name of a node"),
        ("{name: n0, address: 10.0.0.10}", "{name: n0, address: 10.0.0.10, ssh: {jump: nope}}", "6:",
         "nodes.0.ssh.jump: no bastion is named 'nope'; known bastions: gw"),
        ("{name: gw, address: 10.0.0.1}", "{name: gw, address: 10.0.0.1, ssh: {jump: gw}}", "4:",
         "bastions.0.ssh.jump: bastion gw reaches itself (gw -> gw)"),
        ("  - {name: n0, address: 10.0.0.10}\n", "  - {name: n0, address: 10.0.0.10}\n  - {name: n0, address: h}\n",
         "7:", "duplicate node name 'n0'"),
    ],
)
def test_bad_site_settings_are_positioned_errors(tmp_path, old, new, where, message):
    path = tmp_path / "inventory.yaml"
    assert old in SITE
    path.write_text(SITE.replace(old, new))
    res = run_cli("validate", path)
    assert res.code == 2, res.stdout + res.stderr
    assert f"{path}:{where}" in res.stderr and message in res.stderr, res.stderr


def test_the_site_example_is_valid_and_the_ssh_config_fills_only_what_the_inventory_left_unset(tmp_path):
    from chaoskit.cluster.inventory_file import load_inventory

    (tmp_path / "config").write_text("Host n0 gw\n    User fromconfig\n    Port 2200\n    IdentityFile ~/.ssh/site\n"
                                     "Host n0\n    HostName 10.0.0.20\n    ProxyJump gw\n")
    path = tmp_path / "inventory.yaml"
    path.write_text("name: site\nssh: {config: config, port: 22}\nnodes:\n  - {name: n0, address: n0}\n"
                    "  - {name: n1, address: n0, ssh: {user: ops, key: k, jump: none}}\n")
    assert run_cli("validate", path).code == 0
    inventory = load_inventory(path)
    n0, n1 = inventory["n0"].conn, inventory["n1"].conn
    n0.route()
    n1.route()
    assert (n0.address, n0.user, n0.port, n0.key_file) == ("10.0.0.20", "fromconfig", 22, str(Path("~/.ssh/site").expanduser()))
    assert n0.sudo and n0._workdir is None  # no folder named after the user: the agent picks and checks its own
    assert n0.jump is not None
    n0.jump.route()  # the bastion's own config entry applies when it connects
    assert (n0.jump.address, n0.jump.user, n0.jump.port, n0.jump.role) == ("gw", "fromconfig", 2200, "bastion")
    assert n0.jump.key_file == n0.key_file
    assert (n1.address, n1.user, n1.key_file, n1.jump) == ("10.0.0.20", "ops", str(tmp_path / "k"), None)
    assert not n0.connected and not n0.jump.connected
