"""Plugins by name: the one mechanism behind fault kinds and cluster backends.

Modelled on torch elastic's rendezvous handler registry: a name maps to a
creator that is imported only when that name is first used, and a second
registration under a name already taken is refused. A registry's built-ins come
from chaoskit's own tree (a table, or for fault kinds a scan of their modules'
source, :mod:`chaoskit.faults.registry`), so they are found alike in a checkout
and an install; an entry-point group adds outside plugins to them.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Callable, Generic, TypeVar

__all__ = ["Registry", "DuplicateName", "declared_entry_points"]

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
