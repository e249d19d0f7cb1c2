"""The Typer app. Thin: parse, call, print. Heavy third-party modules load inside the modules that use them.

Exit codes (see :class:`chaoskit.core.errors.ExitCode`): 0 every check passed;
1 an SLO or steady-state check failed; 2 bad input; 3 a target or the
infrastructure failed; 4 aborted by a safety limit; 130 interrupted.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError

from chaoskit import __version__
from chaoskit.backends.registry import CLUSTERS, backend
from chaoskit.cli import gameday_cmd, simulate_cmd
from chaoskit.cli.env import current_env
from chaoskit.core.errors import ExitCode, ScenarioError
from chaoskit.crash import recover
from chaoskit.report.html import write_run_report
from chaoskit.report.summary import render_plan, render_result
from chaoskit.runner import check_scenario, run_scenario
from chaoskit.safety.rollback import find_crashed_runs
from chaoskit.scenario import scenario_files, validate_file
from chaoskit.scenario.schema import schema_text

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
    """Run one drill: start the job, inject the faults, measure the recovery, write result.json and report.html."""
    env = current_env()
    console = env.console(err=as_json)
    outcome = run_scenario(scenario, out=out, dry_run=dry_run, console=None if dry_run else console,
                           after_run=lambda run_dir: f"report: {write_run_report(run_dir)}")
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
    text = schema_text()
    if output:
        output.write_text(text)
    else:
        current_env().stdout.write(text)


@app.command(epilog=EXIT_CODES_HELP)
def rollback(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> int:
    """Undo what crashed runs left behind: revert their armed faults, stop the labs they made."""
    out = current_env().stdout
    report = []
    for done in map(recover, find_crashed_runs()):
        run = done.run
        report.append({"run": run.run_id, "faults": [o.__dict__ for o in done.faults], "lab": done.lab})
        if not as_json:
            out.write(f"run {run.run_id} (pid {run.pid} is gone):\n")
            for o in done.faults:
                out.write(f"  {'reverted' if o.ok else 'FAILED  '} {o.kind} on {o.node}" + (f": {o.problem}" if o.problem else "") + "\n")
            if not done.faults:
                out.write("  no fault was left armed\n")
            if done.lab:
                out.write(f"  {done.lab}\n")
    if as_json:
        _print_json({"runs": report})
    elif not report:
        out.write("nothing to roll back: no crashed run found\n")
    return ExitCode.INFRA if any(not all(f["ok"] for f in r["faults"]) for r in report) else ExitCode.OK


def _kinds_help() -> str:
    return "; ".join(f"{name}: {CLUSTERS.get(name).summary}" for name in CLUSTERS.names())


@lab_app.command("up")
def lab_up(
    kind: str = typer.Option("process", "--kind", help="The kind of lab (see 'chaoskit lab kinds')."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Number of nodes the job runs on (default 3)."),
    spare: Optional[int] = typer.Option(None, "--spare", help="Extra idle nodes that can take over (netns)."),
    compose: Optional[Path] = typer.Option(
        None, "--compose", help="docker: the compose file (default: docker-compose.yml here or in a parent folder)."
    ),
    build: bool = typer.Option(False, "--build", help="docker: rebuild the node image even when it exists."),
) -> None:
    """Create a lab that runs reuse (otherwise each run makes and removes its own)."""
    env = current_env()
    chosen = backend(kind)
    given = {k: v for k, v in {"nodes": nodes, "spare": spare, "compose": str(compose) if compose else None}.items()
             if v is not None}
    try:
        spec = chosen.Spec.model_validate({"kind": kind, **given})
    except ValidationError as exc:
        raise ScenarioError(_flag_error(exc, kind), hint=f"see 'chaoskit lab up --help'") from None
    if build and not chosen.builds_images:
        raise ScenarioError(f"--build does not apply to --kind {kind}: its lab has no images to build")
    env.stdout.write(chosen.lab_up(spec, Path.cwd(), say=lambda msg: env.stdout.write(f"{msg}\n"), rebuild=build) + "\n")


def _flag_error(exc: ValidationError, kind: str) -> str:
    err = exc.errors(include_url=False)[0]
    flag = "--" + str(err["loc"][0]) if err["loc"] else "a flag"
    if err["type"] == "extra_forbidden":
        return f"{flag} does not apply to --kind {kind}"
    return f"{flag}: {err['msg'].removeprefix('Value error, ')}"


@lab_app.command("kinds")
def lab_kinds() -> None:
    """List the kinds of cluster: what a node is, and what each needs."""
    for name in CLUSTERS.names():
        current_env().stdout.write(f"{name:8} {CLUSTERS.get(name).summary}\n")


@lab_app.command("down")
def lab_down(
    compose: Optional[Path] = typer.Option(None, "--compose", help="docker: the compose file whose project to remove."),
) -> None:
    """Stop every process of the labs, remove their namespaces, links, rules, containers, networks and volumes. Safe to run twice."""
    out = current_env().stdout
    lines = [line for name in CLUSTERS.names() for line in backend(name).lab_down(compose)]
    out.write("".join(f"{line}\n" for line in lines) or "no lab is up\n")


@lab_app.command("status")
def lab_status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show the labs' nodes and the processes running on them."""
    labs = [lab for name in CLUSTERS.names() for lab in backend(name).lab_status()]
    out = current_env().stdout
    if as_json:
        _print_json({"up": bool(labs), "labs": [asdict(lab) for lab in labs]})
        return
    if not labs:
        out.write("no lab is up ('chaoskit lab up' makes one; runs make their own otherwise)\n")
        return
    for lab in labs:
        out.write(f"{lab.summary}\n")
        for n in lab.nodes:
            out.write(f"  {n['name']}: {n['detail']}\n")


gameday_cmd.register(app)
simulate_cmd.register(app)
