"""YAML loading that remembers where every value came from.

Pydantic reports errors by path (``faults.0.signal``); the loader keeps a map from
each path to its line and column so every error reads ``file:line:col: message``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoskit.errors import ScenarioError, SourcePos

__all__ = ["SourceMap", "load_yaml", "load_yaml_text"]

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
