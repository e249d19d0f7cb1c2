"""Entry point: run the Typer app and map every error to one exit code and one line.

``program`` code (the commands) raises; only :func:`main` catches. The streams
are injected through :class:`CliEnv` so tests run the CLI in-process.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import IO, Sequence

from chaoskit.errors import ChaoskitError, ExitCode

__all__ = ["main", "CliEnv", "current_env"]


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
    return _ENV


def main(argv: Sequence[str] | None = None, env: CliEnv | None = None) -> int:
    """Run chaoskit with ``argv``; return the exit status (see :class:`ExitCode`)."""
    from chaoskit.cli.app import app

    click = _click()
    import typer

    _EXIT = tuple({typer.Exit, *(getattr(m, "Exit") for m in (click.exceptions, typer.exceptions) if hasattr(m, "Exit"))})
    _ABORT = tuple({typer.Abort, *(getattr(m, "Abort") for m in (click.exceptions, typer.exceptions) if hasattr(m, "Abort"))})

    global _ENV
    _ENV = env or CliEnv()
    args = list(sys.argv[1:] if argv is None else argv)
    _ENV.debug = "--debug" in args or os.environ.get("CHAOSKIT_DEBUG") == "1"
    import typer.main

    command = typer.main.get_command(app)
    standalone = argv is None and env is None
    try:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _ENV.stdout, _ENV.stderr
        try:
            rv = command.main(args=args, prog_name="chaoskit", standalone_mode=False)
        finally:
            sys.stdout, sys.stderr = old_out, old_err
        code = int(rv) if isinstance(rv, int) else 0
    except ChaoskitError as exc:
        code = _report(exc)
    except _EXIT as exc:
        code = getattr(exc, "exit_code", 0)
    except _ABORT:
        _ENV.stderr.write("error: interrupted\n")
        code = ExitCode.INTERRUPTED
    except click.exceptions.ClickException as exc:
        _ENV.stderr.write(f"error: {exc.format_message()}\n")
        if isinstance(exc, click.exceptions.UsageError) and exc.ctx is not None:
            _ENV.stderr.write(f"hint: see '{exc.ctx.command_path} --help'\n")
        code = ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        _ENV.stderr.write("error: interrupted\n")
        code = ExitCode.INTERRUPTED
    except Exception:  # noqa: BLE001 - the one place that turns a bug into a message
        if _ENV.debug:
            traceback.print_exc(file=_ENV.stderr)
        else:
            etype, value, _ = sys.exc_info()
            _ENV.stderr.write(f"internal error: {etype.__name__}: {value}\n")
            _ENV.stderr.write("hint: this is a chaoskit bug; rerun with --debug for a traceback and report it\n")
        code = 70
    if standalone:
        sys.exit(int(code))
    return int(code)


def _click():
    """The click that typer uses: vendored as ``typer._click`` since typer 0.2x, else the package."""
    try:
        from typer import _click as vendored  # type: ignore[attr-defined]

        return vendored
    except ImportError:  # pragma: no cover - older typer
        import click

        return click


def _report(exc: ChaoskitError) -> int:
    if _ENV.debug:
        traceback.print_exc(file=_ENV.stderr)
    _ENV.stderr.write(f"error: {exc}\n")
    if exc.hint:
        _ENV.stderr.write(f"hint: {exc.hint}\n")
    return int(exc.exit_code)
