"""Sizes as people write them: ``64MiB``, ``512KiB``, ``1GiB``, ``100MB`` or a number of bytes.

Strict: a whole number, one unit from :data:`UNITS` (binary ``KiB``/``MiB``/``GiB``/``TiB``,
decimal ``kB``/``MB``/``GB``/``TB``, or ``B``), nothing else; ``64m``, ``1.5GiB`` and
``64 MiB of data`` are refused, since a size that reaches a file system must mean one thing.
"""

from __future__ import annotations

import re
from typing import Any

from chaoskit.core.models import with_units

__all__ = ["ByteSize", "parse_size", "format_size", "UNITS", "MAX_SIZE_BYTES"]

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
MAX_SIZE_BYTES = 1 << 50
"""1 PiB: above any checkpoint file system a drill fills, far below what overflows a 64-bit offset."""
_SIZE = re.compile(r"([0-9]{1,16})(B|KiB|MiB|GiB|TiB|kB|MB|GB|TB)")


def parse_size(value: Any) -> int:
    """Bytes for ``value`` (at least 1, at most :data:`MAX_SIZE_BYTES`); ``ValueError`` with a readable message."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 64MiB, not a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value.strip())
        if m is None:
            shown = repr(value) if len(value) <= 40 else repr(value[:37] + "...")
            raise ValueError(f"invalid size {shown}: use a whole number with a unit, such as 64MiB, 512KiB, 1GiB or 100MB")
        size = int(m.group(1)) * UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a size such as 64MiB, got {type(value).__name__}")
    if size < 1:
        raise ValueError("size must be at least 1 byte")
    if size > MAX_SIZE_BYTES:
        raise ValueError("size is larger than 1PiB, the maximum")
    return size


def format_size(size: int) -> str:
    """Short human form: ``64MiB``, ``1.5GiB``, ``300B``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size >= UNITS[unit]:
            return f"{size / UNITS[unit]:g}{unit}"
    return f"{size}B"


ByteSize = with_units(int, parse_size, r"^[0-9]{1,16}(B|KiB|MiB|GiB|TiB|kB|MB|GB|TB)$", 1, MAX_SIZE_BYTES,
                      "A size: 64MiB, 512KiB, 1GiB, 100MB, or a number of bytes.")
