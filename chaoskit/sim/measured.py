"""Recovery phases measured by chaoskit runs, read back for the simulator.

``load_phases(path, fallbacks)`` accepts:

- a run's ``result.json``, or the run directory that holds it;
- a game day: ``gameday.json`` (or the directory that holds it). Its
  ``scenarios`` records (as ``chaoskit gameday`` writes them) carry each run's
  phases; a ``results`` list may instead hold result paths (relative to the
  file), run directories, or the results themselves; a bare JSON list works too.

Each result gives one recovery: ``phases.detection_s``,
``phases.reallocation_s`` and ``phases.checkpoint_load_s``. A phase the run did
not observe is ``null``: it is filled from ``fallbacks`` (values the user gave
by hand) and never read as zero; with no fallback it is an error. A game-day
scenario that never ran (no ``phases`` at all) is skipped with a note. Raises
:class:`~chaoskit.core.errors.ScenarioError` (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from chaoskit.core.errors import ScenarioError
from chaoskit.core.phases import PHASE_TABLE
from chaoskit.sim.model import RecoveryPhases

__all__ = ["PHASE_FIELDS", "load_phases"]

PHASE_FIELDS = {p.name: (p.key, p.sim_flag) for p in PHASE_TABLE if p.sim_flag}
"""The phases the simulator's model has a term for (``core/phases.Phase.sim_flag``): name -> (its key in
``result.json``'s ``phases``, which is :class:`~chaoskit.sim.model.RecoveryPhases`' field, and the option that fills
it in)."""


def load_phases(path: Path, fallbacks: Mapping[str, float | None]) -> tuple[list[RecoveryPhases], list[str]]:
    """Return the recoveries found at ``path`` and notes for the user.

    ``fallbacks`` maps ``detection``/``reallocation``/``checkpoint_load`` to a
    value given by hand (or ``None``); it fills a phase a run did not observe
    and never replaces a measured one.
    """
    notes: list[str] = []
    results = _collect(Path(path), set(), notes)
    phases: list[RecoveryPhases] = []
    unused = {name for name, v in fallbacks.items() if v is not None}
    for origin, result in results:
        measured = result["phases"]
        reasons = measured.get("reasons") if isinstance(measured.get("reasons"), dict) else {}
        values: dict[str, float] = {}  # by key
        for name, (key, flag) in PHASE_FIELDS.items():
            value = measured.get(key)
            if value is None:
                given = fallbacks.get(name)
                why = reasons.get(name) or "not observed"
                if given is None:
                    raise ScenarioError(
                        f"{origin}: {key} is null ({why})",
                        hint=f"the run did not measure it; pass {flag} DURATION to fill it in, or use a run that observed it",
                    )
                values[key] = given
                unused.discard(name)
                notes.append(f"{origin}: {name} was not observed; using {flag} {given:g}s")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ScenarioError(f"{origin}: {key} must be a non-negative number of seconds, got {value!r}")
            values[key] = float(value)
        label = result.get("scenario") or origin
        phases.append(RecoveryPhases(**values, source=str(label)))
    for name in sorted(unused):
        notes.append(f"{PHASE_FIELDS[name][1]} was not used: every run measured {name} (drop --from-run to try other values)")
    if len(phases) > 1:
        notes.append(f"{len(phases)} recoveries from {path}; each failure draws one of them with equal weight")
    return phases, notes


def _collect(path: Path, seen: set[Path], notes: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Every result reachable from ``path`` as ``(where it came from, result)``."""
    if path.is_dir():
        for name in ("result.json", "gameday.json"):
            if (path / name).is_file():
                return _collect(path / name, seen, notes)
        raise ScenarioError(f"{path}: neither result.json nor gameday.json is in this directory",
                            hint="pass a run directory, its result.json, or a game day's gameday.json")
    if path.resolve() in seen:
        raise ScenarioError(f"{path}: the game day lists itself", hint="list result files, not game days")
    seen = seen | {path.resolve()}
    data = _read_json(path)
    if isinstance(data, dict) and "phases" in data:
        if not isinstance(data["phases"], dict):
            raise ScenarioError(f"{path}: 'phases' is {data['phases']!r}: this run measured no recovery",
                                hint="use a run in which a fault was injected and the job recovered")
        return [(str(path), data)]
    if isinstance(data, dict):
        items = data.get("scenarios") if isinstance(data.get("scenarios"), list) else data.get("results")
    else:
        items = data
    if not isinstance(items, list):
        raise ScenarioError(f"{path}: expected a result.json (with 'phases') or a game day (with 'scenarios' or 'results')",
                            hint="pass the result.json that 'chaoskit run' wrote, or a game day's gameday.json")
    out: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(items):
        where = f"{path}: {item.get('scenario') or i}" if isinstance(item, dict) else f"{path}: [{i}]"
        if isinstance(item, str):
            out.extend(_collect(_relative(path, item), seen, notes))
        elif isinstance(item, dict) and isinstance(item.get("phases"), dict):
            out.append((where, item))
        elif isinstance(item, dict) and isinstance(item.get("result"), dict):
            out.append((where, item["result"]))
        elif isinstance(item, dict) and isinstance(item.get("result_path") or item.get("path"), str):
            out.extend(_collect(_relative(path, item.get("result_path") or item.get("path")), seen, notes))
        elif isinstance(item, dict) and "phases" in item:  # a game-day scenario that measured nothing
            status = item.get("status") or "not run"
            notes.append(f"{where}: skipped, no recovery was measured (status {status})")
        else:
            raise ScenarioError(f"{where}: expected a path to a result or a result object with 'phases'")
    if not out:
        raise ScenarioError(f"{path}: the game day holds no measured recovery", hint="run its scenarios first ('chaoskit gameday')")
    return out


def _relative(base: Path, ref: str) -> Path:
    return Path(ref) if Path(ref).is_absolute() else base.parent / ref


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file", hint="pass the result.json of a run, or a game day's gameday.json") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
