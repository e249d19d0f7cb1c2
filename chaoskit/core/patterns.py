"""Regular expressions from scenarios, run with a time bound.

A scenario's pattern (a log rule, ``target.process``, ``workload.process``) meets text the
job controls: a command line, a log line. A pattern that backtracks (``(a|aa)+$``) could hold
a thread for hours; compiled here with the ``regex`` package (``re``'s syntax), each search has a
deadline (:data:`~chaoskit.core.limits.REGEX_TIMEOUT_S`), past which it is an error, not a hang.
"""

from __future__ import annotations

from typing import Any

from chaoskit.core.errors import ScenarioError
from chaoskit.core.limits import REGEX_TIMEOUT_S

__all__ = ["compile_pattern", "bounded_search"]


def compile_pattern(source: str) -> Any:
    """``source`` compiled with ``re``'s syntax (the ``regex`` package's VERSION0).

    ``regex`` is imported here, where a pattern is first compiled, not at the top: it costs about 12 ms, and
    ``chaoskit validate`` (which loads this module through the target selectors) never compiles one."""
    import regex

    return regex.compile(source, regex.VERSION0)


def bounded_search(pattern: Any, text: str, what: str, timeout: float = REGEX_TIMEOUT_S) -> Any:
    """``pattern.search(text)`` within ``timeout``; past it, a :class:`ScenarioError` that names ``what``
    (the scenario field the pattern came from)."""
    try:
        return pattern.search(text, timeout=timeout)
    except TimeoutError:
        raise ScenarioError(
            f"{what}: the pattern {pattern.pattern[:80]!r} took longer than {timeout:g}s on a text of {len(text)} "
            "characters; simplify it (no nested repetition such as (a+)+)") from None
