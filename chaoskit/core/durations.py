"""Durations as people write them: ``250ms``, ``30s``, ``5m``, ``1h``, ``30d``, ``1m30s`` or a number of seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator

from chaoskit.core.limits import MAX_DURATION_S
from chaoskit.core.models import with_units

__all__ = ["Duration", "PositiveDuration", "parse_duration", "format_duration", "SCHEMA_PATTERN"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# [0-9], not \d: Python's \d takes any Unicode digit ("٣٠s"); the whole string must match (fullmatch).
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h|d))+")
_MAX_TEXT = 64  # characters: "1h59m59s999ms" is 13; anything longer is not a duration a person wrote


def parse_duration(value: Any, maximum: float = MAX_DURATION_S) -> float:
    """Return seconds for ``value``, finite and at most ``maximum`` (a scenario's:
    :data:`~chaoskit.core.limits.MAX_DURATION_S`); raise ``ValueError`` with a readable message."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 250ms, 30s or 5m, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {_short(value)}")
        if value > maximum:  # compared as an int: float() of a huge one overflows
            raise ValueError(f"duration {_short(value)} is longer than {_human(maximum)}, the maximum")
        seconds = float(value)
    elif isinstance(value, float):
        seconds = value
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if len(text) > _MAX_TEXT or not _WHOLE.fullmatch(text):
            raise ValueError(f"invalid duration {_short(value)}: use a number with a unit, such as 250ms, 30s, 5m or 1h")
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        raise ValueError(f"expected a duration such as 250ms, 30s or 5m, got {type(value).__name__}")
    if math.isnan(seconds):
        raise ValueError("duration must be a number, not NaN")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {_short(value)}")
    if seconds > maximum:
        raise ValueError(f"duration {_short(value)} is longer than {_human(maximum)}, the maximum")
    return seconds


def _human(seconds: float) -> str:
    return f"{seconds / 86400:g} days"


def _short(value: Any) -> str:
    # repr() of an int over 4,300 digits raises (Python's int-to-str limit): say what it is instead.
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else f"(an integer of {value.bit_length()} bits)"
    return text if len(text) <= 40 else text[:37] + "..."


def format_duration(seconds: float) -> str:
    """Short human form: ``0.25s``, ``30s``, ``5m``."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


SCHEMA_PATTERN = f"^{_WHOLE.pattern}$"
"""The JSON Schema's pattern of a written duration: the parser's own (``_WHOLE``), so an editor using
``chaoskit.schema.json`` accepts what ``validate`` accepts (``1d`` too). Spaces, which the parser drops, are not in it."""

Duration = with_units(float, parse_duration, SCHEMA_PATTERN, 0, MAX_DURATION_S,
                      "A duration: 250ms, 30s, 5m, 1h, or a number of seconds; at most 30 days.", max_length=_MAX_TEXT)


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("duration must be greater than zero")
    return seconds


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A :data:`Duration` that must be greater than zero (fault durations, time limits)."""
