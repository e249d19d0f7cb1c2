"""``chaoskit validate`` and ``chaoskit schema``: the scenario format, checked and described; nothing is touched."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from chaoskit.cli.env import EXIT_CODES_HELP, command_app, current_env, print_json
from chaoskit.core.errors import ExitCode, ScenarioError
from chaoskit.scenario import scenario_files, validate_file
from chaoskit.scenario.checks import check_scenario
from chaoskit.scenario.schema import schema_text

__all__ = ["validate_app", "schema_app"]

validate_app = command_app()


@validate_app.command(epilog=EXIT_CODES_HELP)
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
        print_json({"files": report, "errors": bad})
    elif len(files) > 1:
        env.stdout.write(f"{len(files) - bad} valid, {bad} invalid\n")
    return ExitCode.BAD_INPUT if bad else ExitCode.OK


schema_app = command_app()


@schema_app.command()
def schema(output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout.")) -> None:
    """Print the JSON Schema of scenarios (for editors: yaml-language-server)."""
    text = schema_text()
    if output:
        output.write_text(text)
    else:
        current_env().stdout.write(text)
