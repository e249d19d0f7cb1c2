"""The shape of a ``result.json``: every key path, and whether an object, an array or a value is there.

What a recorded result is compared by (``tests/data/result-shape/``): a refactoring that changes no behaviour
gives the same keys with the same types; timings and ids differ from run to run and are not compared. A list's
items are folded into one path (``faults[]``), dicts keyed by node or rank into one (``*``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

_VARYING_KEY = re.compile(r"(n\d+|rank\d+|n\d+/rank\d+|\d+|[0-9a-f]{8,}|/.*)")
"""Keys that name a node, a rank, a pid or a path: one path ``*`` for all of them."""


def _type(value: Any) -> str:
    """``object``, ``array`` or ``value``: a value's own type (a phase not observed is null in one run and a
    number in the next) is the run's, not the result's shape."""
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else "value"


def shape(value: Any, path: str = "", out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    out = {} if out is None else out
    out.setdefault(path or ".", set()).add(_type(value))
    if isinstance(value, dict):
        for key, item in value.items():
            name = "*" if _VARYING_KEY.fullmatch(str(key)) else str(key)
            shape(item, f"{path}.{name}", out)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):  # a list of values (notes, targets) is one value, however long
                shape(item, f"{path}[]", out)
    return out


def key_order(value: Any, path: str = "", out: list[str] | None = None) -> list[str]:
    """Every key path of :func:`shape`, in the order the file first gives it: result.json written in another
    order is another file, though its shape is the same."""
    out = [] if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{'*' if _VARYING_KEY.fullmatch(str(key)) else key}"
            if name not in out:
                out.append(name)
            key_order(item, name, out)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                key_order(item, f"{path}[]", out)
    return out


def shape_json(value: Any) -> dict[str, str]:
    """:func:`shape` as JSON can hold it: each path's kinds joined with ``|``."""
    return {k: "|".join(sorted(v)) for k, v in sorted(shape(value).items())}


if __name__ == "__main__":  # record one: python tests/result_shape.py RESULT.json > tests/data/result-shape/NAME.json
    print(json.dumps(shape_json(json.loads(Path(sys.argv[1]).read_text())), indent=0))
