"""Command ``export`` (registered by chaoskit.cli.app): a run's or a game day's results as Prometheus metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import command_app, current_env
from chaoskit.report.metrics import export

__all__ = ["export_app"]


def export_cmd(
    path: Path = typer.Argument(..., help="A run folder (result.json) or a game-day folder (gameday.json)."),
    openmetrics: Optional[Path] = typer.Option(None, "--openmetrics", help=(
        "Write the metrics to this file in the OpenMetrics text format, atomically (a node_exporter textfile-collector "
        "drop-in: name it *.prom in the collector's folder).")),
    push: Optional[str] = typer.Option(None, "--push", help="Push them to the Prometheus Pushgateway at this URL (http://host:9091)."),
) -> None:
    """Export drill results as Prometheus metrics (phases, lost steps, verdict; a game day's coverage): to stdout
    in the OpenMetrics text format unless --openmetrics or --push says where."""
    outcome = export(path, openmetrics=openmetrics, push_url=push)
    env = current_env()
    if openmetrics is None and push is None:
        env.stdout.write(outcome.text.decode("utf-8"))
        return
    if openmetrics is not None:
        env.stdout.write(f"wrote {openmetrics}: {len(outcome.drills)} drill(s)\n")
    for key in outcome.pushed:
        env.stdout.write(f"pushed to {push}: " + ", ".join(f"{k}={v}" for k, v in key.items()) + "\n")


export_app = command_app()
export_app.command("export", epilog="Exit codes: 0 exported; 2 bad input (no run or game day there, a bad URL); "
                                     "3 the push failed.")(export_cmd)
