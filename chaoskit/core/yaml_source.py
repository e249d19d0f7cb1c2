"""YAML loading that remembers where every value came from.

Pydantic reports errors by path (``faults.0.signal``); the loader keeps a map from
each path to its line and column so every error reads ``file:line:col: message``,
and :func:`validation_errors` turns a pydantic ``ValidationError`` into those.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from chaoskit.core.errors import ScenarioError, SourcePos

__all__ = ["SourceMap", "load_yaml", "load_yaml_text", "validation_errors"]

PathKey = tuple[Any, ...]

# libyaml's composer is ~15x faster and keeps the same marks; fall back where PyYAML lacks it.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class SourceMap:
    """Positions of every value (and every mapping key) of one YAML document."""

    file: str
    values: dict[PathKey, SourcePos] = field(default_factory=dict)
    keys: dict[PathKey, SourcePos] = field(default_factory=dict)

    def at(self, path: PathKey, *, key: bool = False) -> SourcePos:
        """Best position for ``path``: the exact node, else its nearest ancestor."""
        path = tuple(path)
        table = self.keys if key else self.values
        if path in table:
            return table[path]
        while path:
            path = path[:-1]
            if path in self.values:
                return self.values[path]
        return SourcePos(self.file, 1, 1)


def load_yaml(path: str | Path) -> tuple[Any, SourceMap]:
    """Parse one YAML file; raise :class:`ScenarioError` with its position on bad syntax."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    return load_yaml_text(text, str(path))


def load_yaml_text(text: str, filename: str = "<string>") -> tuple[Any, SourceMap]:
    smap = SourceMap(filename)
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = SourcePos(filename, mark.line + 1, mark.column + 1) if mark else SourcePos(filename, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise ScenarioError(f"YAML syntax error: {problem}", pos=pos) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"YAML error: {exc}", pos=SourcePos(filename, 1, 1)) from None
    if node is None:
        raise ScenarioError("the file is empty; a scenario is a YAML mapping", pos=SourcePos(filename, 1, 1))
    constructor = yaml.SafeLoader("")
    return _convert(node, (), smap, constructor), smap


def _pos(smap: SourceMap, node: yaml.Node) -> SourcePos:
    return SourcePos(smap.file, node.start_mark.line + 1, node.start_mark.column + 1)


def _convert(node: yaml.Node, path: PathKey, smap: SourceMap, constructor: yaml.SafeLoader) -> Any:
    smap.values[path] = _pos(smap, node)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise ScenarioError("YAML merge keys (<<) are not supported", pos=_pos(smap, key_node))
            key = _convert(key_node, path + ("<key>",), smap, constructor)
            if not isinstance(key, (str, int)):
                raise ScenarioError("mapping keys must be plain strings", pos=_pos(smap, key_node))
            if key in out:
                raise ScenarioError(f"duplicate key {key!r}", pos=_pos(smap, key_node))
            smap.keys[path + (key,)] = _pos(smap, key_node)
            out[key] = _convert(value_node, path + (key,), smap, constructor)
        smap.values.pop(path + ("<key>",), None)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (i,), smap, constructor) for i, item in enumerate(node.value)]
    try:
        return constructor.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"cannot read value: {exc}", pos=_pos(smap, node)) from None


def validation_errors(exc: ValidationError, data: Any, smap: SourceMap) -> list[ScenarioError]:
    """One positioned :class:`ScenarioError` per place ``exc`` found wrong in ``data``, in file order."""
    raw = _typos(exc.errors(include_url=False))
    if len(raw) > 1:  # a mapping checked against a union's scalar branch ('lab' | {kind: ...}) says nothing useful
        raw = [e for e in raw if not (e["type"] == "literal_error" and isinstance(e.get("input"), (dict, list)))]
    errors = _merge([_to_error(err, data, smap) for err in raw])
    return sorted(errors, key=lambda e: (e.pos.line, e.pos.col) if e.pos else (0, 0))


def _typos(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An unknown key that looks like a missing one is a typo: say so once, not twice."""
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


def _to_error(err: dict[str, Any], data: Any, smap: SourceMap) -> ScenarioError:
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
        ctx = err.get("ctx", {})
        what = "fault kind" if real[:1] == ["faults"] else "cluster kind" if real[:1] == ["cluster"] else "kind"
        known = str(ctx.get("expected_tags", "")).replace("'", "")
        message = (f"{dotted}: unknown {what} {ctx.get('tag', '')!r}; known kinds: {known}"
                   if etype == "union_tag_invalid" else f"{dotted}: missing 'kind'")
    else:
        pos = smap.at(tuple(real))
        msg = msg.removeprefix("Value error, ")
        message = f"{dotted}: {msg}"
    return ScenarioError(message, pos=pos)
