"""Command ``scorecard`` (registered by chaoskit.cli.app): one fault list on every recovery stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import command_app, current_env
from chaoskit.scorecard import STACKS, run_scorecard

__all__ = ["scorecard_app"]

_EXIT = ("Exit codes: 0 every cell is measured or explained (a stack that did not notice, or a pair that cannot run "
         "here, is a cell too); 1 a cell is an error (a drill that failed to run for a reason that is no fault of the "
         "pair); 2 bad input; 3 PyTorch, which every drill needs, is not installed (said before any drill); 130 "
         "interrupted.")


def scorecard_cmd(
    folder: Path = typer.Argument(..., help="A folder of row scenarios, one fault each (e.g. examples/scorecard/)."),
    stacks: str = typer.Option(",".join(STACKS), "--stacks", help=f"Comma-separated stacks: {', '.join(STACKS)}."),
    repeat: int = typer.Option(1, "--repeat", help="Drills per cell; p50/p95 with more than one."),
    out: Optional[Path] = typer.Option(None, "--out", help="Scorecard folder (default reports/scorecard-<UTC time>/)."),
    as_json: bool = typer.Option(False, "--json", help="Print scorecard.json to stdout; progress goes to stderr."),
) -> int:
    """Run each row on each stack; write scorecard.json, index.html and metrics.prom."""
    env = current_env()
    names = [s.strip() for s in stacks.split(",") if s.strip()]
    card = run_scorecard(folder, names, repeat=repeat, out=out, console=env.console(err=as_json))
    if as_json:
        env.stdout.write(json.dumps(card, indent=2) + "\n")
    else:
        console = env.console()
        for cell in card["cells"]:
            figures = (f"detect {_s(cell['detection_s'])} recover {_s(cell['recovery_s'])} lost {_n(cell['lost_steps'])}"
                       if cell["verdict"] not in ("cannot run",) else "")
            console.print(f"{cell['fault']:>12} x {cell['stack']:<9} {cell['verdict']:<13} {figures}  {cell['why']}",
                          markup=False, highlight=False)
            if cell.get("blame"):
                console.print(f"{'':>12}   blame: {cell['blame']['line']}", markup=False, highlight=False)
    return 1 if any(c["verdict"] == "error" for c in card["cells"]) else 0


def _s(v) -> str:
    return "-" if v is None else f"{v:.2f}s"


def _n(v) -> str:
    return "-" if v is None else f"{v:g}"


scorecard_app = command_app()
scorecard_app.command("scorecard", epilog=_EXIT)(scorecard_cmd)
