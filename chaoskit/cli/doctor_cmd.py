"""``chaoskit doctor INVENTORY [--scenario FILE]``: what chaoskit can and cannot do on each node."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import command_app, current_env, print_result
from chaoskit.core.errors import ExitCode
from chaoskit.doctor import Diagnosis, NodeHealth, diagnose

__all__ = ["doctor_app"]

doctor_app = command_app()


@doctor_app.command(epilog="Exit codes: 0 every node (and every fault of --scenario) is ready; "
                           "2 bad inventory or scenario; 3 something is missing (the table says what).")
def doctor(
    inventory: Path = typer.Argument(..., help="Inventory file (YAML: name, ssh, nodes)."),
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="Also check what this scenario's faults need on their nodes."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Check every node in parallel: reachable, host key, sudo, agent, tools, netem, clock offset, GPUs.

    Changes nothing on any node. With --scenario, each fault is checked against the nodes its
    selector picks."""
    result = diagnose(inventory, scenario)
    print_result(result, as_json, _render)
    return ExitCode.OK if result.ok else ExitCode.INFRA


def _render(result: Diagnosis) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = current_env().console()
    table = Table(title=f"doctor: {escape(str(result.inventory))}", title_justify="left")
    for column in ("node", "reach", "privilege", "agent", "tools", "netem", "clock offset", "GPUs"):
        table.add_column(column)
    for n in result.nodes:
        table.add_row(n.node, _yes(n.reachable), n.privilege or "[red]no[/red]", _yes(n.agent), _tools(n),
                      "-" if n.netem is None else _yes(n.netem), _clock(n), _gpus(n))
    console.print(table)
    if result.policy:
        console.print(escape(result.policy), soft_wrap=True)
    for n in result.nodes:
        for problem in n.problems:
            console.print(f"[red]{n.node}[/red]: {escape(problem)}")
    for f in result.faults:
        state = "[green]ready[/green]" if not f["missing"] else "[red]cannot run[/red]"
        console.print(f"fault {f['fault']} {f['kind']} on {', '.join(f['nodes']) or 'no node'}: {state}")
        for line in f["missing"]:
            console.print(f"  {escape(line)}")
    scope = result.scope
    if scope is not None:
        chosen = scope["chosen"]
        if chosen is not None:
            console.print(f"drilled job: run id {escape(str(chosen['run_id']))}, uid {chosen['uid']} on "
                          f"{', '.join(chosen['nodes'])} ({chosen['workers']} worker(s))", soft_wrap=True)
        if scope["problem"]:
            console.print(f"[red]job[/red]: {escape(scope['problem'])}", soft_wrap=True)
        for item in scope["outside"]:
            console.print(f"{item['what']} '{escape(item['regex'])}': {item['inside']} process(es) in the drilled job's "
                          f"scope, {item['outside']} outside it (never touched)", soft_wrap=True)
    console.print("ready" if result.ok else "[red]not ready[/red]: see above")


def _yes(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]no[/red]"


def _tools(n: NodeHealth) -> str:
    if not n.tools:
        return "-"
    return " ".join(t if ok else f"[red]{t}?[/red]" for t, ok in n.tools.items())


def _clock(n: NodeHealth) -> str:
    if n.clock_offset_s is None:
        return "-"
    return f"{n.clock_offset_s * 1000:+.1f} ms ± {n.clock_uncertainty_s * 1000:.1f}"


def _gpus(n: NodeHealth) -> str:
    seen = "no nvidia-smi" if n.gpus_seen is None else str(n.gpus_seen)
    return f"{seen} / {n.gpus_expected}" if n.gpus_expected else seen
