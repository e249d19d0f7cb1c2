"""Cluster backends by name, from the ``chaoskit.clusters`` entry-point group (see :mod:`chaoskit.core.registry`).

A plugin declares ``[project.entry-points."chaoskit.clusters"] mykind = "pkg.module:MyBackend"``;
a test or an embedding program may call ``CLUSTERS.register("mykind", MyBackend)`` instead.
"""

from __future__ import annotations

from chaoskit.backends.api import ClusterBackend
from chaoskit.core.errors import ScenarioError, did_you_mean
from chaoskit.core.registry import Registry

__all__ = ["CLUSTERS", "GROUP", "backend", "backend_names"]

GROUP = "chaoskit.clusters"


def _check(name: str, cls: type[ClusterBackend]) -> None:
    if getattr(cls, "name", None) != name:
        raise RuntimeError(f"cluster backend {cls!r} registered as {name!r} but declares name {getattr(cls, 'name', None)!r}")


CLUSTERS: Registry[type[ClusterBackend]] = Registry("cluster backend", GROUP, {
    "process": "chaoskit.backends.process:ProcessBackend",
    "ray": "chaoskit.backends.ray:RayBackend",
    "netns": "chaoskit.backends.netns:NetnsBackend",
    "docker": "chaoskit.backends.docker:DockerBackend",
    "inventory": "chaoskit.backends.inventory:InventoryBackend",
    "slurm": "chaoskit.backends.slurm:SlurmBackend",
}, check=_check)


def backend(name: str) -> ClusterBackend:
    """A backend instance by name; :class:`ScenarioError` naming the known ones otherwise."""
    if name not in CLUSTERS:
        raise ScenarioError(f"unknown cluster kind {name!r}{did_you_mean(name, CLUSTERS.names())}", hint=f"known kinds: {', '.join(CLUSTERS.names())}")
    return CLUSTERS.get(name)()


def backend_names() -> list[str]:
    return CLUSTERS.names()
