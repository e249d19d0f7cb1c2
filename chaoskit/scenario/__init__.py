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
        return [ScenarioError("a scenario must be a YAML mapping (name:, faults:, ...)", pos=smap.at(()))]
    try:
        model = scenario_model().model_validate(data)
    except ValidationError as exc:
        raw = _typos(exc.errors(include_url=False))
        errors = _merge([_to_error(err, data, smap) for err in raw])
        return sorted(errors, key=lambda e: (e.pos.line, e.pos.col) if e.pos else (0, 0))
    return LoadedScenario(path, model, smap)


def _typos(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An unknown key that looks like a missing one is a typo: say so once, not twice."""
    import difflib

    missing = {(tuple(e["loc"][:-1]), e["loc"][-1]) for e in errors if e["type"] == "missing"}
    dropped = set()
    for e in errors:
        if e["type"] != "extra_forbidden":
            continue
        parent, key = tuple(e["loc"][:-1]), str(e["loc"][-1])
        names = [m for p, m in missing if p == parent]
        close = difflib.get_close_matches(key, names, n=1)
        if close:
            e["suggest"] = close[0]
            dropped.add((parent, close[0]))
    return [e for e in errors if not (e["type"] == "missing" and (tuple(e["loc"][:-1]), e["loc"][-1]) in dropped)]


def _merge(errors: list[ScenarioError]) -> list[ScenarioError]:
    """One error per place: the alternatives of a union fold into 'A, or B'."""
    merged: dict[str, ScenarioError] = {}
    for e in errors:
        key = str(e.pos)
        head, _, tail = e.message.partition(": ")
        if key in merged and tail:
            prev = merged[key]
            if tail not in prev.message:
                prev.message = f"{prev.message}, or {tail.removeprefix('Input should be ')}"
        else:
            merged[key] = e
    return list(merged.values())


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
        if err.get("suggest"):
            message += f" (did you mean '{err['suggest']}'?)"
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
