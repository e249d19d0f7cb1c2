"""The root of the ``chaoskit`` command: global options and the table of commands.

Each command lives in its own module (``run_cmd``, ``validate_cmd``, ``lab_cmd``,
``gameday_cmd``, ``simulate_cmd``) and is imported only when it runs, so
``chaoskit --help`` loads neither pydantic nor the scenario model, and
``chaoskit validate`` loads no runner (click's "lazily loading subcommands"). The
table carries each command's one-line help for the listing.

Exit codes (see :class:`chaoskit.core.errors.ExitCode`): 0 every check passed;
1 an SLO or steady-state check failed; 2 bad input; 3 a target or the
infrastructure failed; 4 aborted by a safety limit; 70 a chaoskit bug; 130 interrupted.
"""

from __future__ import annotations

import gc
import importlib
from contextlib import contextmanager
from typing import Any, Iterator

import typer
import typer.main
from typer.core import TyperGroup

from chaoskit import __version__
from chaoskit.cli.env import current_env

__all__ = ["app", "COMMANDS"]

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("chaoskit.cli.run_cmd:run_app",
            "Run one drill: start the job, inject the faults, measure the recovery."),
    "validate": ("chaoskit.cli.validate_cmd:validate_app",
                 "Check scenarios without touching anything (file:line:col for every error)."),
    "schema": ("chaoskit.cli.schema_cmd:schema_app", "Print the JSON Schema of scenarios (for editors), or of result.json (--result)."),
    "doctor": ("chaoskit.cli.doctor_cmd:doctor_app",
               "Check an inventory's nodes: reachable, sudo, tools, netem, clock offset, GPUs."),
    "rollback": ("chaoskit.cli.run_cmd:rollback_app",
                 "Undo what crashed runs left behind: revert their faults, stop their labs."),
    "audit": ("chaoskit.cli.audit_cmd:audit_app",
              "List what of chaoskit's is still on each node (faults, leases, state); --fix reverts what journals allow."),
    "catalog": ("chaoskit.cli.gameday_cmd:catalog_app",
                "List the fault classes with their real-world weight and whether they can run here."),
    "gameday": ("chaoskit.cli.gameday_cmd:gameday_app",
                "Run scenarios in turn, score fault coverage, write JUnit and an HTML report."),
    "scorecard": ("chaoskit.cli.scorecard_cmd:scorecard_app",
                  "One fault list on every recovery stack (torchrun, nvrx, torchft, ray, slurm), side by side."),
    "campaign": ("chaoskit.cli.campaign_cmd:campaign_app",
                 "One long run with faults at a real rate: ETTR and its badput, against the simulator's prediction."),
    "report": ("chaoskit.cli.gameday_cmd:report_app", "Rebuild the HTML report of a run or a game day."),
    "export": ("chaoskit.cli.export_cmd:export_app",
               "A run's or a game day's results as Prometheus metrics: OpenMetrics text, or pushed to a Pushgateway."),
    "simulate": ("chaoskit.cli.simulate_cmd:simulate_app",
                 "Plan at scale: what the recovery phases mean for goodput on a whole cluster."),
    "lab": ("chaoskit.cli.lab_cmd:lab_app", "Local lab clusters: nodes on this machine, no infrastructure needed."),
    "init": ("chaoskit.cli.init_cmd:init_app",
             "Write a commented starter scenario for your own job (framework, cluster, launch)."),
}
"""Command name -> (``module:attribute`` of its Typer app, one-line help)."""


class LazyCommands(TyperGroup):
    """A group whose commands are the :data:`COMMANDS` table, each imported on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name][0].partition(":")
            with _loading(for_good=current_env().owns_process):
                command = typer.main.get_command(getattr(importlib.import_module(module), attr))
            command.name = cmd_name
            self.commands[cmd_name] = command
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, short) for name, (_, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@contextmanager
def _loading(for_good: bool) -> Iterator[None]:
    """The garbage collector waits while a command's modules load: they build classes and models that live as long
    as the process (most of what ``chaoskit validate`` takes), nothing a collection could free. In the ``chaoskit``
    process itself (``for_good``) what is loaded by then is frozen (:func:`gc.freeze`), so no later collection,
    the one at exit included, walks it again: about 5% of ``chaoskit validate``'s instructions (bench/README.md)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if for_good:
            gc.freeze()
        if collecting:
            gc.enable()


app = typer.Typer(
    name="chaoskit",
    cls=LazyCommands,
    help=(
        "Chaos drills for GPU training clusters: inject real faults into a training job, "
        "measure detection, reallocation and checkpoint load, check SLOs.\n\n"
        "Start with: chaoskit run scenarios/kill-rank.yaml (runs on the built-in lab)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"chaoskit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    current_env().debug = debug or current_env().debug
