"""The base of every input model (scenarios, inventories, cluster specs) and the names they share."""

from __future__ import annotations

import re
from typing import Annotated, Any, Callable, Iterable
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer, WithJsonSchema

from chaoskit.core.shell import check_ifname

__all__ = ["StrictModel", "NAME_RE", "NAME_RULE", "check_match", "check_each", "check_name", "check_regex", "check_http_url", "Regex", "IfName", "with_units"]

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Node names, label keys and values: safe to reach a shell unquoted, still quoted anyway."""


class StrictModel(BaseModel):
    """Base of every input model: unknown keys are errors."""

    # allow_inf_nan=False: no count, share or size is NaN or infinite (durations say so themselves).
    model_config = ConfigDict(extra="forbid", frozen=False, defer_build=True, allow_inf_nan=False)


def check_match(value: str, pattern: str, what: str, rule: str = "") -> str:
    """``value`` when it is a string ``pattern`` matches whole; else ``ValueError``: ``invalid WHAT 'value'``,
    followed by ``: RULE`` when given (the pattern in words)."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise ValueError(f"invalid {what} {value!r}" + (f": {rule}" if rule else ""))
    return value


def check_each(values: Iterable[str] | None, pattern: str, what: str, rule: str = "") -> Any:
    """``values`` (a list, or a dict whose keys are checked; ``None`` too) when :func:`check_match` passes each."""
    for value in values or ():
        check_match(value, pattern, what, rule)
    return values


NAME_RULE = "letters, digits, '.', '_', '-' only"
"""What :data:`NAME_RE` allows, in words."""


def check_name(value: str, what: str = "name") -> str:
    """``value`` when it matches :data:`NAME_RE`; ``ValueError`` naming ``what`` otherwise."""
    return check_match(value, NAME_RE, what, NAME_RULE)


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


Regex = Annotated[str, AfterValidator(check_regex)]
"""A field holding a Python regular expression (:func:`check_regex`)."""
IfName = Annotated[str, AfterValidator(check_ifname)]
"""A field holding a Linux interface name (:func:`~chaoskit.core.shell.check_ifname`)."""



def with_units(number: type, parse: Callable[[Any], Any], pattern: str, minimum: float, maximum: float,
               description: str, max_length: int | None = None) -> Any:
    """A field type for a quantity people write with units (``30s``, ``64MiB``) or as a plain ``number``: ``parse``
    reads either (``ValueError`` with a readable message otherwise) and the model holds, and writes out, the
    number. Its JSON Schema: a string ``pattern`` matches (of at most ``max_length`` characters when given), or a
    number (an integer for ``int``) from ``minimum`` to ``maximum``; ``description`` says so in words."""
    text: dict[str, Any] = {"type": "string", "pattern": pattern}
    if max_length is not None:
        text["maxLength"] = max_length
    plain = {"type": "integer" if number is int else "number", "minimum": minimum, "maximum": maximum}
    return Annotated[
        number,
        BeforeValidator(parse),
        PlainSerializer(lambda value: value, return_type=number),
        WithJsonSchema({"anyOf": [text, plain], "description": description}),
    ]


MAX_URL = 2048


def check_http_url(value: str, what: str = "URL") -> str:
    """``value`` when it is an ``http``/``https`` URL naming a host (a Prometheus, a Pushgateway), with no
    user:password in it (it would end up in result.json), no fragment, no space or control character;
    ``ValueError`` saying why otherwise."""
    if not isinstance(value, str) or not value or len(value) > MAX_URL:
        raise ValueError(f"invalid {what}: an http:// or https:// URL of at most {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"invalid {what} {value[:80]!r}: no spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid {what} {value[:80]!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"invalid {what} {value[:80]!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"invalid {what} {value[:80]!r}: no host (e.g. http://prometheus:9090)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"invalid {what}: no user or password in the URL (it would be written into the run's files)")
    if parts.fragment or parts.query:
        raise ValueError(f"invalid {what} {value[:80]!r}: no query string or fragment")
    if port == 0:
        raise ValueError(f"invalid {what} {value[:80]!r}: port 0")
    return value
