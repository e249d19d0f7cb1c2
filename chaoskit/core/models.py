"""The base of every input model (scenarios, inventories, cluster specs) and the names they share."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel", "NAME_RE", "check_name", "check_regex"]

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Node names, label keys and values: safe to reach a shell unquoted, still quoted anyway."""


class StrictModel(BaseModel):
    """Base of every input model: unknown keys are errors."""

    # allow_inf_nan=False: no count, share or size is NaN or infinite (durations say so themselves).
    model_config = ConfigDict(extra="forbid", frozen=False, defer_build=True, allow_inf_nan=False)


def check_name(value: str, what: str = "name") -> str:
    """``value`` when it matches :data:`NAME_RE`; ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(value, str) or not re.fullmatch(NAME_RE, value):
        raise ValueError(f"invalid {what} {value!r}: letters, digits, '.', '_', '-' only")
    return value


def check_regex(value: str) -> str:
    """``value`` when it compiles as a Python regular expression; ``ValueError`` saying why otherwise
    (a repeat count of 2**32 or more and a nest too deep for the compiler included)."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regular expression: {exc}") from None
    except OverflowError:
        raise ValueError("invalid regular expression: a repeat count must be below 4294967295 (2**32 - 1)") from None
    except RecursionError:
        raise ValueError("invalid regular expression: groups nested too deeply") from None
    return value
