"""``chaoskit run`` and ``chaoskit rollback``: one drill, and what a crashed one left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import EXIT_CODES_HELP, command_app, current_env, print_json
from chaoskit.core.errors import ExitCode
from chaoskit.crash import recover
from chaoskit.repeat import run_repeated
from chaoskit.report.html import write_repeat_report, write_run_report
from chaoskit.report.summary import render_plan, render_repeat, render_result
from chaoskit.runner import run_scenario
from chaoskit.scenario import load_scenario
from chaoskit.safety.rollback import find_crashed_runs

__all__ = ["run_app", "rollback_app"]

run_app = command_app()


@run_app.command(epilog=EXIT_CODES_HELP)
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default reports/<UTC time>-<name>/)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved targets and exact actions; touch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print result.json to stdout; progress goes to stderr."),
    repeat: Optional[int] = typer.Option(None, "--repeat", min=1, help=(
        "Run the drill N times back to back (each sample in OUT/sample-NN/) and judge the SLOs on the distribution: "
        "p50, p95, max and the median's 95% interval per phase; an SLO such as {p95: 60s} holds for that "
        "percentile, a plain value for every sample. Default: the scenario's own repeat (1).")),
) -> int:
    """Run one drill: start the job, inject the faults, measure the recovery, write result.json and report.html."""
    env = current_env()
    console = env.console(err=as_json)
    if repeat is None and not dry_run:
        repeat = load_scenario(scenario).model.repeat
    if repeat is not None and repeat > 1 and not dry_run:
        outcome = run_repeated(scenario, repeat, out=out, console=console,
                               after_run=lambda run_dir: f"report: {write_run_report(run_dir)}",
                               after_all=lambda d: f"report: {write_repeat_report(d)}")
        if as_json:
            print_json(outcome.result)
        else:
            render_repeat(console, outcome.result)
        return outcome.exit_code
    outcome = run_scenario(scenario, out=out, dry_run=dry_run, console=None if dry_run else console,
                           after_run=lambda run_dir: f"report: {write_run_report(run_dir)}")
    if as_json:
        print_json(outcome.result)
    elif dry_run:
        render_plan(console, outcome.result)
    else:
        render_result(console, outcome.result)
    return outcome.exit_code


rollback_app = command_app()


@rollback_app.command(epilog=EXIT_CODES_HELP)
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
        print_json({"runs": report})
    elif not report:
        out.write("nothing to roll back: no crashed run found\n")
    return ExitCode.INFRA if any(not all(f["ok"] for f in r["faults"]) for r in report) else ExitCode.OK
