"""The HTML report people review: one self-contained file, readable offline.

Built from the JSON a run or a game day leaves behind (``result.json``,
``events.jsonl``, ``error.json``, ``gameday.json``, ``history.jsonl``), so
``chaoskit report DIR`` can rebuild it at any time, also for a run that crashed
half way (events but no result: it renders what is there and says so).

The page (Jinja2, autoescaped) has no external resource of any kind: CSS and JS
are inline, charts are inline SVG drawn from the geometry computed here, and a
Content-Security-Policy forbids every request. Tabs:

1. node health and fault detection: node x time grid of steps/heartbeats, the
   fault and the moment of detection;
2. checkpoint save and restore: step over time, saves, the roll-back to the
   restored step, lost work shaded;
3. migration and rescheduling: which ranks ran on which node before and after;
4. coverage: category x scope matrix, plain and weighted scores, trend;

and an overview with, per scenario, a waterfall of the recovery phases against
their SLO lines.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator

from chaoskit.blame import blame, blame_line
from chaoskit.core.errors import ScenarioError
from chaoskit.core.result import REPEAT_KIND, ResultPart, RunResult, Silent, Slowdown
from chaoskit.core.files import (
    GAMEDAY_FILE,
    GAMEDAY_REPORT,
    HISTORY_FILE,
    RUN_REPORT,
    UnsafePath,
    load_gameday,
    open_shown,
    others_who_change,
    read_history,
    write_new,
)
from chaoskit.coverage import (
    CATEGORIES,
    SCOPES,
    Capabilities,
    catalog_by_id,
    compute_coverage,
    resolve_covers,
)
from chaoskit.core.phases import PHASE_TABLE, SLO_PHASES, phase
from chaoskit.measure import measure_fault, phase_spans
from chaoskit.observe.events import read_events
from chaoskit.report.summary import check_text
from chaoskit.stacks.api import Stack
from chaoskit.stacks.registry import model_stack

__all__ = ["build_report", "write_run_report", "write_repeat_report", "write_campaign_report", "write_gameday_report",
           "load_run", "render_html"]


_W = 760  # width of the timeline charts
_LEFT = 64  # room for node names and step labels
_BINS = 120


def build_report(path: str | Path) -> Path:
    """Rebuild the HTML of a game-day folder (``index.html``) or a run folder
    (``report.html``); return the file written. Raises :class:`ScenarioError`
    when ``path`` holds neither."""
    path = Path(path)
    if (path / GAMEDAY_FILE).is_file():
        return write_gameday_report(path)
    if (_read_json(path / "result.json", _readers(path)) or {}).get("kind") == REPEAT_KIND:
        return write_repeat_report(path)
    if any((path / f).is_file() for f in ("result.json", "events.jsonl", "error.json")):
        return write_run_report(path)
    raise ScenarioError(
        f"{path}: no gameday.json, result.json or events.jsonl here",
        hint="give the folder of a run (chaoskit run --out) or of a game day (chaoskit gameday --out)",
    )


def write_run_report(run_dir: str | Path) -> Path:
    """Render ``report.html`` of a run folder from its files alone; return its path."""
    run_dir = Path(run_dir)
    run = load_run(run_dir, readers=_readers(run_dir))
    record = {"scenario": run["name"], "covers": run["covers"], "injected_kinds": run["injected_kinds"], "status": run["status"]}
    page = {
        "kind": "run", "title": f"chaoskit run: {run['name']}", "runs": [run],
        "coverage": _coverage_view(compute_coverage([record], Capabilities.from_dict(run["capabilities"]))),
        "coverage_note": "coverage of this run alone; what could not run on its machine was probed when it ran",
        "trend": None, "gameday": None, "repeat": None,
    }
    out = run_dir / RUN_REPORT
    return _write_page(out, render_html(page))


def write_repeat_report(repeat_dir: str | Path) -> Path:
    """Render ``report.html`` of a ``chaoskit run --repeat`` folder: the distribution of each phase, then every
    sample as a game day shows its scenarios; return its path."""
    repeat_dir = Path(repeat_dir)
    readers = _readers(repeat_dir)
    summary = _read_json(repeat_dir / "result.json", readers) or {}
    runs = [load_run(repeat_dir / s["dir"], {"index": i, "status": s.get("status"), "error": s.get("error") and {
                 "type": "Error", "message": s["error"], "hint": None}}, readers)
            for i, s in enumerate(summary.get("samples") or [], 1) if (repeat_dir / s["dir"]).is_dir()]
    records = [{"scenario": r["name"], "covers": r["covers"], "injected_kinds": r["injected_kinds"], "status": r["status"]} for r in runs]
    caps = Capabilities.from_dict(runs[0]["capabilities"] if runs else {})
    page = {
        "kind": "repeat", "title": f"chaoskit run: {summary.get('scenario')} x{summary.get('repeat')}", "runs": runs,
        "coverage": _coverage_view(compute_coverage(records, caps)),
        "coverage_note": "coverage of these samples alone", "trend": None, "gameday": None,
        "repeat": {**summary, "strips": _strips(summary.get("distribution") or {}, summary.get("slo") or {})},
    }
    out = repeat_dir / RUN_REPORT
    return _write_page(out, render_html(page))


def _strips(dist: dict[str, Any], slo: dict[str, Any]) -> list[dict[str, Any]]:
    """One strip plot per phase: every sample a dot, the median and the p95 as ticks, the median's 95% interval
    as a band, each percentile SLO as a line; the scale is the phase's own, from 0."""
    w, left, right = _W, 120, 250
    rows = []
    for ph in PHASE_TABLE:
        d = dist.get(ph.key)
        if not d or d.get("p50") is None:
            if d and d.get("n"):
                rows.append({"label": ph.label, "empty": f"not observed in any of {d['n']} samples"})
            continue
        lines = [(p, c["limit"]) for p, c in ((slo.get(ph.name) or {}).get("percentiles") or {}).items()]
        top = max([d["max"], *[v for _, v in lines]]) or 1.0
        scale = (w - left - right) / (top * 1.05)
        x = lambda v: round(left + v * scale, 1)  # noqa: E731
        unit = "s" if ph.unit == "s" else ""
        fmt = (lambda v: f"{v:.2f}s") if ph.unit == "s" else (lambda v: f"{v:g}")
        rows.append({
            "label": ph.label, "empty": None,
            "dots": [{"x": x(v), "title": f"sample {i}: {fmt(v)}"} for i, v in enumerate(d["samples"], 1) if v is not None],
            "p50": {"x": x(d["p50"]), "title": f"median {fmt(d['p50'])}"},
            "p95": {"x": x(d["p95"]), "title": f"p95 {fmt(d['p95'])}"},
            "ci": None if not d.get("ci95") else {"x": x(d["ci95"][0]), "w": max(1.0, x(d["ci95"][1]) - x(d["ci95"][0])),
                                                   "title": f"95% interval of the median: {fmt(d['ci95'][0])} to {fmt(d['ci95'][1])}"},
            "slo": [{"x": x(v), "title": f"SLO {p}{' (every sample)' if p == 'max' else ''} <= {fmt(v)}"} for p, v in lines],
            "text": f"p50 {fmt(d['p50'])} · p95 {fmt(d['p95'])} · max {fmt(d['max'])}" + (f" · {d['missing']} missing" if d["missing"] else ""),
            "text_x": w - right + 6, "left": left, "right": w - right, "unit": unit,
        })
    return rows


def write_gameday_report(gd_dir: str | Path) -> Path:
    gd_dir = Path(gd_dir)
    readers = _readers(gd_dir)
    with _refusing(gd_dir / GAMEDAY_FILE):
        summary = load_gameday(gd_dir, readers)
    runs = [load_run(gd_dir / r["dir"], r, readers) for r in summary["scenarios"]]
    cov = compute_coverage(summary["scenarios"], Capabilities.from_dict(summary.get("capabilities") or {}))
    with _refusing(gd_dir.parent / HISTORY_FILE):
        history = read_history(gd_dir.parent / HISTORY_FILE, until=summary["started_at"], readers=readers)
    page = {
        "kind": "gameday", "title": f"chaoskit game day: {summary['name']}", "runs": runs,
        "coverage": _coverage_view(cov), "coverage_note": None,
        "trend": _trend(history), "gameday": summary, "repeat": None,
        "recovery_trends": _recovery_trends(history, summary.get("regressions") or []),
    }
    out = gd_dir / GAMEDAY_REPORT
    return _write_page(out, render_html(page))


_BUCKET_LABELS = {"startup": "job start-up", "detection": "detection", "reallocation": "reallocation",
                  "checkpoint_load": "checkpoint load", "first_step": "first step after load",
                  "recomputed": "recomputed steps", "checkpoint_saves": "checkpoint saves", "unexplained": "unexplained"}


def write_campaign_report(folder: str | Path) -> Path:
    """Render ``campaign.html`` of a ``chaoskit campaign`` folder from its ``campaign.json``: ETTR measured and
    predicted, the badput buckets side by side, ETTR over time with every fault, the faults and their phases."""
    folder = Path(folder)
    c = _read_json(folder / "campaign.json", _readers(folder))
    if c is None:
        raise ScenarioError(f"{folder}: no campaign.json here", hint="give the folder of chaoskit campaign --out")
    w, left = _W, 150
    pred = (c.get("prediction") or {}).get("badput") or {}
    top = max([*(c["badput"].values()), *pred.values(), 1.0])
    scale = (w - left - 120) / top
    bars = []
    for i, (key, label) in enumerate(_BUCKET_LABELS.items()):
        v, p = c["badput"].get(key, 0.0), pred.get(key)
        bars.append({"label": label, "y": i * 30, "w": round(max(0.0, v) * scale, 1), "value": f"{v:.1f}s",
                     "pw": None if p is None else round(max(0.0, p) * scale, 1),
                     "pvalue": "" if p is None else f"predicted {p:.1f}s"})
    series = c.get("over_time") or []
    chart = None
    if series:
        tmax = series[-1]["t"] or 1.0
        x = _Scale(0.0, tmax, 50, w - 10)
        y = _Scale(0.0, 1.0, 150, 10)
        t0 = c.get("t_job_start")
        chart = {"line": " ".join(f"{x(p['t'])},{y(p['ettr'])}" for p in series),
                 "pred_y": None if c["ettr"]["predicted"] is None else y(c["ettr"]["predicted"]),
                 "ticks": [{"y": y(v), "label": f"{v:.0%}"} for v in (0, 0.25, 0.5, 0.75, 1.0)],
                 "faults": [] if t0 is None else [{"x": x(f["t_fault"] - t0), "title": f"{f['kind']} on {f['target']}"}
                                                  for f in c.get("faults") or [] if 0 <= f["t_fault"] - t0 <= tmax],
                 "bottom": 150, "tmax": f"{tmax:.0f}s"}
    page = {"title": f"chaoskit campaign: {c.get('scenario')}", "c": c, "bars": bars, "bars_h": len(bars) * 30,
            "chart": chart, "left": left}
    out = folder / "campaign.html"
    return _write_page(out, _environment().get_template("campaign.html.j2").render(page=page))


def _readers(folder: Path) -> frozenset[int]:
    """Who else can read the page written in ``folder`` (:func:`~chaoskit.core.files.others_who_change`): each
    file it is rendered from must be one they could read themselves, so root never copies a file only root may
    read into a page another user reads. A folder reached through another user's link is refused (exit 2)."""
    try:
        return others_who_change(folder)
    except FileNotFoundError:
        return frozenset()  # nothing there to read: the caller says so
    except UnsafePath as exc:
        raise ScenarioError(f"{folder} was not read: {exc}",
                            hint="give the folder itself, not a link another user made to it") from None


@contextlib.contextmanager
def _refusing(path: Path) -> Iterator[None]:
    """An :class:`UnsafePath` (a link of another user's, a FIFO, a file the page's readers could not read) said as
    a :class:`ScenarioError` naming ``path`` (exit 2): the page is not written."""
    try:
        yield
    except UnsafePath as exc:
        raise ScenarioError(f"{path} was not read: {exc}",
                            hint="a report is rendered only from regular files its readers could read") from None


def _write_page(out: Path, html: str) -> Path:
    """``out`` replaced by ``html`` without following a link (:func:`~chaoskit.core.files.write_new`): ``chaoskit
    report`` runs as root on folders other users can write, and a link they plant at ``report.html`` (to a ``.pth``
    file, say) is replaced, never written through; a folder reached through a link of theirs is refused."""
    try:
        return write_new(out, html, replace=True)
    except UnsafePath as exc:
        raise ScenarioError(f"{out} was not written: {exc}",
                            hint="give the folder itself, not a link another user made to it") from None


def render_html(page: dict[str, Any]) -> str:
    return _environment().get_template("report.html.j2").render(page=page)


@functools.cache
def _environment():
    """One jinja2 environment per process: it keeps the compiled template (compiling it was most of a report's
    time, each run of a test session compiled it again; jinja2 still reloads a template whose file changed)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("chaoskit.report", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
    )
    env.filters["pct"] = lambda x: "-" if x is None else f"{x:.1%}"
    env.filters["secs"] = lambda x: "-" if x is None else f"{x:.2f}s"
    return env


# -- one run --------------------------------------------------------------------------


def load_run(run_dir: Path, record: dict[str, Any] | None = None, readers: frozenset[int] = frozenset()) -> dict[str, Any]:
    """Everything the page shows about one run, from its folder (and its game-day
    record, if any). Works for a finished run, a run that crashed before writing
    ``result.json``, and a scenario that never started (``error.json`` only).
    Its files are read as :func:`~chaoskit.core.files.open_shown` reads one for the page's ``readers``:
    :class:`ScenarioError` when one may not be."""
    run_dir = Path(run_dir)
    record = record or {}
    result = _read_json(run_dir / "result.json", readers)
    if isinstance(result, dict) and result.get("kind") == REPEAT_KIND:
        return _load_repeat(run_dir, result, record, readers)
    error = _read_json(run_dir / "error.json", readers) or record.get("error")
    try:
        with _refusing(run_dir / "events.jsonl"):
            events = read_events(run_dir / "events.jsonl", readers)
    except FileNotFoundError:
        events = []
    found = _run_result(result)
    run = found or RunResult()  # no result: every part empty, and what the page shows comes from the events
    if found is not None:
        # the charts below read the measurement as plain data: per_fault's first entry, as result.json holds it
        faults = [f.dump() for f in run.faults]
        timing = run.per_fault[0].dump() if run.per_fault else None
        phases, slo = run.phases.dump(), {name: entry.dump() for name, entry in run.slo.items()}
    else:
        faults = [{"kind": e.get("fault_kind"), "node": e.get("node"), "targets": e.get("targets") or [], "t_fault": e["ts"],
                   "mechanism": e.get("mechanism"), "fidelity": e.get("fidelity")}
                  for e in events if e.get("kind") == "fault.injected"]
        timing = measure_fault(events, faults[0]["t_fault"]) if faults else None
        phases, slo = dict(timing or {}), record.get("slo") or {}
    phases = {**dict.fromkeys(_PHASE_KEYS), **phases}
    injected = list(dict.fromkeys(f.get("kind") for f in faults if f.get("kind")))
    covers = record.get("covers") if record.get("covers") is not None else resolve_covers(None, injected)
    name = run.scenario or record.get("scenario") or run_dir.name
    unfinished = None
    if record and record.get("status") is None:
        status, unfinished = "not run", "The game day stopped before this scenario ran."
    elif error:
        status = "error"
    elif found is not None:
        status = run.verdict
    else:
        status = "unfinished"
    if found is None and events:
        unfinished = "The run did not finish: result.json is missing. What follows comes from events.jsonl as far as it goes; there is no SLO verdict."
    nodes = [n["name"] for n in run.cluster.get("nodes", [])]
    nodes += sorted({e["node"] for e in events if e.get("node") and e["node"] not in nodes})
    t_fault = faults[0]["t_fault"] if faults else None
    classes = catalog_by_id()
    index = record.get("index", 1)
    return {
        "id": f"s{index}",
        "index": index,
        "name": name,
        "file": run.scenario_file or record.get("file"),
        "dir": run_dir.name,
        "status": status,
        "unfinished": unfinished,
        "error": error,
        "notes": list(run.notes),
        "presets": [{"name": name, **info.dump()} for name, info in run.presets.items()],
        "cluster": _cluster_label(run.cluster),
        "clocks": _clock_rows(run.clocks),
        "capabilities": run.capabilities,
        "failed_checks": [check_text(k, c) for k, c in run.checks.items() if not c.passed],
        "incident": run.incident.dump() if run.incident is not None else None,
        "triggers": [{"fault": f.fault, **f.trigger.dump()} for f in run.per_fault if f.trigger is not None],
        "started_at": run.started_at or record.get("started_at"),
        "duration_s": run.duration_s or record.get("duration_s"),
        "faults": [{"kind": f.get("kind"), "targets": ", ".join(f.get("targets") or [f.get("node") or "?"]),
                    "mechanism": f.get("mechanism"), "fidelity": f.get("fidelity"),
                    "at": None if t_fault is None else f["t_fault"] - t_fault} for f in faults],
        "covers": covers,
        "covers_names": [f"{c} ({classes[c].name})" for c in covers if c in classes],
        "injected_kinds": injected,
        "category": record.get("category") or (classes[covers[0]].category if covers and covers[0] in classes else "uncategorised"),
        "phases": phases,
        "phase_rows": _phase_rows(phases, slo),
        "recovery_model": run.recovery_model or phases.get("model"),
        "detected_by": phases.get("detected_by"),
        "detections": phases.get("detections") or [],
        "blame": _blame_rows(run, faults, events),
        "slowdown": _slowdown_rows(run.slowdown),
        "reallocation_steps": phases.get("reallocation_steps") or [],
        "waterfall": _waterfall(timing, slo, t_fault),
        "grid": _node_grid(events, nodes, t_fault, timing),
        "ckpt": _checkpoint_chart(events, t_fault, timing, _corrupt_steps(run.silent)),
        "silent": _silent_rows(run.silent),
        "migration": _migration(events, nodes, t_fault, timing),
        "repeat": None,
    }


_BLAME_CLASS = {"right": "ok", "wrong": "bad", "none": "dim"}


def _blame_rows(run: RunResult, faults: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's blame lines (``chaoskit/blame.py``), one per fault: result.json's; for a result from before blame
    was kept, or a run that wrote none, from the timeline, which holds both sides."""
    measured = [f.dump() for f in run.per_fault] or faults
    found = [f.blame.dump() if f.blame is not None else None for f in run.per_fault]
    if not any(found):
        found = blame(events, measured) if events and measured else []
    several = len(found) > 1
    return [{"fault": (f.get("fault") or "") if several else "", "verdict": b.get("verdict"),
             "cls": _BLAME_CLASS.get(str(b.get("verdict")), "dim"), "text": blame_line(b)}
            for f, b in zip(measured, found) if b]


def _load_repeat(run_dir: Path, result: dict[str, Any], record: dict[str, Any],
                 readers: frozenset[int] = frozenset()) -> dict[str, Any]:
    """A game day's scenario that took several samples: the first sample's timelines, the medians as its phases,
    the repeat's verdict, and the distribution's strips."""
    samples = [s for s in result.get("samples") or [] if (run_dir / s["dir"]).is_dir()]
    run = load_run(run_dir / samples[0]["dir"], {**record, "status": record.get("status") or result.get("verdict")}, readers) \
        if samples else load_run(run_dir / "missing", record, readers)
    medians = {k: d.get("p50") for k, d in (result.get("distribution") or {}).items()}
    run.update(dir=run_dir.name, status=record.get("status") or result.get("verdict"),
               phases={**run["phases"], **medians},
               phase_rows=_phase_rows({**run["phases"], **medians}, record.get("slo") or {}),
               repeat={"completed": result.get("completed"), "repeat": result.get("repeat"),
                       "strips": _strips(result.get("distribution") or {}, result.get("slo") or {})})
    return run


def _clock_rows(clocks: dict[str, Any]) -> list[dict[str, str]]:
    """Each node whose clock was measured: its offset to the controller's and how well it is known."""
    rows = []
    for node, c in sorted(clocks.items()):
        offset, error = c.get("offset_s"), c.get("uncertainty_s")
        rows.append({"node": node, "offset": "?" if offset is None else f"{offset * 1000:+.1f}ms",
                     "uncertainty": "not measured" if error is None else f"± {error * 1000:.1f}ms"})
    return rows


_SLOWDOWN_ROWS = (
    ("step_time_before_s", "step time before", "median over the 10 s before the fault", "s"),
    ("step_time_during_s", "step time during", "median while the fault lasted", "s"),
    ("step_time_after_s", "step time after", "median after the revert", "s"),
    ("throughput_lost_pct", "throughput lost", "share of steps the slow phase did not make (1 - before / during)", "%"),
    ("recovery_after_revert_s", "recovery after the revert", "until a step time within 1.25x of before", "s"),
)


def _slowdown_rows(slowdown: Slowdown | None) -> list[dict[str, Any]]:
    """The straggler measures of ``result.json["slowdown"]`` as table rows; none when the run had no slowdown."""
    if slowdown is None:
        return []
    return [{**row, "reason": slowdown.reasons.get(row["key"])} for row in _measure_rows(slowdown, _SLOWDOWN_ROWS)]


def _measure_rows(measures: ResultPart, rows: tuple[tuple[str, str, str, str], ...]) -> list[dict[str, Any]]:
    """``rows`` (key, label, meaning, unit) of one part of a result as table rows, each value as the page shows it."""
    return [{"key": key, "label": label, "value": _shown(getattr(measures, key), unit), "meaning": meaning}
            for key, label, meaning, unit in rows]


def _shown(value: Any, unit: str) -> str:
    if value is None:
        return "not observed"
    if unit == "%":
        return f"{value:g} %"
    if unit == "s":
        return f"{value:.3f} s"
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


def _run_result(data: Any) -> RunResult | None:
    """``result.json``'s content as a :class:`RunResult`; ``None`` when there is none, or it is not one."""
    if not isinstance(data, dict):
        return None
    try:
        return RunResult.model_validate(data)
    except ValueError:  # pydantic's ValidationError: the page says the run did not finish
        return None


def _cluster_label(cluster: dict[str, Any]) -> str | None:
    """``kind id`` of the cluster a run used (the backend's name), ``None`` when the run never got one."""
    return " ".join(str(cluster[k]) for k in ("kind", "id") if cluster.get(k)) or None


def _read_json(path: Path, readers: frozenset[int] = frozenset()) -> Any:
    """The JSON in ``path`` (:func:`~chaoskit.core.files.open_shown` for ``readers``); ``None`` when it is not there
    or not JSON; :class:`ScenarioError` when it may not be read."""
    try:
        with _refusing(path), open_shown(path, readers) as fh:
            return json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


_PHASE_KEYS = (*(p.key for p in PHASE_TABLE), "restored_step", "last_step_before", "detected_by", "uncertainty_s")


def _phase_rows(phases: dict[str, Any], slo: dict[str, Any]) -> list[dict[str, Any]]:
    reasons = phases.get("reasons") or {}
    uncertainty = phases.get("uncertainty_s") or {}
    model = phases.get("model") or Stack.name
    meanings = phase_spans({"reallocation_from": phases.get("reallocation_from")}, model_stack(model).phase_meanings)
    rows = []
    for p in SLO_PHASES:
        entry = slo.get(p.name)
        value = phases.get(p.key)
        plus_minus = uncertainty.get(p.name)
        rows.append({
            "label": p.label, "meaning": meanings.get(p.name, p.meaning),
            "measured": ("not observed" if value is None
                         else f"{value:.3f}s" + (f" ± {plus_minus * 1000:.1f}ms" if plus_minus else "")),
            "reason": None if value is not None else (entry or {}).get("reason") or reasons.get(p.name),
            "limit": f"<= {entry['limit_s']:g}s" if entry else "-",
            "ok": None if not entry else bool(entry["pass"]),
        })
    lost_work = phase("lost_steps")
    lost, entry = phases.get(lost_work.key), slo.get(lost_work.name)
    before, restored = phases.get("last_step_before"), phases.get("restored_step")
    rows.append({
        "label": lost_work.label,
        "meaning": (model_stack(model).lost_work(phases) or
                    f"step {'?' if before is None else before} before the fault, "
                    + ("no restored step observed" if restored is None else f"restored {restored}"
                       + (f" (from the {phases['restored_from']})" if phases.get("restored_from") else ""))),
        "measured": "not observed" if lost is None else f"{lost} steps", "reason": None,
        "limit": f"<= {entry['limit']}" if entry else "-", "ok": None if not entry else bool(entry["pass"]),
    })
    return rows


# -- geometry -------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 x 10^n."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-9:
        ticks.append(round(t, 6))
        t += step
    return ticks


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi if hi > lo else lo + 1.0, a, b

    def __call__(self, v: float) -> float:
        return round(self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a), 1)


def _time_range(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    if not events:
        return None
    return events[0]["ts"], max(events[-1]["ts"], events[0]["ts"] + 1.0)


def _time_ticks(scale: _Scale, origin: float) -> list[dict[str, Any]]:
    ticks = nice_ticks(scale.lo - origin, scale.hi - origin, 8)
    return [{"x": scale(origin + t), "label": f"{t:+g}s" if t else "0"} for t in ticks if scale.lo <= origin + t <= scale.hi]


def _marker(kind: str, x: float, y: float, title: str) -> dict[str, Any]:
    return {"kind": kind, "x": x, "y": y, "title": title}


def _node_grid(events: list[dict[str, Any]], nodes: list[str], t_fault: float | None, timing: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rows of nodes, columns of time bins shaded by steps/heartbeats, with the
    fault, the detection and each worker's exit and start."""
    span = _time_range(events)
    if span is None or not nodes:
        return None
    row_h, top = 22, 26
    scale = _Scale(span[0], span[1], _LEFT, _W - 10)
    width = (scale.hi - scale.lo) / _BINS
    height = top + row_h * len(nodes) + 24
    rows, markers = [], []
    for i, node in enumerate(nodes):
        y = top + i * row_h
        counts = [0] * _BINS
        for e in events:
            if e.get("node") == node and e.get("kind") in ("step", "heartbeat"):
                counts[min(_BINS - 1, int((e["ts"] - scale.lo) / width))] += 1
        peak = max(counts) or 1
        levels = [0 if c == 0 else min(3, math.ceil(3 * c / peak)) for c in counts]
        cells, start = [], 0
        for b in range(1, _BINS + 1):
            if b == _BINS or levels[b] != levels[start]:
                if levels[start]:
                    t0, t1 = scale.lo + start * width, scale.lo + b * width
                    n = sum(counts[start:b])
                    cells.append({"x": scale(t0), "w": round(scale(t1) - scale(t0), 1), "level": levels[start],
                                  "title": f"{node}: {n} step/heartbeat events, {t0 - (t_fault or scale.lo):+.1f}s to {t1 - (t_fault or scale.lo):+.1f}s"})
                start = b
        rows.append({"node": node, "y": y, "cells": cells})
        for e in events:
            if e.get("node") != node:
                continue
            kind, rel = e.get("kind"), e["ts"] - (t_fault or scale.lo)
            who = f"{node}" + (f"/rank{e['rank']}" if e.get("rank") is not None else "")
            if kind == "fault.injected":
                markers.append(_marker("fault", scale(e["ts"]), y + row_h / 2, f"{e.get('fault_kind')} injected on {', '.join(e.get('targets') or [node])}"))
            elif kind == "detect":
                markers.append(_marker("detect", scale(e["ts"]), y + row_h / 2, f"{who} noticed at {rel:+.2f}s: {e.get('why', 'detect')}"))
            elif kind in ("worker.exit", "process.gone"):
                markers.append(_marker("exit", scale(e["ts"]), y + row_h / 2, f"{kind} {who} at {rel:+.2f}s" + (f" (exit code {e['exitcode']})" if "exitcode" in e else "")))
            elif kind == "worker.start":
                markers.append(_marker("start", scale(e["ts"]), y + row_h / 2, f"worker start {who} pid {e.get('pid')} at {rel:+.2f}s"))
    lines = []
    if t_fault is not None:
        lines.append({"kind": "fault", "x": scale(t_fault), "label": "fault"})
    if timing and timing.get("t_detect") is not None:
        lines.append({"kind": "detect", "x": scale(timing["t_detect"]), "label": f"detected +{timing['t_detect'] - t_fault:.2f}s"})
    later = {}  # a cascade's later faults on the same timeline, one line each (its injections share a fault id)
    for e in events:
        if e.get("kind") == "fault.injected" and t_fault is not None and e["ts"] > t_fault:
            later.setdefault(str(e.get("fault") or "").split(".")[0], e)
    for fid, e in later.items():
        lines.append({"kind": "fault", "x": scale(e["ts"]), "label": f"{fid} {e.get('fault_kind')} +{e['ts'] - t_fault:.2f}s"})
    for e in events:  # a stop condition of the site's monitoring that ended the drill
        if e.get("kind") == "safety.stop":
            lines.append({"kind": "fault", "x": scale(e["ts"]), "label": f"stop_when.{e.get('condition')} fired ({e.get('value')})"})
    return {"w": _W, "h": height, "top": top, "row_h": row_h, "left": _LEFT, "bottom": top + row_h * len(nodes),
            "rows": rows, "markers": markers, "lines": lines, "ticks": _time_ticks(scale, t_fault or scale.lo),
            "detected_by": (timing or {}).get("detected_by")}


def _corrupt_steps(silent: Silent | None) -> set[int]:
    """The steps of the checkpoints a silent fault made corrupt (``result.json["silent"]["checkpoints"]``)."""
    return {c.step for c in (silent.checkpoints if silent is not None else []) if c.corrupt}


_SILENT_ROWS = (
    ("detection_s", "detection", "the fault to its first sign: sdc.detected, loss.anomaly, a rank's detect", "s"),
    ("corrupt_steps", "corrupt steps", "steps trained on corrupt state before it was noticed", ""),
    ("fault_step", "corrupted at step", "the step the fault took effect in", ""),
    ("last_clean_checkpoint", "last clean checkpoint", "the newest checkpoint saved before the corruption", ""),
    ("lost_steps", "lost work", "steps back to the last clean checkpoint", ""),
    ("recovered", "recovered", "a new world restored a checkpoint from before the corruption", ""),
)


def _silent_rows(silent: Silent | None) -> dict[str, Any] | None:
    """A silent fault's measures (``result.json["silent"]``) as table rows, its FAIL reason, and its checkpoints."""
    if silent is None:
        return None
    marks = [f"{c.step} {'corrupt' if c.corrupt else 'clean'}" for c in silent.checkpoints]
    return {"rows": _measure_rows(silent, _SILENT_ROWS), "reason": silent.reason, "detected_by": silent.detected_by,
            "checkpoints": marks}


def _checkpoint_chart(events: list[dict[str, Any]], t_fault: float | None, timing: dict[str, Any] | None,
                      corrupt: set[int] | None = None) -> dict[str, Any] | None:
    """Step over time: saves, the fault, the roll-back to the restored step, lost work shaded."""
    steps = [e for e in events if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    span = _time_range(events)
    if not steps or span is None:
        return None
    top, height = 18, 210
    bottom = height - 24
    max_step = max(e["step"] for e in steps)
    y_ticks = nice_ticks(0, max_step, 5)
    x = _Scale(span[0], span[1], _LEFT, _W - 10)
    y = _Scale(0, max(max_step, y_ticks[-1]), bottom, top)
    # One line per stretch of training: break it at each fault and wherever the step
    # goes backwards (a restore); ranks may lag one another by a step.
    faults = sorted(e["ts"] for e in events if e.get("kind") == "fault.injected")
    segments: list[list[tuple[float, int]]] = [[]]
    frontier, prev_ts = -1, None
    for e in steps:
        crossed = prev_ts is not None and any(prev_ts < f <= e["ts"] for f in faults)
        if (crossed or e["step"] < frontier - 2) and segments[-1]:
            segments.append([])
            frontier = -1
        segments[-1].append((e["ts"], e["step"]))
        frontier, prev_ts = max(frontier, e["step"]), e["ts"]
    paths = []
    width = (x.hi - x.lo) / (_BINS * 2)
    for seg in segments:
        binned: dict[int, tuple[float, int]] = {}
        for ts, step in seg:
            b = int((ts - x.lo) / width)
            if b not in binned or step > binned[b][1]:
                binned[b] = (ts, step)
        pts = [binned[b] for b in sorted(binned)]
        paths.append(" ".join(f"{x(ts)},{y(step)}" for ts, step in pts))
    rel = (lambda ts: ts - t_fault) if t_fault is not None else (lambda ts: ts - x.lo)
    corrupt = corrupt or set()
    saves = [_marker("save-corrupt" if e["step"] in corrupt else "save", x(e["ts"]), y(e["step"]),
                     f"checkpoint of step {e['step']} saved at {rel(e['ts']):+.2f}s" + (f" ({e['bytes']} bytes)" if e.get("bytes") else "")
                     + (": corrupt (saved after a silent corruption)" if e["step"] in corrupt else ""))
             for e in events if e.get("kind") == "ckpt.save.end" and isinstance(e.get("step"), int)]
    loads = [_marker("load", x(e["ts"]), y(e["step"]), f"rank {e.get('rank')} loaded step {e['step']} at {rel(e['ts']):+.2f}s")
             for e in events if e.get("kind") == "ckpt.load.end" and isinstance(e.get("step"), int)]
    chart: dict[str, Any] = {
        "w": _W, "h": height, "top": top, "bottom": bottom, "left": _LEFT, "paths": paths, "saves": saves, "loads": loads,
        "x_ticks": _time_ticks(x, t_fault or x.lo), "y_ticks": [{"y": y(t), "label": f"{t:g}"} for t in y_ticks],
        "fault_x": None if t_fault is None else x(t_fault), "down": None, "lost": None, "rollback": None, "summary": None,
    }
    timing = timing or {}
    before, restored, resumed = timing.get("last_step_before"), timing.get("restored_step"), timing.get("t_resumed")
    if t_fault is not None:
        end = resumed if resumed is not None else x.hi
        chart["down"] = {"x": x(t_fault), "w": round(x(end) - x(t_fault), 1),
                         "title": f"no training: {end - t_fault:.2f}s" + ("" if resumed is not None else " (training did not resume)")}
    if t_fault is not None and before is not None and restored is not None and resumed is not None:
        # Lost work: the band of steps computed twice, from when the restored step was
        # first reached until the job got back past the last step before the fault.
        reached = [e["ts"] for e in steps if e["ts"] <= t_fault and e["step"] >= restored]
        regained = [e["ts"] for e in steps if e["ts"] >= resumed and e["step"] >= before]
        t_from, t_to = (reached[0] if reached else t_fault), (regained[0] if regained else resumed)
        chart["lost"] = {"x": x(t_from), "y": y(before), "w": round(x(t_to) - x(t_from), 1), "h": max(1.0, round(y(restored) - y(before), 1)),
                         "title": f"lost work: steps {restored + 1}..{before} ({before - restored} steps), done before the fault and again after the restore"}
        chart["rollback"] = {"x1": x(t_fault), "y1": y(before), "x2": x(resumed), "y2": y(restored),
                             "label": f"rolled back to step {restored}"}
        chart["summary"] = (f"last step before the fault {before}; restored from the checkpoint of step {restored}; "
                            f"{before - restored} steps of work lost; training resumed {resumed - t_fault:.2f}s after the fault")
    elif t_fault is not None:
        chart["summary"] = "training did not resume after the fault" if resumed is None else "no checkpoint was restored"
    return chart


def _worlds(events: list[dict[str, Any]], t_fault: float, t_end: float | None) -> tuple[dict, dict]:
    before: dict[Any, dict[str, Any]] = {}
    after: dict[Any, dict[str, Any]] = {}
    for e in events:
        if e.get("kind") != "worker.start" or e.get("rank") is None:
            continue
        if e["ts"] <= t_fault:
            before[e["rank"]] = e
        elif t_end is None or e["ts"] <= t_end:
            after[e["rank"]] = e
    return before, after


def _migration(events: list[dict[str, Any]], nodes: list[str], t_fault: float | None, timing: dict[str, Any] | None) -> dict[str, Any] | None:
    """Which ranks ran on which node before the fault and in the world that replaced it."""
    if t_fault is None or not nodes:
        return None
    before, after = _worlds(events, t_fault, (timing or {}).get("t_resumed"))
    if not before and not after:
        return None
    ranks = sorted(set(before) | set(after), key=lambda r: (str(type(r)), r))
    chip_h, pad, head = 20, 8, 30
    left_x, right_x, box_w = 20, _W - 300, 280

    def column(world: dict, x0: float) -> tuple[list[dict[str, Any]], dict[Any, float]]:
        boxes, where, y = [], {}, head
        for node in nodes:
            mine = [r for r in ranks if r in world and world[r].get("node") == node]
            h = pad * 2 + chip_h * max(1, len(mine))
            chips = []
            for j, r in enumerate(mine):
                cy = y + pad + j * chip_h
                e = world[r]
                chips.append({"y": cy, "label": f"rank {r} · pid {e.get('pid')}" + (f" · restart {e['restart_count']}" if e.get("restart_count") else "")})
                where[r] = cy + chip_h / 2
            boxes.append({"node": node, "x": x0, "y": y, "h": h, "chips": chips, "empty": not mine})
            y += h + 10
        return boxes, where

    left, ly = column(before, left_x)
    right, ry = column(after, right_x)
    links, rows, moved, stayed, lost = [], [], 0, 0, 0
    for r in ranks:
        b, a = before.get(r), after.get(r)
        if b and a:
            same = b.get("node") == a.get("node")
            moved, stayed = moved + (not same), stayed + same
            links.append({"x1": left_x + box_w, "y1": ly[r], "x2": right_x, "y2": ry[r], "moved": not same,
                          "title": f"rank {r}: {b.get('node')} -> {a.get('node')}" + (" (migrated)" if not same else " (restarted in place)")})
        elif b:
            lost += 1
        rows.append({"rank": r, "node_before": b and b.get("node"), "pid_before": b and b.get("pid"),
                     "node_after": a and a.get("node"), "pid_after": a and a.get("pid"),
                     "restart": a and a.get("restart_count"), "moved": bool(b and a and b.get("node") != a.get("node"))})
    height = max([bx["y"] + bx["h"] for bx in left + right] + [head]) + 10
    parts = [f"{stayed} rank{'s' if stayed != 1 else ''} restarted in place", f"{moved} migrated to another node"]
    if lost:
        parts.append(f"{lost} did not come back")
    if not after:
        parts = ["no new world formed after the fault"]
    return {"w": _W, "h": height, "box_w": box_w, "chip_h": chip_h, "left": left, "right": right, "links": links,
            "rows": rows, "summary": "; ".join(parts), "left_x": left_x, "right_x": right_x,
            "world_before": len(before), "world_after": len(after)}


def _waterfall(timing: dict[str, Any] | None, slo: dict[str, Any], t_fault: float | None) -> dict[str, Any] | None:
    """Detection, reallocation, checkpoint load and resume from the fault, with SLO lines."""
    if not timing or t_fault is None:
        return None
    rel = {k: (timing.get(k) - t_fault if timing.get(k) is not None else None) for k in ("t_detect", "t_realloc", "t_loaded", "t_resumed")}
    spans = (
        ("detection", 0.0 if rel["t_detect"] is not None else None, rel["t_detect"], "detection"),
        ("reallocation", rel["t_detect"], rel["t_realloc"], "reallocation"),
        ("checkpoint load", rel["t_realloc"], rel["t_loaded"], "checkpoint_load"),
        ("resume", rel["t_loaded"], rel["t_resumed"], None),
        ("recovery", 0.0 if rel["t_resumed"] is not None else None, rel["t_resumed"], "recovery"),
    )
    ends = [v for v in rel.values() if v is not None]
    for _, start, _, slo_name in spans:
        entry = slo.get(slo_name) if slo_name else None
        if entry:
            ends.append((start or 0.0) + entry["limit_s"])
    hi = max(ends + [0.1]) * 1.08
    label_w, w, row_h, top = 110, 560, 18, 6
    x = _Scale(0.0, hi, label_w, w - 70)
    rows, slo_marks = [], []
    for i, (label, start, end, slo_name) in enumerate(spans):
        y = top + i * row_h
        entry = slo.get(slo_name) if slo_name else None
        row: dict[str, Any] = {"label": label, "y": y, "bar": None, "startup": None, "text": "not observed", "text_x": label_w,
                               "fail": bool(entry and not entry["pass"])}
        if start is not None and end is not None:
            row["bar"] = {"x": x(start), "w": max(1.0, round(x(end) - x(start), 1)), "title": f"{label}: {end - start:.3f}s (from {start:+.3f}s to {end:+.3f}s)"}
            row["text"] = f"{end - start:.2f}s"
            row["text_x"] = round(row["bar"]["x"] + row["bar"]["w"] + 4, 1)
            if slo_name == "checkpoint_load" and timing.get("startup_s") is not None:
                row["startup"] = {"x": x(start), "w": round(x(start + timing["startup_s"]) - x(start), 1), "title": f"worker start-up until the process group was ready: {timing['startup_s']:.3f}s"}
        if entry and slo_name != "recovery":
            sx = x((start or 0.0) + entry["limit_s"]) if start is not None else None
            if sx is not None:
                slo_marks.append({"x": sx, "y": y, "title": f"{label} SLO {entry['limit_s']:g}s"})
                if abs(sx - row["text_x"]) < 40:  # keep the figure clear of the SLO mark
                    row["text_x"] = round(sx + 5, 1)
        rows.append(row)
    height = top + row_h * len(spans) + 22
    rec = slo.get("recovery")
    return {"w": w, "h": height, "label_w": label_w, "row_h": row_h, "rows": rows, "slo_marks": slo_marks,
            "recovery_slo": None if not rec else {"x": x(rec["limit_s"]), "label": f"recovery SLO {rec['limit_s']:g}s"},
            "ticks": [{"x": x(t), "label": f"{t:g}s"} for t in nice_ticks(0.0, hi, 6) if t <= hi],
            "bottom": top + row_h * len(spans)}


# -- coverage -------------------------------------------------------------------------


def _coverage_view(cov: dict[str, Any]) -> dict[str, Any]:
    total = cov["weight_total"] or 1
    marks = {"covered": "\u2713", "failed": "\u2717", "not attempted": "\u25cb", "not runnable here": "\u2298"}
    classes = [{**c, "share": c["weight"] / total, "css": c["status"].replace(" ", "-"), "mark": marks.get(c["status"], "")}
               for c in cov["classes"]]
    matrix = [{"category": cat, "cells": [[c for c in classes if c["category"] == cat and c["scope"] == scope] for scope in SCOPES]}
              for cat in CATEGORIES]
    return {**cov, "classes": classes, "matrix": matrix, "scopes": SCOPES}


def _recovery_trends(history: Iterable[dict[str, Any]], regressions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario, its recovery over the game days of the history that measured it (the last 30): a sparkline,
    the latest figure, and whether this game day flagged it as a regression."""
    series: dict[str, list[tuple[str, float]]] = {}
    for e in list(history)[-30:]:
        figures = e.get("figures")
        for name, fig in (figures.items() if isinstance(figures, dict) else ()):
            value = fig.get("recovery_s") if isinstance(fig, dict) else None
            if isinstance(value, (int, float)):
                series.setdefault(name, []).append((str(e.get("started_at", "?")), float(value)))
    flagged = {r["scenario"]: r for r in regressions}
    w, h, pad = 220, 36, 4
    rows = []
    for name, points in sorted(series.items()):
        top = max(v for _, v in points) or 1.0
        x = _Scale(0, max(1, len(points) - 1), pad, w - pad)
        y = _Scale(0.0, top * 1.1, h - pad, pad)
        xy = [(x(i) if len(points) > 1 else w / 2, y(v), t, v) for i, (t, v) in enumerate(points)]
        reg = flagged.get(name)
        rows.append({"scenario": name, "w": w, "h": h, "line": " ".join(f"{a:.1f},{b:.1f}" for a, b, _, _ in xy),
                     "dots": [{"x": a, "y": b, "title": f"{t}: {v:.2f}s"} for a, b, t, v in xy],
                     "last": points[-1][1], "count": len(points),
                     "regression": None if reg is None else f"{reg['now']:.2f}s against a median of {reg['baseline']:.2f}s "
                                                            f"over {reg['runs']} game days (+{(reg['ratio'] - 1):.0%})"})
    return rows


def _trend(history: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    entries = list(history)[-30:]
    if not entries:
        return None
    w, h, left, top, bottom = 560, 170, 44, 10, 140
    x = _Scale(0, max(1, len(entries) - 1), left + 10, w - 16)
    y = _Scale(0.0, 1.0, bottom, top)
    points = []
    for i, e in enumerate(entries):
        points.append({"x": x(i) if len(entries) > 1 else (left + w) / 2, "plain_y": y(e.get("plain") or 0), "weighted_y": y(e.get("weighted") or 0),
                       "title": f"{e.get('started_at', '?')}: coverage {(e.get('plain') or 0):.1%}, weighted {(e.get('weighted') or 0):.1%}, "
                                f"{e.get('passed', '?')}/{e.get('scenarios', '?')} scenarios passed"})
    return {"w": w, "h": h, "left": left, "bottom": bottom, "points": points,
            "plain": " ".join(f"{p['x']},{p['plain_y']}" for p in points),
            "weighted": " ".join(f"{p['x']},{p['weighted_y']}" for p in points),
            "y_ticks": [{"y": y(v), "label": f"{v:.0%}"} for v in (0, 0.25, 0.5, 0.75, 1.0)],
            "first": entries[0].get("started_at", "")[:10], "last": entries[-1].get("started_at", "")[:10], "count": len(entries)}
