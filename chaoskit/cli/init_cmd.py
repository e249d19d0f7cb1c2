"""``chaoskit init``: a commented starter scenario for your own job, which ``chaoskit validate`` accepts.

It asks (only on a terminal; flags otherwise) for the framework, the cluster (the process lab, your nodes in
an inventory, a Slurm cluster) and the launch (``command``: chaoskit starts your script under torchrun;
``attach``: it drills a job you started; ``sbatch``: it submits your batch script), then writes the scenario
with the framework's log preset and SLOs to edit, plus any file the scenario names that is not there yet
(a starter ``train.py``, ``train.sbatch`` or ``inventory.yaml``, each saying what to put in it).

For a plain script (``--framework torchrun``, ``launch: command``) it reads the script itself (``--script``, else a
``train.py`` already beside the scenario): read-only, once, through a checked descriptor, 1 MiB at most; and writes
the ``probes.log`` rules for the lines it prints when it steps, saves and loads a checkpoint and starts
(:mod:`chaoskit.observe.script_lines`), each with a comment naming the script's line. What it cannot find it writes
commented, marked EDIT, with the line to fill.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import EXIT_CODES_HELP, command_app, current_env
from chaoskit.core.errors import ExitCode, ScenarioError
from chaoskit.core.files import UnsafePath, write_new
from chaoskit.core.trusted import read_authors_file
from chaoskit.observe.presets import FRAMEWORK_PRESETS
from chaoskit.observe.script_lines import Found, scan
from chaoskit.stacks.registry import framework_stack, log_presets, stack, stack_names

DATA = Path(__file__).resolve().parent.parent / "data"
"""chaoskit's package data: the starter train.py that init writes beside the scenario."""

__all__ = ["init_app", "FRAMEWORKS", "CLUSTERS", "LAUNCHES", "Script", "render"]

MAX_SCRIPT = 1 << 20
"""The most of a script init reads (a training script is a few hundred lines)."""

init_app = command_app()

CLUSTERS = ("lab", "inventory", "slurm")
LAUNCHES: dict[str, tuple[str, ...]] = {"lab": ("command",), "inventory": ("attach", "sbatch"), "slurm": ("sbatch",)}
"""What each cluster can run: the lab starts your script; your own nodes are attached to, or their Slurm
submits your batch script; the Slurm lab submits it."""
_TORCHRUN_JOBS = {"reference", "uninstrumented", *(launch for launches in LAUNCHES.values() for launch in launches)}
"""The launches of a job under torchrun, as a starter writes one (or as the job a stack's starter wraps)."""
FRAMEWORKS = (*FRAMEWORK_PRESETS, *(p.name for s in map(stack, stack_names()) if _TORCHRUN_JOBS & set(s.launches)
                                    for p in s.log_presets))
"""``torchrun`` is a plain PyTorch script under torchrun; the others name the framework (and its preset): the
frameworks' presets, and those of the recovery stacks that run a torchrun job (Ray Train's runs none)."""

CALLBACKS = {
    "hf": "from chaoskit.integrations.hf import ChaoskitCallback; Trainer(..., callbacks=[ChaoskitCallback()])",
    "lightning": "from chaoskit.integrations.lightning import ChaoskitCallback; Trainer(callbacks=[ChaoskitCallback()])",
}


@init_app.command(epilog=EXIT_CODES_HELP)
def init(
    framework: Optional[str] = typer.Option(None, "--framework", help=f"What trains: {', '.join(FRAMEWORKS)} (torchrun: a plain PyTorch script)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Where: lab (this machine), inventory (your nodes over SSH), slurm (the Slurm lab)."),
    launch: Optional[str] = typer.Option(None, "--launch", help="How the job starts: command (lab), attach or sbatch (inventory), sbatch (slurm)."),
    out: Path = typer.Option(Path("scenario.yaml"), "--out", "-o", help="The scenario file to write."),
    force: bool = typer.Option(False, "--force", help="Replace the scenario file if it exists."),
    script: Optional[Path] = typer.Option(None, "--script", help="Your training script (launch: command): init reads "
                                          "the lines it prints for its steps, checkpoints and start, and writes the "
                                          "probes.log rules for them (default: train.py beside --out, when there)."),
) -> int:
    """Write a commented starter scenario for your own job (asks on a terminal, flags otherwise)."""
    env = current_env()
    ask = sys.stdin.isatty() and env.stdout.isatty() if hasattr(env.stdout, "isatty") else False
    framework = _pick("framework", framework, FRAMEWORKS, "torchrun", ask)
    cluster = _pick("cluster", cluster, CLUSTERS, "lab", ask)
    launch = _pick("launch", launch, LAUNCHES.get(cluster, ()), LAUNCHES.get(cluster, ("command",))[0], ask)
    for name, value, known in (("framework", framework, FRAMEWORKS), ("cluster", cluster, CLUSTERS)):
        if value not in known:
            env.stderr.write(f"error: --{name} {value}: not one of {', '.join(known)}\n")
            return ExitCode.BAD_INPUT
    if launch not in LAUNCHES[cluster]:
        env.stderr.write(f"error: --launch {launch} does not run on --cluster {cluster}; it runs "
                         f"{' or '.join(LAUNCHES[cluster])}\n")
        return ExitCode.BAD_INPUT
    own = None
    if launch == "command" and (script is not None or os.path.lexists(out.parent / "train.py")):
        try:
            own = _read_script(script if script is not None else out.parent / "train.py", out, framework)
        except ScenarioError as exc:
            if script is not None:
                env.stderr.write(f"error: {exc}\n")
                return ExitCode.BAD_INPUT
            own = Script("train.py")  # the train.py there is kept as it is, unread: its rules are left to fill
    scenario, extras = render(framework, cluster, launch, own)
    # Made O_EXCL|O_NOFOLLOW from the folder's descriptor (--force: renamed over it), never through a link planted
    # at the name: exists() is false for a dangling link, and writing through one made its target as root.
    try:
        write_new(out, scenario, replace=force, make_folders=True)
    except FileExistsError:
        env.stderr.write(f"error: {out} exists; pick another --out, or --force to replace it\n")
        return ExitCode.BAD_INPUT
    except UnsafePath as exc:
        env.stderr.write(f"error: {out} was not written: {exc}\n")
        return ExitCode.BAD_INPUT
    written = [str(out)]
    for name, text in extras.items():
        path = out.parent / name
        with contextlib.suppress(FileExistsError):  # theirs (a link too) is kept as it is
            written.append(str(write_new(path, text)))
    env.stdout.write(f"wrote {', '.join(written)}\nnext: edit the lines marked EDIT, then chaoskit validate {out}\n")
    return ExitCode.OK


def _pick(name: str, value: str | None, choices: tuple[str, ...], default: str, ask: bool) -> str:
    if value is not None:
        return value
    if ask and len(choices) > 1:
        return typer.prompt(f"{name} ({', '.join(choices)})", default=default)
    return default


@dataclass
class Script:
    """The user's own script for ``launch: command``: ``name`` as the scenario's ``command`` gives it (relative to
    the scenario's folder where it lies below it), and, for a plain script, the rules read from it (``rules``;
    ``None``: not read, as for a script that reports through chaoskit's SDK or a framework's preset)."""

    name: str
    rules: list[Found] | None = field(default=None)


def _read_script(path: Path, out: Path, framework: str) -> Script:
    """``path`` read once (see the module); :class:`ScenarioError` at ``--script`` when missing, refused or too big."""
    data, _, real = read_authors_file(path, roots=None, field="--script", what="script", limit=MAX_SCRIPT,
                                      nothing="nothing was written")
    if real != os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path)):
        # its lines go into the scenario: never those of a file a link made at the script's name points to
        raise ScenarioError(f"--script: {path} is a link; name the script itself; nothing was written")
    here = os.path.abspath(out.parent)
    name = os.path.relpath(os.path.abspath(path), here)
    if name.startswith(".."):
        name = os.path.abspath(path)
    source = data.decode("utf-8", errors="replace")
    uses_chaoskit = re.search(r"^\s*(from|import)\s+chaoskit\b", source, re.MULTILINE) is not None
    if framework != "torchrun" or uses_chaoskit:  # its preset, a callback or the SDK report it
        return Script(name)
    return Script(name, scan(source))


def render(framework: str, cluster: str, launch: str, script: Script | None = None) -> tuple[str, dict[str, str]]:
    """The scenario's text and the files it names (name -> starter text), for one combination; ``script``: the
    user's own script for ``launch: command`` (else the starter ``train.py`` is one of the files)."""
    stack = framework_stack(framework)  # the recovery stack the framework's job runs under (None: plain torchrun)
    preset = log_presets()[framework]
    presets = ["torchrun"] if framework == "torchrun" else ["torchrun", framework]
    steps_seen = "step" in preset.sees
    extras: dict[str, str] = {}
    lines = [
        f"# A starter drill for your own {_what(framework)} job (chaoskit init --framework {framework} "
        f"--cluster {cluster} --launch {launch}).",
        "# Edit the lines marked EDIT, then: chaoskit validate THIS_FILE; chaoskit run THIS_FILE --dry-run; chaoskit run THIS_FILE",
        "name: my-job-kill-rank                 # EDIT: runs and reports are named after it",
        "description: SIGKILL one rank of my job and measure detection, reallocation and checkpoint load",
    ]
    if cluster == "lab":
        lines.append("cluster: {kind: process, nodes: 2}      # the process lab: two nodes on this machine, no root needed")
    elif cluster == "inventory":
        sched = ", scheduler: slurm" if launch == "sbatch" else ""
        lines.append(f"cluster: {{inventory: inventory.yaml{sched}}}   # EDIT inventory.yaml: your nodes "
                     "(chaoskit doctor inventory.yaml checks them)")
        extras["inventory.yaml"] = _INVENTORY
    else:
        lines.append("cluster: {kind: slurm, nodes: 2}        # the Slurm lab (root): chaoskit lab up --kind slurm")
    lines.append("workload:")
    if launch == "command":
        lines += [
            "  launch: command                      # chaoskit starts your script under torchrun on every node",
            _padded(f"  command: [{_yaml_word(script.name if script else 'train.py')}]",
                    "EDIT: your script (relative to this file) and its arguments"),
            "  steps: 400                           # EDIT: the steps your job trains; faults come before the last"
            if script is None else "  # steps: 400                         # EDIT: the steps your script trains: the drill "
            "then checks it reached the last (without it, it runs until your script ends)",
            "  nproc_per_node: 1                    # workers per node",
            "  max_restarts: 3                      # torchrun --max-restarts",
        ]
        lines += list(stack.init_lines) if stack is not None else []
        if script is None:
            extras["train.py"] = (DATA / "starter_train.py").read_text()
    elif launch == "attach":
        lines += [
            "  launch: attach                       # your job, started by your launcher; chaoskit never starts or stops it",
            "  process: 'train\\.py'                 # EDIT: a regular expression over your job's command line",
            "  nproc_per_node: 8                    # EDIT: ranks per node",
        ]
    else:
        lines += [
            "  launch: sbatch                       # your batch script, submitted unmodified (sbatch --requeue ...)",
            "  script: train.sbatch                 # EDIT: your batch script (relative to this file)",
        ]
        if os.geteuid() == 0:  # root's starter script: say whom it runs as (never root; default: the script's owner)
            user = os.environ.get("SUDO_USER") or "nobody"
            named = f"  user: {user if user != 'root' else 'nobody'}"
            lines.append(named + " " * max(1, 39 - len(named)) + "# EDIT: the user the job runs as; chaoskit as root "
                         "submits it as them, never as root")
        extras["train.sbatch"] = _SBATCH
    named = f"  presets: [{', '.join(presets)}]"
    lines += ["probes:", named + " " * max(1, 39 - len(named)) + f"# {framework}'s own log lines; sees: {', '.join(preset.sees)}",
              f"  # the job needs: {preset.verbosity}"]
    if launch != "command":
        lines.append("  sdk: false                           # the job is not started by chaoskit: no SDK events file")
    if framework in CALLBACKS:
        lines.append(f"  # or, with the one line chaoskit needs in your job: {CALLBACKS[framework]}")
    if not steps_seen and launch != "command" or launch == "attach" and not steps_seen:
        lines += [
            f"  log:                                 # {framework}'s own lines give no step: map your job's step line",
            "    - match: 'step (?P<step>\\d+)'      # EDIT: a line your job prints every step",
            "      event: step",
        ]
    elif not steps_seen and framework in CALLBACKS:
        lines.append(f"  # {framework}'s own lines give no step: add the callback above, or a probes.log rule for "
                     "your job's step line")
    elif not steps_seen and script is not None and script.rules is not None:
        lines += _script_rules(script)
    elif not steps_seen:  # a plain script: the starter one reports through the SDK, your own one through its lines
        lines += [f"  # {framework}'s own lines give no step. EDIT: once train.py is your script without chaoskit's SDK,",
                  "  # uncomment and match the line it prints every step (validate refuses a drill no step can reach):",
                  "  # log:",
                  "  #   - {event: step, match: 'Step (?P<step>\\d+)'}",
                  "  #   - {event: ckpt.save.end, match: 'saved checkpoint .*step (?P<step>\\d+)'}",
                  "  #   - {event: ckpt.load.end, match: 'loaded checkpoint .*step (?P<step>\\d+)'}"]
    if launch == "attach":
        lines += [
            "  log_files:                           # EDIT: your job's log on each node (absolute), read there by chaoskit's agent",
            "    - {node: node1, path: /scratch/job/logs/node1.log}",
            "    - {node: node2, path: /scratch/job/logs/node2.log}",
        ]
    lines += [
        "steady_state: {steps: 3, timeout: 5m}  # the job must be training before the fault",
        "faults:",
        "  - kind: process.kill                 # SIGKILL (signal: SIGTERM, ... also); see chaoskit schema for the others",
        ("    target: {nodes: [n1]}              # EDIT: which replica group (each node's worker is its torchrun's rank 0)"
         if stack is not None and stack.every_group_steady and launch == "command" else
         "    target: {ranks: [1]}               # EDIT: which rank (nodes, labels, process, count, percent also)"),
        "    at: {step: 50}                     # EDIT: when (or {after: 30s})",
        "slo:                                   # EDIT: your objectives; a phase that was not observed fails",
        "  detection: 30s",
        "  reallocation: 5m",
        "  checkpoint_load: 5m",
        "  recovery: 10m",
        "safety: {max_nodes: 1, abort_after: 20m}",
    ]
    return "\n".join(lines) + "\n", extras


def _padded(text: str, comment: str) -> str:
    return text + " " * max(1, 39 - len(text)) + "# " + comment


def _yaml_word(text: str) -> str:
    return text if re.fullmatch(r"[\w./-]+", text) else json.dumps(text)


def _quoted(regex: str) -> str:
    return "'" + regex.replace("'", "''") + "'"


_WANTED = {
    "worker.start": ("a worker starts", "'started worker .*rank (?P<rank>\\d+)'"),
    "step": ("it makes a step", "'Step (?P<step>\\d+)'"),
    "ckpt.save.end": ("it saved a checkpoint", "'saved checkpoint .*step (?P<step>\\d+)'"),
    "ckpt.load.end": ("it loaded a checkpoint", "'loaded checkpoint .*step (?P<step>\\d+)'"),
}
"""What each rule init looks for is for, and the example of it written commented when the script shows none."""


def _script_rules(script: Script) -> list[str]:
    """The ``probes.log`` rules read from the user's script: each found one with its script line, each missing one
    commented with EDIT (validate refuses the drill while the step rule is missing)."""
    rules = script.rules or []
    base = os.path.basename(script.name)
    got = {re.sub(r"^(ckpt\.\w+)\.start$", r"\1.end", r.event): r for r in rules}  # a load's start if no end
    out = [_padded("  log:" if rules else "  # log:", f"read from {base} by chaoskit init: each rule matches what "
                   "the line it names prints")]
    for event, (what, example) in _WANTED.items():
        rule = got.get(event)
        if rule is None:
            out.append(f"  # EDIT: no line of {base} says {what}; uncomment and match the one it prints"
                       + (" (validate refuses the drill without it: no step could come)" if event == "step" else ""))
            out.append(f"  #   - {{event: {event}, match: {example}}}")
            continue
        source = rule.source if len(rule.source) <= 90 else rule.source[:87] + "..."
        out.append(_padded(f"    - event: {rule.event}", f"{base}:{rule.line}: {source}"))
        out.append(f"      match: {_quoted(rule.match)}")
    return out


def _what(framework: str) -> str:
    return {"torchrun": "PyTorch (torchrun)", "hf": "Hugging Face Trainer"}.get(framework, framework)


_SBATCH = '''\
#!/bin/bash
# EDIT: your batch script, submitted unmodified by chaoskit (launch: sbatch). It starts one torchrun agent
# per node and resumes from its newest checkpoint when Slurm requeues it. chaoskit passes CHAOSKIT_EVENTS and
# CHAOSKIT_CKPT_DIR in the environment.
#SBATCH --nodes=2
#SBATCH --requeue
srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 1 --rdzv-backend c10d \\
    --rdzv-endpoint "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29500" \\
    train.py
'''

_INVENTORY = '''\
# EDIT: your cluster, as chaoskit sees it; chaoskit touches nothing that is not listed here.
#   chaoskit validate inventory.yaml   # the format (no connection)
#   chaoskit doctor inventory.yaml     # every node: reachable, sudo, tools, clock, GPUs
name: my-cluster
ssh:
  user: drill                       # EDIT: a login user with password-less sudo
  become: sudo
nodes:
  - name: node1
    address: 10.0.0.11              # EDIT: an address or a Host alias of ~/.ssh/config
    gpus: 8
  - name: node2
    address: 10.0.0.12
    gpus: 8
'''
