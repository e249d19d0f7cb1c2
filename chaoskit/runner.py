"""The pipeline of one scenario: load, resolve, preflight, baseline, arm, inject,
observe, revert, measure, report. Each stage is a plain function or method on
plain data; :func:`run_scenario` strings them together. What the run holds (lock, folders, journal, leases,
marker) is its :class:`~chaoskit.session.Session`'s, its probes a :class:`~chaoskit.probeset.ProbeSet`, whom its
job runs as :mod:`chaoskit.jobuser`'s, the nodes' clocks :func:`~chaoskit.cluster.clock.sync_clocks`', its result the
assembler's: the runner keeps the order of the stages.

Errors before anything starts (bad scenario, missing tool) raise. Once the job
runs, every exit path reverts what was injected, stops the job and writes
``result.json``; the return value carries the exit code.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.markup import escape

from chaoskit.backends.api import ClusterHandle
from chaoskit.backends.registry import backend
from chaoskit.cluster.clock import ClockOffset, far_clocks, sync_clocks
from chaoskit.cluster.selectors import (
    TargetSpec,
    resolve_nodes,
    resolve_processes,
    subset,
)
from chaoskit.core import procs
from chaoskit.core.errors import ExitCode, InfraError, SafetyAbort, ScenarioError, TargetGone
from chaoskit.core.files import RESULT_FILE
from chaoskit.core.jobenv import SCOPE_VAR
from chaoskit.assembler import RunRecord, assemble
from chaoskit.core.progress import ProgressFeed, Subscriber, TerminalProgress
from chaoskit.core.result import RunResult
from chaoskit.core.patterns import bounded_search, compile_pattern
from chaoskit.core.secrets import redact_value
from chaoskit.coverage import Capabilities, detect_capabilities
from chaoskit.faults.api import Fault, Injection
from chaoskit.faults.registry import get_fault
from chaoskit.observe.events import make_event
from chaoskit.observe.presets import NO_STEP_SEEN
from chaoskit.jobuser import decide_job_user, job_process_users
from chaoskit.probeset import ProbeSet
from chaoskit.scenario import LoadedScenario, load_scenario
from chaoskit.scenario.checks import check_scenario, uses_inproc_channel, world_size
from chaoskit.session import RunContext, Session
from chaoskit.triggers import Fired, TriggerMissed, TriggerWatch, what_it_waits_for
from chaoskit.core.launches import LAUNCHES
from chaoskit.stacks.registry import stack_of
from chaoskit.workloads.api import Job, JobFolders
from chaoskit.workloads.launch import torch_available
from chaoskit.workloads.registry import job_class, make_job

__all__ = ["RunContext", "RunOutcome", "run_scenario", "plan_scenario"]


Gate = Callable[[list[dict[str, Any]], list[float]], "str | None"]
"""``gate(events since the last fault, fault times so far)``: why the next fault must wait, or ``None``."""

TARGET_POLL_S = 0.2
"""How often an event-triggered fault whose process target matches nothing yet looks again (within its window)."""


@dataclass
class RunOutcome:
    exit_code: int
    result: dict[str, Any]
    run_dir: Path | None
    plan: list[dict[str, Any]] = field(default_factory=list)


def _faults(sc) -> list[Fault]:
    return [get_fault(spec.kind)(spec, f"f{i}") for i, spec in enumerate(sc.faults)]


def plan_scenario(loaded: LoadedScenario, cluster: ClusterHandle) -> list[dict[str, Any]]:
    """What a run would do, without doing it (``--dry-run``)."""
    sc = loaded.model
    inventory = cluster.inventory
    ctx = RunContext(inventory)
    plan = []
    world = world_size(sc, cluster)
    per_node = sc.workload.nproc_per_node
    for fault in _faults(sc):
        spec = fault.spec
        nodes = [n.name for n in inventory.select(spec.target.nodes, spec.target.labels)]
        placeholders = _placeholder_targets(spec.target, nodes, world, per_node)
        actions = fault.plan(ctx, placeholders)
        plan.append({
            "fault": fault.fault_id, "kind": fault.kind,
            "at": spec.at.describe() + (f"; {spec.recur.describe()}" if spec.recur is not None else ""),
            "target": spec.target.describe(), "nodes": nodes,
            "actions": [{"node": a.node, "target": a.target, "command": a.command} for a in actions],
        })
    return plan


def _scope_preview(sc, cluster: ClusterHandle, job: Job, path: Path) -> dict[str, Any]:
    """What ``--dry-run`` says of the job's scope, and how many processes each ``process`` regex matches outside
    it where that can be counted without connecting (nodes that are processes of this machine)."""
    text = job.scope_note()
    regexes = ([("workload.process", sc.workload.process)] if sc.workload.process else []) + [
        (f"faults.{i}.target.process", f.target.process) for i, f in enumerate(sc.faults) if f.target.process]
    local = all(n.conn is not None and n.conn.processes_here for n in cluster.inventory.nodes)
    outside = []
    if regexes and local:
        lines = _unscoped_cmdlines()
        for what, regex in regexes:
            rx = compile_pattern(regex)
            outside.append({"what": what, "regex": regex,
                            "outside": sum(1 for line in lines if bounded_search(rx, line, what))})
    elif regexes:
        inventory = cluster.details.get("inventory", "INVENTORY")
        text += (f"; a dry run connects to nothing, so the processes matching outside the scope are not counted: "
                 f"chaoskit doctor {inventory} --scenario {path} counts them")
    return {"note": text, "outside": outside}


def _unscoped_cmdlines() -> list[str]:
    """The command line of each live process of this machine that carries no job's scope mark (:data:`SCOPE_VAR`)."""
    mark = b"\0" + SCOPE_VAR.encode() + b"="
    lines = []
    for pid in procs.pids():
        line, env = procs.cmdline(pid), procs.environ(pid)
        if line is None or procs.state(pid) in (None, "Z") or (env is not None and mark in b"\0" + env):
            continue
        lines.append(line.replace(b"\0", b" ").decode(errors="replace").strip())
    return lines


class _Placeholder:
    def __init__(self, node: str, rank: int | None) -> None:
        self.node, self.rank = node, rank
        self.pid = f"<pid of rank {rank}>" if rank is not None else "<pid>"

    def label(self) -> str:
        return f"{self.node}/rank{self.rank}" if self.rank is not None else f"{self.node}/<process>"


def _placeholder_targets(target, nodes: list[str], world: int, per_node: int) -> list[Any]:
    if target.ranks is not None:
        items = [_Placeholder(nodes[min(r // per_node, len(nodes) - 1)] if nodes else "?", r) for r in target.ranks]
    elif target.pid is not None or target.process is not None:
        items = [_Placeholder(n, None) for n in nodes]
    else:
        items = [_Placeholder(n, i * per_node + j) for i, n in enumerate(nodes) for j in range(per_node)]
    return subset(items, target)


def run_scenario(path: str | Path, *, out: Path | None = None, dry_run: bool = False, console=None,
                 capabilities: Capabilities | None = None, after_run: Callable[[Path], Any] | None = None,
                 wait: str | None = None, gate: Gate | None = None, progress: Subscriber | None = None) -> RunOutcome:
    """Run one scenario (or, with ``dry_run``, plan it); see the module docstring for what raises.

    ``console``: the terminal the run's progress is printed on (:class:`~chaoskit.core.progress.TerminalProgress`);
    ``progress``: another subscriber to the run's progress events (a game day's board);
    ``capabilities``: what this machine can do, recorded in result.json (probed when not given);
    ``after_run(run_dir)``: called once the run's files are written, errors included (the CLI renders
    the HTML report there); what it raises is reported as a progress line, never lost with the run;
    ``wait``: ``workload.wait`` for a scenario that does not set it (a game day stops at recovery);
    ``path`` may be a scenario already loaded (a campaign's, built from another file);
    ``gate(events, fault_times)``: why the next fault must wait once its trigger came, or ``None``
    (a campaign holds a fault back while the previous one's recovery is in progress)."""
    loaded = path if isinstance(path, LoadedScenario) else load_scenario(path)
    sc = loaded.model
    # A game day's ``wait: recovered`` for a scenario that set none also cuts short a lasting fault's remaining
    # duration once recovery is measured (:meth:`_Run._observe`); a scenario's own ``wait`` keeps every duration.
    cut_short = wait == "recovered" and "wait" not in sc.workload.model_fields_set
    if wait is not None and "wait" not in sc.workload.model_fields_set:
        sc.workload.wait = wait
    preview = check_scenario(loaded)

    run_id = f"{_utc_stamp()}-{sc.name}"
    if dry_run:
        cluster = preview
        job = make_job(cluster, sc.workload, Path(out or Path("reports") / run_id), run_id, base=loaded.path.parent)
        plan = plan_scenario(loaded, cluster)
        result = {"scenario": sc.name, "verdict": "dry-run", "cluster": cluster.info(),
                  "agent": stack_of(sc.workload).agent,
                  "job": {n: " ".join(a) for n, a in job.commands().items()}, "plan": plan, **job.plan_part()}
        result["scope"] = _scope_preview(sc, cluster, job, loaded.path)
        if not torch_available() and LAUNCHES[sc.workload.launch].needs_torch:
            result["preflight"] = ["torch is not installed: pip install 'chaoskit[workload]'"]
        missing = stack_of(sc.workload).missing()  # the recovery stack's own package (its launcher's, its library's)
        if missing:
            result.setdefault("preflight", []).append(missing)
        return RunOutcome(0, redact_value(result), None, plan)
    run_dir = Path(out) if out else Path("reports") / run_id
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ScenarioError(
            f"--out {run_dir} already holds files; a run needs an empty folder",
            hint="pick another --out, or remove that folder",
        )
    cluster = backend(sc.cluster.kind).open(sc.cluster, loaded.path.parent)
    if cluster.inventory.policy is None:  # a lab's: the machine's policy that the checks applied binds the run too
        cluster.inventory.policy = preview.inventory.policy
    try:
        run = _Run(loaded, cluster, run_id, out, [TerminalProgress(console) if console is not None else None, progress],
                   capabilities or detect_capabilities(), after_run)
        run.gate = gate
        run.cut_short = cut_short
    except BaseException:
        with interrupts_deferred():
            cluster.teardown()
        raise
    return run.execute()


def _utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class _Run:
    """One live run. ``execute`` always reverts, stops the job and writes result.json."""

    def __init__(self, loaded: LoadedScenario, cluster: ClusterHandle, run_id: str, out: Path | None,
                 progress: list[Subscriber | None],
                 capabilities: Capabilities, after_run: Callable[[Path], Any] | None) -> None:
        self.capabilities, self.after_run = capabilities, after_run
        self.gate: Gate | None = None
        self.cut_short = False
        """Revert a lasting fault before its duration is up once recovery is measured (a game day's default)."""
        self.loaded, self.sc, self.cluster, self.inventory = loaded, loaded.model, cluster, cluster.inventory
        self.run_id = run_id
        # Absolute: the job runs with the run directory as its working directory.
        self.run_dir = (Path(out) if out else Path("reports") / run_id).resolve()
        self._default_dir = out is None
        self.t0 = time.time()
        self.say = ProgressFeed(self.t0, progress)
        """The run's progress: ``say(message, stage, **data)`` (:mod:`chaoskit.core.progress`)."""
        self.injections: list[tuple[Fault, Injection]] = []
        self.notes: list[str] = []
        self.verdict: str | None = None
        self.job: Job | None = None
        self.clocks: dict[str, ClockOffset] = {}
        self.job_cls = job_class(self.sc.workload.launch, cluster)
        self.job_user = decide_job_user(cluster, self.sc, self.job_cls.runs_as(self.sc.workload, loaded.path.parent),
                                        loaded.path.parent, self.run_dir)
        """Whom the job runs as (:mod:`chaoskit.jobuser`): ``owner`` an author's batch script's user (chaoskit as
        root submits it as that user) or the lab's account, ``None`` chaoskit's; ``root_why`` where it stays root."""
        self.job_owner = self.job_user.owner
        self.t_baseline: float | None = None
        self.fired: dict[str, Fired] = {}
        """Each event-triggered fault's trigger, by fault id (``f<index>``), once it fired."""
        self.recurring: list[Fault] = [f for f in _faults(self.sc) if f.spec.recur is not None]
        """The original faults that strike again when the job comes back to their node (``recur``)."""
        self.returns: dict[str, int] = {}
        """How many times each recurring fault struck again, by its id."""
        self.missed: str | None = None
        """Why a trigger never fired (the faults after it were not injected), or ``None``."""
        self.session = Session(cluster, run_id, self.run_dir, default_dir=self._default_dir,
                               lease_ttl=self.sc.safety.lease_ttl, folders_for=self._folders, say=self.say,
                               note=self.notes.append)
        """The run's hold on its cluster (lock, run folder, journal, leases, marker), opened by :meth:`execute`."""

    # -- stages -------------------------------------------------------------------------

    def execute(self) -> RunOutcome:
        sc = self.sc
        session = self.session
        session.open()
        self.run_dir, self.bus, self.journal, self.leases, self.ctx = (
            session.run_dir, session.bus, session.journal, session.leases, session.ctx)
        self.probes = ProbeSet(sc, self.cluster, self.bus)
        """The probes built from the scenario, started by :meth:`_start`, stopped by :meth:`_teardown`."""
        self.deadline = self.t0 + sc.safety.abort_after
        exit_code = ExitCode.OK
        came: list[int] = []
        restore = install_sigterm()
        try:
            self._preflight()
            self._start()
            self._baseline()
            self._job_process_users()
            for fault in _faults(sc):
                try:
                    self._inject(fault)
                except TriggerMissed as exc:  # the drill as written cannot happen: it ends here, everything reverted
                    self.missed = str(exc)
                    self.say(f"[yellow]trigger never fired:[/yellow] {escape(self.missed)}; ending the drill", "trigger_missed")
                    break
            else:
                self._observe()
        except SafetyAbort as exc:
            self.verdict = "aborted"
            self.notes.append(str(exc))
            self.say(f"[red]aborted:[/red] {escape(str(exc))}", "aborted")
            exit_code = ExitCode.ABORTED
        except KeyboardInterrupt:
            self.verdict = "interrupted"
            self.notes.append("interrupted by Ctrl-C or SIGTERM; every fault was reverted")
            self.say("[yellow]interrupted[/yellow]: reverting", "interrupted")
            exit_code = ExitCode.INTERRUPTED
        except (InfraError, ScenarioError) as exc:
            self.verdict = "error"
            self.notes.append(str(exc))
            self._error = exc
        finally:
            with interrupts_deferred(self.say) as came:
                self._teardown()
            restore()
            session.release()
        if came and exit_code != ExitCode.INTERRUPTED:  # Ctrl-C while tearing down: the run ended, and stops here
            self.notes.append("interrupted by Ctrl-C or SIGTERM during the teardown, which finished first; the drill's "
                              "measurements stand")
            exit_code = ExitCode.INTERRUPTED
        result = redact_value(self._result().dump())
        (self.run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        self.say("", "verdict", verdict=result["verdict"], recovery_s=(result.get("phases") or {}).get("recovery_s"))
        self._after_run()
        session.end()  # ended: nothing left for rollback
        if self.verdict == "error":
            raise self._error
        if exit_code == ExitCode.OK and result["verdict"] != "pass":
            exit_code = ExitCode.CHECK_FAILED
        return RunOutcome(int(exit_code), result, self.run_dir)

    def _after_run(self) -> None:
        if self.after_run is None:
            return
        try:
            said = self.after_run(self.run_dir)
        except Exception as exc:  # noqa: BLE001 - the run's data is safe in its JSON files; say so and go on
            self.say(f"[yellow]after the run:[/yellow] {type(exc).__name__}: {escape(str(exc))}")
        else:
            if said:
                self.say(escape(str(said)))

    def _preflight(self) -> None:
        """Reach every node, measure the clocks of those with their own, and let each fault check its targets,
        before anything starts."""
        watched = self.probes.watch_stop_conditions()  # stopped in _teardown, after the job and the probes
        if watched:
            self.say(f"{watched} stop condition(s) from Prometheus watched", "stop_conditions")
        self.cluster.connect()
        self._sync_clocks()
        self.session.mount_checkpoint_fs(self.sc.workload.checkpoint_fs, self.job_owner,
                                         ttl=self.sc.safety.abort_after + 120.0)
        for fault in _faults(self.sc):
            if fault.target_type == "node":
                fault.preflight(self.ctx, resolve_nodes(self.inventory, fault.spec.target))

    def _folders(self, run_dir: Path) -> JobFolders:
        """Where the job's files go (:meth:`Job.folders`), once the run folder is made."""
        sc = self.sc
        return self.job_cls.folders(self.cluster, sc.workload, run_dir, self.run_id, owned=self.job_owner is not None,
                                    sdk=bool(sc.probes.sdk), inproc=uses_inproc_channel(sc))

    def _sync_clocks(self) -> None:
        """Each remote node's clock offset (:func:`~chaoskit.cluster.clock.sync_clocks`): the times its transport
        reports from now on are on this machine's clock."""
        self.clocks = sync_clocks({n.name: n.conn for n in self.inventory.nodes})
        far = far_clocks(self.clocks)
        if far:
            self.say(f"clocks: {far} against this machine (corrected)", "clocks")

    def _start(self) -> None:
        sc, owner = self.sc, self.job_owner
        folders = self.session.make_job_folder(owner)
        self.probes.start(folders, owner)
        self.job = make_job(self.cluster, sc.workload, self.run_dir, self.run_id, folders.sdk_events, self.probes.on_line,
                            base=self.loaded.path.parent)
        self.probes.watch_silent_data()
        if uses_inproc_channel(sc) and self.job.bootstraps:  # its processes take chaoskit's bootstrap, and the channel's folder
            self.job.use_inproc({n: self.ctx.inproc_folder(n) for n in self.cluster.agent_nodes},
                                sdc_every=sc.probes.sdc.every if sc.probes.sdc is not None else None,
                                final_checksum=any(get_fault(f.kind).needs_final_checksum for f in sc.faults))
        spares = len(self.cluster.agent_nodes) - len(self.cluster.job_nodes)
        if self.probes.process_watcher is not None:  # a job that looks at the nodes pays only for what their watch streams report
            self.job.use_watch(self.probes.process_watcher)
        if not self.job.started:
            self.say(f"{self.cluster.kind} [bold]{escape(self.cluster.id)}[/bold]: attaching to {escape(self.job.found_where())} "
                     f"(processes matching '{escape(sc.workload.process or '')}')", "started", attached=True)
        else:
            length = "until its script ends" if self.job.finish_step() is None else f"{sc.workload.steps} steps"
            self.say(
                f"{self.cluster.kind} [bold]{escape(self.cluster.id)}[/bold]: {len(self.cluster.job_nodes)} nodes x "
                f"{sc.workload.nproc_per_node} worker(s){f' + {spares} spare' if spares else ''}; "
                f"starting the {sc.workload.launch} job ({length})", "started", attached=False,
            )
            self.say(escape(self.job_user.line(self.cluster, self.notes)), "job_user")
        self.job.start()

    def _job_process_users(self) -> None:
        """Who the job's processes run as once it trains (result.json's cluster ``job_process_users``)."""
        users = job_process_users(self.cluster)
        if users:
            self.cluster.details["job_process_users"] = users

    def _baseline(self) -> None:
        need, timeout = self.sc.steady_state.steps, self.sc.steady_state.timeout
        every_group = stack_of(self.sc.workload).every_group_steady

        def steady() -> bool:
            if not self.job.scope_chosen():
                return False
            if (self.bus.last_step or 0) < need:
                return False
            if not every_group:
                return True
            # a stack whose survivors train on while a group starts: step N says nothing of the others; a fault
            # must find every replica group in the quorum (each has committed a step), not one still importing torch
            stepped = {e.get("node") for e in self.bus.snapshot() if e.get("kind") == "step"}
            return set(self.cluster.job_nodes) <= stepped

        ok = self._wait(steady, timeout, what="steady state")
        if not ok:
            raise InfraError(
                f"the job did not reach steady state: no step {need}"
                + (" committed by every replica group" if every_group else "") + f" within {timeout:g}s"
                + (f": {self.job.diagnosis()}" if self.job.diagnosis() else ""),
                hint=f"see the job's output under {self.run_dir / 'logs'}",
            )
        self.t_baseline = time.time()
        self.say(f"steady state: step {self.bus.last_step} reached", "steady", step=self.bus.last_step)
        for i, fault in enumerate(_faults(self.sc)):
            if fault.target_type == "process" and not resolve_processes(self.inventory, fault.spec.target, on_silent=(
                    lambda node, why, i=i: self._note(f"faults.{i}.target: node {node} did not answer at steady state ({why})"))):
                raise InfraError(f"faults.{i}.target: no process matches {fault.spec.target.describe()} on "
                                 f"{', '.join(n.name for n in self.inventory.select(fault.spec.target.nodes, fault.spec.target.labels))} "
                                 "while the job runs; nothing was injected")
        spares = self.job.start_spares()
        if spares:
            self.say(f"spare node(s) {', '.join(spares)} waiting to take over", "spares", nodes=list(spares))

    def _inject(self, fault: Fault) -> None:
        spec = fault.spec
        until = None
        if spec.at.waits_for_event:
            until = self._await_event(fault)  # a cascade strikes during a recovery: the game day's gate never holds it
        elif spec.at.step is not None:
            ok = self._wait(lambda: (self.bus.last_step or 0) >= spec.at.step, self.deadline - time.time(), what=f"step {spec.at.step}")
            if not ok:
                raise SafetyAbort(f"the job never reached step {spec.at.step}")
        else:
            self._wait(lambda: False, max(0.0, self.t_baseline + spec.at.after - time.time()), what="trigger", quiet=True)
        if self.gate is not None and not spec.at.waits_for_event:
            self._hold(fault)
        self._strike(fault, spec.target, until)

    def _strike(self, fault: Fault, target: TargetSpec, until: float | None = None) -> None:
        """Resolve ``target`` now and inject ``fault`` there: journaled, on the timeline, verified. With ``until`` (an
        event trigger's window) a process target that matches nothing yet is looked for again until then: a
        trigger fired in a recovery may find the job's workers between worlds (the agents stopped the old ones and
        have not started the new), and the fault strikes the first that matches."""
        i = int(fault.fault_id[1:].split(".")[0])
        t0, again = time.time(), False
        while True:
            targets, waited = self._resolve_target(fault, target, i, until)
            again = again or waited
            nodes = {t.node for t in targets}
            if len(nodes) > self.sc.safety.max_nodes:
                raise self.loaded.error(
                    f"faults.{i}.target matches processes on {len(nodes)} nodes but safety.max_nodes is {self.sc.safety.max_nodes}",
                    "faults", i, "target",
                )
            for t in targets:
                self.journal.record("inject", fault_id=fault.fault_id, kind=fault.kind, node=t.node, target=t.label(), pid=getattr(t, "pid", None))
            try:
                injections = fault.inject(self.ctx, targets)
                break
            except TargetGone as exc:  # resolved, then gone before the strike (the agents stopping the old world)
                if until is None or time.time() >= until or len(targets) > 1:
                    raise
                self._note(f"faults.{i}: {exc}; its target is looked for again")
                again = True
                self._check_abort()
                time.sleep(TARGET_POLL_S)
        if again:
            self._note(f"faults.{i}: no process matched {target.describe()} when its trigger fired (the job's "
                       f"workers were between worlds); it struck the first that did, {time.time() - t0:.1f}s later")
        for inj in injections:
            self.probes.injected(inj)
            self.journal.record("injected", fault_id=inj.fault_id, kind=inj.kind, node=inj.node, targets=inj.targets, t_fault=inj.t_fault)
            self.bus.publish(make_event("fault.injected", inj.t_fault, node=inj.node, fault=inj.fault_id, fault_kind=inj.kind, targets=inj.targets,
                                        source="chaoskit", **inj.mechanism()))
            self.injections.append((fault, inj))
        labels = ", ".join(dict.fromkeys(t for inj in injections for t in inj.targets))  # gpu.xid with_failure: line and failure, one target
        how = sorted({f"{m['mechanism']}, {m['fidelity']}" for m in (inj.mechanism() for inj in injections) if m})
        self.say(f"[bold red]inject[/bold red] {fault.kind} -> {labels} (step {self.bus.last_step})" + (escape(f" [{'; '.join(how)}]") if how else ""), "injected",
                 fault=fault.fault_id, fault_kind=fault.kind, targets=list(dict.fromkeys(t for inj in injections for t in inj.targets)),
                 step=self.bus.last_step)
        for inj in injections:
            problem = fault.verify(self.ctx, inj) if not fault.lasting else None
            if problem:
                self.notes.append(f"{fault.kind} on {inj.node}: {problem}")
            if inj.detail.get("note"):  # what chaoskit set aside of the fault's own word (an in-process time)
                self._note(f"{fault.kind} on {inj.node}: {inj.detail['note']}")

    def _resolve_target(self, fault: Fault, target: TargetSpec, i: int, until: float | None) -> tuple[list, bool]:
        """``target``'s nodes or processes now, and whether they were looked for more than once: with ``until``, a
        process target that matches nothing is looked for again until then. Raises when nothing matches."""
        waited = False
        if fault.target_type == "node":
            targets = resolve_nodes(self.inventory, target)
        else:  # every node asked at once, each with its own deadline: a silent one delays (and staleness) nobody
            def resolve() -> list:
                return resolve_processes(self.inventory, target, on_silent=lambda node, why: self._note(
                    f"faults.{i}.target: node {node} did not answer while the target was resolved ({why}); "
                    "its processes were not candidates"))
            targets = resolve()
            while not targets and until is not None and time.time() < until and (self.job is None or self.job.running()):
                self._check_abort()
                self._revert_due()
                time.sleep(TARGET_POLL_S)
                targets, waited = resolve(), True
        if not targets:
            raise InfraError(f"faults.{i}.target: no process matches {target.describe()} now")
        return targets, waited

    def _recur_due(self) -> None:
        """A node that keeps failing (a fault's ``recur``): once a worker of the job starts again on a node the fault
        struck, strike there again (after ``recur.after``), until ``recur.times`` returns are used. A return is a
        fault of its own (``f<i>.r<n>``): journaled, leased, measured."""
        for fault in self.recurring:
            recur = fault.spec.recur
            done = self.returns.get(fault.fault_id, 0)
            family = [(f, inj) for f, inj in self.injections if f.fault_id.split(".")[0] == fault.fault_id]
            if not family or (recur.times is not None and done >= recur.times):
                continue
            if any(f.lasting and not inj.reverted for f, inj in family):
                continue  # still in effect where it struck last
            nodes = {inj.node for _, inj in family}
            last = max(inj.t_fault for _, inj in family)
            start = next((e for e in self.bus.snapshot() if e.get("kind") == "worker.start" and e.get("node") in nodes
                          and e["ts"] > last), None)
            if start is None or time.time() < start["ts"] + recur.after:
                continue
            n = done + 1
            self.returns[fault.fault_id] = n
            again = get_fault(fault.kind)(fault.spec, f"{fault.fault_id}.r{n}")
            target = (fault.spec.target if fault.target_type == "node" else fault.spec.target.model_copy(
                update={"nodes": [start["node"]], "ranks": None, "labels": None, "count": None, "percent": None}))
            self.say(f"the job came back to {escape(str(start['node']))}: {fault.kind} strikes again (return {n}"
                     + (f" of {recur.times}" if recur.times else "") + ")", "strikes_again",
                     fault=fault.fault_id, fault_kind=fault.kind, node=start["node"], returns=n)
            try:
                self._strike(again, target)
            except InfraError as exc:  # the worker was gone again before the strike: the next start is the next return
                self._note(f"{fault.kind}'s return {n} to {start['node']}: {exc}")

    def _await_event(self, fault: Fault) -> float:
        """Wait for a fault's event trigger (:mod:`chaoskit.triggers`), then its ``after``; raise
        :class:`TriggerMissed` when the event does not come within its ``within`` or before the job ends. Returns
        the end of that window (the fault's target may still be looked for until then)."""
        at = fault.spec.at
        i = int(fault.fault_id[1:])
        ids = {name: f"f{j}" for name, j in self.sc.fault_names().items()}
        ref = ids[at.during.fault] if at.during is not None else None
        ref_t = next((inj.t_fault for f, inj in self.injections if f.fault_id == ref), None)
        since = self.injections[-1][1].t_fault if self.injections else self.t_baseline
        watch = TriggerWatch(at, ids, since, ref_t)
        t0 = time.time()
        end = t0 + watch.within
        self.say(f"faults.{i}: waiting for {escape(what_it_waits_for(at))}", "waiting", fault=fault.fault_id)
        while not self.bus.wait_for(lambda: watch.feed(self.bus.events) is not None, 0.1):
            self._check_abort()
            self._revert_due()
            running = self.job is None or self.job.running()
            if time.time() >= end or not running:
                why = f"within {watch.within:g}s (faults.{i}.at.within)" if running else "before the job ended"
                raise TriggerMissed(f"faults.{i} ({fault.kind}, at {at.describe()}) never fired: "
                                    f"{what_it_waits_for(at)} did not come {why}; it waited {time.time() - t0:.1f}s, "
                                    "and it and the faults after it were not injected")
        self.fired[fault.fault_id] = Fired(watch.fired, time.time() - t0)
        if at.after:
            self._wait(lambda: False, max(0.0, watch.fired["ts"] + at.after - time.time()), what="trigger", quiet=True)
        return end

    def _note(self, message: str) -> None:
        """A note for result.json, once (resolution may run from several threads)."""
        if message not in self.notes:
            self.notes.append(message)

    def _hold(self, fault: Fault) -> None:
        """Wait while the gate says why the fault must not come yet; say how long it was held."""
        since = self.injections[-1][1].t_fault - 1.0 if self.injections else 0.0
        def why() -> str | None:
            if any(not inj.reverted for f, inj in self.injections if f.lasting):
                return "the previous fault is still in effect"
            return self.gate([e for e in self.bus.snapshot() if e["ts"] >= since], [inj.t_fault for _, inj in self.injections])

        reason, t0 = why(), time.time()
        if reason is None:
            return
        self.say(f"holding {fault.kind}: {escape(str(reason))}", "holding", fault=fault.fault_id, why=str(reason))
        while reason is not None:
            self._wait(lambda: False, 0.5, what="the gate", quiet=True)
            reason = why()
        self.notes.append(f"{fault.kind} ({fault.spec.at.describe()}) held back {time.time() - t0:.1f}s: {reason or 'until the previous recovery ended'}")

    def _observe(self) -> None:
        sc = self.sc
        felt = [inj for fault, inj in self.injections if not fault.primes] or [inj for _, inj in self.injections]
        t_fault = felt[0].t_fault if felt else time.time()
        announced: set[str] = set()
        realloc_label = stack_of(sc.workload).reallocation_label
        while True:
            self._check_abort()
            self._revert_due()
            self._recur_due()
            if len(announced) == 4 and sc.workload.wait != "recovered":
                m = {"t_resumed": None}  # all said: a long job (a campaign) need not be measured ten times a second
            else:
                m = self.measure(self.bus.snapshot(), t_fault, node=felt[0].node if felt else None)  # progress lines only; result.json measures with clocks
            for key, label, stage in () if len(announced) == 4 else (("t_detect", "detected", "detected"), ("t_realloc", realloc_label, "reallocated"), ("t_loaded", "checkpoint loaded", "loaded"), ("t_resumed", "training resumed", "resumed")):
                if m[key] is not None and key not in announced:
                    announced.add(key)
                    # the job's own words (an exception's text, "[.../pair.cc:537] Connection closed") are not markup
                    extra = f" by {escape(m['detected_by'])}" if key == "t_detect" else ""
                    self.say(f"{label} {m[key] - t_fault:.2f}s after the fault{extra}", stage,
                             after_s=m[key] - t_fault, **({"detected_by": m["detected_by"]} if key == "t_detect" else {}))
            pending = any(not inj.reverted for _, inj in self.injections if _.lasting)
            if not pending and self._watched_long_enough():
                return
            if not self.job.running():
                if pending:  # the job has ended: a fault still in effect has nothing left to drill
                    self.say("the job has ended; reverting the faults still in effect", "job_ended")
                    self._revert_due(force=True)
                return
            felt = [inj for fault, inj in self.injections if not fault.primes] or [inj for _, inj in self.injections]
            if len(felt) > 1 and m["t_resumed"] is not None:  # an incident of several faults ends with the last's recovery
                m = self.measure(self.bus.snapshot(), felt[-1].t_fault, node=felt[-1].node)
            if sc.workload.wait == "recovered" and m["t_resumed"] is not None:
                if not pending:
                    return
                if self.cut_short and not any(f.measures_slowdown for f, inj in self.injections if f.lasting and not inj.reverted):
                    # recovery is measured and nothing after it is: the rest of the faults' durations drills nothing
                    left = [inj.kind for f, inj in self.injections if f.lasting and not inj.reverted]
                    self.say(f"recovery measured; reverting {', '.join(left)} before its duration is up", "cut_short", fault_kinds=left)
                    self.notes.append(f"{', '.join(left)} reverted {time.time() - t_fault:.1f}s after the fault, once recovery "
                                      "was measured (a game day stops each drill there; set workload.wait to keep every duration)")
                    self._revert_due(force=True)
                    return
            time.sleep(0.1)

    def _watched_long_enough(self) -> bool:
        """A drill that must not restart the job (``expect: {restart: false}``) with a ``window``: watched that long
        since its last fault ended."""
        window = self.sc.expect.window
        if self.sc.expect.restart or window is None:
            return False
        events = self.bus.snapshot()
        ended = [next((e["ts"] for e in events if e.get("kind") == "fault.reverted" and e.get("fault") == inj.fault_id),
                      inj.t_fault) for _, inj in self.injections]
        return time.time() >= max(ended, default=0.0) + window

    def _check_abort(self) -> None:
        fired = self.probes.stop_fired
        if fired is not None:
            raise SafetyAbort(f"{fired['message']}; every fault reverted")
        if time.time() > self.deadline:
            raise SafetyAbort(f"safety.abort_after ({self.sc.safety.abort_after:g}s) reached; every fault reverted")

    def _revert_due(self, force: bool = False) -> None:
        for fault, inj in self.injections:
            if inj.reverted or not fault.lasting:
                continue
            due = fault.duration is not None and time.time() >= inj.t_fault + fault.duration
            if force or due:
                self._revert(fault, inj)

    def _revert(self, fault: Fault, inj: Injection) -> None:
        try:
            fault.revert(self.ctx, inj)
            problem = fault.verify(self.ctx, inj)
        except InfraError as exc:
            problem = str(exc)
        inj.reverted = True
        if problem is None:
            self.leases.release(inj.fault_id)
        else:  # leave the node's watchdog armed: it reverts by itself when the lease goes stale
            self.leases.abandon(inj.fault_id)
        ts = time.time()
        self.journal.record("reverted", fault_id=inj.fault_id, kind=inj.kind, node=inj.node, verified=problem is None, problem=problem)
        self.bus.publish(make_event("fault.reverted", ts, node=inj.node, fault=inj.fault_id, fault_kind=inj.kind, source="chaoskit"))
        self.say(f"reverted {inj.kind} on {', '.join(inj.targets)}" + (f" [red]({escape(str(problem))})[/red]" if problem else ""), "reverted",
                 fault=inj.fault_id, fault_kind=inj.kind, targets=list(inj.targets), verified=problem is None)
        if problem:
            self.notes.append(f"revert of {inj.kind} on {inj.node} not verified: {problem}")

    def _teardown(self) -> None:
        try:
            self._revert_due(force=True)
        finally:  # each step whatever the one before raised: the session lets the cluster go last
            try:
                if self.job is not None:
                    self.job.stop()
            finally:
                try:
                    self.probes.stop()
                finally:
                    self.session.close()

    def _wait(self, predicate, timeout: float, what: str, quiet: bool = False) -> bool:
        """Wait for ``predicate`` while the job runs; abort on the safety deadline."""
        end = time.time() + max(0.0, timeout)
        while time.time() < end:
            if predicate():
                return True
            self._check_abort()
            self._revert_due()
            if self.job is not None and not self.job.running():
                if predicate():
                    return True
                codes = self.job.returncodes()
                why = self.job.diagnosis()
                if self.bus.last_step is None:  # it may have trained to the end: nothing read a step of it
                    why = "; ".join(filter(None, [why, NO_STEP_SEEN]))
                raise InfraError(f"the training job ended before {what} (agent exit codes {codes})" + (f": {why}" if why else ""),
                                 hint=f"see {self.run_dir / 'logs'}")
            self.bus.wait_for(predicate, min(0.1, max(0.0, end - time.time())))
        return predicate()

    # -- results ------------------------------------------------------------------------

    def _result(self) -> RunResult:
        """The run's result (:func:`~chaoskit.assembler.assemble`), once what its probes could not read is noted."""
        for problem in (self.probes.problems() + list(self.job.line_errors if self.job is not None else [])[:5]
                        + self.probes.watch_notes()):
            if problem not in self.notes:
                self.notes.append(problem)
        return assemble(RunRecord(
            sc=self.sc, scenario_file=self.loaded.path, run_dir=self.run_dir, cluster=self.cluster,
            capabilities=self.capabilities, t0=self.t0, t_baseline=self.t_baseline, events=self.bus.snapshot(),
            injections=self.injections, fired=self.fired, recurring=self.recurring, missed=self.missed,
            verdict=self.verdict, notes=self.notes, job=self.job, clocks=self.clocks,
            stop_fired=self.probes.stop_fired, disagree_at_end=self.probes.disagree_at_end))

    def measure(self, events: list[dict[str, Any]], t_fault: float, node: str | None = None) -> dict[str, Any]:
        """One fault's recovery as the run watches it (its progress lines), with the scenario's recovery model."""
        return stack_of(self.sc.workload).measure(events, t_fault, 0.0, node=node)


def install_sigterm():
    """SIGTERM behaves like Ctrl-C (revert, then exit 130) while a run is live."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


FORCE_AFTER = 3
"""Ctrl-C (or SIGTERM) this many times during a teardown abandons it: a last way out of one that hangs."""


@contextlib.contextmanager
def interrupts_deferred(say: Callable[[str], None] | None = None):
    """Ctrl-C and SIGTERM wait until the block is done, and the list it yields holds each that came: a teardown
    cut half way leaves a lab, a job or a fault's lease behind. The :data:`FORCE_AFTER`-th raises at once."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def hold(signum, frame):  # noqa: ARG001
        came.append(signum)
        if len(came) >= FORCE_AFTER:
            raise KeyboardInterrupt
        if say is not None:
            say(f"interrupted: finishing the teardown first ({FORCE_AFTER - len(came)} more to abandon it)")

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield came
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
