"""Scenarios: the YAML format, its models and its loader.

:func:`load_scenario` returns a validated scenario with a source map, so later
stages (target resolution, preflight) can still point at ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.errors import ScenarioError, SourcePos

__all__ = ["LoadedScenario", "load_scenario", "scenario_files"]


@dataclass
class LoadedScenario:
    path: Path
    model: Any  # the dynamic Scenario model (see chaoskit.scenario.model.scenario_model)
    source: Any  # SourceMap

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
    from pydantic import ValidationError

    from chaoskit.scenario.loader import load_yaml
    from chaoskit.scenario.model import scenario_model

    path = Path(path)
    try:
        data, smap = load_yaml(path)
    except ScenarioError as exc:
        return [exc]
    if not isinstance(data, dict):
        return [ScenarioError("a scenario must be a YAML mapping (name:, faults:, ...)", pos=SourcePos(str(path), 1, 1))]
    try:
        model = scenario_model().model_validate(data)
    except ValidationError as exc:
        return [_to_error(err, data, smap) for err in exc.errors(include_url=False)]
    return LoadedScenario(path, model, smap)


def _to_error(err: dict[str, Any], data: Any, smap: Any) -> ScenarioError:
    loc = list(err["loc"])
    # Drop pydantic's union-member tags (e.g. 'process.kill', 'str', 'LabSpec') that are not keys of the data.
    real: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            real.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            real.append(part)
            node = node[part]
    etype = err["type"]
    msg = err["msg"]
    dotted = ".".join(str(p) for p in real) or "(top level)"
    if etype == "missing":
        field = loc[-1]
        pos = smap.at(tuple(real))
        message = f"{dotted}: missing required key '{field}'" if real else f"missing required key '{field}'"
    elif etype == "extra_forbidden":
        pos = smap.at(tuple(real), key=True)
        message = f"unknown key '{real[-1] if real else loc[-1]}'" + (f" in {'.'.join(map(str, real[:-1]))}" if len(real) > 1 else "")
    elif etype in ("union_tag_invalid", "union_tag_not_found"):
        pos = smap.at(tuple(real) + ("kind",))
        from chaoskit.faults.registry import fault_kinds

        tag = err.get("ctx", {}).get("tag", "")
        message = f"{dotted}: unknown fault kind {tag!r}; known kinds: {', '.join(fault_kinds())}" if etype == "union_tag_invalid" else f"{dotted}: missing 'kind'"
    else:
        pos = smap.at(tuple(real))
        msg = msg.removeprefix("Value error, ")
        message = f"{dotted}: {msg}"
    return ScenarioError(message, pos=pos)


def scenario_files(paths: list[str | Path]) -> list[Path]:
    """Expand folders to their ``*.yaml``/``*.yml`` files (sorted); keep files as given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out
