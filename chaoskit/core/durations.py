"""Durations as people write them: ``250ms``, ``30s``, ``5m``, ``1h``, ``1m30s`` or a number of seconds."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["Duration", "PositiveDuration", "parse_duration", "format_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")


def parse_duration(value: Any) -> float:
    """Return seconds for ``value``; raise ``ValueError`` with a readable message."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 250ms, 30s or 5m, not a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not _WHOLE.match(text):
            raise ValueError(f"invalid duration {value!r}: use a number with a unit, such as 250ms, 30s, 5m or 1h")
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        raise ValueError(f"expected a duration such as 250ms, 30s or 5m, got {type(value).__name__}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form: ``0.25s``, ``30s``, ``5m``."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(lambda s: s, return_type=float),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h))+$"},
                {"type": "number", "minimum": 0},
            ],
            "description": "A duration: 250ms, 30s, 5m, 1h, or a number of seconds.",
        }
    ),
]


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("duration must be greater than zero")
    return seconds


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A :data:`Duration` that must be greater than zero (fault durations, time limits)."""
