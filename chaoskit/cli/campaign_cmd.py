"""``chaoskit campaign``: faults at a rate in one long run, measured as ETTR against the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.campaign import run_campaign
from chaoskit.cli.env import EXIT_CODES_HELP, command_app, current_env, print_json
from chaoskit.cli.gameday_cmd import parse_cli_duration
from chaoskit.report.html import write_campaign_report, write_run_report

__all__ = ["campaign_app"]

campaign_app = command_app()


@campaign_app.command(epilog=EXIT_CODES_HELP)
def campaign(
    scenario: Path = typer.Argument(..., help=(
        "Scenario YAML: its cluster, job and blast radius, and its faults as the menu to draw from (each with its "
        "settings; 'at' and the target are drawn).")),
    duration: str = typer.Option(..., "--duration", help="Training time the campaign runs for, e.g. 20m."),
    mtbf: str = typer.Option(..., "--mtbf", help="Mean time between faults (a Poisson process), e.g. 2m."),
    kinds: Optional[str] = typer.Option(None, "--kinds", help="Comma-separated fault kinds to draw from (default: every fault of the scenario)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the draw; printed and recorded, so a campaign can be replayed."),
    overlap: bool = typer.Option(False, "--overlap", help="Let a fault arrive while the previous recovery is in progress."),
    out: Optional[Path] = typer.Option(None, "--out", help="Campaign folder (default reports/<UTC time>-<name>-campaign/)."),
    as_json: bool = typer.Option(False, "--json", help="Print campaign.json to stdout; progress goes to stderr."),
) -> int:
    """Run one long job with faults arriving at random (kinds weighted by real-world failure data), measure the
    effective training time ratio (ETTR) and its badput, and compare it with the simulator's prediction."""
    env = current_env()
    console = env.console(err=as_json)
    code, summary, folder = run_campaign(
        scenario, duration_s=parse_cli_duration(duration, "--duration", "20m, 90s or 1h"), mtbf_s=parse_cli_duration(mtbf, "--mtbf", "2m"), seed=seed,
        kinds=None if kinds is None else [k.strip() for k in kinds.split(",") if k.strip()], overlap=overlap, out=out,
        console=console, after_run=lambda run_dir: f"report: {write_run_report(run_dir)}")
    page = write_campaign_report(folder)
    if as_json:
        print_json(summary)
        return code
    e = summary["ettr"]
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    console.print(f"ETTR measured {pct(e['measured'])}, predicted {pct(e['predicted'])}"
                  + ("" if e["gap"] is None else f" (gap {e['gap'] * 100:+.1f} points; most of it: {e['explained_by']})"))
    console.print("badput: " + ", ".join(f"{k} {v:.1f}s" for k, v in summary["badput"].items()))
    console.print(f"{len(summary['faults'])} faults of {len(summary['fault_kinds'])} kinds ({', '.join(summary['fault_kinds'])}); seed {summary['seed']}")
    from rich.markup import escape

    stopped = summary["stopped"]
    if stopped["early"]:
        console.print(f"[red]stopped early[/red] after {stopped['faults_injected']} of {stopped['faults_drawn']} faults: "
                      f"{escape(str(stopped['why']))}")
    console.print(f"campaign: {folder / 'campaign.json'}  report: {page}", markup=False, highlight=False)
    return code

