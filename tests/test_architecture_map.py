"""docs/architecture.md is a map the next engineer can trust: short, its layers those of pyproject.toml's contracts,
and every path and name it cites still there (as the README's fault table is the registry's own).

Every backticked token of the map is read as one of:

- a path (it has a ``/`` or ends in a file suffix): a file or folder of the checkout or of ``chaoskit/``, a glob
  that matches one, or ``path/module.attr`` (``core/result.RunResult``): the module's file exists and the name
  resolves; a run's own files (``result.json``) are the names :mod:`chaoskit.core.files` gives them;
- a dotted name: ``module.attr`` under ``chaoskit`` (``measure.incident``), ``Class.attr`` of a class the map's
  modules define (``Fault.inject``), a scenario field (``workload.recovery``), a fault kind (``storage.slow``)
  an event kind (``fault.injected``) or a registry's entry-point group (``chaoskit.faults``);
- a lone ``CamelCase`` or ``UPPER_CASE`` name: defined by a module the map cites;
- ``chaoskit CMD`` and ``make TARGET``: a command of the table, a target of the Makefile.

Anything else (YAML snippets, lone lowercase words such as ``kind``) is prose.
"""

from __future__ import annotations

import importlib
import re
import tomllib
import typing
from pathlib import Path

from pydantic import BaseModel

import pytest

from chaoskit.backends.registry import CLUSTERS
from chaoskit.cli.app import COMMANDS
from chaoskit.core import files
from chaoskit.core.event_kinds import EVENT_KINDS
from chaoskit.faults.registry import FAULTS
from chaoskit.scenario.model import ScenarioBase
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

MAP = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "chaoskit"
MAX_WORDS = 2500

TICKED = re.compile(r"`([^`\n]+)`")
SUFFIX = re.compile(r"\.(py|md|json|jsonl|toml|ya?ml|csv|html|txt)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
NAME = re.compile(r"^(?:[A-Z][a-z0-9]+[A-Za-z0-9]*|[A-Z][A-Z0-9_]+)$")
RUN_FILES = {v for k, v in vars(files).items() if k.isupper() and isinstance(v, str) and SUFFIX.search(v)}


def _text() -> str:
    return re.sub(r"^```.*?^```", "", MAP.read_text(), flags=re.M | re.S)


def _tokens() -> list[str]:
    return list(dict.fromkeys(TICKED.findall(_text())))


def _module(dotted: str):
    """The chaoskit module ``dotted`` names (``measure``, ``core.result``), or None."""
    try:
        return importlib.import_module(f"chaoskit.{dotted}")
    except ImportError:
        return None


def _resolve(obj, attrs: list[str]) -> bool:
    for attr in attrs:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _module_and_attrs(parts: list[str]) -> tuple[object, list[str]] | None:
    """The longest importable chaoskit module among the leading ``parts``, and the attributes after it."""
    for cut in range(len(parts), 0, -1):
        module = _module(".".join(parts[:cut]))
        if module is not None:
            return module, parts[cut:]
    return None


def _cited_modules(tokens: list[str]) -> list[object]:
    modules = []
    for token in tokens:
        if token.endswith(".py") and "*" not in token:
            stem = token.removeprefix("chaoskit/").removesuffix(".py").replace("/", ".")
            modules.append(_module(stem))
        elif "/" in token and not SUFFIX.search(token) and "." in token.rsplit("/", 1)[-1]:
            path, _, _ = token.rpartition("/")
            modules.append(_module(path.replace("/", ".") + "." + token.rsplit("/", 1)[-1].split(".")[0]))
        elif DOTTED.match(token):
            found = _module_and_attrs(token.split("."))
            modules.append(found[0] if found else None)
    return [m for m in modules if m is not None]


def _defined(name: str, modules: list[object]) -> object | None:
    return next((getattr(m, name) for m in modules if hasattr(m, name)), None)


def _scenario_field(parts: list[str]) -> bool:
    model: object = ScenarioBase
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        annotation = fields[part].annotation
        model = next((a for a in (annotation, *typing.get_args(annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return True


def _path_problem(token: str) -> str | None:
    if token in RUN_FILES:
        return None
    for base in (ROOT, PACKAGE):
        if "*" in token and list(base.glob(token)):
            return None
        if (base / token).exists():
            return None
    folder, _, last = token.rpartition("/")
    if folder and "." in last and not SUFFIX.search(token):  # path/module.attr
        stem, *attrs = last.split(".")
        for base in (ROOT, PACKAGE):
            if (base / folder / f"{stem}.py").exists():
                module = _module(f"{folder}.{stem}".replace("/", ".").removeprefix("chaoskit."))
                return None if module is not None and _resolve(module, attrs) else f"{token}: no such name"
    return f"{token}: no such file"


def _dotted_problem(token: str, modules: list[object]) -> str | None:
    parts = token.split(".")
    found = _module_and_attrs(parts)
    if found is not None and _resolve(*found):
        return None
    owner = _defined(parts[0], modules)
    if owner is not None and _resolve(owner, parts[1:]):
        return None
    if _scenario_field(parts) or token in FAULTS or token in EVENT_KINDS or token in (FAULTS.group, CLUSTERS.group):
        return None
    return f"{token}: not a chaoskit name, a scenario field, a fault kind, an event kind or a plugin group"


def test_the_map_fits_in_one_reading():
    words = len(MAP.read_text().split())
    assert words <= MAX_WORDS, f"docs/architecture.md has {words} words; a map has at most {MAX_WORDS}"


def test_every_path_and_name_the_map_cites_exists():
    tokens = _tokens()
    modules = _cited_modules(tokens)
    makefile = (ROOT / "Makefile").read_text()
    problems = []
    for token in tokens:
        if token.startswith("chaoskit ") and not token.startswith("chaoskit --"):
            if token.split()[1] not in COMMANDS:
                problems.append(f"{token}: no such command")
        elif token.startswith("make "):
            if not re.search(rf"^{re.escape(token.split()[1])}:", makefile, re.M):
                problems.append(f"{token}: no such Makefile target")
        elif re.search(r"[\s:{}()=<>|,'\"\[\]]", token) or token.startswith(("-", "$")):
            continue
        elif "/" in token or SUFFIX.search(token):
            problems.append(_path_problem(token))
        elif DOTTED.match(token):
            problems.append(_dotted_problem(token, modules))
        elif NAME.match(token) and _defined(token, modules) is None:
            problems.append(f"{token}: defined by no module the map cites")
    problems = [p for p in problems if p]
    assert not problems, "docs/architecture.md cites what is not there:\n" + "\n".join(problems)


def test_the_maps_layers_are_the_contracts():
    """The first column of the map's layer table, row by row, is the 'Layers' contract of pyproject.toml."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["name"].startswith("Layers"))["layers"]
    truth = [sorted(m.strip().removeprefix("chaoskit.") for m in row.split("|")) for row in layers]
    section = _text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    mapped = [sorted(t.rstrip("/").removesuffix(".py").replace("/", ".") for t in TICKED.findall(row.split("|")[1]))
              for row in rows]
    assert mapped == truth, "the map's layer table differs from pyproject.toml's layers contract"


def test_the_checks_catch_a_stale_name(monkeypatch, tmp_path):
    """A renamed function, a moved file and an unknown kind are each reported."""
    stale = tmp_path / "architecture.md"
    stale.write_text(MAP.read_text() + "\n`measure.no_such_phase` `faults/no_such_kind.py` `storage.nonesuch` "
                                       "`NoSuchClass` `chaoskit nosuch`\n")
    monkeypatch.setattr(f"{__name__}.MAP", stale)
    try:
        test_every_path_and_name_the_map_cites_exists()
    except AssertionError as exc:
        for name in ("measure.no_such_phase", "faults/no_such_kind.py", "storage.nonesuch", "NoSuchClass", "chaoskit nosuch"):
            assert name in str(exc)
    else:
        raise AssertionError("a stale map passed")
