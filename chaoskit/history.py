"""What game days remember: per-scenario figures over time, regressions against them, coverage that decays.

Every game day appends one line to ``history.jsonl`` (beside its folder). Besides the coverage
it always recorded, the line holds each scenario's figures (``figures``: status and phases;
with repeats, the phases' medians and the sample count), so that

- :func:`find_regressions` can say that a scenario's recovery today is more than a threshold
  above the median of its last K game days (``chaoskit gameday --fail-on-regression 25%``);
- :func:`fresh_coverage` can count a class as covered only while some game day proved it within
  a window (``--fresh 30d``): a reliability score that decays when the drills stop.

Pure functions over the history's entries; reading and appending the file is
:mod:`chaoskit.core.files`' and the game day's.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from chaoskit.core.files import parse_utc_iso, utc_iso
from chaoskit.core.phases import PHASE_TABLE
from chaoskit.coverage import Capabilities, catalog_by_id, compute_coverage
from chaoskit.distribution import percentile

__all__ = ["REGRESSION_WINDOW", "FIGURES", "scenario_figures", "find_regressions", "fresh_coverage"]

REGRESSION_WINDOW = 5
"""How many earlier game days a scenario's recovery is compared with (their median)."""
FIGURES = tuple(p.key for p in PHASE_TABLE)
"""The figures the history keeps of each scenario: every phase of ``core/phases.PHASE_TABLE``."""


def scenario_figures(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario name, what the history keeps of it: status, phases (medians with repeats), samples."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("status") is None:
            continue
        phases = r.get("phases") or {}
        out[r["scenario"]] = {"status": r["status"], "samples": r.get("samples") or 1,
                              **{k: phases.get(k) for k in FIGURES}}
    return out


def find_regressions(current: Mapping[str, Mapping[str, Any]], history: Iterable[Mapping[str, Any]],
                     threshold: float, window: int = REGRESSION_WINDOW, figure: str = "recovery_s") -> list[dict[str, Any]]:
    """Scenarios whose ``figure`` now is more than ``threshold`` (0.25 = 25%) above the median of their last
    ``window`` measured values in ``history`` (oldest first). A scenario with no earlier figure has no baseline,
    and one whose figure is missing now is not judged here (its SLO already fails it)."""
    past: dict[str, list[float]] = {}
    for entry in history:
        figures = entry.get("figures")
        for name, fig in (figures.items() if isinstance(figures, Mapping) else ()):
            value = fig.get(figure) if isinstance(fig, Mapping) else None
            if isinstance(value, (int, float)):
                past.setdefault(name, []).append(float(value))
    found = []
    for name, fig in current.items():
        now, before = fig.get(figure), past.get(name, [])[-window:]
        if not isinstance(now, (int, float)) or not before:
            continue
        baseline = percentile(before, 50)
        if now > baseline * (1 + threshold):
            found.append({"scenario": name, "figure": figure, "now": round(float(now), 4), "baseline": round(baseline, 4),
                          "runs": len(before), "ratio": round(now / baseline, 3) if baseline else None,
                          "threshold": threshold})
    return found


def fresh_coverage(records: list[Mapping[str, Any]], caps: Capabilities, history: Iterable[Mapping[str, Any]],
                   window_s: float, now: float) -> dict[str, Any]:
    """Coverage counting a class when this game day or an earlier one within ``window_s`` seconds of ``now``
    proved it (a scenario of the class passed). ``proven_at`` gives each counted class the latest such time."""
    classes = catalog_by_id()
    proven: dict[str, str] = {}
    extra = []
    for entry in history:
        started = parse_utc_iso(entry.get("started_at"))
        if started is None or now - started > window_s:
            continue
        for cls in entry.get("covered") or []:
            if cls in classes:
                proven[cls] = max(proven.get(cls, ""), entry["started_at"])
                extra.append({"scenario": f"game day of {entry['started_at']}", "covers": [cls],
                              "injected_kinds": list(classes[cls].kinds), "status": "pass"})
    cov = compute_coverage([*records, *extra], caps)
    stamp = utc_iso(now)
    for r in records:
        if r.get("status") == "pass":
            for cls in r.get("covers") or []:
                if set(r.get("injected_kinds") or []) & set(classes[cls].kinds if cls in classes else ()):
                    proven[cls] = stamp
    return {**cov, "window_s": window_s, "proven_at": {c: proven[c] for c in cov["covered"] if c in proven}}
