"""The result assembler: what a finished run recorded (:class:`RunRecord`: its timeline, what was injected, what
the checks read) made into its ``result.json`` (:class:`~chaoskit.core.result.RunResult`). It starts, stops and
connects to nothing; the runner hands it the record once the teardown is done.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.backends.api import ClusterHandle
from chaoskit.blame import attach_blame
from chaoskit.cluster.clock import ClockOffset
from chaoskit.core.launches import LAUNCHES
from chaoskit.core.phases import PHASE_TABLE, SLO_PHASES
from chaoskit.core.result import RunResult
from chaoskit.coverage import Capabilities
from chaoskit.faults.api import Fault, Injection
from chaoskit.goodput import account, goodput_terms
from chaoskit.measure import (
    baseline_restarts, false_restart, incident, measure_checkpoint_io, measure_slowdown, node_returns,
    reallocation_steps, slo_verdict, unseen_signals,
)
from chaoskit.observe.sdc import silent_summary
from chaoskit.stacks.registry import log_presets, stack_of
from chaoskit.triggers import Fired
from chaoskit.workloads.api import Job

__all__ = ["RunRecord", "assemble"]


@dataclass
class RunRecord:
    """What a run recorded, all its result is made of."""

    sc: Any
    """The scenario's model."""
    scenario_file: Path
    run_dir: Path
    cluster: ClusterHandle
    capabilities: Capabilities
    t0: float
    """When the run started (this machine's clock)."""
    t_baseline: float | None
    """When steady state was reached, or ``None`` when it was not."""
    events: list[dict[str, Any]]
    """The timeline (``events.jsonl``)."""
    injections: list[tuple[Fault, Injection]]
    fired: dict[str, Fired]
    """Each event-triggered fault's trigger, by fault id, once it fired."""
    recurring: list[Fault]
    """The faults that strike again where the job comes back (``recur``)."""
    missed: str | None
    """Why a trigger never fired, or ``None``."""
    verdict: str | None
    """``aborted``, ``interrupted`` or ``error`` when the run ended so; ``None``: the checks decide."""
    notes: list[str]
    """The run's notes; the assembler adds what it finds to this list."""
    job: Job | None
    clocks: dict[str, ClockOffset]
    stop_fired: dict[str, Any] | None = None
    """The ``safety.stop_when`` condition that fired, or ``None``."""
    disagree_at_end: Any = None
    """What the in-process checksums said of the replicas at the job's end (a silent fault's watch), or ``None``."""


def assemble(r: RunRecord) -> RunResult:
    """The run's :class:`~chaoskit.core.result.RunResult`: only the keys that apply, in result.json's order."""
    events = r.events
    per_fault = []
    slowdown = None
    for fault, inj in r.injections:
        # an in-process fault's answer names the step its process was training: the lines it logged before
        # the fault may be read a moment after it (measure.steps_before)
        m = _measure(r, events, inj.t_fault, _clock_error(r, inj.node), node=inj.node,
                     fault_step=inj.detail.get("step"))
        steps = reallocation_steps(events, m["t_detect"], m["t_realloc"], r.cluster.details.get("slurm"))
        if steps:
            m["reallocation_steps"] = steps
        per_fault.append({"fault": inj.fault_id, "kind": inj.kind, "node": inj.node, "targets": inj.targets, "t_fault": inj.t_fault, **m})
        fired = r.fired.get(fault.fault_id)
        if fired is not None:
            per_fault[-1]["trigger"] = fired.record(fault.spec.at, inj.t_fault)
        if fault.measures_slowdown and slowdown is None:
            t_revert = next((e["ts"] for e in events if e.get("kind") == "fault.reverted" and e.get("fault") == inj.fault_id), None)
            slowdown = measure_slowdown(events, inj.t_fault, t_revert)
    # The headline is the first fault the job feels: a corrupted checkpoint only matters at the restart a later
    # fault causes, and the work lost counts from that fault's last step to the (older) step restored.
    # A fault the job did not feel by itself (chaoskit's own link to a node cut, then a kill elsewhere) has the
    # later fault's detection as its own: the headline is the first fault detected before the next one came.
    felt = [m for (fault, _), m in zip(r.injections, per_fault) if not fault.primes]
    by_itself = [m for m in felt if m["t_detect"] is not None
                 and not any(m["t_fault"] < o["t_fault"] < m["t_detect"] for o in per_fault)]
    phases_full = (by_itself or felt or per_fault or [None])[0]
    unseen = (unseen_signals(phases_full, events, {p: log_presets()[p].sees for p in r.sc.probes.presets})
              if phases_full else {})
    slo_cfg = r.sc.slo.model_dump()
    slo = slo_verdict(phases_full or {"reasons": {p.name: "no fault was injected" for p in SLO_PHASES}}, slo_cfg)
    steps = [e["step"] for e in events if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    final_step = max(steps) if steps else None
    recurrence = [node_returns(events, struck, f.spec.recur.times) for f in r.recurring
                  if (struck := [m for m in per_fault if m["fault"].split(".")[0] == f.fault_id])]
    if r.sc.slo.returns is not None:
        came = sum(r["returns"] for r in recurrence)
        slo["returns"] = {"limit": r.sc.slo.returns, "measured": came, "pass": came <= r.sc.slo.returns}
    checks: dict[str, Any] = {}
    if r.t_baseline is not None:
        checks["steady_state"] = {"pass": True, "step": r.sc.steady_state.steps}
        if r.injections:  # a worker that exited or a world that restarted before the first fault: not steady
            allowed = r.sc.steady_state.restarts_allowed
            # a job found running: its log's history and its restarts before steady state are not this
            # baseline's (they are read at once when the run attaches); a job chaoskit started: all of them
            found = LAUNCHES[r.sc.workload.launch].found
            restarts, first = baseline_restarts(events, min(inj.t_fault for _, inj in r.injections),
                                                found=found, since=r.t_baseline if found else r.t0)
            checks["steady_state"].update(restarts=restarts, restarts_allowed=allowed)
            if restarts > allowed:
                why = (f"the baseline was not steady: {restarts} restart{'s' if restarts != 1 else ''} of the job's "
                       f"workers before the first fault ({first}); steady_state.restarts_allowed is {allowed}")
                checks["steady_state"].update({"pass": False, "reason": why})
                _note(r, why)
            elif restarts:
                _note(r, f"{restarts} restart{'s' if restarts != 1 else ''} of the job's workers before the first "
                           f"fault ({first}), within steady_state.restarts_allowed: {allowed}")
    if not r.sc.expect.restart and r.injections:
        checks["no_restart"] = _no_restart_check(r, events, phases_full)
    if r.missed is not None:
        checks["triggered"] = {"pass": False, "reason": r.missed}
        _note(r, r.missed)
    elif r.fired:
        checks["triggered"] = {"pass": True}
    if r.sc.workload.wait == "finish" and r.verdict is None and r.job is not None:
        checks["training_finished"] = r.job.finished(final_step)
    reverted_ok = all(inj.reverted for f, inj in r.injections if f.lasting)
    if any(f.lasting for f, _ in r.injections):
        checks["faults_reverted"] = {"pass": reverted_ok}
    if slowdown is not None and r.verdict is None and not (slowdown.get("throughput_lost_pct") or 0) > 0:
        r.notes.append("the slowdown did not slow the job: its step time did not grow while the fault lasted")
    elif (slowdown is None and phases_full and phases_full["t_detect"] is None and phases_full.get("t_realloc") is None
          and r.verdict is None and r.sc.expect.restart and checks.get("training_finished", {}).get("pass")):
        r.notes.append("the job showed no sign of the fault: nothing detected it and training never stopped")
    silent = _silent(r, events)
    if silent is not None:
        checks["silent_fault_detected"] = {"pass": silent["detected"], **({"reason": silent["reason"]} if "reason" in silent else {})}
        if "reason" in silent and silent["reason"] not in r.notes:
            r.notes.insert(0, silent["reason"])
    verdict = r.verdict
    if verdict is None:
        verdict = "pass" if all(v["pass"] for v in slo.values()) and all(c["pass"] for c in checks.values()) else "fail"
    phases = {p.key: (phases_full or {}).get(p.key) for p in PHASE_TABLE}
    if phases_full:
        phases["restored_step"] = phases_full["restored_step"]
        for key in ("restored_from", "reallocation_from"):  # which line gave them (not in torchft's)
            if phases_full.get(key) is not None:
                phases[key] = phases_full[key]
        phases["last_step_before"] = phases_full["last_step_before"]
        phases["detected_by"] = phases_full["detected_by"]
        phases["detections"] = phases_full["detections"]
        phases["reasons"] = phases_full["reasons"]
        phases["uncertainty_s"] = phases_full["uncertainty_s"]
        if phases_full.get("reallocation_steps"):
            phases["reallocation_steps"] = phases_full["reallocation_steps"]
        if unseen:
            phases["unseen"] = unseen
        phases["model"] = phases_full["model"]
        # the torchft model's lost work, in parts; who in NVRx noticed; whether the in-process restart kept every process
        for key in ("discarded_steps", "catch_up_steps", "healed_group", "rank_monitor", "wrapper", "in_process",
                    "world_size"):
            if key in phases_full:
                phases[key] = phases_full[key]
    if silent is not None and phases.get("lost_steps") is None:
        phases["lost_steps"] = silent["lost_steps"]  # back to the last clean checkpoint
    return RunResult(**{
        "scenario": r.sc.name,
        "scenario_file": str(r.scenario_file),
        "verdict": verdict,
        "started_at": _iso(r.t0),
        "ended_at": _iso(time.time()),
        "duration_s": round(time.time() - r.t0, 3),
        "run_dir": str(r.run_dir),
        "cluster": r.cluster.info(),
        "workload": r.sc.workload.model_dump(),
        "recovery_model": r.sc.workload.recovery,
        "faults": [{"kind": inj.kind, "fault": inj.fault_id, "node": inj.node, "targets": inj.targets, "t_fault": inj.t_fault,
                    **inj.mechanism()} for _, inj in r.injections],
        "phases": phases,
        "slo": slo,
        "checks": checks,
        "per_fault": per_fault,
        **attach_blame(per_fault, events, phases_full, getattr(r.job, "root_cause", None)),  # whom the stack named
        **({"incident": incident(felt)} if len(felt) > 1 else {}),
        **({"recurrence": recurrence} if recurrence else {}),
        **({"slowdown": slowdown} if slowdown is not None else {}),
        **_checkpoint_io(r, events),
        **({"silent": silent} if silent is not None else {}),
        "final_step": final_step,
        # the run's lost time in ml-goodput-measurement's buckets, beside a production goodput dashboard
        "goodput": goodput_terms(account(events, per_fault), per_fault),
        "notes": r.notes,
        "capabilities": r.capabilities.as_dict(),
        "clocks": {name: c.as_dict() for name, c in r.clocks.items()},
        **({"stop_condition": r.stop_fired} if r.stop_fired else {}),
        **(r.job.result_part() if r.job is not None else {}),
        # which signals each log preset could not see: a phase it left unmeasured is explained here
        **({"presets": {name: {"sees": list(p.sees), "cannot_see": p.cannot_see, "verbosity": p.verbosity}
                        for name, p in ((n, log_presets()[n]) for n in r.sc.probes.presets)}}
           if r.sc.probes.presets else {}),
    })


def _checkpoint_io(r: RunRecord, events: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"checkpoint_io": ...}`` for the first fault that harms the checkpoint storage (its save and load times
    before, during and after it), or ``{}``."""
    for fault, inj in r.injections:
        if fault.measures_checkpoint_io:
            t_revert = next((e["ts"] for e in events if e.get("kind") == "fault.reverted"
                             and e.get("fault") == inj.fault_id), None)
            nodes = {i.node for f, i in r.injections if f is fault}  # the storage harmed: those nodes'
            return {"checkpoint_io": {"fault": fault.fault_id, "nodes": sorted(nodes),
                                      **measure_checkpoint_io(events, inj.t_fault, t_revert, nodes)}}
    return {}


def _no_restart_check(r: RunRecord, events: list[dict[str, Any]], phases: dict[str, Any] | None) -> dict[str, Any]:
    """``checks.no_restart`` of a drill with ``expect: {restart: false}``: passed when the job rode through the
    disturbances; else the false restart, who made it, and what it cost (the headline's recovery and lost work)."""
    t_first = min(inj.t_fault for _, inj in r.injections)
    found = false_restart(events, t_first)
    if found is None:  # rode through: the summary and the report say so
        return {"pass": True}
    cost = {k: (phases or {}).get(k) for k in ("recovery_s", "lost_steps")}
    why = (f"a false restart: {found['what']} {found['after_s']:.2f}s after the first fault, a disturbance the "
           f"job should have ridden through (expect.restart: false); it cost "
           + ("an unmeasured recovery" if cost["recovery_s"] is None else f"{cost['recovery_s']:.2f}s of recovery")
           + " and " + ("unmeasured lost work" if cost["lost_steps"] is None else f"{cost['lost_steps']} steps"))
    _note(r, why)
    return {"pass": False, "reason": why, "false_restart": {**found, **cost}}


def _silent(r: RunRecord, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first silent fault's own measure (a bit flip, NaN: nothing fails by itself), or ``None``."""
    for fault, inj in r.injections:
        if fault.silent:
            return silent_summary(events, inj.t_fault, inj.detail.get("step"), r.disagree_at_end,
                                  fault.describe(inj))
    return None


def _clock_error(r: RunRecord, node: str) -> float:
    clock = r.clocks.get(node)
    return clock.error_s if clock is not None else 0.0


def _measure(r: RunRecord, events: list[dict[str, Any]], t_fault: float, t_fault_uncertainty: float = 0.0,
             node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """One fault's recovery, measured with the scenario's recovery model (``workload.recovery``)."""
    return stack_of(r.sc.workload).measure(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)


def _note(r: RunRecord, message: str) -> None:
    """A note for result.json, once."""
    if message not in r.notes:
        r.notes.append(message)


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
