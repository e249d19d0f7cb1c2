"""Scenarios: the YAML format, its models and its loader.

:func:`load_scenario` returns a validated scenario with a source map, so later
stages (target resolution, preflight) can still point at ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chaoskit.core.errors import ScenarioError, SourcePos
from chaoskit.core.yaml_source import SourceMap, load_yaml, validation_errors
from chaoskit.scenario.model import ScenarioBase, model_for

__all__ = ["LoadedScenario", "load_scenario", "scenario_files", "validate_file", "validate_data"]


@dataclass
class LoadedScenario:
    path: Path
    model: ScenarioBase
    """An instance of the ``Scenario`` model :func:`~chaoskit.scenario.model.scenario_model` builds."""
    source: SourceMap

    def pos(self, *path: Any, key: bool = False) -> SourcePos:
        return self.source.at(path, key=key)

    def error(self, message: str, *path: Any, hint: str | None = None) -> ScenarioError:
        return ScenarioError(message, pos=self.pos(*path), hint=hint)


def load_scenario(path: str | Path) -> LoadedScenario:
    """Load and validate one scenario file; raise :class:`ScenarioError` at the first problem."""
    errors = validate_file(path)
    if isinstance(errors, LoadedScenario):
        return errors
    raise errors[0]


def validate_file(path: str | Path) -> "LoadedScenario | list[ScenarioError]":
    """Validate one file: the loaded scenario, or every error found in it."""
    path = Path(path)
    try:
        data, smap = load_yaml(path, what="scenario")
    except ScenarioError as exc:
        return [exc]
    return validate_data(path, data, smap)


def validate_data(path: Path, data: Any, smap: SourceMap) -> "LoadedScenario | list[ScenarioError]":
    """Validate a scenario already read by :func:`~chaoskit.core.yaml_source.load_yaml`."""
    if not isinstance(data, dict):
        return [ScenarioError("a scenario must be a YAML mapping (name:, faults:, ...)", pos=smap.at(()))]
    try:
        scenario = model_for(data)
        model = scenario.model_validate(data)
    except ValidationError as exc:
        return validation_errors(exc, data, smap, scenario)
    return LoadedScenario(path, model, smap)


def scenario_files(paths: list[str | Path]) -> list[Path]:
    """Expand folders to their ``*.yaml``/``*.yml`` files (sorted); keep files as given.

    A path that cannot even be looked at (a name too long, a NUL in it) is kept, so that
    reading it reports why, at its own line."""
    out: list[Path] = []
    for p in map(Path, paths):
        try:
            folder = p.is_dir()
        except (OSError, ValueError):
            folder = False
        if folder:
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and _is_file(q)))
        else:
            out.append(p)
    return out


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return True  # let reading it say what is wrong
