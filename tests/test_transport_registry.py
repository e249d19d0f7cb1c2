"""The transport registry: a transport is one module whose class says ``name = "..."``; an inventory file's node
is made by the class its ``transport:`` names, and SSH and docker are siblings over one agent transport."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaoskit.cluster.transports.api import InventorySite, ListedNode
from chaoskit.cluster.transports.registry import TRANSPORTS, takes_ssh, transport_class
from chaoskit.core.errors import ScenarioError


def test_the_built_in_transports_are_found_in_their_source_without_importing_them():
    """Listing the transports (and asking which keep SSH settings) imports no transport, so no paramiko and no
    docker SDK; asking for one imports that one."""
    code = ("import sys; from chaoskit.cluster.transports.registry import TRANSPORTS, takes_ssh; "
            "names = TRANSPORTS.names(); ssh = [n for n in names if takes_ssh(n)]; "
            "print(names, ssh, sorted(m for m in sys.modules if m.startswith(('paramiko', 'docker')) "
            "or m.rsplit('.', 1)[-1] in ('ssh', 'docker', 'ray', 'local', 'agent_transport')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['docker', 'local', 'ray', 'ssh'] ['ssh'] []"
    for name in TRANSPORTS.names():
        assert transport_class(name).name == name


def test_ssh_and_docker_are_siblings_over_one_agent_transport():
    """The docker transport shares the agent's contract, not SSH's settings: it takes no user, key or host keys."""
    from chaoskit.cluster.transports.agent_transport import AgentTransport

    ssh, docker = transport_class("ssh"), transport_class("docker")
    assert issubclass(ssh, AgentTransport) and issubclass(docker, AgentTransport)
    assert not issubclass(docker, ssh) and not issubclass(ssh, docker)
    with pytest.raises(TypeError):
        docker("n0", "lab-n0", user="ops")
    with pytest.raises(TypeError):
        docker("n0", "lab-n0", known_hosts="/nonexistent")
    node = docker("n0", "lab-n0", scope_token="lab.n0")
    assert node.container == "lab-n0" and node.scope["env"] == "lab.n0" and node.label == "node n0"


def test_an_unknown_transport_is_an_error_naming_the_known_ones():
    with pytest.raises(ScenarioError, match=r"unknown transport 'shh'.*") as info:
        transport_class("shh")
    assert "ssh" in str(info.value) and "known transports: docker, local, ray, ssh" in (info.value.hint or "")
    assert not takes_ssh("shh")


def test_an_inventory_node_names_a_transport_of_the_registry_that_makes_nodes(tmp_path: Path):
    """The transports a node may name come from the registry (``inventory_node = True`` in the class, read from
    the source): the inventory's schema lists them, and a typo or a lab's transport is refused at its line with
    the ones it may name."""
    from chaoskit.cli.env import CliEnv
    from chaoskit.cli.main import main
    from chaoskit.cluster.inventory_spec import NodeSpec
    from chaoskit.cluster.transports.registry import inventory_transports

    assert inventory_transports() == ["ray", "ssh"]
    assert NodeSpec.model_json_schema()["properties"]["transport"]["enum"] == ["ray", "ssh"]
    for name, said in (("shh", "unknown transport 'shh' (did you mean 'ssh'?)"), ("docker", "unknown transport 'docker'")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: x\nssh: {{user: root}}\nnodes:\n  - {{name: a, address: 10.0.0.1, transport: {name}}}\n")
        err = io.StringIO()
        assert main(["validate", str(path)], CliEnv(stdout=io.StringIO(), stderr=err)) == 2
        assert err.getvalue() == (f"{path}:4:45: nodes.0.transport: {said}: an inventory's node is reached by ray or ssh\n")


class ToyTransport:
    """A transport a plugin adds: its node is made by its own ``from_inventory``."""

    name = "toy"

    def __init__(self, node: str, address: str) -> None:
        self.node, self.address = node, address

    @classmethod
    def from_inventory(cls, site: InventorySite, index: int, spec) -> ListedNode:
        return ListedNode(cls(spec.name, spec.address), {**spec.labels, "toy": "yes"})


@pytest.fixture
def toy_transport():
    TRANSPORTS.register("toy", ToyTransport)
    yield ToyTransport
    TRANSPORTS.unregister("toy")


def test_an_inventory_node_is_made_by_the_class_its_transport_names(tmp_path: Path, toy_transport):
    """build_inventory asks the registry for each node's class: a registered plugin's class makes its node, and
    the file names it as it names ssh (the transports a node may name are the registry's, not a list of the
    format's)."""
    from chaoskit.cluster.inventory_file import build_inventory, load_inventory_file

    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent("""\
        name: mixed
        ssh: {user: root, known_hosts: ./known_hosts}
        nodes:
          - {name: a, address: 10.0.0.1, labels: {rack: r1}}
          - {name: b, address: 10.0.0.2, labels: {rack: r2}, transport: toy}
        """))
    inv = build_inventory(load_inventory_file(path))
    a, b = inv["a"], inv["b"]
    assert type(a.conn).name == "ssh" and a.ssh is not None and a.conn.known_hosts == str(tmp_path / "known_hosts")
    assert isinstance(b.conn, ToyTransport) and b.conn.address == "10.0.0.2" and b.ssh is None
    assert b.labels == {"rack": "r2", "toy": "yes"} and b.transport == "toy"


def test_a_fault_gets_every_transport_from_its_context():
    """No fault builds a transport itself: the node's comes from ``ctx.transport(node)``, and this machine acting
    for a node (a revert that runs on the controller, its watchdog) from ``ctx.controller(node)``, which refuses
    a node outside the inventory as ``ctx.transport`` does."""
    import ast

    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.core.errors import InfraError
    from chaoskit.runner import RunContext
    from tests.conftest import ROOT

    built = []
    for path in sorted((ROOT / "chaoskit" / "faults").glob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id.endswith("Transport"):
                built.append(f"{path.name}:{call.lineno}: {call.func.id}(...)")
    assert built == []
    ctx = RunContext(Inventory("lab", [Node("n0")]))
    here = ctx.controller("n0")
    assert here.node == "n0" and here is ctx.controller("n0") and here is not ctx.transport("n0")
    with pytest.raises(InfraError, match="'n9': it is not in the inventory"):
        ctx.controller("n9")
