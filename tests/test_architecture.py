"""The layering of docs/architecture.md holds, and breaks loudly when someone imports upward.

``lint-imports`` (import-linter) checks the contracts in pyproject.toml: the layers, the fault
kinds, the transports and the cluster backends. These tests run it on the real tree, and on copies with one
upward import added, to show that the check can fail.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGE = ROOT / "chaoskit"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_hold():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 6 and f"Contracts: {len(contracts)} kept, 0 broken." in res.stdout


def tree_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contracts with ``line`` appended to ``module`` (a path under chaoskit/)."""
    shutil.copytree(PACKAGE, tmp_path / "chaoskit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "chaoskit" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    return tmp_path


def test_an_upward_import_breaks_the_contract(tmp_path):
    res = lint_imports(tree_with(tmp_path, "core/errors.py", "from chaoskit.runner import RunContext  # the core reaching up"))
    assert res.returncode != 0
    assert "Layers: each imports only from below BROKEN" in res.stdout
    assert "chaoskit.core.errors -> chaoskit.runner" in res.stdout


def test_a_backend_importing_another_breaks_the_contract(tmp_path):
    res = lint_imports(tree_with(tmp_path, "backends/ray.py", "from chaoskit.backends.process import ProcessBackend"))
    assert res.returncode != 0
    assert "Cluster backends are independent of each other BROKEN" in res.stdout


TRANSPORTS_CONTRACT = "Transports above the agent's channel, the generic fan-out below all"


def test_the_agents_channel_importing_a_transport_breaks_the_contract(tmp_path):
    res = lint_imports(tree_with(tmp_path, "cluster/transports/channel.py", "from chaoskit.cluster.transports.ssh import GRACE_S"))
    assert res.returncode != 0
    assert f"{TRANSPORTS_CONTRACT} BROKEN" in res.stdout


def test_the_generic_fan_out_importing_a_transport_breaks_the_contract(tmp_path):
    """The selectors (and so ``validate``) import the fan-out: it stays free of paramiko's transports."""
    res = lint_imports(tree_with(tmp_path, "cluster/fanout.py", "from chaoskit.cluster.transports.ssh import GRACE_S"))
    assert res.returncode != 0
    assert f"{TRANSPORTS_CONTRACT} BROKEN" in res.stdout


def _local_imports() -> list[tuple[str, int, str]]:
    """(file, line, module) of every import of a chaoskit module inside a function."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("chaoskit"):
                    found.append((str(path.relative_to(ROOT)), inner.lineno, inner.module))
    return found


def test_chaoskit_modules_import_each_other_at_the_top():
    """Only the simulator (numpy at its top) is imported inside functions, to keep numpy out of --help."""
    assert [(f, line, m) for f, line, m in _local_imports() if not m.startswith("chaoskit.sim")] == []


def test_no_code_outside_the_backends_asks_which_kind_of_cluster_it_is():
    kinds = ("process", "ray", "netns", "docker")
    pattern = re.compile(r"""(kind|\.name)\s*[!=]=\s*["'](%s)["']|["'](%s)-lab["']""" % ("|".join(kinds), "|".join(kinds)))
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("backends", "lab"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert offenders == []


def test_a_fault_kind_importing_another_breaks_the_contract(tmp_path):
    res = lint_imports(tree_with(tmp_path, "faults/gpu.py", "from chaoskit.faults.process import KillFault"))
    assert res.returncode != 0
    assert "Fault kinds are independent of each other BROKEN" in res.stdout
    assert "chaoskit.faults.gpu -> chaoskit.faults.process" in res.stdout


@pytest.mark.parametrize("package, registry, base, attr, some, contract", [
    ("chaoskit.faults", "FAULTS", "chaoskit.faults.api:Fault", "kind", {"process.kill", "gpu.xid", "inproc.slow"},
     "Fault kinds are independent of each other"),
    ("chaoskit.backends", "CLUSTERS", "chaoskit.backends.api:ClusterBackend", "name", {"process", "netns", "slurm", "inventory"},
     "Cluster backends are independent of each other"),
])
def test_the_built_ins_are_found_in_their_modules_not_in_entry_points(package, registry, base, attr, some, contract):
    """A built-in fault kind (backend) is a class in a module of chaoskit/faults/ (backends/) declaring
    ``kind = "..."`` (``name = "..."``): no entry point of pyproject.toml names one (the group is for other
    packages'), every one found loads and declares the name it was found under, every such class of those
    modules is found, and each lives in a module the independence contract reaches by its wildcard (a direct
    child of the package)."""
    import importlib
    import inspect
    import pkgutil
    import tomllib

    registry = getattr(importlib.import_module(f"{package}.registry"), registry)
    module_name, _, cls_name = base.partition(":")
    base = getattr(importlib.import_module(module_name), cls_name)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert registry.group not in project["project"].get("entry-points", {})
    found = registry.builtin()
    assert some <= set(found)
    for name, target in found.items():
        module, _, cls_attr = target.partition(":")
        assert module.count(".") == 2 and module.startswith(f"{package}."), target
        cls = registry.get(name)
        assert (cls.__module__, cls.__qualname__, getattr(cls, attr)) == (module, cls_attr, name)
        assert issubclass(cls, base) and cls.Spec.model_fields["kind"].annotation.__args__ == (name,)
    declared = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        for name, obj in vars(importlib.import_module(f"{package}.{info.name}")).items():
            if inspect.isclass(obj) and issubclass(obj, base) and attr in vars(obj) and obj.__module__ == f"{package}.{info.name}":
                declared[getattr(obj, attr)] = f"{obj.__module__}:{name}"
    assert declared == found
    [independent] = [c["modules"] for c in project["tool"]["importlinter"]["contracts"] if c["name"] == contract]
    assert independent == [f"{package}.*"]


def test_an_entry_point_under_a_built_in_kinds_name_is_refused_unless_it_is_the_built_in(monkeypatch):
    """An install made when the built-ins were entry points still declares them, each naming the built-in
    itself: those are the built-ins. A plugin taking a built-in's name is refused, as a second registration is."""
    from chaoskit.core import registry as core_registry

    # What an install declares stands in here (installing a plugin package would change the shared venv); the
    # registry that reads it is the real one.
    stale = [("process.kill", "chaoskit.faults.process:KillFault"), ("my.kind", "mypkg.faults:MyFault")]
    monkeypatch.setattr(core_registry, "declared_entry_points", lambda group: stale)
    faults = core_registry.Registry("fault kind", "chaoskit.faults", {"process.kill": "chaoskit.faults.process:KillFault"})
    assert faults.names() == ["my.kind", "process.kill"]
    monkeypatch.setattr(core_registry, "declared_entry_points", lambda group: [("process.kill", "mypkg.faults:Kill")])
    taken = core_registry.Registry("fault kind", "chaoskit.faults", {"process.kill": "chaoskit.faults.process:KillFault"})
    with pytest.raises(core_registry.DuplicateName, match="is a built-in's name"):
        taken.names()
