"""The Typer app. Thin: parse, call, print. Heavy modules load inside commands.

Exit codes (see :class:`chaoskit.errors.ExitCode`): 0 every check passed;
1 an SLO or steady-state check failed; 2 bad input; 3 a target or the
infrastructure failed; 4 aborted by a safety limit; 130 interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from chaoskit import __version__
from chaoskit.cli.main import current_env

app = typer.Typer(
    name="chaoskit",
    help=(
        "Chaos drills for GPU training clusters: inject real faults into a training job, "
        "measure detection, reallocation and checkpoint load, check SLOs.\n\n"
        "Start with: chaoskit run scenarios/kill-rank.yaml (runs on the built-in lab)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
lab_app = typer.Typer(help="Local lab clusters: nodes on this machine, no infrastructure needed.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")

EXIT_CODES_HELP = "Exit codes: 0 pass, 1 SLO/check failed, 2 bad input, 3 infrastructure failed, 4 aborted by a safety limit, 130 interrupted."


def _version(value: bool) -> None:
    if value:
        typer.echo(f"chaoskit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    current_env().debug = debug or current_env().debug


def _print_json(data) -> None:
    current_env().stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command(epilog=EXIT_CODES_HELP)
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default reports/<UTC time>-<name>/)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved targets and exact actions; touch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print result.json to stdout; progress goes to stderr."),
) -> int:
    """Run one drill: start the job, inject the faults, measure the recovery, write result.json."""
    from chaoskit.report.summary import render_plan, render_result
    from chaoskit.runner import run_scenario

    env = current_env()
    console = env.console(err=as_json)
    outcome = run_scenario(scenario, out=out, dry_run=dry_run, console=None if dry_run else console)
    if as_json:
        _print_json(outcome.result)
    elif dry_run:
        render_plan(console, outcome.result)
    else:
        render_result(console, outcome.result)
    return outcome.exit_code


@app.command(epilog=EXIT_CODES_HELP)
def validate(
    paths: List[Path] = typer.Argument(..., help="Scenario files or folders (searched for *.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Check scenarios without touching anything. Every error reads file:line:col: message."""
    from chaoskit.errors import ExitCode, ScenarioError
    from chaoskit.runner import check_scenario
    from chaoskit.scenario import scenario_files, validate_file

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
        _print_json({"files": report, "errors": bad})
    elif len(files) > 1:
        env.stdout.write(f"{len(files) - bad} valid, {bad} invalid\n")
    return ExitCode.BAD_INPUT if bad else ExitCode.OK


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout.")) -> None:
    """Print the JSON Schema of scenarios (for editors: yaml-language-server)."""
    from chaoskit.scenario.schema import schema_text

    text = schema_text()
    if output:
        output.write_text(text)
    else:
        current_env().stdout.write(text)


@app.command(epilog=EXIT_CODES_HELP)
def rollback(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> int:
    """Undo what crashed runs left behind: revert their armed faults, stop the labs they made."""
    from chaoskit.errors import ExitCode
    from chaoskit.safety.cleanup import inventory_for, teardown_lab
    from chaoskit.safety.rollback import find_crashed_runs, rollback_journal

    out = current_env().stdout
    report = []
    failed = False
    for run in find_crashed_runs():
        outcomes = rollback_journal(run.journal, inventory_for(run), run_id=run.run_id) if run.journal.exists() else []
        failed |= any(not o.ok for o in outcomes)
        lab = teardown_lab(run) if all(o.ok for o in outcomes) else None
        if all(o.ok for o in outcomes):
            run.marker.unlink(missing_ok=True)
        report.append({"run": run.run_id, "faults": [o.__dict__ for o in outcomes], "lab": lab})
        if not as_json:
            out.write(f"run {run.run_id} (pid {run.pid} is gone):\n")
            for o in outcomes:
                out.write(f"  {'reverted' if o.ok else 'FAILED  '} {o.kind} on {o.node}" + (f": {o.problem}" if o.problem else "") + "\n")
            if not outcomes:
                out.write("  no fault was left armed\n")
            if lab:
                out.write(f"  {lab}\n")
    if as_json:
        _print_json({"runs": report})
    elif not report:
        out.write("nothing to roll back: no crashed run found\n")
    return ExitCode.INFRA if failed else ExitCode.OK


@lab_app.command("up")
def lab_up(
    nodes: int = typer.Option(3, "--nodes", min=1, max=64, help="Number of nodes the job runs on."),
    kind: str = typer.Option(
        "process", "--kind",
        help="process: local process groups (no root); netns: network namespaces with sshd (root); "
             "docker: the services of docker-compose.yml as containers (a docker engine).",
    ),
    spare: int = typer.Option(0, "--spare", min=0, max=16, help="netns: extra idle nodes that can take over."),
    ray: bool = typer.Option(False, "--ray", help="process: join the nodes into a Ray cluster (head + one 'ray start' per node)."),
    compose: Optional[Path] = typer.Option(
        None, "--compose", help="docker: the compose file (default: docker-compose.yml here or in a parent folder)."
    ),
    build: bool = typer.Option(False, "--build", help="docker: rebuild the node image even when it exists."),
) -> None:
    """Create a lab that runs reuse (otherwise each run makes and removes its own)."""
    from chaoskit.errors import ScenarioError

    out = current_env().stdout
    if kind == "docker":
        import time

        from chaoskit.lab.docker import DockerLab

        if nodes != 3 or spare:
            raise ScenarioError("--nodes and --spare do not apply to --kind docker: the compose file's services are the nodes",
                                hint="add or remove services in docker-compose.yml; a scenario picks how many it uses")

        existing = DockerLab.load(compose)
        if existing is not None:
            out.write(f"docker lab {existing.project.name} is already up ({', '.join(existing.containers())}); "
                      "'chaoskit lab down' first\n")
            return
        t0 = time.time()
        lab = DockerLab.up(compose, build=build, say=lambda msg: out.write(f"  {msg}\n"))
        out.write(f"docker lab {lab.project.name} up in {time.time() - t0:.1f}s: {', '.join(lab.containers())} "
                  f"(from {lab.project.path})\n")
        return
    if kind == "netns":
        from chaoskit.lab.netns import NetnsLab

        existing = NetnsLab.load()
        if existing is not None:
            out.write(f"netns lab {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first\n")
            return
        lab = NetnsLab.create(nodes, spare=spare)
        out.write(f"netns lab {lab.lab_id} up: {nodes} nodes + {spare} spare ({', '.join(lab.node_names())})\n")
        out.write(f"inventory: {lab.inventory_path}\n")
        return
    if kind != "process":
        raise ScenarioError(f"unknown lab kind {kind!r}", hint="available: process, netns, docker")
    if spare:
        raise ScenarioError("--spare needs --kind netns")
    from chaoskit.lab.process import ProcessLab

    existing = ProcessLab.load()
    if existing is not None:
        out.write(f"lab {existing.lab_id} is already up ({existing.nodes} nodes); 'chaoskit lab down' first\n")
        return
    lab = ProcessLab.create(nodes, persistent=True)
    if ray:
        import time

        from chaoskit.lab.ray import RayLab, ray_available

        if not ray_available():
            lab.down()
            raise ScenarioError("--ray needs Ray", hint="pip install 'chaoskit[ray]'")
        t0 = time.time()
        try:
            ray_lab = RayLab.start(lab, persistent=True)
        except BaseException:
            lab.down()
            raise
        out.write(f"lab {lab.lab_id} up: {nodes} process nodes ({', '.join(lab.node_names())}) "
                  f"joined into Ray at {ray_lab.address} in {time.time() - t0:.1f}s\n")
        return
    out.write(f"lab {lab.lab_id} up: {nodes} process nodes ({', '.join(lab.node_names())})\n")


@lab_app.command("down")
def lab_down(
    compose: Optional[Path] = typer.Option(None, "--compose", help="docker: the compose file whose project to remove."),
) -> None:
    """Stop every process of the labs, remove their namespaces, links, rules, containers, networks and volumes. Safe to run twice."""
    from chaoskit.lab.process import ProcessLab

    out = current_env().stdout
    found = False
    lab = ProcessLab.load()
    if lab is not None:
        found = True
        from chaoskit.lab.ray import RayLab

        ray_lab = RayLab.load(lab)
        n = ray_lab.down() if ray_lab is not None else 0
        n += lab.down()
        out.write(f"lab {lab.lab_id} down: {n} process(es) stopped\n")
    netns = _netns_lab()
    if netns is not None:
        found = True
        netns.down()
        out.write(f"netns lab {netns.lab_id} down\n")
    for docker_lab in _docker_labs(compose):
        found = True
        removed = docker_lab.down()
        out.write(f"docker lab {docker_lab.project.name} down: removed " + "; ".join(
            f"{len(v)} {k} ({', '.join(v)})" if v else f"0 {k}" for k, v in removed.items()) + "\n")
    if not found:
        out.write("no lab is up\n")


def _docker_labs(compose: Optional[Path] = None) -> list:
    """Docker labs on the engine: projects chaoskit made (by label) and the compose file's project.

    No docker SDK or no engine means no docker lab, unless --compose asked for one."""
    import importlib.util

    if compose is None and importlib.util.find_spec("docker") is None:
        return []
    from chaoskit.errors import InfraError, ScenarioError
    from chaoskit.lab.docker import DockerLab

    try:
        return DockerLab.find(compose)
    except (InfraError, ScenarioError):
        if compose is not None:
            raise
        return []


def _netns_lab():
    import os

    if os.geteuid() != 0:
        return None
    from chaoskit.lab.netns import NetnsLab

    return NetnsLab.load()


@lab_app.command("status")
def lab_status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show the labs' nodes and the processes running on them."""
    from chaoskit.lab.process import ProcessLab

    lab = ProcessLab.load()
    netns = _netns_lab()
    docker_labs = _docker_labs()
    out = current_env().stdout
    if as_json:
        data: dict = {"up": lab is not None or netns is not None or bool(docker_labs)}
        if docker_labs:
            data["docker"] = [d.status() for d in docker_labs]
        if lab is not None:
            procs = lab.processes()
            from chaoskit.lab.ray import RayLab

            ray_lab = RayLab.load(lab)
            data.update({"id": lab.lab_id, "nodes": lab.node_names(), "ray": ray_lab.address if ray_lab else None,
                         "processes": [{"node": n, "pid": p, "cmdline": c} for n, p, c in procs]})
        if netns is not None:
            data["netns"] = netns.status()
        _print_json(data)
        return
    if lab is None and netns is None and not docker_labs:
        out.write("no lab is up ('chaoskit lab up' makes one; runs make their own otherwise)\n")
        return
    for d in docker_labs:
        st = d.status()
        out.write(f"docker lab {d.project.name}: {st['compose'] or '(compose file unknown)'}\n")
        for n in st["nodes"]:
            out.write(f"  {n['name']}: {n['container']} {n['state']} ({n['image']})\n")
    if lab is not None:
        procs = lab.processes()
        from chaoskit.lab.ray import RayLab

        ray_lab = RayLab.load(lab)
        out.write(f"lab {lab.lab_id}: {lab.nodes} process nodes" + (f", Ray at {ray_lab.address}" if ray_lab else "") + "\n")
        for name in lab.node_names():
            out.write(f"  {name}: {sum(1 for p in procs if p[0] == name)} process(es)\n")
    if netns is not None:
        st = netns.status()
        out.write(f"netns lab {st['id']}: inventory {st['inventory']}\n")
        for n in st["nodes"]:
            out.write(f"  {n['name']}: {'on ' if n['on'] else 'OFF'} mgmt {n['address']} data {n['data_address']}, {n['processes']} process(es)\n")


def _register_commands() -> None:
    import importlib

    for name in ("chaoskit.cli.simulate_cmd", "chaoskit.cli.gameday_cmd"):
        importlib.import_module(name).register(app)


_register_commands()
