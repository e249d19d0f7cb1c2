"""Transports by name: the built-ins found in this package's modules, plugins from the ``chaoskit.transports``
entry-point group (see :mod:`chaoskit.core.registry`).

A built-in transport is a class of a module of ``chaoskit/cluster/transports/`` that declares ``name = "..."`` in
its body (:func:`~chaoskit.core.registry.declared_in_source`): the modules' source is read, not imported, so
listing the names imports no transport (and so no paramiko or docker SDK), and adding a transport is adding its
module. What an inventory file's node with ``transport: NAME`` becomes is the class's
``from_inventory(site, index, spec)`` (:class:`~chaoskit.cluster.transports.api.InventorySite` in,
:class:`~chaoskit.cluster.transports.api.ListedNode` out); a class body that says ``ssh_settings = True`` keeps
the node's SSH settings, which :func:`takes_ssh` reads from the source without importing it, and one that says
``inventory_node = True`` may be named by an inventory file's node (:func:`inventory_transports`, what the
inventory model validates ``transport:`` against and lists in its schema). A plugin from
another package declares ``[project.entry-points."chaoskit.transports"] mine = "pkg.module:MyTransport"``; a
test or an embedding program may call ``TRANSPORTS.register("mine", MyTransport)`` instead.
"""

from __future__ import annotations

from pathlib import Path

from chaoskit.core.errors import ScenarioError, did_you_mean
from chaoskit.core.registry import Registry, declared_in_source

__all__ = ["TRANSPORTS", "GROUP", "NAME_RE", "builtin_transports", "inventory_transports", "takes_ssh", "transport_class",
           "transport_names"]

GROUP = "chaoskit.transports"
NAME_RE = r"[a-z][a-z0-9_-]*"
"""A transport's name, as an inventory file's ``transport: NAME`` writes it."""


def builtin_transports(folder: Path = Path(__file__).parent,
                       package: str = "chaoskit.cluster.transports") -> dict[str, str]:
    """Every built-in transport's name to ``module:Class``, from the source of the modules in ``folder``."""
    return {name: target for name, (target, _) in _declared(folder, package).items()}


def _declared(folder: Path = Path(__file__).parent,
              package: str = "chaoskit.cluster.transports") -> dict[str, tuple[str, dict[str, str]]]:
    return declared_in_source(folder, package, "name", NAME_RE, ("ssh_settings", "inventory_node"))


def _check(name: str, cls: type) -> None:
    if getattr(cls, "name", None) != name:
        raise RuntimeError(f"transport {cls!r} registered as {name!r} but declares name {getattr(cls, 'name', None)!r}")


TRANSPORTS: Registry[type] = Registry("transport", GROUP, builtin_transports, check=_check)


def transport_class(name: str) -> type:
    """The transport class registered as ``name``; :class:`ScenarioError` naming the known ones otherwise."""
    if name not in TRANSPORTS:
        raise ScenarioError(f"unknown transport {name!r}{did_you_mean(name, TRANSPORTS.names())}",
                            hint=f"known transports: {', '.join(TRANSPORTS.names())}")
    return TRANSPORTS.get(name)


def transport_names() -> list[str]:
    return TRANSPORTS.names()


def takes_ssh(name: str) -> bool:
    """Whether a node of transport ``name`` keeps SSH settings: a built-in's from its source (nothing imported), a
    plugin's from its class."""
    found = _declared()
    if name in found:
        return found[name][1].get("ssh_settings") == "True"
    return name in TRANSPORTS and bool(getattr(TRANSPORTS.get(name), "ssh_settings", False))


def inventory_transports() -> list[str]:
    """The transports an inventory file's node may name (``transport: NAME``), sorted: a built-in whose class body
    says ``inventory_node = True`` (read from its source, nothing imported), a plugin whose class makes a node
    (``from_inventory``)."""
    found = _declared()
    return [name for name in TRANSPORTS.names()
            if (found[name][1].get("inventory_node") == "True" if name in found
                else callable(getattr(TRANSPORTS.get(name), "from_inventory", None)))]
