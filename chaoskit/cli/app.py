"""The Typer app. Thin: parse, call, print. Heavy modules load inside commands.

Exit codes (see :class:`chaoskit.errors.ExitCode`): 0 every check passed;
1 an SLO or steady-state check failed; 2 bad input; 3 a target or the
infrastructure failed; 4 aborted by a safety limit; 130 interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from chaoskit import __version__
from chaoskit.cli.main import current_env

app = typer.Typer(
    name="chaoskit",
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
lab_app = typer.Typer(help="Local lab clusters: nodes on this machine, no infrastructure needed.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")

EXIT_CODES_HELP = "Exit codes: 0 pass, 1 SLO/check failed, 2 bad input, 3 infrastructure failed, 4 aborted by a safety limit, 130 interrupted."


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


def _print_json(data) -> None:
    current_env().stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command(epilog=EXIT_CODES_HELP)
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default reports/<UTC time>-<name>/)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved targets and exact actions; touch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print result.json to stdout; progress goes to stderr."),
) -> int:
    """Run one drill: start the job, inject the faults, measure the recovery, write result.json."""
    from chaoskit.report.summary import render_plan, render_result
    from chaoskit.runner import run_scenario

    env = current_env()
    console = env.console(err=as_json)
    outcome = run_scenario(scenario, out=out, dry_run=dry_run, console=None if dry_run else console)
    if as_json:
        _print_json(outcome.result)
    elif dry_run:
        render_plan(console, outcome.result)
    else:
        render_result(console, outcome.result)
    return outcome.exit_code


@app.command(epilog=EXIT_CODES_HELP)
def validate(
    paths: List[Path] = typer.Argument(..., help="Scenario files or folders (searched for *.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Check scenarios without touching anything. Every error reads file:line:col: message."""
    from chaoskit.errors import ExitCode, ScenarioError
    from chaoskit.runner import check_scenario
    from chaoskit.scenario import scenario_files, validate_file

    env = current_env()
    files = scenario_files(paths)
    if not files:
        env.stderr.write("error: no scenario files found\n")
        return ExitCode.BAD_INPUT
    report = []
    for f in files:
        res = validate_file(f)
        errors = res if isinstance(res, list) else []
        if not errors:
            try:
                check_scenario(res)
            except ScenarioError as exc:
                errors = [exc]
        report.append({"file": str(f), "ok": not errors, "errors": [str(e) for e in errors]})
        if not as_json:
            if errors:
                for e in errors:
                    env.stderr.write(f"{e}\n")
            else:
                env.stdout.write(f"ok  {f}\n")
    bad = sum(1 for r in report if not r["ok"])
    if as_json:
        _print_json({"files": report, "errors": bad})
    elif len(files) > 1:
        env.stdout.write(f"{len(files) - bad} valid, {bad} invalid\n")
    return ExitCode.BAD_INPUT if bad else ExitCode.OK


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout.")) -> None:
    """Print the JSON Schema of scenarios (for editors: yaml-language-server)."""
    from chaoskit.scenario.schema import schema_text

    text = schema_text()
    if output:
        output.write_text(text)
    else:
        current_env().stdout.write(text)


@lab_app.command("up")
def lab_up(
    nodes: int = typer.Option(3, "--nodes", min=1, max=64, help="Number of nodes."),
    kind: str = typer.Option("process", "--kind", help="process: nodes are local process groups (no root needed)."),
) -> None:
    """Create a lab that runs reuse (otherwise each run makes and removes its own)."""
    from chaoskit.errors import ScenarioError
    from chaoskit.lab.process import ProcessLab

    if kind != "process":
        raise ScenarioError(f"unknown lab kind {kind!r}", hint="available: process")
    existing = ProcessLab.load()
    if existing is not None:
        current_env().stdout.write(f"lab {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first\n")
        return
    lab = ProcessLab.create(nodes, persistent=True)
    current_env().stdout.write(f"lab {lab.lab_id} up: {nodes} process nodes ({', '.join(lab.node_names())})\n")


@lab_app.command("down")
def lab_down() -> None:
    """Stop every process of the lab and forget it. Safe to run twice."""
    from chaoskit.lab.process import ProcessLab

    lab = ProcessLab.load()
    if lab is None:
        current_env().stdout.write("no lab is up\n")
        return
    n = lab.down()
    current_env().stdout.write(f"lab {lab.lab_id} down: {n} process(es) stopped\n")


@lab_app.command("status")
def lab_status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show the lab's nodes and the processes running on them."""
    from chaoskit.lab.process import ProcessLab

    lab = ProcessLab.load()
    if lab is None:
        if as_json:
            _print_json({"up": False})
        else:
            current_env().stdout.write("no lab is up ('chaoskit lab up' makes one; runs make their own otherwise)\n")
        return
    procs = lab.processes()
    if as_json:
        _print_json({"up": True, "id": lab.lab_id, "nodes": lab.node_names(),
                     "processes": [{"node": n, "pid": p, "cmdline": c} for n, p, c in procs]})
        return
    out = current_env().stdout
    out.write(f"lab {lab.lab_id}: {lab.nodes} process nodes\n")
    for name in lab.node_names():
        mine = [p for p in procs if p[0] == name]
        out.write(f"  {name}: {len(mine)} process(es)\n")


# Commands that live in their own modules register themselves here. Each module
# must stay cheap to import (heavy imports inside the command functions), since
# this runs on every `chaoskit` start-up.
def _register_commands() -> None:
    import importlib

    for name in ("chaoskit.cli.simulate_cmd", "chaoskit.cli.gameday_cmd"):
        importlib.import_module(name).register(app)


_register_commands()
