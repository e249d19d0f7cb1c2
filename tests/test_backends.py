"""The cluster-backend registry: adding a kind of cluster is one class plus one registration.

A toy backend, defined here, is registered from the test module (as a plugin's entry point
would be) and then named by a scenario: ``chaoskit validate`` and ``chaoskit run --dry-run``
take it like a built-in one. Its nodes are imaginary: a dry run touches nothing, so nothing
needs to exist (a real run would need real nodes, which is what the built-in backends test).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from chaoskit.backends.api import ClusterBackend, ClusterHandle, ClusterSpec
from chaoskit.backends.registry import CLUSTERS
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.core.registry import DuplicateName
from tests.conftest import run_cli


class ToySpec(ClusterSpec):
    kind: Literal["toy"] = Field(..., description="toy: imaginary nodes for a dry run.")
    racks: int = Field(1, ge=1, description="Racks the nodes spread over.")


class ToyBackend(ClusterBackend):
    name = "toy"
    Spec = ToySpec
    summary = "imaginary nodes (tests only)"

    def preview(self, spec: ToySpec, base: Path) -> ClusterHandle:
        nodes = [Node(f"t{i}", labels={"rack": f"r{i % spec.racks}"}) for i in range(spec.nodes)]
        return ClusterHandle(id="toy-cluster", kind=self.name, inventory=Inventory("toy", nodes),
                             job_nodes=[n.name for n in nodes], rdzv_host="toy-head", scope=lambda node: f"toy.{node}")


@pytest.fixture
def toy_backend():
    CLUSTERS.register("toy", ToyBackend)
    yield ToyBackend
    CLUSTERS.unregister("toy")


def _scenario(tmp_path: Path, cluster: str) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(f"""name: toy-drill
cluster: {cluster}
faults:
  - kind: process.kill
    target: {{ranks: [3]}}
    at: {{step: 10}}
""")
    return path


def test_a_registered_backend_is_validated_and_dry_run_like_a_built_in_one(toy_backend, tmp_path):
    scenario = _scenario(tmp_path, "{kind: toy, nodes: 4, racks: 2}")
    res = run_cli("validate", scenario)
    assert res.code == 0, res.stderr
    res = run_cli("run", scenario, "--dry-run", "--json")
    assert res.code == 0, res.stderr
    plan = res.json
    assert plan["cluster"]["kind"] == "toy" and plan["cluster"]["job_nodes"] == ["t0", "t1", "t2", "t3"]
    [fault] = plan["plan"]
    assert fault["actions"] == [{"node": "t3", "target": "t3/rank3", "command": "kill -s KILL <pid of rank 3>"}]


def test_a_registered_backends_own_fields_are_validated(toy_backend, tmp_path):
    res = run_cli("validate", _scenario(tmp_path, "{kind: toy, nodes: 4, racks: 0}"))
    assert res.code == 2
    assert "toy.yaml:2:39: cluster.racks: Input should be greater than or equal to 1" in res.stderr
    res = run_cli("validate", _scenario(tmp_path, "{kind: toy, nodes: 2}"))
    assert res.code == 2 and "rank 3 does not exist: the job has ranks 0..1" in res.stderr


def test_an_unregistered_kind_is_refused_naming_the_known_ones(tmp_path):
    res = run_cli("validate", _scenario(tmp_path, "{kind: toy, nodes: 4}"))
    assert res.code == 2
    assert "unknown cluster kind 'toy'; known kinds: docker, inventory, netns, process, ray" in res.stderr


def test_a_second_registration_under_a_taken_name_is_refused(toy_backend):
    with pytest.raises(DuplicateName, match="cluster backend 'process' is already registered"):
        CLUSTERS.register("process", ToyBackend)
    with pytest.raises(DuplicateName, match="cluster backend 'toy' is already registered"):
        CLUSTERS.register("toy", ToyBackend)


def test_backends_are_imported_only_when_used():
    """Listing the kinds and the lab kinds imports no backend; using one imports that one alone."""
    code = ("import sys; from chaoskit.backends.registry import CLUSTERS, backend, lab_kinds; names = CLUSTERS.names(); "
            "labs = lab_kinds(); backend('process'); "
            "print(names, labs, sorted(m for m in sys.modules if m.startswith('chaoskit.backends.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names = sorted(CLUSTERS.builtin())
    labs = [name for name in names if CLUSTERS.get(name).has_lab]
    assert "inventory" in names and "inventory" not in labs and "process" in labs
    assert out.strip() == (f"{names} {labs} "
                           "['chaoskit.backends.api', 'chaoskit.backends.process', 'chaoskit.backends.registry']")


def test_a_backend_module_dropped_in_is_found_without_a_table_or_an_entry_point(tmp_path):
    """Adding a backend is adding its module: the scan finds a class that says ``name = "..."`` (and whether it has
    a lab), and nothing else: not an annotation, not a nested class, not a module starting with '_'."""
    from chaoskit.backends.registry import NAME_RE
    from chaoskit.core.registry import declared_in_source

    (tmp_path / "mine.py").write_text(
        'class MineBackend(ClusterBackend):\n    """One."""\n\n    name = "mine"  # the kind\n    has_lab = False\n\n'
        'class Other:\n    name: str = "x"\n\n    class Inner:\n        name = "inner"\n')
    (tmp_path / "_private.py").write_text('class Hidden:\n    name = "hidden"\n')
    found = declared_in_source(tmp_path, "pkg.backends", "name", NAME_RE, ("has_lab",))
    assert found == {"mine": ("pkg.backends.mine:MineBackend", {"has_lab": "False"})}
    (tmp_path / "again.py").write_text('class Again:\n    name = "mine"\n')
    with pytest.raises(RuntimeError, match="'mine' is declared by pkg.backends2.again:Again and pkg.backends2.mine:MineBackend"):
        declared_in_source(tmp_path, "pkg.backends2", "name", NAME_RE)


def test_the_entry_point_scan_agrees_with_importlib_metadata():
    """chaoskit reads entry_points.txt itself (importlib.metadata costs more to import than the scan);
    it must find what importlib.metadata finds, for its groups and for one every install has."""
    from importlib.metadata import entry_points

    from chaoskit.core.registry import declared_entry_points

    for group in ("chaoskit.faults", "chaoskit.clusters", "console_scripts"):
        assert sorted(declared_entry_points(group)) == sorted((ep.name, ep.value) for ep in entry_points(group=group))


def test_a_backend_without_a_lab_is_refused_by_lab_up():
    res = run_cli("lab", "up", "--kind", "inventory")
    assert res.code == 2 and "--kind inventory is not a lab" in res.stderr
    kinds = run_cli("lab", "kinds").stdout
    assert any(line.startswith("inventory ") and line.endswith("(not a lab)") for line in kinds.splitlines())


def test_lab_up_help_names_every_built_in_lab_kind():
    """The --kind help names the kinds from the registry's scan of the backends' source; a backend that cannot
    make a lab is not offered."""
    from chaoskit.backends.registry import CLUSTERS

    labs = [name for name, cls in CLUSTERS.all().items() if cls.has_lab]
    text = " ".join(run_cli("lab", "up", "--help").stdout.split())
    offered = text.split("--kind <str>")[1].split(";")[0].replace(",", " ").split()
    assert labs and offered == labs and "inventory" not in offered, (labs, text)
