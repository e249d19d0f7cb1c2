"""Exit codes and the exception root, split by who is at fault.

Every error chaoskit raises on purpose is a :class:`ChaoskitError`. The CLI maps
each subclass to one :class:`ExitCode` and prints one line (plus a hint); a
traceback only with ``--debug``.
"""

from __future__ import annotations

import difflib
import enum
from typing import Iterable

__all__ = [
    "ExitCode",
    "ChaoskitError",
    "ScenarioError",
    "InfraError",
    "SafetyAbort",
    "SourcePos",
    "OutcomeUnknown",
    "one_line",
    "did_you_mean",
]


class ExitCode(enum.IntEnum):
    """Process exit status of every chaoskit command (documented in the README)."""

    OK = 0
    """Every check passed."""
    CHECK_FAILED = 1
    """An SLO or steady-state check failed (the drill ran; the cluster did not meet it)."""
    BAD_INPUT = 2
    """Bad input: scenario, inventory or flags. Nothing was injected."""
    INFRA = 3
    """A target or the infrastructure failed: unreachable host, missing tool."""
    ABORTED = 4
    """Aborted by a safety limit (``safety.abort_after``, a ``safety.stop_when`` condition); every fault was reverted."""
    INTERNAL = 70
    """A chaoskit bug (EX_SOFTWARE): the message says so; ``--debug`` shows the traceback."""
    INTERRUPTED = 130
    """Interrupted by Ctrl-C or SIGTERM, after reverting."""


class SourcePos:
    """A place in a user's file: ``file:line:col`` (1-based)."""

    __slots__ = ("file", "line", "col")

    def __init__(self, file: str, line: int, col: int) -> None:
        self.file, self.line, self.col = file, line, col

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def __repr__(self) -> str:
        return f"SourcePos({self})"


# Line breaks and other control characters, as a user's value may carry them into a message
# ('unknown key "a\rb"'): shown escaped, so every error stays one line.
_ESCAPES = {c: repr(chr(c))[1:-1] for c in [*range(0x20), 0x7F, 0x85, 0x2028, 0x2029]}


def did_you_mean(word: object, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when one of ``names`` is close to ``word`` (a typo), else ``""``: what an error
    about an unknown name adds, so ``process.kil`` is told ``process.kill`` and not only the list to read."""
    if not isinstance(word, str) or not word:
        return ""
    close = difflib.get_close_matches(word, [n for n in names if n != word], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_line(text: str) -> str:
    """``text`` with line breaks and control characters escaped (``\\n``, ``\\x00``)."""
    return text.translate(_ESCAPES)


class ChaoskitError(Exception):
    """Root of every deliberate chaoskit error.

    ``message`` is one line; ``hint`` tells the user what to do about it.
    """

    exit_code: ExitCode = ExitCode.INFRA

    def __init__(self, message: str, *, hint: str | None = None, pos: SourcePos | None = None) -> None:
        message = one_line(message)
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else one_line(hint)
        self.pos = pos

    def __str__(self) -> str:
        return f"{self.pos}: {self.message}" if self.pos else self.message


class ScenarioError(ChaoskitError):
    """The user's input is wrong: scenario, inventory, flags (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class InfraError(ChaoskitError):
    """A target or the infrastructure failed: unreachable, missing tool (exit 3)."""

    exit_code = ExitCode.INFRA


class TargetGone(InfraError):
    """The selected process exited (or its pid now names another) before the fault reached it: nothing was done
    to it. A fault struck in a recovery may meet this (the agents stop the old world's workers); the runner
    looks for its target again within the trigger's window."""


class OutcomeUnknown(InfraError):
    """The connection to a node dropped while a command ran: it may or may not have taken effect."""


class SafetyAbort(ChaoskitError):
    """A safety limit stopped the run (exit 4); the runner reverts everything before it exits."""

    exit_code = ExitCode.ABORTED
