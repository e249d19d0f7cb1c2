"""The base of every input model (scenarios, inventories, cluster specs) and the names they share."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel", "NAME_RE", "check_name"]

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Node names, label keys and values: safe to reach a shell unquoted, still quoted anyway."""


class StrictModel(BaseModel):
    """Base of every input model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False, defer_build=True)


def check_name(value: str, what: str = "name") -> str:
    """``value`` when it matches :data:`NAME_RE`; ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(value, str) or not re.match(NAME_RE, value):
        raise ValueError(f"invalid {what} {value!r}: letters, digits, '.', '_', '-' only")
    return value
