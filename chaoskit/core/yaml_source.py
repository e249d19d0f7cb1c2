"""YAML loading that remembers where every value came from, within bounds.

Pydantic reports errors by path (``faults.0.signal``); the loader keeps a map from
each path to its line and column so every error reads ``file:line:col: message``,
and :func:`validation_errors` turns a pydantic ``ValidationError`` into those.

Input is untrusted: :func:`read_input` reads at most :data:`~chaoskit.core.limits.MAX_FILE_BYTES`
of a regular file (a FIFO, a device or a folder is refused by its type before it is
opened), and the document is built from the parser's events, counting every value
(aliases as the values they stand for) and its nesting, so an alias bomb or a deep
nest is refused at once. Only the core tags are read (str, int, float, bool, null,
seq, map); any other tag, and a value its tag cannot read, is an error at its position.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import stat
import types as types_module
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from chaoskit.core.errors import ScenarioError, SourcePos, did_you_mean
from chaoskit.core.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

__all__ = ["SourceMap", "input_text", "load_yaml", "load_yaml_text", "read_input", "validation_errors"]

PathKey = tuple[Any, ...]

# libyaml's parser is ~15x faster and keeps the same marks; fall back where PyYAML lacks it.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null")}
# Plain scalars that PyYAML's resolver would turn into a date or a 'value' (a lone '=') stay text:
# a description such as `2024-05-01` means the string.
_AS_TEXT = {_CORE + "timestamp", _CORE + "value"}
_STR = _CORE + "str"


@functools.lru_cache(maxsize=4096)
def _resolve_plain(value: str, implicit: tuple[bool, bool]) -> str:
    """The tag of an untagged scalar (inventories repeat the same values hundreds of times)."""
    tag = _RESOLVER.resolve(yaml.ScalarNode, value, implicit)
    return _STR if tag in _AS_TEXT else tag
_MERGE = _CORE + "merge"
# What YAML 1.1 allows in a stream (libyaml refuses the rest with a character offset, not a line).
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_LONGEST_KEY = 1024  # libyaml's limit on a plain (simple) key


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


def read_input(path: str | Path, what: str = "file") -> str:
    """The text of one input file, at most :data:`MAX_FILE_BYTES`, decoded as UTF-8.

    Raise :class:`ScenarioError` at ``file:1:1`` when it is missing, unreadable, not a regular
    file (checked before it is opened, so a FIFO never blocks) or too large, and at the
    offending byte's ``line:col`` when it is not UTF-8."""
    name = str(path)
    start = SourcePos(name, 1, 1)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ScenarioError(f"no such {what}", pos=start) from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, EACCES; ValueError: a NUL in the name
        raise ScenarioError(f"cannot read this {what}: {_reason(exc)}", pos=start) from None
    if not stat.S_ISREG(mode):
        raise ScenarioError(f"not a regular file ({_file_type(mode)}); only a regular file is read", pos=start)
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, opening it still returns at once.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ScenarioError(f"cannot read this {what}: {_reason(exc)}", pos=start) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ScenarioError(f"not a regular file ({_file_type(mode)}); only a regular file is read", pos=start)
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ScenarioError(f"cannot read this {what}: {_reason(exc)}", pos=start) from None
    finally:
        os.close(fd)
    return input_text(b"".join(chunks), name, what)


def input_text(data: bytes, name: str, what: str = "file") -> str:
    """The text of an input file already read (at most :data:`MAX_FILE_BYTES` + 1 bytes of it, e.g. through a
    checked descriptor), with :func:`read_input`'s limit and decoding: :class:`ScenarioError` at ``name:1:1`` when
    it is larger, at the byte's ``line:col`` when it is not UTF-8."""
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError(f"the {what} is larger than {MAX_FILE_BYTES // 1024} KiB, the limit for input files",
                            pos=SourcePos(name, 1, 1))
    return _decode(data, name)


def load_yaml(path: str | Path, *, merge: bool = False, what: str = "file") -> tuple[Any, SourceMap]:
    """Read (:func:`read_input`) and parse one YAML file; raise :class:`ScenarioError` with its position."""
    return load_yaml_text(read_input(path, what), str(path), merge=merge)


def load_yaml_text(text: str, filename: str = "<string>", *, merge: bool = False) -> tuple[Any, SourceMap]:
    """Parse one YAML document; ``merge`` allows merge keys (``<<: *base``, which compose files use)."""
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        char = bad.group()
        raise ScenarioError(f"control character U+{ord(char):04X} ({_char_name(char)}) is not allowed in YAML",
                            pos=_text_pos(text, bad.start(), filename))
    if text.startswith("\ufeff"):
        text = text[1:]
    builder = _Builder(filename, merge)
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            builder.feed(event)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = SourcePos(filename, mark.line + 1, mark.column + 1) if mark else SourcePos(filename, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        if mark and mark.column >= _LONGEST_KEY and "mapping values" in problem:
            problem += f" (a key is at most {_LONGEST_KEY} characters, on one line)"
        raise ScenarioError(f"YAML syntax error: {problem}", pos=pos) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"YAML error: {str(exc).splitlines()[0] if str(exc) else 'invalid YAML'}",
                            pos=SourcePos(filename, 1, 1)) from None
    if not builder.documents:
        raise ScenarioError("the file is empty; a scenario is a YAML mapping", pos=SourcePos(filename, 1, 1))
    return builder.root, builder.smap


# -- reading -----------------------------------------------------------------------------


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        col = len(data[line_start:exc.start].decode("utf-8", "replace")) + 1
        raise ScenarioError(f"invalid UTF-8: byte 0x{data[exc.start]:02x} ({exc.reason})",
                            pos=SourcePos(name, line, col)) from None


def _text_pos(text: str, index: int, name: str) -> SourcePos:
    return SourcePos(name, text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1)


def _char_name(char: str) -> str:
    names = {"\0": "NUL", "\x1b": "ESC", "\x7f": "DEL", "\ufeff": "BOM"}
    if char in names:
        return names[char]
    if 0xD800 <= ord(char) <= 0xDFFF:
        return "a lone surrogate"
    return "a control character"


# -- building the document from the parser's events --------------------------------------

_NO_KEY = object()


@dataclass
class _Anchor:
    value: Any
    size: int
    """Values it stands for, counting its own aliases expanded."""
    height: int
    base: PathKey
    entries: tuple[int, int]
    """The slice of :attr:`_Builder.entries` recorded while it was built."""


@dataclass
class _Frame:
    value: Any  # the dict or list being filled
    path: PathKey
    pos: SourcePos
    anchor: str | None
    start_count: int
    start_entry: int
    height: int = 0
    key: Any = _NO_KEY
    key_pos: SourcePos | None = None
    merging: bool = False
    merges: list[tuple[Any, PathKey, int, int]] = field(default_factory=list)


class _Builder:
    """Python values and their positions from a stream of YAML events, one document, within the limits."""

    def __init__(self, filename: str, merge: bool) -> None:
        self.smap = SourceMap(filename)
        self.merge = merge
        self.root: Any = None
        self.documents = 0
        self.count = 0
        self.stack: list[_Frame] = []
        self.anchors: dict[str, _Anchor] = {}
        self.open_anchors: set[str] = set()
        self.entries: list[tuple[PathKey, SourcePos, bool]] = []

    def feed(self, ev: yaml.Event) -> None:
        if isinstance(ev, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise ScenarioError("a second YAML document ('---'); a file holds one", pos=self._pos(ev))
        elif isinstance(ev, yaml.ScalarEvent):
            self._scalar(ev)
        elif isinstance(ev, yaml.AliasEvent):
            self._alias(ev)
        elif isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self._start(ev)
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            self._end()

    def _pos(self, ev: yaml.Event) -> SourcePos:
        mark = ev.start_mark
        return SourcePos(self.smap.file, mark.line + 1, mark.column + 1) if mark else SourcePos(self.smap.file, 1, 1)

    def _slot(self) -> tuple[bool, PathKey]:
        """Whether the next node is a mapping key, and its path when it is a value."""
        if not self.stack:
            return False, ()
        top = self.stack[-1]
        if isinstance(top.value, list):
            return False, top.path + (len(top.value),)
        if top.key is _NO_KEY:
            return True, ()
        return False, top.path + (("<<",) if top.merging else (top.key,))

    def _count(self, n: int, pos: SourcePos) -> None:
        self.count += n
        if self.count > MAX_NODES:
            raise ScenarioError(f"more than {MAX_NODES:,} values (aliases count as the values they repeat); "
                                "the limit for input files", pos=pos)

    def _depth(self, height: int, pos: SourcePos) -> None:
        if len(self.stack) + height > MAX_DEPTH:
            raise ScenarioError(f"nested more than {MAX_DEPTH} levels deep, the limit for input files", pos=pos)

    def _record(self, path: PathKey, pos: SourcePos, is_key: bool = False) -> None:
        (self.smap.keys if is_key else self.smap.values)[path] = pos
        self.entries.append((path, pos, is_key))

    def _scalar(self, ev: yaml.ScalarEvent) -> None:
        pos = self._pos(ev)
        self._count(1, pos)
        self._depth(0, pos)
        tag = ev.tag
        if tag is None or tag == "!":
            tag = _resolve_plain(ev.value, ev.implicit)
        is_key, path = self._slot()
        if tag == _MERGE:
            if is_key and ev.tag is None:
                self._merge_key(pos)
                return
            tag = _CORE + "str"  # a plain `<<` anywhere but a key is text
        if tag not in _SCALAR_TAGS:
            raise ScenarioError(f"the tag {_short(tag)} is not supported: only strings, numbers, booleans and null",
                                pos=pos)
        if tag == _STR:
            value: Any = ev.value  # what the constructor would return, without building a node for it
        else:
            node = yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, ev.style)
            try:
                value = _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, node)
            except (yaml.YAMLError, ValueError, KeyError, TypeError, ArithmeticError):
                text = ev.value if len(ev.value) <= 40 else ev.value[:37] + "..."
                raise ScenarioError(f"cannot read {text!r} as {_short(tag)}", pos=pos) from None
        start = len(self.entries)
        if not is_key:
            self._record(path, pos)
        self._done(value, pos, is_key, path, ev.anchor, size=1, height=0, start_entry=start)

    def _alias(self, ev: yaml.AliasEvent) -> None:
        pos = self._pos(ev)
        anchor = self.anchors.get(ev.anchor)
        if anchor is None:
            if ev.anchor in self.open_anchors:
                raise ScenarioError(f"alias *{ev.anchor} is inside the node it refers to (a loop)", pos=pos)
            raise ScenarioError(f"alias *{ev.anchor} refers to no anchor &{ev.anchor} before it", pos=pos)
        self._count(anchor.size, pos)
        self._depth(anchor.height, pos)
        is_key, path = self._slot()
        start = len(self.entries)
        if not is_key:
            cut = len(anchor.base)
            for p, where, p_is_key in self.entries[anchor.entries[0]:anchor.entries[1]]:
                self._record(path + p[cut:], where, p_is_key)
        self._done(anchor.value, pos, is_key, path, None, size=anchor.size, height=anchor.height, start_entry=start)

    def _start(self, ev: yaml.CollectionStartEvent) -> None:
        pos = self._pos(ev)
        mapping = isinstance(ev, yaml.MappingStartEvent)
        allowed = _CORE + ("map" if mapping else "seq")
        if ev.tag not in (None, "!", allowed):
            raise ScenarioError(f"the tag {_short(ev.tag)} is not supported on a {'mapping' if mapping else 'list'}",
                                pos=pos)
        self._count(1, pos)
        self._depth(1, pos)
        is_key, path = self._slot()
        if is_key:
            raise ScenarioError("mapping keys must be plain strings", pos=pos)
        start = len(self.entries)
        self._record(path, pos)
        if ev.anchor is not None:
            self.open_anchors.add(ev.anchor)
        self.stack.append(_Frame({} if mapping else [], path, pos, ev.anchor, self.count - 1, start))

    def _end(self) -> None:
        frame = self.stack.pop()
        if frame.merges:
            self._apply_merges(frame)
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
        is_key, path = self._slot()
        self._done(frame.value, frame.pos, is_key, frame.path, frame.anchor,
                   size=self.count - frame.start_count, height=frame.height + 1, start_entry=frame.start_entry)

    def _done(self, value: Any, pos: SourcePos, is_key: bool, path: PathKey, anchor: str | None, *,
              size: int, height: int, start_entry: int) -> None:
        """Put a finished node in its place: the root, a list item, a mapping key or a mapping value."""
        if anchor is not None:
            self.anchors[anchor] = _Anchor(value, size, height, path, (start_entry, len(self.entries)))
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        top.height = max(top.height, height)
        if isinstance(top.value, list):
            top.value.append(value)
        elif is_key:
            # str and int keys; YAML 1.1 reads a bare `on:`/`off:` as a boolean, which the power model maps back
            if value is None or not isinstance(value, (str, int)):
                raise ScenarioError("mapping keys must be plain strings", pos=pos)
            if value in top.value:
                raise ScenarioError(f"duplicate key {value!r}", pos=pos)
            top.key, top.key_pos = value, pos
            self._record(top.path + (value,), pos, is_key=True)
        elif top.merging:
            top.merges.append((value, path, start_entry, len(self.entries)))
            top.key, top.merging = _NO_KEY, False
        else:
            top.value[top.key] = value
            top.key = _NO_KEY

    def _merge_key(self, pos: SourcePos) -> None:
        top = self.stack[-1]
        if not self.merge:
            raise ScenarioError("YAML merge keys (<<) are not supported", pos=pos)
        if top.merges:
            raise ScenarioError("duplicate key '<<'", pos=pos)
        top.key, top.key_pos, top.merging = "<<", pos, True

    def _apply_merges(self, frame: _Frame) -> None:
        """``<<: *base`` (or a list of them): the base's keys that the mapping does not set itself."""
        out: dict[Any, Any] = frame.value
        for value, prefix, start, end in frame.merges:
            if isinstance(value, dict):
                sources = [(value, prefix)]
            elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
                sources = [(v, prefix + (i,)) for i, v in enumerate(value)]
            else:
                raise ScenarioError("a merge key (<<) takes a mapping or a list of mappings", pos=self.smap.at(prefix))
            taken: dict[Any, PathKey] = {}
            for src, src_path in sources:
                for k, v in src.items():
                    if k not in out:
                        out[k] = v
                        taken[k] = src_path
            cut = len(prefix) + (0 if isinstance(value, dict) else 1)
            for p, where, is_key in self.entries[start:end]:
                if len(p) > cut and taken.get(p[cut]) == p[:cut]:
                    self._record(frame.path + p[cut:], where, is_key)


def _short(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


def validation_errors(exc: ValidationError, data: Any, smap: SourceMap, model: Any = None) -> list[ScenarioError]:
    """One positioned :class:`ScenarioError` per place ``exc`` found wrong in ``data``, in file order.

    With the ``model`` that was validated, an unknown key is told the nearest key its mapping takes
    (``rank`` -> ``ranks``), not only the missing ones."""
    raw = _typos(exc.errors(include_url=False), model)
    if len(raw) > 1:  # a mapping checked against a union's scalar branch ('lab' | {kind: ...}) says nothing useful
        raw = [e for e in raw if not (e["type"] in ("literal_error", "string_type") and isinstance(e.get("input"), (dict, list)))]
    errors = _merge([_to_error(err, data, smap) for err in raw])
    return sorted(errors, key=lambda e: (e.pos.line, e.pos.col) if e.pos else (0, 0))


def _typos(errors: list[dict[str, Any]], model: Any = None) -> list[dict[str, Any]]:
    """An unknown key is told the nearest key its mapping takes; one that looks like a missing key is a typo of
    it, said once, not twice (the missing key's error goes)."""
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
        elif model is not None and (close := difflib.get_close_matches(key, _keys_at(model, parent), n=1)):
            e["suggest"] = close[0]
    return [e for e in errors if not (e["type"] == "missing" and (tuple(e["loc"][:-1]), e["loc"][-1]) in dropped)]


def _keys_at(model: Any, loc: PathKey) -> list[str]:
    """The keys the mapping at pydantic's ``loc`` in ``model`` takes, as written in a file (aliases). A union's
    part of ``loc`` (a fault's ``kind`` tag, a member's name) picks its member; one that names no member, nor
    any field, leaves every member in play, and the keys are then those of them all."""
    types = [model]
    for part in loc:
        found = []
        for tp in _members(types):
            if isinstance(part, int) and typing.get_origin(tp) in (list, tuple, set, frozenset):
                found.extend(typing.get_args(tp)[:1])
            elif isinstance(part, str) and _is_model(tp):
                fields = {f.alias or name: f for name, f in tp.model_fields.items()}
                if part in fields:
                    found.append(fields[part].annotation)
                elif part == tp.__name__ or any(part in _literals(f.annotation) for f in fields.values()):
                    found.append(tp)  # a union's member, by its name or its tag
            elif typing.get_origin(tp) is dict and isinstance(part, str):
                found.extend(typing.get_args(tp)[1:2])
        if found or isinstance(part, int):
            types = found
        # else: a union member's label pydantic puts in loc (``function-after[...]``): every member stays in play
        if not types:
            return []
    return sorted({f.alias or name for tp in _members(types) if _is_model(tp) for name, f in tp.model_fields.items()})


def _members(types: list[Any]) -> list[Any]:
    """``types`` with ``Annotated`` unwrapped and unions (``X | None`` too) opened into their members."""
    out: list[Any] = []
    todo = list(types)
    while todo:
        tp = todo.pop(0)
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            todo.append(typing.get_args(tp)[0])
        elif origin is typing.Union or origin is types_module.UnionType:
            todo.extend(typing.get_args(tp))
        else:
            out.append(tp)
    return out


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "model_fields")


def _literals(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()


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
        tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        message = (f"{dotted}: unknown {what} {ctx.get('tag', '')!r}{did_you_mean(ctx.get('tag'), tags)}; known kinds: {known}"
                   if etype == "union_tag_invalid" else f"{dotted}: missing 'kind'")
    else:
        pos = smap.at(tuple(real))
        msg = msg.removeprefix("Value error, ")
        if etype in ("literal_error", "enum"):  # 'Input should be 'a', 'b' or 'c'': a typo is told the one it meant
            msg += did_you_mean(err.get("input"), re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", ""))))
        message = f"{dotted}: {msg}"
    return ScenarioError(message, pos=pos)
