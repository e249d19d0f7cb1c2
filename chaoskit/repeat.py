"""``chaoskit run --repeat N``: the same drill N times back to back, judged on the distribution.

Each sample is an ordinary run into ``<out>/sample-NN/`` (its own result.json, events,
journal and report), on the same lab: one that ``chaoskit lab up`` left is reused by every
sample, as by any run. The folder itself gets:

- ``result.json``: ``{"repeat": N, "samples": [...], "distribution": {<phase>_s: {n, missing,
  p50, p95, max, ci95, samples}}, "slo": ..., "verdict": ...}`` (phases named as in a run's
  ``phases``; :mod:`chaoskit.distribution` says how each figure is computed);
- ``report.html``: each phase's samples as a strip against its SLO, and every sample's run.

The verdict passes when every sample's own checks passed (the job reached steady state,
finished, every fault was reverted) and every SLO holds on the distribution: a plain limit
for every sample, ``{p95: 60s}`` for that percentile. A sample that fails only a
percentile SLO does not fail the repeat by itself.

A sample that cannot run (exit 2 or 3) or is interrupted stops the repeats; the folder
still gets its result.json with the samples so far and ``stopped: {early, why, after}`` (which
sample, and its error or verdict), then the error is raised as usual.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from chaoskit.core.errors import ChaoskitError, ExitCode, ScenarioError
from chaoskit.core.files import RESULT_FILE, empty_out_dir, utc_iso, utc_stamp
from chaoskit.core.limits import MAX_REPEAT
from chaoskit.core.progress import Progress, Subscriber, TerminalProgress
from chaoskit.core.result import REPEAT_KIND, RunResult
from chaoskit.distribution import distribution, slo_on_distribution
from chaoskit.runner import RunOutcome, run_scenario
from chaoskit.scenario import load_scenario

__all__ = ["run_repeated", "SAMPLE_DIR"]

SAMPLE_DIR = "sample-{:02d}"


def run_repeated(path: str | Path, repeat: int, *, out: Path | None = None, console=None, capabilities=None,
                 after_run: Callable[[Path], Any] | None = None,
                 after_all: Callable[[Path], Any] | None = None, wait: str | None = None,
                 progress: Subscriber | None = None) -> RunOutcome:
    """Run the scenario at ``path`` ``repeat`` times into ``out`` (default ``reports/<UTC>-<name>-xN``).

    ``after_run(sample_dir)`` follows each sample (its report), ``after_all(out)`` the whole (the
    distribution's report); ``wait`` and ``progress`` (a subscriber to the progress events, beside ``console``'s) are
    passed to each sample's :func:`run_scenario`, and each sample begins with a ``sample`` event. Raises :class:`ScenarioError` on a bad count or an ``out`` that
    holds files, and whatever a sample raised, once the folder's result.json is written."""
    if not 1 <= repeat <= MAX_REPEAT:
        raise ScenarioError(f"--repeat {repeat} is out of range: 1 to {MAX_REPEAT}", hint="e.g. --repeat 5")
    loaded = load_scenario(path)  # a bad file fails here, before any sample
    started = time.time()
    out = Path(out) if out else Path("reports") / f"{utc_stamp(started)}-{loaded.model.name}-x{repeat}"
    empty_out_dir(out, "repeat")
    samples: list[dict[str, Any]] = []
    raised: BaseException | None = None
    code = ExitCode.OK
    for i in range(1, repeat + 1):
        sample_dir = out / SAMPLE_DIR.format(i)
        header = Progress("sample", f"[bold]sample {i} of {repeat}[/bold]", data={"sample": i, "of": repeat})
        for subscriber in (TerminalProgress(console) if console is not None else None, progress):
            if subscriber is not None:
                subscriber(header)
        try:
            outcome = run_scenario(path, out=sample_dir, console=console, capabilities=capabilities, after_run=after_run,
                                   wait=wait, progress=progress)
        except ChaoskitError as exc:
            samples.append(_sample(sample_dir, _read(sample_dir), exc.exit_code, error=str(exc)))
            raised = exc
            break
        except KeyboardInterrupt as exc:  # before the run's own handling began (opening the lab): stop, keep what ran
            samples.append(_sample(sample_dir, _read(sample_dir), ExitCode.INTERRUPTED, error="interrupted by Ctrl-C or SIGTERM"))
            raised = exc
            break
        samples.append(_sample(sample_dir, outcome.result, outcome.exit_code))
        if outcome.exit_code in (ExitCode.INTERRUPTED, ExitCode.ABORTED):
            code = ExitCode(outcome.exit_code)
            break
    result = summarize_samples(loaded.model.name, str(loaded.path), repeat, samples, loaded.model.slo.model_dump(),
                               started=started)
    result["run_dir"] = str(out)
    result["stopped"] = _stopped(samples, repeat)
    (out / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
    if after_all is not None:
        try:
            said = after_all(out)
        except Exception as exc:  # noqa: BLE001 - the samples are safe in their files; say so and go on
            said = f"after the repeats: {type(exc).__name__}: {exc}"
        if said and console is not None:
            console.print(str(said))
        if said and progress is not None:
            progress(Progress("note", str(said)))
    if raised is not None:
        raise raised
    if code == ExitCode.OK and result["verdict"] != "pass":
        code = ExitCode.CHECK_FAILED
    return RunOutcome(int(code), result, out)


def summarize_samples(name: str, scenario_file: str, repeat: int, samples: list[dict[str, Any]],
                      slo: dict[str, Any], *, started: float) -> dict[str, Any]:
    """The repeat's ``result.json`` from its samples (as :func:`run_repeated` records them)."""
    measured = [s for s in samples if s["phases"] is not None]
    dist = distribution(s["phases"] for s in measured)
    slo_result = slo_on_distribution(dist, slo) if measured else {}
    checks_ok = all(s["checks_pass"] for s in samples)
    complete = len(samples) == repeat and all(s["status"] not in ("error", "interrupted", "aborted") for s in samples)
    verdict = "pass" if complete and checks_ok and all(v["pass"] for v in slo_result.values()) else "fail"
    ended = time.time()
    return {
        "scenario": name,
        "scenario_file": scenario_file,
        "kind": REPEAT_KIND,
        "verdict": verdict,
        "repeat": repeat,
        "completed": len(measured),
        "started_at": utc_iso(started),
        "ended_at": utc_iso(ended),
        "duration_s": round(ended - started, 3),
        "samples": samples,
        "distribution": dist,
        "slo": slo_result,
    }


def _stopped(samples: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    """Whether the repeats ended before the N asked for, and why: the last sample's error or verdict."""
    if len(samples) >= repeat or not samples:
        return {"early": False, "why": None, "after": len(samples)}
    last = samples[-1]
    return {"early": True, "why": f"{last['dir']}: {last.get('error') or last['status']}", "after": len(samples)}


def _sample(sample_dir: Path, result: dict[str, Any] | None, exit_code: int, error: str | None = None) -> dict[str, Any]:
    run = RunResult.model_validate(result or {})
    status = run.verdict or "error"  # no result at all: the default verdict, error
    return {
        "dir": sample_dir.name,
        "status": "error" if error else status,
        "exit_code": int(exit_code),
        "phases": run.phases.dump() if run.faults else None,
        "injected_kinds": run.injected_kinds,
        "checks_pass": error is None and status not in ("error",) and all(c.passed for c in run.checks.values()),
        "slo_pass": all(v.passed for v in run.slo.values()),
        **({"error": error} if error else {}),
    }


def _read(sample_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((sample_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
