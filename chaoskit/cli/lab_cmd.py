"""``chaoskit lab up|down|status|kinds``: local clusters, through the cluster-backend registry."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from chaoskit.backends.registry import CLUSTERS, backend, lab_kinds
from chaoskit.cli.env import command_app, current_env, print_json
from chaoskit.core.accounts import unheld_account_processes
from chaoskit.core.errors import ScenarioError
from chaoskit.safety.rollback import find_crashed_runs

__all__ = ["lab_app"]

lab_app = command_app(help="Local lab clusters: nodes on this machine, no infrastructure needed.", no_args_is_help=True)


@lab_app.command("up")
def lab_up(
    kind: str = typer.Option("process", "--kind", help=f"{', '.join(lab_kinds())}; 'chaoskit lab kinds' says what each is and needs."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Number of nodes the job runs on (default 3)."),
    spare: Optional[int] = typer.Option(None, "--spare", help="Extra idle nodes that can take over (netns)."),
    compose: Optional[Path] = typer.Option(
        None, "--compose", help="docker: the compose file (default: docker-compose.yml here or in a parent folder)."
    ),
    build: bool = typer.Option(False, "--build", help="docker: rebuild the node image even when it exists."),
) -> None:
    """Create a lab that runs reuse (otherwise each run makes and removes its own)."""
    env = current_env()
    chosen = backend(kind)
    if not chosen.has_lab:
        raise ScenarioError(f"--kind {kind} is not a lab: {chosen.summary}",
                            hint="a scenario names it (see 'chaoskit lab kinds'); 'chaoskit doctor' checks the nodes")
    given = {k: v for k, v in {"nodes": nodes, "spare": spare, "compose": str(compose) if compose else None}.items()
             if v is not None}
    try:
        spec = chosen.Spec.model_validate({"kind": kind, **given})
    except ValidationError as exc:
        raise ScenarioError(_flag_error(exc, kind), hint="see 'chaoskit lab up --help'") from None
    if build and not chosen.builds_images:
        raise ScenarioError(f"--build does not apply to --kind {kind}: its lab has no images to build")
    env.stdout.write(chosen.lab_up(spec, Path.cwd(), say=lambda msg: env.stdout.write(f"{msg}\n"), rebuild=build) + "\n")


def _flag_error(exc: ValidationError, kind: str) -> str:
    err = exc.errors(include_url=False)[0]
    flag = "--" + str(err["loc"][0]) if err["loc"] else "a flag"
    if err["type"] == "extra_forbidden":
        return f"{flag} does not apply to --kind {kind}"
    return f"{flag}: {err['msg'].removeprefix('Value error, ')}"


@lab_app.command("kinds")
def lab_kinds() -> None:
    """List the kinds of cluster: what a node is, and what each needs."""
    names = CLUSTERS.names()
    width = max(map(len, names)) + 1
    for name in names:
        cls = CLUSTERS.get(name)
        current_env().stdout.write(f"{name:{width}} {cls.summary}{'' if cls.has_lab else ' (not a lab)'}\n")


@lab_app.command("down")
def lab_down(
    compose: Optional[Path] = typer.Option(None, "--compose", help="docker: the compose file whose project to remove."),
) -> None:
    """Stop every process of the labs, remove their namespaces, links, rules, containers, networks and volumes. Safe to run twice."""
    out = current_env().stdout
    lines = [line for name in CLUSTERS.names() for line in backend(name).lab_down(compose)]
    out.write("".join(f"{line}\n" for line in lines) or "no lab is up\n")
    out.write("".join(f"{line}\n" for line in _crashed_runs_labs()))
    out.write("".join(f"{line}\n" for line in _accounts_left()))


def _accounts_left() -> list[str]:
    """A lab account that processes still run as with no run or lab holding it: a dead run's job, left running."""
    return [f"lab account {name}: {len(pids)} process(es) still run as it (pid {', '.join(map(str, pids[:10]))}), "
            "held by no run or lab: a dead run's job; 'chaoskit audit' lists them, stop them before it is used again"
            for name, pids in unheld_account_processes().items()]


def _crashed_runs_labs() -> list[str]:
    """A lab a run made for itself and left behind when it died is the run's, with its armed faults: rollback's."""
    return [f"run {run.run_id} (pid {run.pid} is gone) left its {run.info.get('kind', '')} lab {run.info['lab']}: "
            "'chaoskit rollback' reverts what it left armed and removes the lab"
            for run in find_crashed_runs() if run.info.get("lab") and run.info.get("ephemeral")]


@lab_app.command("status")
def lab_status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show the labs' nodes and the processes running on them."""
    labs = [lab for name in CLUSTERS.names() for lab in backend(name).lab_status()]
    out = current_env().stdout
    if as_json:
        print_json({"up": bool(labs), "labs": [asdict(lab) for lab in labs]})
        return
    if not labs:
        out.write("no lab is up ('chaoskit lab up' makes one; runs make their own otherwise)\n")
        out.write("".join(f"{line}\n" for line in _crashed_runs_labs()))
        return
    for lab in labs:
        out.write(f"{lab.summary}\n")
        for n in lab.nodes:
            out.write(f"  {n['name']}: {n['detail']}\n")
