"""Fault kinds by name: the built-ins found in this package's modules, plugins from the ``chaoskit.faults``
entry-point group (see :mod:`chaoskit.core.registry`).

A built-in kind is a class of a module of ``chaoskit/faults/`` that declares ``kind = "family.name"`` in its
body (:func:`builtin_kinds`). The modules' source is read, not imported, so listing the kinds (which
``validate`` does on every start) costs a read of a dozen files, and adding a kind is adding its module: no
table here, no entry point. The same class body names the catalog classes the kind reproduces
(``covers = ("software.hang",)``, :func:`fault_covers`), which the catalog (:mod:`chaoskit.coverage`) reads:
no list of kinds there either. A plugin from another package declares
``[project.entry-points."chaoskit.faults"] "family.name" = "pkg.module:MyFault"`` and may set ``covers`` too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from chaoskit.core.registry import Registry, declared_in_source
from chaoskit.faults.api import Fault

__all__ = ["FAULTS", "builtin_kinds", "builtin_covers", "fault_covers", "fault_kinds", "fault_kinds_markdown", "get_fault", "readme_with_fault_kinds",
           "GROUP"]

GROUP = "chaoskit.faults"

KIND_RE = r"[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*"
"""A kind's name: ``family.name``."""


def builtin_kinds(folder: Path = Path(__file__).parent, package: str = "chaoskit.faults") -> dict[str, str]:
    """Every built-in kind's name to ``module:Class``, from the source of the modules in ``folder``.

    The rule: a top-level class whose body assigns a string literal to ``kind`` (``kind = "process.kill"``; a
    spec's ``kind: Literal[...]`` is an annotation and does not count). A name found twice is refused, as the
    registry refuses a second registration. What is found is checked where it is loaded: the class must
    exist and declare that kind (``_check``; ``tests/test_architecture.py`` loads every one).
    """
    return {name: target for name, (target, _) in _declared(folder, package).items()}


def builtin_covers(folder: Path = Path(__file__).parent, package: str = "chaoskit.faults") -> dict[str, tuple[str, ...]]:
    """Every built-in kind's name to the catalog classes its class body names (``covers = ("a.b", ...)`` on one
    line, a tuple of string literals), read from the source as :func:`builtin_kinds` reads ``kind``."""
    return {name: covers for name, (_, covers) in _declared(folder, package).items()}


def _declared(folder: Path, package: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    found = declared_in_source(folder, package, "kind", KIND_RE, also=("covers",))
    return {name: (target, _class_ids(extra["covers"], f"{target}.covers") if "covers" in extra else ())
            for name, (target, extra) in found.items()}


def _class_ids(text: str, where: str) -> tuple[str, ...]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise RuntimeError(f"{where}: expected a tuple of catalog class ids on one line, got {text}")
    return value


def _check(name: str, cls: type[Fault]) -> None:
    if getattr(cls, "kind", None) != name:
        raise RuntimeError(f"fault plugin {cls!r} registered as {name!r} but declares kind {getattr(cls, 'kind', None)!r}")


FAULTS: Registry[type[Fault]] = Registry("fault kind", GROUP, builtin_kinds, check=_check)


def fault_kinds() -> dict[str, type[Fault]]:
    """Every known fault kind, by name, sorted."""
    return FAULTS.all()


def get_fault(kind: str) -> type[Fault]:
    return FAULTS.get(kind)


def fault_covers() -> dict[str, tuple[str, ...]]:
    """Every known kind to the catalog classes it says it reproduces (its class's ``covers``), sorted by kind: the
    built-ins' from their source, without importing them; a plugin's from its class (loaded for it)."""
    found = builtin_covers()
    return {name: found[name] if name in found else tuple(getattr(FAULTS.get(name), "covers", ()))
            for name in sorted(FAULTS.names())}


def fault_kinds_markdown() -> str:
    """The README's table of fault kinds, one row a kind, from each kind's spec: what it acts on and the first
    sentence of its docstring (a test keeps the README's copy equal to this)."""
    acts_on = {"process": "ranks", "node": "nodes"}
    rows = ["| kind | acts on | what it does |", "| --- | --- | --- |"]
    for name, cls in fault_kinds().items():
        doc = " ".join((cls.Spec.__doc__ or "").split())
        first = doc.split(". ")[0].rstrip(".").replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{name}` | {acts_on.get(cls.target_type, cls.target_type)} | {first} |")
    return "\n".join(rows) + "\n"


def readme_with_fault_kinds(readme: str) -> str:
    """``readme`` with the table under its ``## Fault kinds`` heading replaced by :func:`fault_kinds_markdown`
    (``make readme`` writes it back; ``tests/test_docs.py`` checks that it changes nothing)."""
    lines = readme.splitlines(keepends=True)
    heading = lines.index("## Fault kinds\n")
    start = next(i for i in range(heading + 1, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[:start]) + fault_kinds_markdown() + "".join(lines[end:])
