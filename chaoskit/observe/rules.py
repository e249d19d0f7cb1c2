"""Log rules: a pattern over a job's output lines and the timeline event a match makes.

A rule is data: the presets (:mod:`chaoskit.observe.presets`) and a scenario's ``probes.log`` are lists of them,
and :class:`~chaoskit.observe.probes.LogRegexProbe` runs them. They live apart from the probes so that what only
needs their names and texts (``chaoskit validate``, the presets' table) loads neither the probes nor the transports.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from chaoskit.core.patterns import compile_pattern

__all__ = ["LogRule", "TORCHRUN_RULES"]


@dataclass(frozen=True)
class LogRule:
    match: str
    """The pattern's text, in ``re``'s syntax."""
    event: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, match: str, event: str, fields: dict[str, Any] | None = None) -> "LogRule":
        return cls(match, event, tuple((fields or {}).items()))

    @functools.cached_property
    def pattern(self) -> Any:
        """The compiled pattern (the ``regex`` package: ``re``'s syntax, plus a ``timeout`` on every search), made on
        first use: the presets' 40 rules are module constants, and ``chaoskit validate`` needs only their names."""
        return compile_pattern(self.match)


TORCHRUN_RULES = (
    # torch/distributed/elastic/multiprocessing/api.py, as the agent reports a dead worker:
    # "failed (exitcode: -9) local_rank: 0 (pid: 2368) of binary: ..."
    LogRule.of(
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)",
        "worker.exit",
        {"source": "torchrun", "who": "torchrun agent"},
    ),
)
