"""The recovery stacks side by side: one fault list run on every stack (``chaoskit scorecard``).

A row is a plain scenario file in a folder (``examples/scorecard/``): one fault, on the lab it needs, written for
plain torchrun. A column is a recovery stack (:data:`STACKS`): torchrun (torchelastic restarts the world), nvrx
(NVIDIA's ft_launcher with rank heartbeats), nvrx-inprocess (NVIDIA's in-process restart), torchft (per-step fault
tolerance), then ray (Ray Train's own restart) and slurm (the job under Slurm's requeue), each a stack module's own
(:attr:`chaoskit.stacks.api.Stack.scorecard_column`, which adapts the row: :meth:`chaoskit.stacks.api.Stack.adapt_row`).
:func:`run_scorecard` turns each row into one scenario per stack (``<out>/scenarios/``;
:class:`CannotRun` says why a pair cannot run, which becomes its cell), runs them all as one game day
(``<out>/gameday/``: the labs shared between drills, ``repeat`` honoured) and reads each drill's files back into
one cell per (stack, fault):

``{stack, fault, detection_s, recovery_s, lost_steps, verdict, why, timeouts, warnings, dir}`` and, repeated,
``p50``/``p95`` per phase. ``verdict`` is ``pass``/``fail`` (the row's SLOs), ``rode through``/``false restart``
(a row with ``expect: {restart: false}``: a disturbance the stack should ride through), ``not detected`` ("not detected
within X": the stack never noticed while the run watched), ``cannot run`` ("cannot run here: why", decided before
any drill) or ``error`` (a drill that came to no verdict: "failed before its fault: " and the drill's error line
where it was started and its job failed at the start; interrupted; not run); no cell is blank. ``timeouts`` are
the stack's settings behind the numbers as the drill ran them: the collective timeout, and the recovery stack's own
(:meth:`chaoskit.stacks.api.Stack.timeouts`, read from the validated workload: NVRx's heartbeat timeout, torchft's
timeouts, Ray's health check; from the drill's result: Slurm's SlurmdTimeout,
:meth:`chaoskit.stacks.api.Stack.ran_timeouts`); ``warnings`` the ones that make detection take minutes. A column
whose stack says so carries a note (``stack_notes``: nvrx-inprocess is deprecated upstream).

It writes ``scorecard.json``, ``index.html`` (:mod:`chaoskit.report.scorecard`) and ``metrics.prom``
(OpenMetrics with a ``stack`` label).
"""

from __future__ import annotations

import copy
import datetime as _dt
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from rich.markup import escape

from chaoskit.backends.api import ClusterHandle
from chaoskit.blame import blame, blame_line
from chaoskit.core.errors import ChaoskitError, InfraError, ScenarioError, did_you_mean
from chaoskit.core.files import GAMEDAY_FILE, RESULT_FILE, make_run_dir, write_new
from chaoskit.core.limits import MAX_REPEAT
from chaoskit.gameday import run_gameday
from chaoskit.observe.events import read_events
from chaoskit.report.scorecard import write_scorecard_html, write_scorecard_metrics
from chaoskit.scenario import load_scenario, scenario_files
from chaoskit.scenario.checks import check_scenario
from chaoskit.scenario.model import workload_model
from chaoskit.stacks.api import LONG_DETECTION_S, CannotRun
from chaoskit.stacks.registry import by_column, stack_of
from chaoskit.workloads.launch import torch_available

__all__ = ["STACKS", "Stack", "CannotRun", "SCORECARD_FILE", "run_scorecard", "cells_from_gameday", "adapt_row"]

SCORECARD_FILE = "scorecard.json"
@dataclass(frozen=True)
class Stack:
    name: str
    describe: str
    adapt: Callable[[dict[str, Any], Path], dict[str, Any]]
    """Row document, rows' folder -> this stack's scenario document; :class:`CannotRun` when it cannot."""
    unfit: Callable[[ClusterHandle], str | None] = lambda handle: None
    """Why the stack cannot run on the scenario's (previewed) cluster, asked of the cluster itself; ``None``: it can."""
    missing: Callable[[], str | None] = lambda: None
    """What this machine lacks to start a job under the stack, with the install line; ``None``: nothing."""


def _columns() -> dict[str, Stack]:
    """Every column: each recovery stack's that names one (:func:`chaoskit.stacks.registry.by_column`: plain
    torchrun's first, those that run every row on a cluster of their own, Ray Train's and Slurm's, last)."""
    return {column: Stack(column, s.describe, s.adapt_row, s.unfit, s.missing) for column, s in by_column().items()}


STACKS: dict[str, Stack] = _columns()
"""The scorecard's columns, by name (``--stacks``), as the stacks registered at import have them."""


def adapt_row(row: Path, stack: str) -> dict[str, Any]:
    """The scenario document of ``row`` on ``stack`` (named ``<fault>--<stack>``); :class:`CannotRun` with why."""
    doc = yaml.safe_load(Path(row).read_text(encoding="utf-8"))
    doc = copy.deepcopy(doc)
    fault = doc["name"]
    doc["name"] = f"{fault}--{stack}"
    doc.setdefault("workload", {})
    doc.pop("repeat", None)
    doc.pop("covers", None)
    return _columns()[stack].adapt(doc, Path(row).resolve().parent)


def _missing_before_drills(runnable: list[Path], console) -> list[str]:
    """What this install lacks, found before the first drill: PyTorch for the drills (an error: nothing runs),
    ``prometheus_client`` for ``metrics.prom`` (a note: the file is skipped, the drills run)."""
    if runnable and not torch_available():
        raise InfraError("the scorecard's drills start a PyTorch job, and PyTorch is not installed; no drill was run",
                         hint="pip install 'chaoskit[workload]' (torch==2.13.0, the CPU build)")
    notes = []
    if importlib.util.find_spec("prometheus_client") is None:
        notes.append("metrics.prom not written: it needs prometheus_client (pip install 'chaoskit[prometheus]')")
    for note in notes:
        if console is not None:
            console.print(f"[yellow]note:[/yellow] {escape(note)}")
    return notes


def run_scorecard(folder: str | Path, stacks: list[str], *, repeat: int = 1, out: Path | None = None,
                  console=None, capabilities=None) -> dict[str, Any]:
    """Run every row of ``folder`` on every stack of ``stacks``; write ``scorecard.json``, ``index.html`` and
    ``metrics.prom`` in ``out`` and return the scorecard. :class:`ScenarioError` for an unknown stack, no rows,
    a row that does not load (file:line:col) or an ``out`` that already holds a scorecard."""
    columns = _columns()  # a stack registered since the import (a plugin's) has its column too
    unknown = [s for s in stacks if s not in columns]
    if unknown or not stacks:
        typo = did_you_mean(unknown[0], columns) if len(unknown) == 1 else ""
        raise ScenarioError(f"unknown stack {', '.join(unknown) or '(none)'}{typo}; known: {', '.join(columns)}",
                            hint="--stacks torchrun,nvrx,nvrx-inprocess,torchft,ray,slurm")
    if not 1 <= repeat <= MAX_REPEAT:
        raise ScenarioError(f"--repeat {repeat}: expected 1..{MAX_REPEAT}")
    rows = scenario_files([folder])
    if not rows:
        raise ScenarioError(f"no scenario files in {folder}", hint="a folder of row scenarios, e.g. examples/scorecard/")
    for row in rows:
        load_scenario(row)  # a broken row is the user's to fix, at its line
    started = time.time()
    out = Path(out) if out else Path("reports") / f"scorecard-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}"
    if (out / SCORECARD_FILE).exists():
        raise ScenarioError(f"{out} already holds a scorecard", hint="choose another --out, or remove that folder")
    make_run_dir(out, 0o755, default=False)  # as a run folder: its parents walked, no other user's link followed
    scen_dir = out / "scenarios"
    scen_dir.mkdir(exist_ok=True)
    planned: list[tuple[str, str, Path | None, str | None]] = []  # stack, fault, file, why not
    lacking = {stack: why for stack in stacks if (why := columns[stack].missing()) is not None}
    for stack, why in lacking.items():  # said before the first drill: its column's cells say it again
        if console is not None:
            console.print(f"[yellow]note:[/yellow] {escape(f'{stack} column not run: {why}')}")
    for row in rows:
        fault = load_scenario(row).model.name
        for stack in stacks:
            try:
                if stack in lacking:
                    raise CannotRun(lacking[stack])
                doc = adapt_row(row, stack)
                if repeat > 1:
                    doc["repeat"] = repeat
                path = scen_dir / f"{doc['name']}.yaml"
                write_new(path, yaml.safe_dump(doc, sort_keys=False), replace=True)
                why = columns[stack].unfit(check_scenario(load_scenario(path)))
                if why is not None:
                    raise CannotRun(why)
            except CannotRun as exc:
                planned.append((stack, fault, None, f"cannot run here: {exc}"))
                continue
            except ChaoskitError as exc:  # the stack's lab or job cannot take this fault (validate's words)
                planned.append((stack, fault, None, f"cannot run here: {exc.message}"))
                continue
            planned.append((stack, fault, path, None))
    runnable = [p[2] for p in planned if p[2] is not None]
    notes = _missing_before_drills(runnable, console)
    gameday_dir = out / "gameday"
    if runnable:
        run_gameday(runnable, out=gameday_dir, console=console, capabilities=capabilities)
    card = {
        "kind": "chaoskit.scorecard",
        "rows": str(folder),
        "stacks": stacks,
        **({"stack_notes": notes_by} if (notes_by := {s: by_column()[s].scorecard_note for s in stacks
                                                      if s in by_column() and by_column()[s].scorecard_note}) else {}),
        "faults": list(dict.fromkeys(p[1] for p in planned)),
        "repeat": repeat,
        "started_at": _iso(started),
        "ended_at": _iso(time.time()),
        "duration_s": round(time.time() - started, 3),
        "cells": cells_from_gameday(planned, gameday_dir),
        **({"notes": notes} if notes else {}),
    }
    write_new(out / SCORECARD_FILE, json.dumps(card, indent=2) + "\n", replace=True)
    _attach_to_gameday(gameday_dir, card)
    write_scorecard_html(out, card)
    if not notes:  # else the note above says why there is no metrics.prom
        write_scorecard_metrics(out, card)
    return card


def cells_from_gameday(planned: list[tuple[str, str, Path | None, str | None]], gameday_dir: Path) -> list[dict[str, Any]]:
    """One cell per planned pair, from the game day's records and each drill's ``result.json``."""
    records = {}
    if (gameday_dir / GAMEDAY_FILE).is_file():
        for r in json.loads((gameday_dir / GAMEDAY_FILE).read_text(encoding="utf-8")).get("scenarios", []):
            records[r.get("scenario")] = r
    cells = []
    for stack, fault, path, why_not in planned:
        if path is None:
            cells.append(_blank(stack, fault, "cannot run", why_not or "cannot run here"))
            continue
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        record = records.get(doc["name"])
        if record is None or record.get("status") is None:  # an interrupted game day keeps the drills it never ran
            cells.append(_blank(stack, fault, "error", "not run: the game day ended before it"))
            continue
        if record.get("status") == "interrupted":
            cells.append(_blank(stack, fault, "error", "interrupted by Ctrl-C or SIGTERM during the drill"))
            continue
        cells.append(_cell(stack, fault, doc, record, gameday_dir / record["dir"]))
    return cells


def _blank(stack: str, fault: str, verdict: str, why: str) -> dict[str, Any]:
    return {"stack": stack, "fault": fault, "detection_s": None, "recovery_s": None, "lost_steps": None,
            "verdict": verdict, "why": why, "timeouts": {}, "warnings": [], "dir": None}


def _cell(stack: str, fault: str, doc: dict[str, Any], record: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    result = _read(run_dir / RESULT_FILE) or {}
    samples = [_read(run_dir / s["dir"] / RESULT_FILE) or {} for s in result.get("samples") or []] \
        if result.get("kind") == "chaoskit.repeat" else [result]
    phases = record.get("phases") or {}
    timeouts, warnings = stack_timeouts(stack, doc, samples[0] if samples else {})
    cell = {"stack": stack, "fault": fault, "detection_s": phases.get("detection_s"),
            "recovery_s": phases.get("recovery_s"), "lost_steps": phases.get("lost_steps"),
            "detected_by": phases.get("detected_by") if "detected_by" in phases else _first(samples, "detected_by"),
            "verdict": record.get("verdict") or record.get("status") or "error", "why": "",
            "timeouts": timeouts, "warnings": warnings, "dir": str(run_dir)}
    cell["blame"] = _cell_blame(result, samples, run_dir)
    if result.get("kind") == "chaoskit.repeat":
        dist = result.get("distribution") or {}
        for key in ("detection_s", "recovery_s", "lost_steps"):
            d = dist.get(key) or {}
            cell[key] = d.get("p50")
            cell.setdefault("p50", {})[key] = d.get("p50")
            cell.setdefault("p95", {})[key] = d.get("p95")
        cell["samples"] = result.get("completed")
    if record.get("status") == "error" and not result.get("faults") and not result.get("samples"):
        # Started, and ended in an error before its first fault (the job failed at its start, the lab did not come
        # up): the drill's error, with its own line. "cannot run" is the plan's, decided before any drill.
        message = ((record.get("error") or {}).get("message") or next(iter(result.get("notes") or []), None)
                   or "no error recorded")
        return {**cell, "verdict": "error", "why": f"failed before its fault: {message}"}
    if (doc.get("expect") or {}).get("restart") is False:
        return _disturbance_cell(cell, samples, doc)
    if cell["detection_s"] is None:
        watched = _watched_s(samples)
        cell["verdict"] = "not detected"
        cell["why"] = (f"not detected within {watched:.0f}s (the run watched that long after the fault)"
                       if watched is not None else "not detected: the fault was not injected")
        return cell
    who = (cell.get("detected_by") or "?") + _bound(cell["detection_s"], cell.get("detected_by") or "", doc)
    if cell["recovery_s"] is None:
        reason = ((phases.get("reasons") or {}).get("recovery") or _first_reason(samples, "recovery")
                  or "training did not resume")
        cell["why"] = f"detected by {who}; not recovered: {reason}"
    else:
        failed = [name for name, s in (record.get("slo") or {}).items() if isinstance(s, dict) and s.get("pass") is False]
        cell["why"] = f"detected by {who}" + (f"; SLO missed: {', '.join(failed)}" if failed else "")
    world = ((samples[0] if samples else {}).get("phases") or {}).get("world_size")
    if world and world.get("after", 0) < world.get("before", 0):  # the in-process Wrapper dropped unresponsive ranks
        cell["why"] += f"; went on with {world['after']} of {world['before']} ranks"
    return cell


def _cell_blame(result: dict[str, Any], samples: list[dict[str, Any]], run_dir: Path) -> dict[str, Any] | None:
    """Whom the stack named as failed in this cell, against the truth (``chaoskit/blame.py``): ``{verdict, line}``,
    the line being the first sample's; with repeats also every sample's ``verdicts``, and ``verdict`` is ``mixed``
    where they differ. A drill from before blame was kept gets it from its timeline (``events.jsonl``); ``None``
    where neither is there (the drill did not run)."""
    dirs = ([run_dir / str(s.get("dir")) for s in result.get("samples") or []]
            if result.get("kind") == "chaoskit.repeat" else [run_dir])
    found = []
    for sample, folder in zip(samples, dirs):
        b = sample.get("blame")
        if b is None and len(sample.get("per_fault") or []) == 1:
            try:
                events = read_events(folder / "events.jsonl")
            except OSError:
                events = []
            b = blame(events, sample["per_fault"])[0] if events else None
        if b:
            found.append(b)
    if not found:
        return None
    verdicts = [str(b.get("verdict")) for b in found]
    out: dict[str, Any] = {"verdict": verdicts[0] if len(set(verdicts)) == 1 else "mixed", "line": blame_line(found[0])}
    if len(found) > 1:
        out["verdicts"] = verdicts
    return out


def _disturbance_cell(cell: dict[str, Any], samples: list[dict[str, Any]], doc: dict[str, Any]) -> dict[str, Any]:
    """A row the job must ride through (``expect: {restart: false}``): ``rode through``, or ``false restart`` with
    who restarted it, when, and what it cost (each sample's ``checks.no_restart``)."""
    checks = [(s.get("checks") or {}).get("no_restart") for s in samples]
    if not any(checks):
        cell["verdict"] = "error"
        cell["why"] = "the drill did not judge the disturbance (no checks.no_restart)"
        return cell
    false = [c["false_restart"] for c in checks if c and c.get("pass") is False and c.get("false_restart")]
    if not false:
        cell["verdict"] = "rode through"
        cell["why"] = "no worker exit, restart, new rendezvous or detection by the stack"
        return cell
    first = false[0]
    who = first.get("who") or "?"
    by = ("" if who in str(first.get("what")) else f" by {who}") + _bound(first["after_s"], who, doc)
    cost = ", ".join(part for part in (
        None if first.get("recovery_s") is None else f"{first['recovery_s']:.1f}s of recovery",
        None if first.get("lost_steps") is None else f"{first['lost_steps']} steps lost") if part) or "cost not measured"
    cell["verdict"] = "false restart"
    cell["why"] = (f"{first.get('what')} {first['after_s']:.1f}s after the disturbance{by}; it cost {cost}"
                   + (f" (in {len(false)} of {len(samples)} samples)" if len(samples) > 1 else ""))
    return cell


def _bound(detection_s: float, who: str, doc: dict[str, Any]) -> str:
    """Which configured timeout the detection came at, where one did: the number is then the setting's, as the
    drill ran it (the validated workload's, through its recovery stack)."""
    w = _workload(doc)
    if w is None:
        return ""
    own = stack_of(w).bound(who, detection_s, w)
    if own is not None:
        return own
    if "collective" in who and abs(detection_s - w.collective_timeout) <= max(1.0, 0.2 * w.collective_timeout):
        return f", at the collective timeout ({w.collective_timeout:g}s)"
    return ""


def _workload(doc: dict[str, Any]) -> Any:
    """The adapted scenario's workload as the drill validated it (defaults filled in), or ``None`` when it does not
    validate (its drill was refused, and said why)."""
    try:
        return workload_model().model_validate(doc.get("workload") or {})
    except ValueError:
        return None


def stack_timeouts(stack: str, doc: dict[str, Any], result: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The stack's settings behind a cell's numbers, as the drill ran them (the validated workload's), and a warning
    for each that makes detection take minutes."""
    raw = doc.get("workload") or {}
    w = _workload(doc)
    timeouts: dict[str, str] = {}
    warnings: list[str] = []
    if w is None:
        return timeouts, warnings
    collective = w.collective_timeout
    timeouts["collective timeout"] = f"{collective:g}s"
    if "collective_timeout" not in raw:
        timeouts["collective timeout"] += " (chaoskit's default; torch's own is 30 min, NCCL's watchdog 10 min)"
    if collective >= LONG_DETECTION_S:
        warnings.append(f"collective timeout {collective:g}s: a hang is noticed only after {collective / 60:.0f} min")
    ran = stack_of(w)
    column = by_column().get(stack)
    for own in (ran, column) if column is not None and column.name != ran.name else (ran,):
        for said, said_warnings in (own.timeouts(w), own.ran_timeouts(result)):
            timeouts.update(said)
            warnings += said_warnings
    return timeouts, warnings


def _attach_to_gameday(gameday_dir: Path, card: dict[str, Any]) -> None:
    """The scorecard is part of the game day's JSON too (``gameday.json``'s ``scorecard``)."""
    path = gameday_dir / GAMEDAY_FILE
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        data["scorecard"] = {k: card[k] for k in ("stacks", "faults", "repeat", "cells")}
        write_new(path, json.dumps(data, indent=2) + "\n", replace=True)


def _watched_s(samples: list[dict[str, Any]]) -> float | None:
    spans = []
    for s in samples:
        faults = s.get("faults") or []
        end = _ts(s.get("ended_at"))
        if faults and faults[0].get("t_fault") and end:
            spans.append(end - faults[0]["t_fault"])
    return min(spans) if spans else None


def _first(samples: list[dict[str, Any]], key: str) -> Any:
    return next(((s.get("phases") or {}).get(key) for s in samples if (s.get("phases") or {}).get(key)), None)


def _first_reason(samples: list[dict[str, Any]], phase: str) -> str | None:
    return next((((s.get("phases") or {}).get("reasons") or {}).get(phase) for s in samples
                 if ((s.get("phases") or {}).get("reasons") or {}).get(phase)), None)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _ts(iso: Any) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
