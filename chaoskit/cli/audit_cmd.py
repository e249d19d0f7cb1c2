"""``chaoskit audit INVENTORY_OR_LAB [--fix]``: what of chaoskit's is still on each node."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from chaoskit.audit import AuditResult, audit, fix
from chaoskit.cli.env import command_app, current_env, print_result
from chaoskit.core.errors import ExitCode

__all__ = ["audit_app"]

audit_app = command_app()


@audit_app.command(epilog="Exit codes: 0 nothing of chaoskit's is left; 1 something is (listed), or a node could not "
                          "be read; 2 bad input.")
def audit_command(
    target: str = typer.Argument(...,
                                 help="An inventory file, or a lab kind (process, netns, slurm): the lab of that kind that is up."),
    fix_it: bool = typer.Option(False, "--fix", help=(
        "First revert what the trusted journals of dead runs show armed (as 'chaoskit rollback' does), then audit.")),
    checkpoint_dir: Optional[list[Path]] = typer.Option(None, "--checkpoint-dir", help=(
        "Also look here (on every node) for storage faults' asides and fill files; repeatable.")),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", help=(
        "The inventory's nodes are Slurm's, through this slurm.conf (a scenario's scheduler: slurm): Slurm drains "
        "with chaoskit's reason are looked for too.")),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """List everything of chaoskit's still present on each node: qdiscs, nft tables, links down, cgroups, stopped
    processes, asides and fill files, Slurm drains, nodes powered off, crash loops, leases and watchdogs of dead
    runs, state files. Changes nothing unless --fix."""
    dirs = [str(d) for d in checkpoint_dir or []]
    conf = str(slurm_conf) if slurm_conf is not None else None
    result = (fix if fix_it else audit)(target, checkpoint_dirs=dirs, slurm_conf=conf)
    print_result(result, as_json, _render)
    return ExitCode.OK if result.clean else ExitCode.CHECK_FAILED


def _render(result: AuditResult) -> None:
    out = current_env().stdout
    for item in result.fixed:
        what = item.get("lab") or f"{item['kind']} on {item['node']}"
        out.write(f"fix: {'reverted' if item['ok'] else 'FAILED  '} {what}" + (f": {item['problem']}" if item.get("problem") else "") + "\n")
    for run in result.live_runs:
        out.write(f"run {run} is still running: what it holds now is its own, not counted\n")
    for node in [*result.nodes, "controller"]:
        mine = [x for x in result.leftovers if x.node == node]
        for x in mine:
            also = f" (also on {', '.join(x.also_on)})" if x.also_on else ""
            out.write(f"{node}: {x.kind}: {x.what}{also}\n")
        if node in result.unreadable:
            out.write(f"{node}: could not be read: {result.unreadable[node]}\n")
    n = len(result.leftovers)
    if result.clean:
        out.write(f"{result.target}: clean ({len(result.nodes)} node(s), {result.took_s:.1f}s)\n")
    else:
        out.write(f"{result.target}: {n} leftover(s)" + (f", {len(result.unreadable)} node(s) not read" if result.unreadable else "")
                  + ("; 'chaoskit audit --fix' reverts what dead runs' journals allow" if n and not result.fixed else "") + "\n")
