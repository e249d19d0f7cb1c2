"""Commands ``catalog``, ``gameday`` and ``report`` (registered by chaoskit.cli.app).

Imported on every CLI start; chaoskit's modules at the top, heavy third-party ones where used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from chaoskit.cli.env import command_app, current_env
from chaoskit.core.errors import ScenarioError
from chaoskit.coverage import catalog, detect_capabilities, total_interruptions
from chaoskit.core.durations import parse_duration
from chaoskit.gameday import run_gameday
from chaoskit.history import REGRESSION_WINDOW
from chaoskit.report.html import build_report
from chaoskit.report.metrics import check_push_url

__all__ = ["catalog_app", "gameday_app", "report_app", "parse_fraction", "parse_cli_duration"]

_EXIT_GAMEDAY = (
    "Exit codes: 0 every scenario passed and coverage reached --min-coverage; 1 a scenario failed, "
    "errored or aborted, coverage is under the minimum, or (--fail-on-regression) a scenario's recovery regressed; "
    "2 bad input; 3 the --push failed; 130 interrupted."
)


def catalog_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the fault classes: category, scope, real-world weight, the fault kinds that
    exercise each, and whether it can run here."""
    env = current_env()
    caps = detect_capabilities()
    total = total_interruptions()
    classes = [{**c.as_dict(), "share": c.weight / total, "runnable_here": caps.unrunnable_reason(c) is None,
                "reason": caps.unrunnable_reason(c), "here": caps.here(c)} for c in catalog()]
    if as_json:
        env.stdout.write(json.dumps({"classes": classes, "weight_total": total,
                                     "source": "Llama 3 405B pre-training, 419 unexpected interruptions in 54 days (Llama 3 paper, Table 5)"},
                                    indent=2) + "\n")
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"fault catalog: {len(classes)} classes; weight = share of {total} real interruptions (Llama 3 405B, 54 days)",
                  title_justify="left")
    table.add_column("class")
    table.add_column("scope")
    table.add_column("weight", justify="right")
    table.add_column("fault kinds")
    table.add_column("here")
    for i, c in enumerate(classes):
        if i and c["category"] != classes[i - 1]["category"]:
            table.add_section()
        if c["here"]:  # one line per mechanism: real or emulated, runnable here or why not
            here = "\n".join(escape(line) for line in c["here"])
        else:
            here = "[green]runnable[/green]" if c["runnable_here"] else f"[yellow]not runnable:[/yellow] {escape(c['reason'])}"
        table.add_row(f"[bold]{c['id']}[/bold]\n[dim]{escape(c['description'])}[/dim]", c["scope"],
                      f"{c['weight']} ({c['share']:.1%})",
                      ", ".join(f"{k} (Xid {', '.join(map(str, c['xid_codes']))})" if k == "gpu.xid" and c.get("xid_codes") else k
                                for k in c["kinds"]) or "-", here)
    env.console().print(table)


def gameday_cmd(
    paths: List[Path] = typer.Argument(..., help="Scenario files or folders (searched for *.yaml)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Game-day folder (default reports/gameday-<UTC time>/); history.jsonl goes beside it."),
    min_coverage: Optional[str] = typer.Option(None, "--min-coverage", help="Exit 1 if plain coverage is under this: a fraction (0.5) or a percentage (50%)."),
    as_json: bool = typer.Option(False, "--json", help="Print gameday.json to stdout; progress goes to stderr."),
    fail_on_regression: Optional[str] = typer.Option(None, "--fail-on-regression", help=(
        "Exit 1 if a scenario's recovery (its median, with repeats) is more than this above the median of its last "
        f"{REGRESSION_WINDOW} game days in history.jsonl: a fraction (0.25) or a percentage (25%).")),
    fresh: Optional[str] = typer.Option(None, "--fresh", help=(
        "Coverage counts a class only if this game day or one in history.jsonl proved it within this long (e.g. 30d): "
        "a score that decays when drills stop. --min-coverage then applies to it.")),
    until: str = typer.Option("recovered", "--until", help=(
        "For scenarios that set no workload.wait: 'recovered' stops each drill once the job trained on after its "
        "recovery, reverting then a fault whose duration is not up (the game day's default: CI time is spent on "
        "drills, not on jobs training on or faults outlasting their recovery); 'finish' trains every job to its "
        "last step.")),
    push: Optional[str] = typer.Option(None, "--push", help=(
        "Push the game day's metrics (each drill's phases and verdict, the coverage) to the Prometheus Pushgateway "
        "at this URL (http://host:9091) once it is over; a failed push is exit 3, with every file written.")),
) -> int:
    """Run scenarios in turn and score fault coverage; write gameday.json, junit.xml, index.html."""
    env = current_env()
    minimum = None if min_coverage is None else parse_fraction(min_coverage, "--min-coverage")
    regression = None if fail_on_regression is None else parse_fraction(fail_on_regression, "--fail-on-regression", top=10.0)
    fresh_s = None if fresh is None else parse_cli_duration(fresh, "--fresh", "30d, 12h or 3600")
    push_url = None if push is None else check_push_url(push)
    outcome = run_gameday(paths, out=out, min_coverage=minimum, console=env.console(err=as_json),
                          fail_on_regression=regression, fresh_s=fresh_s, until=until, push=push_url)
    if as_json:
        env.stdout.write(json.dumps(outcome.summary, indent=2, default=str) + "\n")
    return outcome.exit_code


def report_cmd(path: Path = typer.Argument(..., help="A run folder or a game-day folder.")) -> None:
    """Rebuild the HTML report from a run's (report.html) or a game day's (index.html) JSON files."""
    written = build_report(path)
    current_env().stdout.write(f"{written}\n")


def parse_fraction(text: str, flag: str, top: float = 1.0) -> float:
    """``0.5`` or ``50%`` -> 0.5; :class:`ScenarioError` for anything outside 0..``top``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ScenarioError(f"{flag} {text!r} is not a number", hint="a fraction such as 0.5 or a percentage such as 50%") from None
    if not 0 <= value <= top:  # also refuses nan
        raise ScenarioError(f"{flag} {text} is outside 0..{top:g}", hint="a fraction such as 0.5 or a percentage such as 50%")
    return value


def parse_cli_duration(text: str, flag: str, example: str = "30d") -> float:
    """A positive duration given on the command line (``30d``, ``20m``, or seconds); :class:`ScenarioError` otherwise."""
    try:
        raw = text.strip()
        value = parse_duration(int(raw) if raw.isascii() and raw.isdigit() else raw)
    except ValueError as exc:
        raise ScenarioError(f"{flag} {text!r}: {exc}", hint=f"e.g. {example}") from None
    if value <= 0:
        raise ScenarioError(f"{flag} {text} is not a positive duration", hint=f"e.g. {example}")
    return value


catalog_app = command_app()
catalog_app.command("catalog")(catalog_cmd)
gameday_app = command_app()
gameday_app.command("gameday", epilog=_EXIT_GAMEDAY)(gameday_cmd)
report_app = command_app()
report_app.command("report", epilog="Exit codes: 0 written; 2 the folder holds no run or game day.")(report_cmd)
