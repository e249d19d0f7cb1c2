"""Entry point: run the Typer app and map every error to one exit code and one line.

``program`` code (the commands) raises; only :func:`main` catches. The streams
are injected through :class:`CliEnv` so tests run the CLI in-process.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Sequence

import typer
import typer.main

from chaoskit.cli.app import app
from chaoskit.cli.env import CliEnv, set_env
from chaoskit.core.errors import ChaoskitError, ExitCode
from chaoskit.core.secrets import redact_text

__all__ = ["main", "CliEnv"]


def main(argv: Sequence[str] | None = None, env: CliEnv | None = None) -> int:
    """Run chaoskit with ``argv``; return the exit status (see :class:`ExitCode`)."""
    click = _click()
    _EXIT = tuple({typer.Exit, *(getattr(m, "Exit") for m in (click.exceptions, typer.exceptions) if hasattr(m, "Exit"))})
    _ABORT = tuple({typer.Abort, *(getattr(m, "Abort") for m in (click.exceptions, typer.exceptions) if hasattr(m, "Abort"))})

    standalone = argv is None and env is None
    env = set_env(env or CliEnv(owns_process=standalone))
    args = list(sys.argv[1:] if argv is None else argv)
    env.debug = "--debug" in args or os.environ.get("CHAOSKIT_DEBUG") == "1"
    command = typer.main.get_command(app)
    try:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = env.stdout, env.stderr
        try:
            rv = command.main(args=args, prog_name="chaoskit", standalone_mode=False)
        finally:
            sys.stdout, sys.stderr = old_out, old_err
        code = int(rv) if isinstance(rv, int) else 0
    except ChaoskitError as exc:
        code = _report(exc, env)
    except _EXIT as exc:
        code = getattr(exc, "exit_code", 0)
    except _ABORT:
        env.stderr.write("error: interrupted\n")
        code = ExitCode.INTERRUPTED
    except click.exceptions.ClickException as exc:
        env.stderr.write(f"error: {exc.format_message()}\n")
        if isinstance(exc, click.exceptions.UsageError) and exc.ctx is not None:
            env.stderr.write(f"hint: see '{exc.ctx.command_path} --help'\n")
        code = ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        env.stderr.write("error: interrupted\n")
        code = ExitCode.INTERRUPTED
    except Exception:  # noqa: BLE001 - the one place that turns a bug into a message
        if env.debug:
            traceback.print_exc(file=env.stderr)
        else:
            etype, value, _ = sys.exc_info()
            env.stderr.write(f"internal error: {etype.__name__}: {value}\n")
            env.stderr.write("hint: this is a chaoskit bug; rerun with --debug for a traceback and report it\n")
        code = ExitCode.INTERNAL
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


def _report(exc: ChaoskitError, env: CliEnv) -> int:
    if env.debug:
        traceback.print_exc(file=env.stderr)
    env.stderr.write(f"error: {redact_text(str(exc))}\n")
    if exc.hint:
        env.stderr.write(f"hint: {redact_text(exc.hint)}\n")
    return int(exc.exit_code)
