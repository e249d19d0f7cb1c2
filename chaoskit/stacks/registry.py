"""Recovery stacks by name: the built-ins found in this package's modules, plugins from the ``chaoskit.stacks``
entry-point group (see :mod:`chaoskit.core.registry`).

A built-in stack is a class of a module of ``chaoskit/stacks/`` that declares ``name = "..."`` in its body: the
modules' source is read, not imported, so listing the names (the ``workload.recovery`` enum) imports no stack, and
adding a stack is adding its module (and its test). A plugin from another package declares
``[project.entry-points."chaoskit.stacks"] mystack = "pkg.module:MyStack"``; a test or an embedding program may call
``STACKS.register("mystack", MyStack)`` instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoskit.core.registry import Registry, declared_in_source
from chaoskit.observe.presets import FRAMEWORK_PRESETS, Preset, rules_of_presets
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import Stack

__all__ = ["STACKS", "GROUP", "NAME_RE", "builtin_stacks", "stack", "stack_of", "stack_names", "by_column",
           "settings_keys", "model_stack", "framework_stack", "default_stack", "log_presets", "preset_rules"]

GROUP = "chaoskit.stacks"
NAME_RE = r"[a-z][a-z0-9-]*"
"""A stack's name, as ``workload.recovery`` writes it."""


def builtin_stacks(folder: Path = Path(__file__).parent, package: str = "chaoskit.stacks") -> dict[str, str]:
    """Every built-in stack's name to ``module:Class``, from the source of the modules in ``folder`` (``api.py``'s
    base declares none: its name is an annotated class variable)."""
    return {name: target for name, (target, _) in declared_in_source(folder, package, "name", NAME_RE).items()}


def _check(name: str, cls: type[Stack]) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Stack)) or cls.name != name:
        raise RuntimeError(f"recovery stack {cls!r} registered as {name!r} but declares name {getattr(cls, 'name', None)!r}")


STACKS: Registry[type[Stack]] = Registry("recovery stack", GROUP, builtin_stacks, check=_check)


def stack(name: str) -> Stack:
    """The stack registered as ``name`` (``KeyError`` for an unknown one: a validated workload names a known one)."""
    return STACKS.get(name)()


def stack_of(workload: Any) -> Stack:
    """The stack of a validated ``workload``."""
    return stack(workload.recovery)


def stack_names() -> list[str]:
    return STACKS.names()


def by_column() -> dict[str, Stack]:
    """The stacks that have a scorecard column, by column name: plain torchrun's first, then in registry order, the
    columns that run every row on a cluster of their own (:attr:`Stack.scorecard_cluster`) last."""
    stacks = [s for s in (stack(n) for n in STACKS.names()) if s.scorecard_column]
    stacks.sort(key=lambda s: (s.name != Stack.name, s.scorecard_cluster is not None))
    return {s.scorecard_column: s for s in stacks}


def default_stack(launch: str, scheduled: bool = False) -> Stack:
    """The stack of a job of ``launch`` whose scenario names none (``scheduled``: on a cluster with a batch
    scheduler): the first in registry order that claims it (:meth:`Stack.default_under`), else plain torchrun."""
    return next((s for s in (stack(n) for n in STACKS.names()) if s.default_under(launch, scheduled)), stack(Stack.name))


def settings_keys() -> dict[str, Stack]:
    """Each stack's ``workload`` settings key -> the stack."""
    return {s.settings_key: s for s in (stack(n) for n in STACKS.names()) if s.settings_key}


def log_presets() -> dict[str, Preset]:
    """Every log preset by name (what ``probes.presets`` names): the frameworks' (:mod:`chaoskit.observe.presets`),
    then each stack's own (:attr:`Stack.log_presets`), in registry order."""
    presets = dict(FRAMEWORK_PRESETS)
    for name in STACKS.names():
        for preset in STACKS.get(name).log_presets:
            if presets.setdefault(preset.name, preset) is not preset:
                raise RuntimeError(f"log preset {preset.name!r} of recovery stack {name!r} is already another's")
    return presets


def preset_rules(names: list[str] | tuple[str, ...], torchrun: bool = True) -> tuple[list[LogRule], bool]:
    """The rules of the presets named (``torchrun``: the built-in torchrun rule even when not named), and whether
    torchrun's ``--tee`` prefixes give each line's rank (``KeyError`` for an unknown name: a validated scenario names
    known ones)."""
    presets = log_presets()
    return rules_of_presets([presets[name] for name in names], torchrun=torchrun)


def model_stack(model: str | None) -> Stack:
    """The stack whose model measured a recorded result (its phases' ``model``); plain torchrun's for none, or for
    a model no stack registered here has (a result from another install)."""
    return stack(model) if model and model in STACKS else Stack()


def framework_stack(framework: str) -> Stack | None:
    """The stack a ``chaoskit init --framework`` starter runs under, or ``None`` (plain torchrun)."""
    return next((s for s in (stack(n) for n in STACKS.names()) if s.framework == framework), None)
