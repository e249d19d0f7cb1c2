"""A game day: run a suite of scenarios in turn, score fault coverage, report.

:func:`run_gameday` runs every scenario with :func:`chaoskit.runner.run_scenario`
into a folder of its own (``<out>/<NN>-<name>/``), going on past failures: a
scenario that cannot load or start (exit 2 or 3), fails its SLOs or aborts is
recorded and the next one runs. Only Ctrl-C (or SIGTERM) stops the suite, after
the current run reverted its faults.

It writes, in ``out``:

- ``gameday.json``: the record of every scenario and the coverage, rewritten
  after each scenario (``finished: false`` until the end), so a game day that
  dies half way still leaves what it did;
- ``junit.xml`` for CI, ``index.html`` for people;

and appends one line to ``<out>/../history.jsonl`` (``reports/history.jsonl``
for the default ``out``), which the report draws as a trend.

Exit status: 0 when every scenario passed and coverage reached the minimum,
1 otherwise, 130 when interrupted.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.core.errors import ChaoskitError, ExitCode, ScenarioError
from chaoskit.core.files import GAMEDAY_FILE, HISTORY_FILE, UnsafePath, append_own, make_run_dir, read_history, write_new
from chaoskit.core.progress import Progress
from chaoskit.core.result import REPEAT_KIND, RunResult
from chaoskit.coverage import (
    catalog_by_id,
    compute_coverage,
    detect_capabilities,
    resolve_covers,
)
from chaoskit.history import find_regressions, fresh_coverage, scenario_figures
from chaoskit.labpool import LabPool, group_order
from chaoskit.repeat import run_repeated
from chaoskit.report.html import write_gameday_report, write_repeat_report, write_run_report
from chaoskit.report.junit import write_junit
from chaoskit.report.metrics import check_push_url, push_gameday
from chaoskit.runner import install_sigterm, interrupts_deferred, run_scenario
from chaoskit.scenario import load_scenario, scenario_files

__all__ = ["GamedayOutcome", "run_gameday", "summarize"]

ERROR_FILE = "error.json"


@dataclass
class GamedayOutcome:
    exit_code: int
    summary: dict[str, Any]
    out_dir: Path


def run_gameday(
    paths: list[str | Path],
    *,
    out: Path | None = None,
    min_coverage: float | None = None,
    console=None,
    capabilities=None,
    fail_on_regression: float | None = None,
    fresh_s: float | None = None,
    until: str = "recovered",
    push: str | None = None,
) -> GamedayOutcome:
    """Run the scenarios under ``paths`` (files, or folders searched for YAML).

    ``min_coverage`` is a fraction (0..1) of plain coverage (of the fresh coverage with
    ``fresh_s``); ``capabilities`` (a :class:`chaoskit.coverage.Capabilities`) defaults to probing
    this machine. ``fail_on_regression`` (0.25 = 25%): fail when a scenario's recovery is that much
    above the median of its last game days in the history; ``fresh_s``: coverage counts a class
    proven by this game day or by one in the history within that many seconds. ``until``: each
    drill's ``workload.wait`` where the scenario sets none: ``recovered`` (the default: stop once
    the job trained on after its recovery and every fault was reverted) or ``finish``.
    ``push``: a Pushgateway's URL, pushed the game day's metrics (:mod:`chaoskit.report.metrics`) once
    every file is written; :class:`InfraError` when that fails.
    Raises :class:`ScenarioError` when there is nothing to run, ``out`` already
    holds a game day or ``push`` is no http(s) URL.
    """
    if push is not None:
        check_push_url(push)
    files = scenario_files(list(paths))
    if not files:
        raise ScenarioError(f"no scenario files in {', '.join(map(str, paths))}", hint="give scenario files or folders holding *.yaml")
    if min_coverage is not None and not 0 <= min_coverage <= 1:
        raise ScenarioError(f"--min-coverage {min_coverage:g} is not a fraction between 0 and 1", hint="e.g. --min-coverage 0.5 or 50%")
    started = time.time()
    out = Path(out) if out else Path("reports") / f"gameday-{_stamp(started)}"
    if (out / GAMEDAY_FILE).exists():
        raise ScenarioError(f"{out} already holds a game day", hint="choose another --out, or remove that folder")
    make_run_dir(out, 0o755, default=False)  # as a run folder: its parents walked, no other user's link followed
    caps = capabilities or detect_capabilities()
    if fail_on_regression is not None and fail_on_regression < 0:
        raise ScenarioError(f"--fail-on-regression {fail_on_regression:g} is negative", hint="e.g. --fail-on-regression 25%")
    planned = [_plan(i, f) for i, f in enumerate(files, 1)]
    keys = [LabPool.key(*lab) if lab is not None else None for _, lab in planned]
    order = group_order(keys)  # scenarios that can share a lab run back to back, numbered in that order
    records, labs = [], {}
    for n, i in enumerate(order, 1):
        record, lab = planned[i]
        record.update(index=n, dir=f"{n:02d}-{record['scenario']}")
        records.append(record)
        if lab is not None:
            labs[n] = (*lab, keys[i], keys.count(keys[i]) if keys[i] is not None else 1)
    gd = _Gameday(out, records, caps, min_coverage, started, console)
    gd.labs = labs
    if until not in ("recovered", "finish"):
        raise ScenarioError(f"--until {until!r}: expected recovered or finish", hint="--until finish trains every job to its last step")
    gd.fail_on_regression, gd.fresh_s, gd.until = fail_on_regression, fresh_s, until
    outcome = gd.execute()
    if push is not None and not gd.interrupted:
        pushed = push_gameday(out, push)
        if console is not None:
            console.print(f"pushed to {push}: {len(pushed) - 1} drill group(s) and the game day's coverage", markup=False)
    return outcome


def summarize(
    name: str,
    records: list[dict[str, Any]],
    caps,
    *,
    started: float,
    ended: float | None = None,
    min_coverage: float | None = None,
    finished: bool = True,
    interrupted: bool = False,
    regressions: list[dict[str, Any]] | None = None,
    fresh: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``gameday.json``: the scenario records (as :func:`run_gameday`
    keeps them), their counts, the coverage and the exit status. ``regressions``
    (from :func:`chaoskit.history.find_regressions`) fail it; ``fresh`` (the coverage
    within a window) is what ``min_coverage`` then applies to."""

    cov = compute_coverage(records, caps)
    ran = [r for r in records if r["status"] is not None]
    counts = {
        "total": len(records),
        "passed": sum(1 for r in ran if r["status"] == "pass"),
        "failed": sum(1 for r in ran if r["status"] in ("fail", "aborted")),
        "errored": sum(1 for r in ran if r["status"] == "error"),
        "interrupted_scenarios": sum(1 for r in ran if r["status"] == "interrupted"),
        "not_run": len(records) - len(ran),
    }
    below = min_coverage is not None and (fresh or cov)["plain"] < min_coverage
    if interrupted:
        code = ExitCode.INTERRUPTED
    elif counts["passed"] != counts["total"] or below or regressions:
        code = ExitCode.CHECK_FAILED
    else:
        code = ExitCode.OK
    ended = time.time() if ended is None else ended
    return {
        "kind": "chaoskit.gameday",
        "version": 1,
        "name": name,
        "finished": finished,
        "interrupted": interrupted,
        "stopped": {"early": bool(interrupted and counts["not_run"]),
                    "why": "interrupted by Ctrl-C or SIGTERM" if interrupted else None,
                    "ran": len(ran), "of": len(records)},
        "started_at": _iso(started),
        "ended_at": _iso(ended),
        "duration_s": round(ended - started, 3),
        "host": socket.gethostname(),
        "capabilities": caps.as_dict(),
        "min_coverage": min_coverage,
        "coverage_below_minimum": below,
        **counts,
        "exit_code": int(code),
        "coverage": cov,
        **({"fresh_coverage": fresh} if fresh is not None else {}),
        "regressions": regressions or [],
        "scenarios": records,
    }


# -- one game day ---------------------------------------------------------------------


def _plan(index: int, path: Path) -> tuple[dict[str, Any], tuple[Any, Path] | None]:
    """Load a scenario for its name, kinds and covers, and its cluster (spec, folder) for a shared lab;
    a load error is recorded, not raised."""

    record: dict[str, Any] = {
        "index": index, "file": str(path), "scenario": _safe_name(path.stem), "dir": None,
        "category": "uncategorised", "covers": [], "kinds": [], "injected_kinds": [],
        "status": None, "verdict": None, "exit_code": None, "started_at": None, "ended_at": None,
        "duration_s": None, "phases": None, "slo": None, "error": None,
    }
    try:
        loaded = load_scenario(path)
        sc = loaded.model
        record["scenario"] = sc.name
        record["repeat"] = sc.repeat
        record["kinds"] = list(dict.fromkeys(f.kind for f in sc.faults))
        lab = (sc.cluster, loaded.path.parent)
        try:
            record["covers"] = resolve_covers(sc.covers, [f.catalog_tag() for f in sc.faults])
        except ValueError as exc:
            raise loaded.error(str(exc), "covers") from None
    except ScenarioError as exc:
        record.update(status="error", exit_code=int(exc.exit_code), error=_error(exc))
        lab = None
    classes = catalog_by_id()
    if record["covers"]:
        record["category"] = classes[record["covers"][0]].category
    record["dir"] = f"{index:02d}-{record['scenario']}"
    return record, lab


class _Gameday:
    def __init__(self, out: Path, records: list[dict[str, Any]], caps, min_coverage: float | None, started: float, console) -> None:
        self.out, self.records, self.caps, self.min_coverage = out, records, caps, min_coverage
        self.started, self.console = started, console
        self.interrupted = False
        self.fail_on_regression: float | None = None
        self.fresh_s: float | None = None
        self.until = "recovered"
        try:
            self.history = read_history(out.parent / HISTORY_FILE)
        except UnsafePath as exc:
            raise ScenarioError(f"{out.parent / HISTORY_FILE} was not read: {exc}",
                                hint="remove it, or choose an --out whose folder holds a history of your own") from None
        self.regressions: list[dict[str, Any]] | None = None
        self.fresh: dict[str, Any] | None = None
        self.labs: dict[int, tuple[Any, Path, str | None, int]] = {}
        """Per record index: its cluster spec, the scenario's folder, its shared-lab key and how many share it."""
        self.pool = LabPool(self._say)

    def execute(self) -> GamedayOutcome:
        board = _Board(self.records)
        live = _live(self.console, board)
        restore = install_sigterm()  # SIGTERM stops the game day like Ctrl-C: the run reverts, the shared lab comes down
        try:
            with live:
                self._live = live
                previous: tuple[str | None, Path] | None = None
                for record in self.records:
                    if self.interrupted:
                        break
                    try:
                        self._share_lab(record, previous)
                        self._run_one(record, board, live)
                    except KeyboardInterrupt:  # between runs, or while writing: stop, report what ran
                        self.interrupted = True
                    lab = self.labs.get(record["index"])
                    previous = (lab[2] if lab else None, self.out / record["dir"])
                    self._write(finished=False)
                with interrupts_deferred(self._say) as came:
                    self.pool.release()  # the last shared lab; on every other way out, the finally below
                self.interrupted = self.interrupted or bool(came)
            if self.console is not None and not self.console.is_terminal:
                self.console.line()  # a non-terminal Live ends its last render without a newline
        finally:
            try:
                with interrupts_deferred(self._say):
                    self.pool.release()
            finally:
                restore()
                self._judge_history()
                summary = self._write(finished=True)

        write_junit(summary, self.out / "junit.xml")
        self._append_history(summary)
        write_gameday_report(self.out)
        if self.console is not None:
            _print_summary(self.console, summary, self.out)
        return GamedayOutcome(summary["exit_code"], summary, self.out)

    def _say(self, message: str) -> None:
        live = getattr(self, "_live", None)
        if live is not None and hasattr(live, "console"):
            from rich.text import Text

            live.console.print(Text(f"game day: {message}"), highlight=False)
        elif self.console is not None:
            self.console.print(f"game day: {message}", highlight=False, markup=False)

    def _share_lab(self, record: dict[str, Any], previous: tuple[str | None, Path] | None) -> None:
        """Bring up, keep (verified clean) or take down the shared lab before ``record`` runs."""
        lab = self.labs.get(record["index"])
        if lab is None or record["status"] == "error":
            return
        spec, base, key, size = lab
        t0 = time.time()
        last_run = previous[1] if previous is not None and previous[0] == key else None
        try:
            shared = self.pool.before(record["scenario"], spec, base, size, last_run)
        except Exception as exc:  # noqa: BLE001 - the run then opens its own lab and meets the same problem there
            self._say(f"no shared lab for {record['scenario']}: {exc}")
            self.pool.release()
            return
        if shared is not None:
            record["lab"] = {**shared, "ready_s": round(time.time() - t0, 3)}

    def _run_one(self, record: dict[str, Any], board: "_Board", live) -> None:
        run_dir = self.out / record["dir"]
        run_dir.mkdir(parents=True, exist_ok=True)
        if record["status"] == "error":  # did not load: nothing to run
            _write_json(run_dir / ERROR_FILE, record["error"])
            board.done(record)
            return
        t0 = time.time()
        record["started_at"] = _iso(t0)
        board.start(record, t0)
        feed = _BoardFeed(board, live, record["scenario"])
        try:
            if record.get("repeat", 1) > 1:
                outcome = run_repeated(record["file"], record["repeat"], out=run_dir, progress=feed,
                                       capabilities=self.caps, after_run=write_run_report, after_all=write_repeat_report,
                                       wait=self.until)
            else:
                outcome = run_scenario(record["file"], out=run_dir, progress=feed, capabilities=self.caps,
                                       after_run=write_run_report, wait=self.until)
            record.update(status=outcome.result.get("verdict"), exit_code=outcome.exit_code)
            self._take_result(record, outcome.result)
            if outcome.exit_code == ExitCode.INTERRUPTED:
                self.interrupted = True
        except ChaoskitError as exc:
            record.update(status="error", exit_code=int(exc.exit_code), error=_error(exc))
        except KeyboardInterrupt:
            record.update(status="interrupted", exit_code=int(ExitCode.INTERRUPTED), error={"type": "Interrupted", "message": "interrupted by Ctrl-C or SIGTERM", "hint": None})
            self.interrupted = True
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not lose the night's report
            record.update(status="error", exit_code=int(ExitCode.INTERNAL), error={
                "type": type(exc).__name__, "message": f"internal error: {exc}",
                "hint": "this is a chaoskit bug; the traceback is in error.json", "traceback": traceback.format_exc(),
            })
        if record["status"] == "error" and (run_dir / "result.json").is_file():
            # The runner writes result.json before raising an error from inside a live run.
            self._take_result(record, json.loads((run_dir / "result.json").read_text(encoding="utf-8")))
            record["status"] = "error"
        if record["error"] is not None:
            _write_json(run_dir / ERROR_FILE, record["error"])
        t1 = time.time()
        record.update(ended_at=_iso(t1), duration_s=round(t1 - t0, 3), controller=_own_figures())
        board.done(record)

    @staticmethod
    def _take_result(record: dict[str, Any], result: dict[str, Any]) -> None:
        if result.get("kind") == REPEAT_KIND:  # N samples: the medians stand for the scenario
            record["verdict"] = result.get("verdict")
            record["samples"] = result.get("completed")
            record["distribution"] = result.get("distribution")
            record["phases"] = {k: d.get("p50") for k, d in (result.get("distribution") or {}).items()}
            record["slo"] = {name: _one_slo(name, v) for name, v in (result.get("slo") or {}).items()}
            record["injected_kinds"] = list(dict.fromkeys(
                k for s in result.get("samples") or [] for k in s.get("injected_kinds") or []))
            record["checks"] = {"samples_checks": {"pass": all(s["checks_pass"] for s in result.get("samples") or [])}}
            record["notes"] = [f"{s['dir']}: {s['status']}" for s in result.get("samples") or [] if s["status"] != "pass"]
            return
        run = RunResult.model_validate(result)
        record["verdict"] = run.verdict
        record["injected_kinds"] = run.injected_kinds
        record["phases"] = run.phases.dump()
        given = run.model_fields_set  # a result cut short may lack them: the record says null, as before
        record["slo"] = {name: entry.dump() for name, entry in run.slo.items()} if "slo" in given else None
        record["checks"] = {name: check.dump() for name, check in run.checks.items()} if "checks" in given else None
        record["notes"] = list(run.notes)

    def _judge_history(self) -> None:
        """Regressions against the history, and coverage within the freshness window (when asked for)."""
        if self.fail_on_regression is not None:
            self.regressions = find_regressions(scenario_figures(self.records), self.history, self.fail_on_regression)
        if self.fresh_s is not None:
            self.fresh = fresh_coverage(self.records, self.caps, self.history, self.fresh_s, time.time())

    def _write(self, finished: bool) -> dict[str, Any]:
        summary = summarize(self.out.name, self.records, self.caps, started=self.started, min_coverage=self.min_coverage,
                            finished=finished, interrupted=self.interrupted, regressions=self.regressions, fresh=self.fresh)
        summary["labs"] = [h.as_dict() for h in self.pool.history]
        _write_json(self.out / GAMEDAY_FILE, summary)
        return summary

    def _append_history(self, summary: dict[str, Any]) -> None:
        cov = summary["coverage"]
        entry = {
            "started_at": summary["started_at"], "ended_at": summary["ended_at"], "gameday": str(self.out),
            "scenarios": summary["total"], "passed": summary["passed"], "failed": summary["failed"],
            "errored": summary["errored"], "plain": cov["plain"], "weighted": cov["weighted"],
            "covered": cov["covered"], "catalog_size": cov["total"], "exit_code": summary["exit_code"],
            "figures": scenario_figures(self.records),
        }
        try:
            append_own(self.out.parent / HISTORY_FILE, json.dumps(entry, separators=(",", ":")) + "\n")
        except UnsafePath as exc:
            raise ScenarioError(f"{self.out.parent / HISTORY_FILE} was not written: {exc}",
                                hint="remove it; the game day's own files are written") from None


# -- live progress ----------------------------------------------------------------------


class _Board:
    """What the live display shows: each scenario, its phase and its elapsed time.
    Rendered anew at every refresh, so elapsed times tick by themselves."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.current: dict[str, Any] | None = None
        self.phase = ""
        self.t_start = 0.0
        self.t0 = time.time()

    def start(self, record: dict[str, Any], t0: float) -> None:
        self.current, self.phase, self.t_start = record, "starting", t0

    def done(self, record: dict[str, Any]) -> None:
        self.current = None

    def __rich__(self):
        from rich.spinner import Spinner
        from rich.table import Table

        done = sum(1 for r in self.records if r["status"] is not None)
        table = Table(title=f"game day: {done}/{len(self.records)} scenarios, {time.time() - self.t0:.0f}s", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("scenario")
        table.add_column("phase")
        table.add_column("elapsed", justify="right")
        for r in self.records:
            if r is self.current:
                table.add_row(str(r["index"]), r["scenario"], Spinner("dots", text=self.phase), f"{time.time() - self.t_start:.1f}s")
            elif r["status"] is None:
                table.add_row(str(r["index"]), r["scenario"], "[dim]waiting[/dim]", "")
            else:
                table.add_row(str(r["index"]), r["scenario"], _status_markup(r), f"{r['duration_s'] or 0:.1f}s")
        return table


def _status_markup(r: dict[str, Any]) -> str:
    from rich.markup import escape

    colour = {"pass": "green", "fail": "red", "error": "red", "aborted": "red"}.get(r["status"], "yellow")
    text = f"[{colour}]{r['status'].upper()}[/{colour}]"
    if r.get("error"):
        text += " " + escape(r["error"]["message"][:80])
    elif (r.get("phases") or {}).get("recovery_s") is not None:
        text += f" recovered in {r['phases']['recovery_s']:.2f}s"
    return text


def _live(console, board: _Board):
    import contextlib

    if console is None:
        return contextlib.nullcontext()
    from rich.live import Live

    return Live(board, console=console, refresh_per_second=4, transient=False)


class _BoardFeed:
    """The game day's subscriber to a run's progress events: each becomes the board's phase and is printed above the
    live display, prefixed with the scenario's name."""

    def __init__(self, board: _Board, live, name: str) -> None:
        self.board, self.live, self.name = board, live, name

    def __call__(self, event: Progress) -> None:
        if not event.message:  # the verdict: the board shows it once the record is done
            return
        from rich.text import Text

        text = Text.from_markup(event.message).plain.strip()
        self.board.phase = text[:70]
        if hasattr(self.live, "console"):
            line = text if event.elapsed_s is None else f"{event.elapsed_s:.2f}s  {text}"
            self.live.console.print(Text(f"{self.name}: {line}"), highlight=False)


def _print_summary(console, summary: dict[str, Any], out: Path) -> None:
    cov = summary["coverage"]
    console.print(
        f"coverage: {cov['covered_count']}/{cov['total']} classes ({cov['plain']:.1%}), "
        f"weighted {cov['weight_covered']}/{cov['weight_total']} real interruptions ({cov['weighted']:.1%})"
    )
    fresh = summary.get("fresh_coverage")
    if fresh is not None:
        console.print(f"fresh coverage (proven within {fresh['window_s'] / 86400:g} days): {fresh['covered_count']}/{fresh['total']} "
                      f"classes ({fresh['plain']:.1%}), weighted {fresh['weighted']:.1%}")
    for r in summary.get("regressions") or []:
        console.print(f"[red]regression:[/red] {r['scenario']} recovered in {r['now']:.2f}s, {r['ratio'] - 1:.0%} above the median "
                      f"{r['baseline']:.2f}s of its last {r['runs']} game days (threshold {r['threshold']:.0%})")
    if summary["coverage_below_minimum"]:
        console.print(f"[red]coverage {cov['plain']:.1%} is under the minimum {summary['min_coverage']:.1%}[/red]")
    labs = summary.get("labs") or []
    if labs:
        console.print("shared labs: " + ", ".join(f"{lab['kind']} ({len(lab['scenarios'])} scenarios, up in {lab['up_s']:.0f}s)"
                                                  for lab in labs))
    console.print(
        f"scenarios: {summary['passed']} passed, {summary['failed']} failed, {summary['errored']} errored"
        + (f", {summary['not_run']} not run (interrupted)" if summary["not_run"] else "")
    )
    console.print(f"report: {out / 'index.html'}  junit: {out / 'junit.xml'}", markup=False, highlight=False)


# -- helpers ----------------------------------------------------------------------------


def _one_slo(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A repeat's SLO on the distribution in the shape of one drill's (``limit_s``, ``measured_s``, ``pass``), so
    the JUnit and the game-day page read both alike: the failing percentile if one failed, else the first."""
    checks = entry.get("percentiles") or {}
    pname, check = next(((p, c) for p, c in checks.items() if not c["pass"]), next(iter(checks.items()), (None, {})))
    unit = "" if name == "lost_steps" else "_s"
    out = {f"limit{unit}": check.get("limit"), f"measured{unit}": check.get("measured"), "pass": entry.get("pass"),
           "percentile": "every sample" if pname == "max" and entry.get("every_sample") else pname}
    if entry.get("reason"):
        out["reason"] = entry["reason"]
    return out


def _error(exc: ChaoskitError) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "hint": exc.hint}


def _safe_name(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:60] or "scenario"


def _own_figures() -> dict[str, int | float | None]:
    """This controller's open fds, threads and resident memory (MiB), read right after a drill's teardown, before
    the next one starts: what a long game day must not grow (``bench/soak.py`` reads them)."""
    try:
        fds: int | None = len(os.listdir("/proc/self/fd"))
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return {"fds": fds, "threads": int(status["Threads"]), "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1)}
    except (OSError, KeyError, ValueError):
        return {"fds": None, "threads": None, "rss_mib": None}


def _write_json(path: Path, data: Any) -> None:
    """``path`` replaced without following a link (:func:`~chaoskit.core.files.write_new`)."""
    write_new(path, json.dumps(data, indent=2, default=str) + "\n", replace=True)


def _stamp(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
