"""What a plain training script prints about itself, read from its source: the ``probes.log`` rules for its step,
checkpoint and worker-start lines (``chaoskit init``, issue 51).

A plain PyTorch script under torchrun reports nothing chaoskit can see but its own prints: torchrun's lines carry
no step. :func:`scan` parses the script (never runs it) and finds

- its ``print(...)`` and logging calls (``logger.info``, ``logging.warning``, ...) and what each prints: an f-string,
  a ``%`` format with its arguments, ``str.format``, several ``print`` arguments joined by a space;
- the ``torch.save`` / ``torch.load`` calls and the lines that announce them: the first print after the call in the
  same block (``ckpt.save.end`` / ``ckpt.load.end``), else the last one before it (``.start``), else, one call up,
  around the call of the function that holds it;
- the step line: a print inside a loop that shows a value named like a step (``step``, ``global_step``,
  ``iteration``, ``it``), and the worker-start line: one outside any loop that says ``start``.

Each :class:`Found` is a regular expression over what the line prints: its literal text escaped, the step (and the
rank, the pid) as named groups of digits, any other value as ``.*?``, cut after the last group's next literal
text. A line that prints too little literal text to be told apart (``print(step)``) is not used. Stdlib only.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass

__all__ = ["Found", "scan", "EVENTS"]

EVENTS = ("worker.start", "step", "ckpt.save.end", "ckpt.load.end")
"""The events :func:`scan` looks for, in the order a scenario lists them (``.start`` stands in for a missing ``.end``)."""

_LOG_CALLS = {"debug", "info", "warning", "warn", "error", "critical", "exception"}
_STEP = re.compile(r"step|^(?:iteration|iter|itr|it)$", re.IGNORECASE)
_RANK = re.compile(r"(?:^|_)(?:global_?rank|local_?rank|rank|gpu_?id)$", re.IGNORECASE)
_PID = re.compile(r"(?:^|_)(?:pid|getpid)$", re.IGNORECASE)
_GROUPS = (("step", _STEP), ("rank", _RANK), ("pid", _PID))
_MIN_LITERAL = 3
"""Letters a rule must match besides its groups: ``(?P<step>\\d+)`` alone would take any number of any line."""


@dataclass(frozen=True)
class Found:
    """One rule: ``event`` for lines matching ``match``, from the script's line ``line`` (1-based), whose text
    (stripped) is ``source``."""

    event: str
    match: str
    line: int
    source: str


@dataclass
class _Print:
    node: ast.Call
    parts: list  # str (literal) or str (group name: "step", "rank", "pid") wrapped in a tuple, or None (any value)
    in_loop: bool

    @property
    def groups(self) -> set[str]:
        return {p[0] for p in self.parts if isinstance(p, tuple) and p[0]}

    @property
    def literal(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))


def scan(source: str) -> list[Found]:
    """The rules found in the script ``source`` (at most one per kind of :data:`EVENTS`; a ``.start`` in place of a
    ``.end`` it could not find); empty for a script that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    prints = {id(p.node): p for p in _prints(tree, parents)}
    found: dict[str, Found] = {}
    used: set[int] = set()

    def take(event: str, p: _Print) -> None:
        rule = _regex(p.parts)
        if rule is None or event in found:
            return
        used.add(id(p.node))
        found[event] = Found(event, rule, p.node.lineno, lines[p.node.lineno - 1].strip())

    for verb in ("save", "load"):
        for call in _torch_calls(tree, verb):
            end, start = _announcements(call, parents, prints, tree)
            if end is not None:
                take(f"ckpt.{verb}.end", end)
            elif start is not None:
                take(f"ckpt.{verb}.start", start)
    free = [p for p in sorted(prints.values(), key=lambda p: p.node.lineno) if id(p.node) not in used]
    steps = [p for p in free if "step" in p.groups and p.in_loop] or [p for p in free if "step" in p.groups]
    steps.sort(key=lambda p: ("loss" not in p.literal.lower(), p.node.lineno))
    for p in steps:
        take("step", p)
    for p in free:
        if not p.in_loop and id(p.node) not in used and "start" in p.literal.lower():
            take("worker.start", p)
    order = {e: i for i, e in enumerate(("worker.start", "step", "ckpt.save.start", "ckpt.save.end",
                                         "ckpt.load.start", "ckpt.load.end"))}
    return sorted(found.values(), key=lambda f: order[f.event])


def _prints(tree: ast.AST, parents: dict[ast.AST, ast.AST]):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            parts: list = []
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Starred):
                    parts.append((None,))
                    continue
                if i:
                    parts.append(" ")
                parts += _parts(arg)
        elif isinstance(func, ast.Attribute) and func.attr in _LOG_CALLS and node.args:
            parts = _parts(node.args[0], node.args[1:])
        else:
            continue
        yield _Print(node, parts, _in_loop(node, parents))


def _parts(expr: ast.expr, args: list[ast.expr] | None = None) -> list:
    """What ``expr`` prints, as literal text and values (``args``: the ``%`` arguments of a logging call)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return _percent(expr.value, args) if args else [expr.value]
    if isinstance(expr, ast.JoinedStr):
        out: list = []
        for value in expr.values:
            if isinstance(value, ast.Constant):
                out.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                out.append(_value(value.value, padded=value.format_spec is not None))
        return out
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _parts(expr.left) + _parts(expr.right)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod) and isinstance(expr.left, ast.Constant) \
            and isinstance(expr.left.value, str):
        right = expr.right.elts if isinstance(expr.right, ast.Tuple) else [expr.right]
        return _percent(expr.left.value, list(right))
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format" \
            and isinstance(expr.func.value, ast.Constant) and isinstance(expr.func.value.value, str):
        return _format(expr.func.value.value, expr.args, {k.arg: k.value for k in expr.keywords if k.arg})
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "str" and expr.args:
        return [_value(expr.args[0])]
    return [_value(expr)]


def _percent(text: str, args: list[ast.expr] | None) -> list:
    out: list = []
    args = list(args or [])
    pos = 0
    for m in re.finditer(r"%(?:\((\w+)\))?[-+ #0]*(\*|\d+)?(?:\.(\d+))?[hlL]?([diouxXeEfFgGcrsa%])", text):
        out.append(text[pos:m.start()])
        pos = m.end()
        if m.group(4) == "%":
            out.append("%")
            continue
        out.append(_value(args.pop(0), padded=bool(m.group(2))) if args else (None,))
    out.append(text[pos:])
    return [p for p in out if p != ""]


def _format(text: str, args: list[ast.expr], kwargs: dict[str, ast.expr]) -> list:
    out: list = []
    auto = 0
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return [(None,)]
    for literal, name, spec, _ in fields:
        out.append(literal)
        if name is None:
            continue
        key = name.split(".")[0].split("[")[0]
        if key == "":
            expr = args[auto] if auto < len(args) else None
            auto += 1
        elif key.isdigit():
            expr = args[int(key)] if int(key) < len(args) else None
        else:
            expr = kwargs.get(key)
        out.append(_value(expr, padded=bool(spec)) if expr is not None else (_group(key),))
    return [p for p in out if p != ""]


def _value(expr: ast.expr, padded: bool = False) -> tuple:
    """A printed value: ``(group, padded)``, the group ``step`` / ``rank`` / ``pid`` by the value's name, or None."""
    name = ""
    if isinstance(expr, ast.Name):
        name = expr.id
    elif isinstance(expr, ast.Attribute):
        name = expr.attr
    elif isinstance(expr, ast.Call):
        func = expr.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "int" and expr.args:
            return _value(expr.args[0], padded)
    elif isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
        name = expr.slice.value
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):  # step + 1: still the step
        group = _value(expr.left)[0]
        return (group if group == "step" else None, padded)
    return (_group(name), padded)


def _group(name: str) -> str | None:
    for group, pattern in _GROUPS:
        if pattern.search(name):
            return group
    return None


def _regex(parts: list) -> str | None:
    """The regular expression over what ``parts`` print (see the module), or None when it would match too much."""
    pieces: list[str] = []
    seen: set[str] = set()
    groups: list[int] = []
    for part in parts:
        if isinstance(part, str):
            pieces.append(re.escape(part).replace("\\ ", " "))  # a space needs no escape
            continue
        group = part[0]
        pad = r"\s*" if len(part) > 1 and part[1] else ""
        if group in ("step", "rank", "pid") and group not in seen:
            seen.add(group)
            groups.append(len(pieces))
            pieces.append(f"{pad}(?P<{group}>\\d+)")
        elif group in ("step", "rank", "pid"):
            groups.append(len(pieces))
            pieces.append(f"{pad}\\d+")
        else:
            pieces.append(None)  # type: ignore[arg-type]
    # from the first literal text to the literal text after the last group: a value past it ends the rule
    last = groups[-1] if groups else next((i for i, p in enumerate(pieces) if p is not None), len(pieces))
    end = next((i for i in range(last + 1, len(pieces)) if pieces[i] is None), len(pieces))
    pieces = pieces[:end]
    while pieces and pieces[0] is None:
        pieces.pop(0)
    text = "".join(p if p is not None else ".*?" for p in pieces).rstrip()
    literal = re.sub(r"\(\?P<\w+>\\d\+\)|\\d\+|\\s\*|\.\*\?|\\", "", text)
    if sum(c.isalpha() for c in literal) < _MIN_LITERAL:
        return None
    try:
        re.compile(text)
    except re.error:
        return None
    return text


def _in_loop(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _called_in_loop(node, parents)
    return False


def _called_in_loop(func: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """A function (a method) the script calls from inside a loop: its prints repeat as the loop does."""
    root = func
    while root in parents:
        root = parents[root]
    name = func.name  # type: ignore[attr-defined]
    for node in ast.walk(root):
        if isinstance(node, ast.Call) and _callee(node) == name and node is not func:
            up = node
            while up in parents:
                up = parents[up]
                if isinstance(up, (ast.For, ast.While, ast.AsyncFor)):
                    return True
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    break
    return False


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _torch_calls(tree: ast.AST, verb: str) -> list[ast.Call]:
    return sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr == verb and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"),
                  key=lambda n: n.lineno)


def _announcements(call: ast.AST, parents: dict[ast.AST, ast.AST], prints: dict[int, _Print], tree: ast.AST,
                   depth: int = 0) -> tuple[_Print | None, _Print | None]:
    """The print after ``call`` in its block (and the blocks around it, up to its function), and the last one
    before it: ``(after, before)``; one call up when its function prints neither."""
    after = before = None
    node = call
    while node in parents and after is None:
        parent = parents[node]
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                i = block.index(node)
                after = after or _first_print(block[i + 1:], prints)
                before = before or _first_print(reversed(block[:i]), prints, last=True)
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if after is None and before is None and depth == 0:
                for caller in ast.walk(tree):
                    if isinstance(caller, ast.Call) and _callee(caller) == parent.name:
                        up = _announcements(caller, parents, prints, tree, depth + 1)
                        if up != (None, None):
                            return up
            break
        node = parent
    return after, before


def _first_print(stmts, prints: dict[int, _Print], last: bool = False) -> _Print | None:
    """The first (``last``: the last) print of ``stmts``, looking into ``if``/``with``/``try`` but not into a loop or a
    function: a line printed every step is not a checkpoint's announcement."""
    for stmt in stmts:
        hits = [prints[id(n)] for n in _outside_loops(stmt) if id(n) in prints]
        if hits:
            hits.sort(key=lambda p: p.node.lineno)
            return hits[-1] if last else hits[0]
    return None


def _outside_loops(node: ast.AST):
    if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Lambda)):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _outside_loops(child)
