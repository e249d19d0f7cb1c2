"""What can be checked of a scenario against its cluster without touching anything.

``chaoskit validate`` and every run (before anything starts) call :func:`check_scenario`:
the scenario's backend previews its cluster, and selectors, blast radius, steps,
coverage claims, log-file nodes and the workload's launch are checked against it.
Each error points at the scenario's line.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from pathlib import Path
from typing import Any

from chaoskit.backends.api import ClusterHandle
from chaoskit.backends.registry import CLUSTERS, backend
from chaoskit.cluster.policy import SitePolicy, site_policy, under_roots
from chaoskit.cluster.selectors import check_static, select_nodes
from chaoskit.cluster.slurm import SubmitRefused, submit_user
from chaoskit.core.errors import ScenarioError
from chaoskit.core.jobenv import GUARDED, guarded, owned_by
from chaoskit.core.launches import LAUNCHES
from chaoskit.coverage import resolve_covers
from chaoskit.faults.registry import get_fault
from chaoskit.scenario import LoadedScenario
from chaoskit.scenario.model import ScenarioBase
from chaoskit.stacks.registry import default_stack, log_presets, stack_of

__all__ = ["check_scenario", "preview_cluster", "uses_inproc_channel", "world_size"]


def world_size(sc: ScenarioBase, cluster: ClusterHandle) -> int:
    """Ranks of the job: workers per node times the nodes that form its world."""
    return len(cluster.job_nodes) * sc.workload.nproc_per_node


def uses_inproc_channel(sc: ScenarioBase) -> bool:
    """Whether the run needs the in-process channel: a fault that acts through it, or the SDC probe."""
    return sc.probes.sdc is not None or any(get_fault(f.kind).uses_inproc_channel for f in sc.faults)


def preview_cluster(loaded: LoadedScenario) -> ClusterHandle:
    """The handle the scenario's cluster would give, built without touching anything.

    An error in a file the cluster pulls in (a compose file, an inventory) names that file's
    line first, then the scenario's ``cluster:`` that pulled it in; one with no position of its
    own is put at the scenario's ``cluster:``."""
    try:
        return backend(loaded.model.cluster.kind).preview(loaded.model.cluster, loaded.path.parent)
    except ScenarioError as exc:
        where = loaded.pos("cluster")
        if exc.pos is None:
            exc.pos = where
        elif exc.pos.file != where.file:
            exc.message = f"{exc.message} (cluster of {where})"
        raise


def check_scenario(loaded: LoadedScenario) -> ClusterHandle:
    """Every check that needs the cluster but touches nothing (``validate`` runs it too); return the preview."""
    cluster = preview_cluster(loaded)
    if cluster.kind != "inventory" and cluster.inventory.policy is None:
        # a lab runs the author's workload.command, compose file and log files too: this machine's policy binds it
        machine = site_policy()
        if isinstance(machine, list):
            err = machine[0]
            if err.pos is None:
                err.pos = loaded.pos("cluster")
            raise err
        cluster.inventory.policy = machine
    _recovery_checks(loaded, cluster)
    if cluster.inventory.policy is not None:
        _policy_checks(loaded, cluster, cluster.inventory.policy)
    _env_checks(loaded, cluster.inventory.policy)
    _static_checks(loaded, cluster)
    return cluster


def _recovery_checks(loaded: LoadedScenario, cluster: ClusterHandle) -> None:
    """The recovery stack on this cluster: the one its launch gets here when the scenario names none (a job Slurm
    requeues: ``slurm-requeue``), refused at the ``recovery`` line where the cluster cannot run the one it names."""
    w = loaded.model.workload
    if "recovery" not in w.model_fields_set:
        default = default_stack(w.launch, cluster.scheduler is not None).name
        if default != w.recovery:
            w.recovery = default
        return
    problem = stack_of(w).cluster_problem(cluster)
    if problem:
        raise loaded.error(f"workload.recovery: {problem}", "workload", "recovery")


def _env_checks(loaded: LoadedScenario, policy: SitePolicy | None) -> None:
    """``workload.env`` changes nothing chaoskit owns under the scenario's recovery stack, and no LD_* or PYTHON*
    variable the site policy's ``env`` does not name: a scenario's author is not who runs it (a game day's folder,
    a CI job), and the job may run as root. Each refusal at the variable's line."""
    w = loaded.model.workload
    allowed = policy.env if policy is not None else None
    for name in w.env:
        owner = owned_by(name, w.recovery, stack_of(w).owned_env)
        if owner is not None:
            raise loaded.error(f"workload.env.{name}: {name} is set by {owner}; a scenario may not set or unset it",
                               "workload", "env", name)
        if guarded(name, allowed):
            raise loaded.error(
                f"workload.env.{name}: {name} changes what code the job's processes load ({', '.join(GUARDED)}), and "
                f"the site policy's env does not name it" + (f" (it names {', '.join(allowed)})" if allowed else ""),
                "workload", "env", name,
                hint="a site's owners allow it in /etc/chaoskit/policy.yaml (env: [NAME]); or set it in the "
                     "environment you run chaoskit from, which the job inherits")


def _policy_checks(loaded: LoadedScenario, cluster: ClusterHandle, policy: SitePolicy) -> None:
    """The scenario asks for nothing the cluster's site policy does not allow (each refusal at its line)."""
    sc, inventory = loaded.model, cluster.inventory
    limit = policy.max_nodes
    if limit is not None and sc.safety.max_nodes > limit:
        raise loaded.error(f"safety.max_nodes: {sc.safety.max_nodes} is more than the site policy's max_nodes "
                           f"({limit}) for this cluster", "safety", "max_nodes")
    touched: set[str] = set()
    for i, spec in enumerate(sc.faults):
        problem = policy.allows_kind(spec.kind)
        if problem:
            raise loaded.error(f"faults.{i}.kind: {problem}", "faults", i, "kind")
        if limit is None:
            continue
        nodes = [n.name for n in select_nodes(inventory, spec.target)]
        if spec.target.ranks is not None:  # ranks live on the job's nodes, nproc_per_node each
            per_node = max(1, sc.workload.nproc_per_node)
            ranked = {cluster.job_nodes[r // per_node] for r in spec.target.ranks if r // per_node < len(cluster.job_nodes)}
            nodes = [n for n in nodes if n in ranked]
        if len(nodes) > limit:
            raise loaded.error(f"faults.{i}.target: it may touch {len(nodes)} nodes ({', '.join(nodes)}); the site "
                               f"policy allows a drill at most {limit} on this cluster", "faults", i, "target")
        touched.update(nodes)
        if len(touched) > limit:
            raise loaded.error(f"faults.{i}.target: with the faults before it the drill would touch {len(touched)} nodes "
                               f"({', '.join(sorted(touched))}); the site policy allows at most {limit}", "faults", i, "target")
    if policy.log_roots is not None:
        for j, lf in enumerate(sc.probes.log_files):
            if not under_roots(lf.path, policy.log_roots):
                raise loaded.error(f"probes.log_files.{j}.path: {lf.path} is outside the site policy's log_roots "
                                   f"({', '.join(policy.log_roots)}); chaoskit reads log files there only",
                                   "probes", "log_files", j, "path")
    for k, rule in enumerate(sc.probes.prometheus):
        problem = policy.allows_url(rule.url)
        if problem:
            raise loaded.error(f"probes.prometheus.{k}.url: {problem}", "probes", "prometheus", k, "url")
    for k, cond in enumerate(sc.safety.stop_when):
        problem = policy.allows_url(cond.prometheus)
        if problem:
            raise loaded.error(f"safety.stop_when.{k}.prometheus: {problem}", "safety", "stop_when", k, "prometheus")
    ckpt = sc.workload.checkpoint_dir
    if policy.checkpoint_roots is not None and ckpt is not None and not under_roots(ckpt, policy.checkpoint_roots):
        raise loaded.error(f"workload.checkpoint_dir: {ckpt} is outside the site policy's checkpoint_roots "
                           f"({', '.join(policy.checkpoint_roots)})", "workload", "checkpoint_dir")
    w = sc.workload
    if policy.launches is not None and w.launch not in policy.launches:
        raise loaded.error(f"workload.launch: the site policy allows no launch: {w.launch} on this cluster (allowed: "
                           f"{', '.join(policy.launches) or 'none'})", "workload", "launch")
    if policy.script_roots is not None:
        _script_roots(loaded, cluster, policy.script_roots)
    users = policy.jobs.users if policy.jobs is not None else None
    if users is not None and w.launch == "sbatch" and cluster.scheduler is not None:
        owner = _submit_user(loaded)
        name, uid = (owner.name, str(owner.uid)) if owner is not None else (_me(), str(os.geteuid()))
        if name not in users and uid not in users:
            raise loaded.error(f"workload.user: the batch script would be submitted as {name} (uid {uid}), who is not "
                               f"one of the site policy's jobs.users ({', '.join(users)})", "workload", "user")


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _script_roots(loaded: LoadedScenario, cluster: ClusterHandle, roots: list[str]) -> None:
    """Every program of the author's that the drill runs (``workload.command``'s script, ``workload.script``, the
    cluster's own files such as a compose file) lies, links resolved, inside the site policy's ``script_roots``.
    A cluster's file is judged where it was when the cluster read it (``author_files``: the very file it uses); the
    workload's scripts are checked here early, and again on the file opened when the job starts."""
    w, base = loaded.model.workload, loaded.path.parent
    files: list[tuple[tuple[Any, ...], Path, str]] = [(("cluster", field), path, str(path))
                                                      for field, path in cluster.author_files.items()]
    if w.launch == "command" and w.command:
        script = w.command_script(base)
        if script is None:
            raise loaded.error(f"workload.command: {w.command[0]} runs a module, which the site policy's script_roots "
                               f"({', '.join(roots)}) cannot bound: name the script's file", "workload", "command", 0)
        files.append((("workload", "command", 0), script, os.path.realpath(script)))
    if w.script is not None:
        files.append((("workload", "script"), base / w.script, os.path.realpath(base / w.script)))
    for where, path, real in files:
        if not under_roots(real, roots):
            raise loaded.error(f"{'.'.join(str(p) for p in where)}: {path} is outside the site policy's script_roots "
                               f"({', '.join(roots)}); a drill runs an author's program only from there", *where)


def _submit_user(loaded: LoadedScenario):
    """Whom the batch script would be submitted as (``None``: as chaoskit), or the refusal at its line."""
    w = loaded.model.workload
    script = loaded.path.parent / w.script
    try:
        return submit_user(w.user, script)
    except SubmitRefused as exc:
        raise loaded.error(f"workload.{exc.field}: {exc.message}; nothing was submitted", "workload", exc.field) from None


def _bounds_steps(workload: Any) -> bool:
    """Whether ``workload.steps`` bounds the job's steps: not for a launch that ends itself (``launch: command``:
    its script ends when it will) unless the scenario sets it, as the job's ``finish_step`` has it."""
    return not LAUNCHES[workload.launch].ends_itself or "steps" in workload.model_fields_set


SCRIPT_READ_BYTES = 1 << 20
"""How much of a ``launch: command`` script :func:`_no_step_source` reads for an import of chaoskit."""


def _no_step_source(loaded: LoadedScenario) -> str | None:
    """Why the job can never report a step, or ``None`` when something can: a ``step`` log rule, a preset that
    sees steps, or a launch whose job writes the SDK's events (for ``launch: command``, only a script that imports
    chaoskit: the SDK or a framework callback; torchrun's own lines carry no step)."""
    sc = loaded.model
    if any(rule.event == "step" for rule in sc.probes.log) or any("step" in log_presets()[p].sees for p in sc.probes.presets):
        return None
    if not LAUNCHES[sc.workload.launch].sdk_events:
        return f"launch: {sc.workload.launch}'s job writes no SDK events and no probes.log rule or preset reads a step"
    if not sc.probes.sdk:
        return "probes.sdk is off and no probes.log rule or preset reads a step"
    script = sc.workload.command_script(loaded.path.parent)
    if script is None:
        return None
    try:  # a regular file only, never a FIFO a read would wait on (a docker lab's script is not checked above)
        fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the script's own check says what is wrong with it
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = fh.read(SCRIPT_READ_BYTES)
    if b"chaoskit" in text:
        return None
    return (f"{script.name} does not use chaoskit (no SDK, no callback), torchrun's lines carry no step, and no "
            "probes.log rule or preset reads one")


def _check_trigger(loaded: LoadedScenario, inventory: Any, i: int) -> None:
    """A fault's ``id`` names it once; a trigger's node is in the inventory, and the fault it names is an earlier
    one (faults are injected in order: a later one has not happened while this one waits)."""
    sc = loaded.model
    spec = sc.faults[i]
    if spec.id is not None:
        taken = next((j for j, other in enumerate(sc.faults[:i]) if other.id == spec.id), None)
        if taken is not None or (spec.id != f"f{i}" and spec.id in {f"f{j}" for j in range(len(sc.faults))}):
            whose = f"faults.{taken}'s id" if taken is not None else "another fault's own name (f<index>)"
            raise loaded.error(f"faults.{i}.id: {spec.id!r} is already {whose}; give each fault its own id",
                               "faults", i, "id")
    at = spec.at
    if at.node is not None and at.node not in inventory:
        raise loaded.error(f"faults.{i}.at.node: node {at.node!r} is not in the inventory ({', '.join(inventory.names())})",
                           "faults", i, "at", "node")
    named = [(("at", "during", "fault"), at.during.fault)] if at.during is not None else []
    named += [(("at", "fault"), at.fault)] if at.fault is not None else []
    names = sc.fault_names()
    for where, name in named:
        j = names.get(name)
        if j is None or j >= i:
            earlier = [f.id or f"f{k}" for k, f in enumerate(sc.faults[:i])]
            why = (f"no fault of this scenario is named {name!r}" if j is None
                   else f"{name!r} is this fault or a later one, and faults are injected in order")
            raise loaded.error(f"faults.{i}.{'.'.join(where)}: {why}; name an earlier fault"
                               + (f" ({', '.join(earlier)})" if earlier else " (this is the first: it has none)"),
                               "faults", i, *where)


def _static_checks(loaded: LoadedScenario, cluster: ClusterHandle) -> None:
    inventory = cluster.inventory
    sc = loaded.model
    for i, spec in enumerate(sc.faults):
        def error(message: str, *sub: Any, _i: int = i) -> ScenarioError:
            return loaded.error(f"faults.{_i}.target: {message}", "faults", _i, "target", *sub)

        check_static(inventory, spec.target, world_size(sc, cluster), sc.safety.max_nodes, error)
        fault = get_fault(spec.kind)(spec, f"f{i}")
        for node in select_nodes(inventory, spec.target):
            problem = fault.unfit(node)
            if problem:
                raise loaded.error(f"faults.{i}: {problem}", "faults", i, "kind")
        misfit = fault.check_job(sc.workload)
        if misfit:
            field, problem = misfit
            raise loaded.error(f"faults.{i}.{field}: {problem}", "faults", i, field)
        peers = getattr(spec, "peers", None)
        for name in (peers.nodes if peers is not None else None) or []:
            if name not in inventory:
                raise loaded.error(f"faults.{i}.peers: node {name!r} is not in the inventory ({', '.join(inventory.names())})",
                                   "faults", i, "peers", "nodes")
        _check_trigger(loaded, inventory, i)
        if spec.at.step is not None and _bounds_steps(sc.workload) and spec.at.step >= sc.workload.steps:
            raise loaded.error(
                f"faults.{i}.at.step: step {spec.at.step} is never reached: the job runs {sc.workload.steps} steps",
                "faults", i, "at", "step",
            )
    for j, rule in enumerate(sc.probes.log):
        if rule.event == "step" and "step" not in rule.fields and "step" not in re.compile(rule.match).groupindex:
            raise loaded.error(
                f"probes.log.{j}.match: a step rule needs a group named step ((?P<step>...)): without one its lines "
                "give no step number, so the rule can never report a step", "probes", "log", j, "match",
                hint=r"capture the step number, e.g. match: 'step (?P<step>\d+)'")
    try:
        resolve_covers(sc.covers, [f.catalog_tag() for f in sc.faults])
    except ValueError as exc:
        raise loaded.error(str(exc), "covers") from None
    for j, lf in enumerate(sc.probes.log_files):
        if lf.node not in inventory:
            raise loaded.error(f"probes.log_files.{j}.node: node {lf.node!r} is not in the inventory", "probes", "log_files", j, "node")
        if sc.workload.launch == "attach" and not lf.path.startswith("/"):
            raise loaded.error(f"probes.log_files.{j}.path: an attached job writes its logs on its nodes: give the "
                               f"absolute path on {lf.node} (each node's agent reads it there)", "probes", "log_files", j, "path")
        roots = inventory.policy.log_roots if inventory.policy is not None else None
        if sc.workload.launch != "attach" and lf.path.startswith("/") and roots is None:
            # read as root on this machine: /etc/shadow would reach the events (with log_roots, checked above)
            raise loaded.error(f"probes.log_files.{j}.path: {lf.path} is outside the job's folder: a job's log file is "
                               "a path relative to its folder, or one inside the site policy's log_roots",
                               "probes", "log_files", j, "path")
    if sc.workload.launch not in backend(sc.cluster.kind).launches:
        able = [name for name in CLUSTERS.names() if sc.workload.launch in CLUSTERS.get(name).launches]
        raise loaded.error(f"workload.launch: {sc.workload.launch} does not run on a cluster of kind {sc.cluster.kind}; "
                           f"it needs kind: {' or '.join(able)}", "workload", "launch")
    if sc.workload.launch == "sbatch" and cluster.scheduler is None:
        raise loaded.error("workload.launch: sbatch needs a cluster with Slurm (kind: slurm, or an inventory with "
                           "scheduler: slurm); nothing was submitted", "workload", "launch")
    if sc.workload.slurm_job is not None and cluster.scheduler is None:
        raise loaded.error("workload.slurm_job: the cluster has no Slurm to ask for the job (kind: slurm, or an "
                           "inventory with scheduler: slurm)", "workload", "slurm_job")
    if sc.workload.checkpoint_fs is not None and cluster.checkpoint_fs is None:
        raise loaded.error(f"workload.checkpoint_fs: a cluster of kind {sc.cluster.kind} cannot give the job a checkpoint "
                           "file system of its own (the process lab, cluster: lab, can)", "workload", "checkpoint_fs")
    if sc.workload.script is not None and not (loaded.path.parent / sc.workload.script).is_file():
        raise loaded.error(f"workload.script: no batch script {loaded.path.parent / sc.workload.script}; nothing was submitted",
                           "workload", "script")
    if sc.workload.launch == "sbatch" and cluster.scheduler is not None:
        _submit_user(loaded)  # an author's batch script runs as its user, never as root
    script = sc.workload.command_script(loaded.path.parent)
    if script is not None and cluster.launch_wrap is None and not script.is_file():
        # the nodes start the job from this machine's files (a relative script always is one of them)
        raise loaded.error(f"workload.command: no script {script} (a relative script is taken from the scenario's "
                           "folder); nothing was started", "workload", "command", 0)
    if sc.workload.launch == "attach" and not sc.probes.log and not any("step" in log_presets()[p].sees for p in sc.probes.presets):
        raise loaded.error(
            "probes.log: chaoskit sees an attached job only through its log lines; map them to events (at least "
            "`step`) with probes.log, and name the files with probes.log_files", "probes",
        )
    never = _no_step_source(loaded)
    if never is not None:
        at = next((i for i, spec in enumerate(sc.faults) if spec.at.step is not None), None)
        where = (("faults", at, "at", "step") if at is not None
                 else ("steady_state",) if "steady_state" in sc.model_fields_set else ("workload",))
        what = f"faults.{at}.at.step" if at is not None else "steady_state"
        hint = (r"add a probes.log rule for the job's step line (e.g. {event: step, match: 'Step (?P<step>\d+)'}), "
                "a preset that sees steps, or chaoskit.probe.step(n) in the script (docs/frameworks.md)")
        raise loaded.error(f"{what}: can never fire: no step event can come ({never}), so steady state (step "
                           f"{sc.steady_state.steps}) is never reached; {hint}", *where, hint=hint)
    if sc.workload.launch == "uninstrumented" and sc.probes.sdk and not sc.probes.log and not sc.probes.presets:
        raise loaded.error(
            "probes.log: an uninstrumented job writes no SDK events; map its log lines to events with probes.log",
            "probes",
        )
