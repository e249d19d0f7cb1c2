"""``chaoskit validate`` and ``chaoskit schema``: scenarios and inventories checked, the scenario and result formats described; nothing is touched."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import List

import typer

from chaoskit.cli.env import EXIT_CODES_HELP, command_app, current_env, print_json
from chaoskit.cluster.inventory_spec import looks_like_inventory, validate_inventory_data
from chaoskit.cluster.policy import SitePolicy, origin
from chaoskit.core.errors import ExitCode, InfraError, ScenarioError
from chaoskit.core.yaml_source import load_yaml
from chaoskit.scenario import scenario_files, validate_data
from chaoskit.scenario.checks import check_scenario

__all__ = ["validate_app"]

validate_app = command_app()


@validate_app.command(epilog=EXIT_CODES_HELP)
def validate(
    paths: List[Path] = typer.Argument(..., help="Scenario or inventory files, or folders (searched for *.yaml, *.yml)."),
    inventory: bool = typer.Option(
        False, "--inventory", help="Check every file as an inventory (default: a mapping with nodes: or ray: and no faults: is one)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Check scenarios and inventories without touching anything. Every error reads file:line:col: message.

    Every file is checked, whatever happens to the others; with more than one, a last line
    counts them. Exit 2 if any is invalid, 3 if one is valid but its target can never take it (an in-process
    fault for an attached job without chaoskit's SDK), 70 if chaoskit failed on one (a bug)."""
    env = current_env()
    files = scenario_files(paths)
    if not files:
        env.stderr.write("error: no scenario files found\n")
        return ExitCode.BAD_INPUT
    report = []
    internal = infra = 0
    for f in files:
        try:
            kind, errors, policy = _check(f, inventory)
            lines = [str(e) for e in errors]
        except InfraError as exc:  # the scenario is well formed, but its target can never take it (exit 3)
            infra += 1
            kind, policy = "scenario", None
            lines = [f"{f}: {_one_line(exc)}" + (f"\nhint: {exc.hint}" if exc.hint else "")]
        except Exception as exc:  # noqa: BLE001 - one file's bug must not keep the others from being checked
            if env.debug:
                traceback.print_exc(file=env.stderr)
            internal += 1
            kind, lines, policy = "unknown", [f"{f}: internal error: {type(exc).__name__}: {_one_line(exc)}"], None
        report.append({"file": str(f), "kind": kind, "ok": not lines, "errors": lines,
                       "policy": origin(policy) if not lines and kind != "unknown" else None})
        if as_json:
            continue
        if lines:
            env.stderr.write("".join(f"{line}\n" for line in lines))
        else:
            env.stdout.write(f"ok  {f}{' (inventory)' if kind == 'inventory' else ''}\n")
            if policy is not None:  # which site policy applied, and from where (none: nothing to say)
                env.stdout.write(f"    {origin(policy)}\n")
    bad = sum(1 for r in report if not r["ok"])
    if as_json:
        print_json({"files": report, "errors": bad})
    elif len(files) > 1:
        env.stdout.write(f"{len(files) - bad} valid, {bad} invalid\n")
    if internal:
        env.stderr.write("hint: an internal error is a chaoskit bug; rerun with --debug for a traceback and report it\n")
        return ExitCode.INTERNAL
    return ExitCode.BAD_INPUT if bad > infra else ExitCode.INFRA if infra else ExitCode.OK


def _check(path: Path, as_inventory: bool) -> tuple[str, list[ScenarioError], SitePolicy | None]:
    """``("scenario" | "inventory", errors, the site policy that applied)`` for one file, read once."""
    try:
        data, smap = load_yaml(path, what="inventory" if as_inventory else "file")
    except ScenarioError as exc:
        return ("inventory" if as_inventory else "scenario"), [exc], None
    if as_inventory or looks_like_inventory(data):
        res = validate_inventory_data(path, data, smap)
        return ("inventory", res, None) if isinstance(res, list) else ("inventory", [], res.policy)
    res = validate_data(path, data, smap)
    if isinstance(res, list):
        return "scenario", res, None
    try:
        cluster = check_scenario(res)
    except ScenarioError as exc:
        return "scenario", [exc], None
    return "scenario", [], cluster.inventory.policy


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."
