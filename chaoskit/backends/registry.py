"""Cluster backends by name: the built-ins found in this package's modules, plugins from the ``chaoskit.clusters``
entry-point group (see :mod:`chaoskit.core.registry`).

A built-in backend is a class of a module of ``chaoskit/backends/`` that declares ``name = "kind"`` in its body
(:func:`~chaoskit.core.registry.declared_in_source`): the modules' source is read, not imported, so listing the
kinds (``validate`` does, on every start) imports no backend, and adding a backend is adding its module: no table
here, no entry point. The same class body says ``has_lab = False`` when ``chaoskit lab up`` cannot make one
(:func:`lab_kinds`). A plugin from another package declares
``[project.entry-points."chaoskit.clusters"] mykind = "pkg.module:MyBackend"``; a test or an embedding program may
call ``CLUSTERS.register("mykind", MyBackend)`` instead.
"""

from __future__ import annotations

from pathlib import Path

from chaoskit.backends.api import ClusterBackend
from chaoskit.core.errors import ScenarioError, did_you_mean
from chaoskit.core.registry import Registry, declared_in_source

__all__ = ["CLUSTERS", "GROUP", "NAME_RE", "backend", "backend_names", "builtin_backends", "lab_kinds"]

GROUP = "chaoskit.clusters"

NAME_RE = r"[a-z][a-z0-9_-]*"
"""A cluster kind's name, as ``cluster: {kind: NAME}`` and ``lab up --kind NAME`` write it."""


def builtin_backends(folder: Path = Path(__file__).parent, package: str = "chaoskit.backends") -> dict[str, str]:
    """Every built-in backend's kind to ``module:Class``, from the source of the modules in ``folder``: a
    top-level class whose body assigns a string literal to ``name``."""
    return {name: target for name, (target, _) in _declared(folder, package).items()}


def _declared(folder: Path = Path(__file__).parent, package: str = "chaoskit.backends") -> dict[str, tuple[str, dict[str, str]]]:
    return declared_in_source(folder, package, "name", NAME_RE, ("has_lab",))


def _check(name: str, cls: type[ClusterBackend]) -> None:
    if getattr(cls, "name", None) != name:
        raise RuntimeError(f"cluster backend {cls!r} registered as {name!r} but declares name {getattr(cls, 'name', None)!r}")


CLUSTERS: Registry[type[ClusterBackend]] = Registry("cluster backend", GROUP, builtin_backends, check=_check)


def backend(name: str) -> ClusterBackend:
    """A backend instance by name; :class:`ScenarioError` naming the known ones otherwise."""
    if name not in CLUSTERS:
        raise ScenarioError(f"unknown cluster kind {name!r}{did_you_mean(name, CLUSTERS.names())}", hint=f"known kinds: {', '.join(CLUSTERS.names())}")
    return CLUSTERS.get(name)()


def backend_names() -> list[str]:
    return CLUSTERS.names()


def lab_kinds() -> list[str]:
    """The kinds ``chaoskit lab up`` can make, sorted: a built-in's from its source (its class body does not say
    ``has_lab = False``), without importing it; a plugin's from its class (loaded for it)."""
    found = _declared()
    return [name for name in CLUSTERS.names()
            if (found[name][1].get("has_lab") != "False" if name in found else CLUSTERS.get(name).has_lab)]
