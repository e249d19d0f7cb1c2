"""``chaoskit campaign``: one long training run with faults arriving at a real rate, measured as ETTR.

A drill asks "did this one fault recover"; a campaign asks "how much of our training time do
failures cost". It takes a scenario as the menu (its cluster, its job, its blast radius, and
its ``faults:`` as the kinds to draw from, each with its settings), then:

1. **Draws** the faults: arrival times of a Poisson process of mean gap ``mtbf`` over the
   campaign's ``duration`` (after steady state), each fault's kind from the scenario's faults
   weighted by the catalog's real-world counts of the classes that kind exercises (plus one, so
   that no listed kind is impossible), and its
   target at random inside the blast radius (one random rank for a rank target, one random
   job node for a node target). The seed and every draw are printed and recorded: the same
   seed replays the same faults.
2. **Runs** them in one job (an ordinary run into ``<out>/run/``, so its result.json,
   events, journal and report are a drill's), holding a fault back while the previous one's
   recovery is in progress (``--overlap`` lets them collide), for as long as it takes the job
   to train ``duration`` worth of steps.
3. **Measures** the effective training time ratio: time on steps that were kept over wall time
   (job start to last step), and the badput in buckets: start-up, detection, reallocation,
   checkpoint load, the first step after it, recomputed (lost) steps, checkpoint saves, and what
   none of those explains (a fault held back costs no training time: it only arrives later).
4. **Predicts** the same with the simulator's exact model (:func:`chaoskit.sim.model.goodput`)
   from this campaign's own figures: its step time, checkpoint interval and save cost, the
   rate of faults it suffered and the phases it measured; says the gap and the bucket that
   explains most of it.

It writes ``campaign.json`` (``{seed, duration_s, mtbf_s, faults: [{t, kind, target, phases}],
ettr: {measured, predicted}, badput: {<bucket>: seconds}, goodput: {badput_s: {<BadputType>: seconds}, ...},
stopped: {early, why, ...}, ...}``; ``goodput`` is the badput in the buckets of Google's ml-goodput-measurement,
:func:`chaoskit.goodput.goodput_terms`) and
``campaign.html``, also when the run stops early (the job ran out of restarts, a safety limit, Ctrl-C):
what it measured until then, and why it stopped (the run's error is not raised then: its exit code is
returned, and its message is in ``stopped.why``). Before it
starts, it warns when the job's ``max_restarts`` is below the faults the draw holds (torchrun would
give up before the campaign ends) and says how to raise it (:func:`restart_warning`).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from chaoskit.core.errors import ChaoskitError, ExitCode, ScenarioError
from chaoskit.core.files import EVENTS_FILE, RESULT_FILE, empty_out_dir, utc_iso, utc_stamp
from chaoskit.core.result import RunResult
from chaoskit.core.launches import LAUNCHES
from chaoskit.core.yaml_source import load_yaml
from chaoskit.coverage import catalog
from chaoskit.goodput import BUCKETS, account, goodput_terms
from chaoskit.measure import measure_fault
from chaoskit.observe.events import read_events
from chaoskit.runner import RunOutcome, run_scenario
from chaoskit.scenario import LoadedScenario, load_scenario, validate_data
from chaoskit.scenario.checks import preview_cluster
from chaoskit.sim import require_numpy

__all__ = ["plan_campaign", "run_campaign", "measure_campaign", "restart_warning", "CAMPAIGN_FILE", "BUCKETS"]

CAMPAIGN_FILE = "campaign.json"
TAIL = 0.1
"""No fault is drawn in the last tenth of the campaign: its recovery must fit in the run."""
MAX_FAULTS = 10_000


def plan_campaign(loaded: LoadedScenario, duration_s: float, mtbf_s: float, seed: int,
                  kinds: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The campaign's faults: ``[{t, kind, template, target}]``, ``t`` in seconds after steady state.

    Raises :class:`ScenarioError` when ``kinds`` names a kind the scenario has no fault of, or the
    numbers make no campaign (no positive duration or MTBF)."""
    if not (duration_s > 0 and mtbf_s > 0 and math.isfinite(duration_s) and math.isfinite(mtbf_s)):
        raise ScenarioError(f"a campaign needs a positive --duration and --mtbf, got {duration_s:g}s and {mtbf_s:g}s")
    templates = list(enumerate(loaded.model.faults))
    if kinds is not None:
        wanted = list(kinds)
        unknown = [k for k in wanted if k not in {f.kind for _, f in templates}]
        if unknown:
            raise ScenarioError(f"--kinds {', '.join(unknown)}: {loaded.path} has no fault of that kind",
                                hint=f"its faults: {', '.join(sorted({f.kind for _, f in templates}))}")
        templates = [(i, f) for i, f in templates if f.kind in wanted]
    weights = _kind_weights()
    per_kind: dict[str, int] = {}
    for _, f in templates:
        per_kind[f.kind] = per_kind.get(f.kind, 0) + 1
    # a kind's real-world weight, shared by the scenario's faults of that kind; a kind in no class weighs 1
    w = [weights.get(f.kind, 1) / per_kind[f.kind] for _, f in templates]
    preview = preview_cluster(loaded)
    world = len(preview.job_nodes) * loaded.model.workload.nproc_per_node
    rng = random.Random(seed)
    draws: list[dict[str, Any]] = []
    t = 0.0
    while len(draws) < MAX_FAULTS:
        t += rng.expovariate(1.0 / mtbf_s)
        if t > duration_s * (1 - TAIL):
            break
        index, spec = rng.choices(templates, weights=w)[0]
        target = spec.target.model_dump(mode="json", exclude_defaults=True)
        if target.get("ranks"):
            target["ranks"] = [rng.randrange(world)]
        elif target.get("nodes") and spec.target.ranks is None:
            target["nodes"] = [rng.choice(list(preview.job_nodes))]
        draws.append({"t": round(t, 3), "kind": spec.kind, "template": index, "target": target})
    return draws


def restart_warning(loaded: LoadedScenario, draws: list[dict[str, Any]], duration_s: float, mtbf_s: float) -> str | None:
    """Why the job may give up before the campaign ends: its ``workload.max_restarts`` is below the faults this
    draw holds, or below those the duration and MTBF make likely (each fault that kills a worker costs torchrun
    one restart); ``None`` when it is not, or when chaoskit does not start the job (``attach``, ``sbatch``)."""
    workload = loaded.model.workload
    if not LAUNCHES[workload.launch].restarts_own:
        return None
    expected = duration_s * (1 - TAIL) / mtbf_s
    need = max(len(draws), math.ceil(expected))
    if workload.max_restarts >= need:
        return None
    return (f"the job's workload.max_restarts is {workload.max_restarts}, but this draw holds {len(draws)} fault(s) "
            f"({expected:.1f} expected from --duration and --mtbf): torchrun gives up after {workload.max_restarts} "
            f"restart(s) and the campaign ends early. Raise it in {loaded.path} (workload: {{max_restarts: {need}}}), "
            "or give a longer --mtbf or a shorter --duration")


def _kind_weights() -> dict[str, int]:
    """Each fault kind's real-world weight: the interruptions of the catalog classes it exercises, plus one, so
    that a kind whose classes the data never saw (an OOM kill) is rare rather than impossible."""
    out: dict[str, int] = {}
    for cls in catalog():
        for kind in cls.kinds:
            out[kind] = out.get(kind, 1) + cls.weight
    return out


def campaign_scenario(loaded: LoadedScenario, draws: list[dict[str, Any]], duration_s: float) -> LoadedScenario:
    """The scenario the campaign runs: the menu's file with its faults replaced by the draws (each at its time
    after steady state), a job long enough for ``duration_s`` of steps, and room in ``safety.abort_after``."""
    data, smap = load_yaml(loaded.path, what="scenario")
    sc = loaded.model
    faults = []
    for d in draws:
        spec = dict(data["faults"][d["template"]])
        spec.pop("at", None)
        spec["target"] = d["target"]
        spec["at"] = {"after": d["t"]}
        faults.append(spec)
    if not faults:
        raise ScenarioError(f"the draw gave no fault in {duration_s:g}s: the MTBF is longer than the campaign",
                            hint="a longer --duration, a shorter --mtbf, or another --seed")
    workload = dict(data.get("workload") or {})
    workload["steps"] = max(sc.workload.steps, int(duration_s / sc.workload.step_time))
    workload["wait"] = "finish"
    safety = dict(data.get("safety") or {})
    safety["abort_after"] = max(sc.safety.abort_after, duration_s * 3 + 300)
    data = {**data, "faults": faults, "workload": workload, "safety": safety}
    checked = validate_data(loaded.path, data, smap)
    if isinstance(checked, list):
        raise checked[0]
    return checked


def run_campaign(path: str | Path, *, duration_s: float, mtbf_s: float, seed: int | None = None,
                 kinds: Iterable[str] | None = None, overlap: bool = False, out: Path | None = None, console=None,
                 after_run: Callable[[Path], Any] | None = None) -> tuple[int, dict[str, Any], Path]:
    """Draw, run and measure a campaign; return ``(exit_code, campaign.json's content, out)``.

    The exit code is the run's (0 when every fault was measured and the job finished, 1 otherwise; the error's
    when the run stopped on one, 3 for a job out of restarts, with ``stopped`` saying why); bad input raises
    :class:`ScenarioError` before anything starts, and an error before the run began is raised as it is."""
    loaded = load_scenario(path)
    require_numpy("a campaign's prediction (the simulator's model)")
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    draws = plan_campaign(loaded, duration_s, mtbf_s, seed, kinds)
    scenario = campaign_scenario(loaded, draws, duration_s)
    started = time.time()
    out = Path(out) if out else Path("reports") / f"{utc_stamp(started)}-{loaded.model.name}-campaign"
    empty_out_dir(out, "campaign")
    warning = restart_warning(loaded, draws, duration_s, mtbf_s)
    plan = {"seed": seed, "duration_s": duration_s, "mtbf_s": mtbf_s, "overlap": overlap, "draws": draws,
            "warnings": [warning] if warning else []}
    (out / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    if console is not None:
        console.print(f"campaign of {loaded.model.name}: seed {seed}, {len(draws)} faults drawn over {duration_s:g}s "
                      f"(MTBF {mtbf_s:g}s)")
        for i, d in enumerate(draws, 1):
            console.print(f"  fault {i}: {d['kind']} at +{d['t']:.1f}s on {_target_text(d['target'])}")
        if warning:
            console.print(f"[yellow]warning:[/yellow] {warning}", markup=True, highlight=False)
    raised: BaseException | None = None
    code = ExitCode.OK
    try:
        outcome: RunOutcome = run_scenario(scenario, out=out / "run", console=console, after_run=after_run,
                                           gate=None if overlap else _recovered_gate)
        code = ExitCode(outcome.exit_code)
    except (ChaoskitError, KeyboardInterrupt) as exc:
        raised = exc
        code = ExitCode(exc.exit_code) if isinstance(exc, ChaoskitError) else ExitCode.INTERRUPTED
    if not (out / "run" / RESULT_FILE).is_file():  # stopped before the run began (the lab, the lock): nothing measured
        if raised is not None:
            raise raised
    summary = measure_campaign(out / "run", plan)
    summary["started_at"] = utc_iso(started)
    summary["run_dir"] = str(out / "run")
    summary["stopped"] = _stopped(summary, plan, raised, code)
    summary["warnings"] = plan["warnings"]
    (out / CAMPAIGN_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return int(code), summary, out


def _stopped(summary: dict[str, Any], plan: dict[str, Any], raised: BaseException | None, code: int) -> dict[str, Any]:
    """Whether the campaign ended before its draw did, and why: the run's error, its verdict and notes."""
    injected, drawn = len(summary["faults"]), len(plan["draws"])
    why = None
    if raised is not None:
        why = str(raised) if isinstance(raised, ChaoskitError) else "interrupted by Ctrl-C or SIGTERM"
    elif summary.get("verdict") in ("aborted", "interrupted", "error"):
        why = "; ".join(summary.get("notes") or []) or summary.get("verdict")
    elif injected < drawn:
        why = f"the job ended after {injected} of the {drawn} faults drawn"
    return {"early": why is not None, "why": why, "exit_code": int(code), "faults_injected": injected,
            "faults_drawn": drawn}


def _recovered_gate(events: list[dict[str, Any]], injected: list[float]) -> str | None:
    """Why the next fault must wait (a recovery in progress), or ``None``: the last fault was followed by a
    step after its checkpoint load, or by no detection at all (nothing to recover from)."""
    if not injected:
        return None
    m = measure_fault(events, injected[-1])
    if m["t_detect"] is not None and m["t_resumed"] is None:
        return "the previous fault's recovery is in progress"
    return None


def measure_campaign(run_dir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """ETTR and badput of a campaign's run, measured from its files, beside the simulator's prediction."""
    result = RunResult.read(run_dir / RESULT_FILE)
    events = read_events(run_dir / EVENTS_FILE)
    faults = []
    for draw, fault in zip(plan["draws"], result.per_fault):
        faults.append({"t": draw["t"], "kind": fault.kind, "target": _target_text(draw["target"]),
                       "nodes": fault.targets, "t_fault": fault.t_fault,
                       "phases": {k: getattr(fault, k) for k in ("detection_s", "reallocation_s", "checkpoint_load_s",
                                                                 "recovery_s", "lost_steps")}})
    # each measured fault's phases in full: the goodput buckets also need its start-up and its reasons
    per_fault = [fault.model_dump() for fault in result.per_fault[:len(faults)]]
    spent = account(events, per_fault)
    steps, saves, step_s, t_start, wall = spent.steps, spent.saves, spent.step_s, spent.t_start, spent.wall_s
    final_step, kept, buckets = spent.final_step, spent.kept_s, spent.buckets
    measured = (kept / wall) if wall else None
    prediction = _predict(plan, faults, step_s, result, saves, wall, buckets)
    gap = None if measured is None or prediction["ettr"] is None else round(measured - prediction["ettr"], 4)
    explains = None
    if gap is not None:
        explains = _explain(measured, prediction, buckets, plan.get("overlap", False))
    kinds = sorted({f["kind"] for f in faults})
    return {
        "kind": "chaoskit.campaign", "scenario": result.scenario, "scenario_file": result.scenario_file,
        "seed": plan["seed"], "duration_s": plan["duration_s"], "mtbf_s": plan["mtbf_s"], "overlap": plan.get("overlap", False),
        "verdict": result.verdict, "faults": faults, "fault_kinds": kinds,
        "t_job_start": t_start, "wall_s": None if wall is None else round(wall, 3), "kept_s": round(kept, 3), "final_step": final_step,
        "step_time_s": step_s, "checkpoint_interval_steps": result.workload.get("checkpoint_every"),
        "checkpoint_save_s": round(statistics.median(saves), 4) if saves else 0.0, "saves": len(saves),
        "ettr": {"measured": None if measured is None else round(measured, 4), "predicted": prediction["ettr"],
                 "gap": gap, "explained_by": explains},
        "badput": buckets,
        "goodput": goodput_terms(spent, per_fault),
        "prediction": prediction,
        "over_time": _ettr_over_time(steps, t_start, step_s, faults),
        "notes": list(result.notes),
    }


def _predict(plan, faults, step_s, result: RunResult, saves, wall, buckets) -> dict[str, Any]:
    """The simulator's exact model (:func:`chaoskit.sim.model.goodput`) for this job: its step time, checkpoint
    interval and save cost, the phases it measured, and the rate of faults it suffered over its running time
    (``n / (wall - start-up)``: a Poisson draw gives more or fewer faults than the MTBF asked; the prediction at
    the asked MTBF is given beside it). Start-up, which the model has no term for, is taken as measured.

    The model lets a failure strike during a recovery and start it over (goodput ``E[exp(-λR)]``); a
    campaign without ``--overlap`` holds such a fault back until the recovery ends, so each fault costs one
    whole recovery: ``1 - λ(R + τ/2) - C/(τ+C)``. ``ettr_held_back`` is that variant, so that a gap from it
    can be named rather than guessed."""
    measured = [f["phases"] for f in faults if all(f["phases"][k] is not None for k in
                                                   ("detection_s", "reallocation_s", "checkpoint_load_s"))]
    every = result.workload.get("checkpoint_every") or 1
    running = (wall or 0.0) - buckets["startup"]
    if not (measured and step_s and wall and running > 0):
        return {"ettr": None, "badput": {}, "why": "no fault with all three phases measured, or no steps"}
    from chaoskit.sim.model import ClusterModel, RecoveryPhases, goodput  # numpy: only when a campaign is measured

    tau = every * step_s
    cost = statistics.median(saves) if saves else 0.0
    n = len(faults)
    phases = tuple(RecoveryPhases(p["detection_s"], p["reallocation_s"], p["checkpoint_load_s"], source="campaign")
                   for p in measured)

    def at(mtbf_s: float) -> float:
        model = ClusterModel(gpus=1, gpu_rate_per_hour=3600.0 / mtbf_s, window_s=wall, ckpt_interval_s=tau,
                             ckpt_cost_s=cost, phases=phases)
        return float(goodput(model)) * running / wall

    suffered = running / n
    mttr = statistics.fmean(p["detection_s"] + p["reallocation_s"] + p["checkpoint_load_s"] for p in measured)
    lam = 1.0 / suffered
    # no fault during a recovery: a fault due then comes right after it, so each of the n costs one whole recovery
    # and half an interval of recomputed steps, linearly
    held = (1.0 - lam * (mttr + tau / 2) - cost / (tau + cost)) * running / wall
    mean = lambda key: statistics.fmean(p[key] for p in measured)  # noqa: E731
    predicted = {"startup": buckets["startup"], "detection": n * mean("detection_s"), "reallocation": n * mean("reallocation_s"),
                 "checkpoint_load": n * mean("checkpoint_load_s"), "first_step": 0.0,
                 "recomputed": n * tau / 2, "checkpoint_saves": running / (tau + cost) * cost, "unexplained": 0.0}
    return {"ettr": round(at(suffered), 4), "ettr_at_asked_mtbf": round(at(plan["mtbf_s"]), 4),
            "ettr_held_back": round(held, 4),
            "model": "chaoskit.sim.model.goodput (exact, Poisson failures that may strike a recovery)",
            "inputs": {"step_time_s": step_s, "checkpoint_interval_s": round(tau, 4), "checkpoint_cost_s": round(cost, 4),
                       "mtbf_s": round(suffered, 3), "mtbf_asked_s": plan["mtbf_s"], "faults": n, "mttr_s": round(mttr, 3)},
            "badput": {k: round(v, 3) for k, v in predicted.items()}}


GAP_POINTS = 0.05
"""A gap of more than 5 points between measured and predicted ETTR is explained by name."""


def _explain(measured: float, prediction: dict[str, Any], buckets: dict[str, float], overlap: bool) -> str:
    """What explains most of the gap: faults held back out of recoveries (when the model's variant without
    faults during a recovery is much closer), else the badput bucket furthest from its prediction."""
    gap = measured - prediction["ettr"]
    held = prediction.get("ettr_held_back")
    if (not overlap and held is not None and abs(gap) > GAP_POINTS / 2
            and abs(measured - held) < abs(gap) / 2):
        return ("no fault during a recovery: the campaign held faults back (no --overlap), the model lets one "
                f"strike a recovery; without that, the model predicts {held:.1%}")
    diffs = {k: buckets[k] - prediction["badput"].get(k, 0.0) for k in BUCKETS}
    worst = max(diffs, key=lambda k: abs(diffs[k]))
    return f"{worst}: measured {buckets[worst]:.1f}s, predicted {prediction['badput'].get(worst, 0.0):.1f}s"


def _ettr_over_time(steps, t_start, step_s, faults, points: int = 60) -> list[dict[str, float]]:
    """ETTR so far at evenly spaced times: kept steps up to then (the highest step reached, less what a later
    fault rolled back) over the wall time so far."""
    if not steps or t_start is None or not step_s:
        return []
    t_end = steps[-1]["ts"]
    out = []
    for i in range(1, points + 1):
        t = t_start + (t_end - t_start) * i / points
        reached = max((e["step"] for e in steps if e["ts"] <= t), default=0)
        out.append({"t": round(t - t_start, 2), "ettr": round(reached * step_s / (t - t_start), 4)})
    return out


def _target_text(target: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in target.items())
