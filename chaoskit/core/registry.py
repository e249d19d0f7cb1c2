"""Plugins by name: the one mechanism behind fault kinds and cluster backends.

Modelled on torch elastic's rendezvous handler registry: a name maps to a
creator that is imported only when that name is first used, and a second
registration under a name already taken is refused. A registry's built-ins come
from chaoskit's own tree, found in their modules' source (:func:`declared_in_source`:
each fault kind's class says ``kind = "..."``, each backend's ``name = "..."``), so they
are found alike in a checkout and an install, and adding one is adding its module; an
entry-point group adds outside plugins to them.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Callable, Generic, TypeVar

__all__ = ["Registry", "DuplicateName", "declared_entry_points", "declared_in_source"]

T = TypeVar("T")
Creator = Callable[[], T]


class DuplicateName(ValueError):
    """A second registration under a name that is already taken."""


class Registry(Generic[T]):
    """Names to lazily created objects (classes, usually) of one kind.

    ``group`` is the entry-point group plugins declare themselves in; ``builtin``
    maps the built-ins' names to ``module:attribute``, or is a function that returns
    that map, called once, on the first look at the names. An entry point under a
    built-in's name is refused (:class:`DuplicateName`) unless it names the very same
    target (an install's metadata from when the built-ins were entry points too).
    ``check(name, obj)`` may refuse what a creator returned.
    """

    def __init__(self, what: str, group: str, builtin: dict[str, str] | Callable[[], dict[str, str]],
                 check: Callable[[str, T], None] | None = None) -> None:
        self.what, self.group, self._builtin, self._check = what, group, builtin, check
        self._creators: dict[str, Creator[T]] | None = None
        self._loaded: dict[str, T] = {}
        self.generation = 0
        """Bumped by every registration, so caches built over the names (the scenario model) can tell."""

    def register(self, name: str, target: T | str) -> None:
        """Add ``name``: the object itself, or ``"module:attribute"`` to import on first use."""
        creators = self._scan()
        if name in creators:
            raise DuplicateName(f"{self.what} {name!r} is already registered")
        creators[name] = _importer(target) if isinstance(target, str) else (lambda: target)
        self.generation += 1

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests register toy plugins and take them away again)."""
        self._scan().pop(name, None)
        self._loaded.pop(name, None)
        self.generation += 1

    def names(self) -> list[str]:
        """Every registered name, sorted; nothing is imported."""
        return sorted(self._scan())

    def __contains__(self, name: object) -> bool:
        return name in self._scan()

    def get(self, name: str) -> T:
        """The object registered as ``name``, created on first use; ``KeyError`` for an unknown name."""
        if name not in self._loaded:
            obj = self._scan()[name]()
            if self._check is not None:
                self._check(name, obj)
            self._loaded[name] = obj
        return self._loaded[name]

    def all(self) -> dict[str, T]:
        """Every registered object by name, sorted (creates them all)."""
        return {name: self.get(name) for name in self.names()}

    def builtin(self) -> dict[str, str]:
        """The built-ins' names to ``module:attribute``, sorted by name; nothing is imported."""
        if callable(self._builtin):
            self._builtin = self._builtin()
        return dict(sorted(self._builtin.items()))

    def _scan(self) -> dict[str, Creator[T]]:
        if self._creators is None:
            builtin = self.builtin()
            creators: dict[str, Creator[T]] = {name: _importer(target) for name, target in builtin.items()}
            plugins: set[str] = set()
            for name, target in declared_entry_points(self.group):
                if name in builtin and _same_target(target, builtin[name]):
                    continue
                if name in plugins:
                    raise DuplicateName(f"{self.what} {name!r} is declared twice in the {self.group!r} entry-point group")
                if name in creators:
                    raise DuplicateName(f"{self.what} {name!r} of the {self.group!r} entry-point group ({target}) "
                                        f"is a built-in's name ({builtin[name]})")
                plugins.add(name)
                creators[name] = _importer(target)
            self._creators = creators
        return self._creators


_CLASS = re.compile(r"^class\s+([A-Za-z_]\w*)\s*[(:]")


@functools.lru_cache(maxsize=8)
def declared_in_source(folder: Path, package: str, key: str, name_re: str,
                       also: tuple[str, ...] = ()) -> dict[str, tuple[str, dict[str, str]]]:
    """The built-ins of one registry, found in the source of the modules of ``folder`` (package ``package``):
    every top-level class whose body assigns a string literal ``name_re`` matches whole to ``key``
    (``kind = "process.kill"``; an annotation such as ``kind: Literal[...]`` does not count), by that name, as
    ``("package.module:Class", {attribute: its value's source text})`` for the attributes of ``also`` the same
    body assigns on one line (read, not evaluated: the caller parses them).

    The modules are read, not imported, so listing the names costs a read of a few files. A module whose name
    starts with ``_`` is skipped; a name found twice is refused (``RuntimeError``), as a second registration is.
    What is found is checked where it is loaded (the registry's ``check``: the class exists and declares it)."""
    key_line = re.compile(rf"""^    {key}\s*=\s*(["'])({name_re})\1\s*(?:#.*)?$""")
    also_names = "|".join(map(re.escape, also)) or "(?!)"
    also_line = re.compile(rf"^    ({also_names})\s*=\s*(.+?)\s*(?:#[^\"')]*)?$")
    # Only these lines can change what is found: a top-level statement (it ends a class body) and a body's
    # assignment to `key` or one of `also`. One search over the file finds them; a loop over every line of
    # every kind's module cost validate more than the rest of the look. The search starts at a newline, not at
    # ^ of a MULTILINE pattern: re then skips to each newline instead of trying every character (3.5x faster).
    wanted = re.compile(rf"\n((?:[^\W\d_@]|@|    (?:{re.escape(key)}|{also_names})\s*=).*)")
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for path in sorted(Path(folder).glob("*.py")):
        if path.name.startswith("_"):
            continue
        cls, name, extra = None, None, {}
        for line in [*wanted.findall("\n" + path.read_text(encoding="utf-8")), "end"]:
            start = _CLASS.match(line)
            if start or line[:1].isalpha() or line.startswith("@"):  # a top-level statement: the class body has ended
                if name is not None:
                    target = f"{package}.{path.stem}:{cls}"
                    if name in found:
                        raise RuntimeError(f"{key} {name!r} is declared by {found[name][0]} and {target}")
                    found[name] = (target, extra)
                cls, name, extra = (start.group(1) if start else None), None, {}
            elif cls is not None and (m := key_line.match(line)):
                name = m.group(2)
            elif cls is not None and (m := also_line.match(line)):
                extra[m.group(1)] = m.group(2)
    return found


def _same_target(a: str, b: str) -> bool:
    return "".join(a.split()) == "".join(b.split())


def _importer(target: str) -> Creator:
    module, _, attrs = target.partition(":")

    def create():
        obj = importlib.import_module(module.strip())
        for attr in filter(None, attrs.split("[", 1)[0].strip().split(".")):
            obj = getattr(obj, attr)
        return obj

    return create


def declared_entry_points(group: str) -> list[tuple[str, str]]:
    """(name, ``module:attribute``) of every entry point in ``group`` that an installed distribution declares.

    What ``importlib.metadata.entry_points(group=...)`` gives, read straight from the
    ``entry_points.txt`` files: importing ``importlib.metadata`` (and the ``email`` package
    it pulls in) costs more than the whole scan, and this runs on every ``chaoskit`` start.
    A distribution found twice on ``sys.path`` counts once, the first one, as there.
    """
    return [(name, target) for g, name, target in _entry_points() if g == group]


@functools.lru_cache(maxsize=1)
def _entry_points() -> tuple[tuple[str, str, str], ...]:
    seen: set[str] = set()
    found: list[tuple[str, str, str]] = []
    for entry in sys.path:
        try:
            children = sorted(e.name for e in os.scandir(entry or "."))
        except OSError:
            continue
        for child in children:
            if not child.endswith((".dist-info", ".egg-info")):
                continue
            dist = child.rsplit(".", 1)[0].split("-", 1)[0].lower().replace("-", "_").replace(".", "_")
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", child, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            section = None
            for line in text.splitlines():
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section is not None and "=" in line:
                    name, _, target = line.partition("=")
                    found.append((section, name.strip(), target.strip()))
    return tuple(found)
