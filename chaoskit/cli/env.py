"""The streams and flags a command runs with, injected so tests run the CLI in-process."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Callable

import typer

__all__ = ["CliEnv", "current_env", "set_env", "print_json", "print_result", "command_app", "EXIT_CODES_HELP"]


@dataclass
class CliEnv:
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    debug: bool = False
    owns_process: bool = False
    """The ``chaoskit`` command itself, whose process ends with the command (not a test or a program calling
    :func:`~chaoskit.cli.main.main`): what it loads may be kept out of the garbage collector's sight for good."""

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


EXIT_CODES_HELP = ("Exit codes: 0 pass, 1 SLO/check failed, 2 bad input, 3 infrastructure failed, "
                   "4 aborted by a safety limit, 70 internal error, 130 interrupted.")


def print_json(data: Any) -> None:
    """``data`` as indented JSON on the command's stdout."""
    current_env().stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_result(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """A check's ``result`` as the command prints it: its ``as_dict()`` as JSON with ``--json``, else ``render(result)``."""
    if as_json:
        print_json(result.as_dict())
    else:
        render(result)


def command_app(**options: Any) -> typer.Typer:
    """A Typer app for one command of the lazy table in :mod:`chaoskit.cli.app` (``options`` as for ``app.command``)."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None, **options)
