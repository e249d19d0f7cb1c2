"""``chaoskit schema``: the JSON Schema of scenarios, or with ``--result`` of a run's result.json.

A module of its own, so that ``chaoskit validate`` does not import the result model it never reads."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import command_app, current_env
from chaoskit.core.result import result_schema_text
from chaoskit.scenario.schema import schema_text

__all__ = ["schema_app"]

schema_app = command_app()


@schema_app.command()
def schema(output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
           result: bool = typer.Option(False, "--result", help="The schema of a run's result.json instead.")) -> None:
    """Print the JSON Schema of scenarios (for editors: yaml-language-server), or with --result of result.json."""
    text = result_schema_text() if result else schema_text()
    if output:
        output.write_text(text)
    else:
        current_env().stdout.write(text)
