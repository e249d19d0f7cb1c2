"""The streams and flags a command runs with, injected so tests run the CLI in-process."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO

__all__ = ["CliEnv", "current_env", "set_env"]


@dataclass
class CliEnv:
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    debug: bool = False

    def console(self, err: bool = False):
        from rich.console import Console

        stream = self.stderr if err else self.stdout
        return Console(file=stream, highlight=False, soft_wrap=False, width=None if stream.isatty() else 110)


_ENV = CliEnv()


def current_env() -> CliEnv:
    """The environment of the command that is running."""
    return _ENV


def set_env(env: CliEnv) -> CliEnv:
    """Make ``env`` the running command's environment (:func:`chaoskit.cli.main.main` does, per call)."""
    global _ENV
    _ENV = env
    return env
