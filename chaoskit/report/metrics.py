"""Drill results as Prometheus metrics: an OpenMetrics file (a textfile-collector drop-in) and Pushgateway pushes.

:func:`export` reads a run folder (``result.json``, a single drill or a repeat's)
or a game-day folder (``gameday.json`` and each scenario's ``result.json``) and
builds the metrics with ``prometheus_client`` (imported here only, when used).

Per drill, labelled ``scenario``, ``cluster`` (the cluster's id) and ``fault_kind``
(the kinds injected, in order, joined by ``+``; ``none`` when nothing was):

- ``chaoskit_detection_seconds``, ``chaoskit_reallocation_seconds``,
  ``chaoskit_checkpoint_load_seconds``, ``chaoskit_recovery_seconds``,
  ``chaoskit_lost_steps``: the phases (a repeat's medians); a phase that was
  not observed has no sample (absent, never zero);
- ``chaoskit_drill_passed``: 1 when the verdict is ``pass``, else 0;
- ``chaoskit_drill_result{result=...}``: 1 for the drill's verdict, 0 for the others;
- ``chaoskit_drill_duration_seconds``, ``chaoskit_drill_end_timestamp_seconds``.

Per game day: ``chaoskit_coverage_ratio{weighted="false"|"true"}``,
``chaoskit_gameday_scenarios{status=...}``, ``chaoskit_gameday_end_timestamp_seconds``.

A push (``PUT``, replacing the group) sends each drill to the group
``{job="chaoskit", scenario, cluster}`` (so the latest drill of a scenario on a
cluster is what the Pushgateway holds, whether a game day or ``chaoskit run``
made it), and a game day's own metrics to ``{job="chaoskit_gameday"}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.cluster.policy import origin, site_policy
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.files import GAMEDAY_FILE, RESULT_FILE, UnsafePath, parse_utc_iso, write_new
from chaoskit.core.phases import PHASE_TABLE
from chaoskit.core.result import REPEAT_KIND, RunResult
from chaoskit.core.models import check_http_url

__all__ = ["METRICS", "DRILL_LABELS", "RESULTS", "Drill", "ExportOutcome", "read_drills", "export", "push_gameday",
           "check_push_url"]

DRILL_LABELS = ("scenario", "cluster", "fault_kind")
RESULTS = ("pass", "fail", "aborted", "error", "interrupted")
"""The values of ``chaoskit_drill_result``'s ``result`` label."""
_PHASES = tuple(p for p in PHASE_TABLE if p.metric)
"""The phases exported, each as its own gauge (``core/phases.Phase.metric``)."""
METRICS: dict[str, str] = {
    **{str(p.metric): p.metric_help for p in _PHASES},
    "chaoskit_drill_passed": "1 when the drill passed every SLO and check, else 0.",
    "chaoskit_drill_result": "1 for the drill's verdict (label result), 0 for the other verdicts.",
    "chaoskit_drill_duration_seconds": "Wall time of the drill.",
    "chaoskit_drill_end_timestamp_seconds": "Unix time the drill ended.",
    "chaoskit_coverage_ratio": "Fault coverage of the game day: share of catalog classes (weighted=false) or of real interruptions (weighted=true) proven.",
    "chaoskit_gameday_scenarios": "Scenarios of the game day by outcome (label status).",
    "chaoskit_gameday_end_timestamp_seconds": "Unix time the game day ended.",
}
"""Every metric chaoskit exports, with its help text (docs/monitoring.md lists them; the Grafana dashboard uses only these)."""
GAMEDAY_STATUSES = ("passed", "failed", "errored", "not_run")
DRILL_JOB, GAMEDAY_JOB = "chaoskit", "chaoskit_gameday"
_PUSH_TIMEOUT_S = 10.0


@dataclass
class Drill:
    """One drill's figures, from its result.json (or a game day's record of it)."""

    scenario: str
    cluster: str
    fault_kind: str
    verdict: str
    phases: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    ended_at: float | None = None

    def labels(self) -> dict[str, str]:
        return {"scenario": self.scenario, "cluster": self.cluster, "fault_kind": self.fault_kind}


@dataclass
class ExportOutcome:
    drills: list[Drill]
    gameday: dict[str, Any] | None
    text: bytes
    """The OpenMetrics exposition of everything."""
    pushed: list[dict[str, str]] = field(default_factory=list)
    """The grouping keys pushed to."""


def check_push_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host that this machine's site policy allows (its
    ``prometheus_urls``); :class:`ScenarioError` (exit 2) otherwise, naming the policy that refused it."""
    try:
        check_http_url(url, "--push URL")
    except ValueError as exc:
        raise ScenarioError(str(exc), hint="e.g. --push http://pushgateway:9091") from None
    policy = site_policy()
    if isinstance(policy, list):
        raise policy[0]
    problem = policy.allows_url(url) if policy is not None else None
    if problem:
        raise ScenarioError(f"--push {problem}; {origin(policy)}",
                            hint="push to a Pushgateway the site policy names, or ask its owners to add it")
    return url


def read_drills(path: Path) -> tuple[list[Drill], dict[str, Any] | None]:
    """The drills of a run folder or a game-day folder, and the game day's summary (``None`` for a run).
    :class:`ScenarioError` when ``path`` holds neither."""
    path = Path(path)
    if (path / GAMEDAY_FILE).is_file():
        summary = _load(path / GAMEDAY_FILE)
        drills = []
        for record in summary.get("scenarios") or []:
            if record.get("status") is None:
                continue  # not run (the game day was interrupted)
            result = _load_quiet(path / str(record.get("dir") or "") / RESULT_FILE) if record.get("dir") else None
            kinds = record.get("injected_kinds") or []
            drills.append(Drill(
                scenario=str(record.get("scenario")), cluster=_cluster(result, path / str(record.get("dir") or "")),
                fault_kind="+".join(kinds) or "none", verdict=str(record.get("status")),
                phases=dict(record.get("phases") or {}), duration_s=record.get("duration_s"),
                ended_at=parse_utc_iso(record.get("ended_at"))))
        return drills, summary
    if (path / RESULT_FILE).is_file():
        return [_drill(_load(path / RESULT_FILE), path)], None
    raise ScenarioError(f"{path} holds no {RESULT_FILE} or {GAMEDAY_FILE}", hint="give a run folder or a game-day folder")


def export(path: Path, *, openmetrics: Path | None = None, push_url: str | None = None) -> ExportOutcome:
    """Read ``path`` (a run or a game day), write the OpenMetrics file (atomically: a textfile collector never
    reads half of it) and push to the Pushgateway at ``push_url`` when given. :class:`InfraError` (exit 3) when
    the push fails."""
    if push_url is not None:
        check_push_url(push_url)  # before any file is read or written
    drills, gameday = read_drills(path)
    from prometheus_client.openmetrics.exposition import generate_latest

    registry = _registry(drills, gameday)
    outcome = ExportOutcome(drills, gameday, generate_latest(registry))
    if openmetrics is not None:
        _write_atomic(Path(openmetrics), outcome.text)
    if push_url is not None:
        outcome.pushed = _push_all(push_url, drills, gameday)
    return outcome


def push_gameday(folder: Path, url: str) -> list[dict[str, str]]:
    """Push a finished game day's metrics (``gameday --push``); the grouping keys pushed to."""
    return export(folder, push_url=url).pushed


# -- building ----------------------------------------------------------------------------


def _registry(drills: list[Drill], gameday: dict[str, Any] | None, *, with_gameday: bool = True):
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry(auto_describe=True)

    def gauge(name: str, labels: tuple[str, ...], unit: str = "") -> Any:
        return Gauge(name, METRICS[name], labels, unit=unit, registry=registry)

    if drills:
        phases = {p.key: gauge(str(p.metric), DRILL_LABELS, "seconds" if p.unit == "s" else "") for p in _PHASES}
        passed = gauge("chaoskit_drill_passed", DRILL_LABELS)
        result = gauge("chaoskit_drill_result", DRILL_LABELS + ("result",))
        duration = gauge("chaoskit_drill_duration_seconds", DRILL_LABELS, "seconds")
        ended = gauge("chaoskit_drill_end_timestamp_seconds", DRILL_LABELS, "seconds")
        for d in drills:
            labels = d.labels()
            for key, gauge_ in phases.items():
                if isinstance(d.phases.get(key), (int, float)):
                    gauge_.labels(**labels).set(d.phases[key])
            passed.labels(**labels).set(1 if d.verdict == "pass" else 0)
            for r in RESULTS + (() if d.verdict in RESULTS else (d.verdict,)):
                result.labels(**labels, result=r).set(1 if r == d.verdict else 0)
            if d.duration_s is not None:
                duration.labels(**labels).set(d.duration_s)
            if d.ended_at is not None:
                ended.labels(**labels).set(d.ended_at)
    if gameday is not None and with_gameday:
        cov = gameday.get("coverage") or {}
        ratio = gauge("chaoskit_coverage_ratio", ("weighted",), "ratio")
        ratio.labels(weighted="false").set(float(cov.get("plain") or 0.0))
        ratio.labels(weighted="true").set(float(cov.get("weighted") or 0.0))
        scenarios = gauge("chaoskit_gameday_scenarios", ("status",))
        for status in GAMEDAY_STATUSES:
            scenarios.labels(status=status).set(int(gameday.get(status) or 0))
        end = parse_utc_iso(gameday.get("ended_at"))
        if end is not None:
            gauge("chaoskit_gameday_end_timestamp_seconds", (), "seconds").set(end)
    return registry


def _push_all(url: str, drills: list[Drill], gameday: dict[str, Any] | None) -> list[dict[str, str]]:
    from prometheus_client import push_to_gateway

    groups: list[tuple[str, dict[str, str], Any]] = []
    by_group: dict[tuple[str, str], list[Drill]] = {}
    for d in drills:
        by_group.setdefault((d.scenario, d.cluster), []).append(d)
    for (scenario, cluster), group in by_group.items():
        groups.append((DRILL_JOB, {"scenario": scenario, "cluster": cluster}, _registry(group[-1:], None)))
    if gameday is not None:
        groups.append((GAMEDAY_JOB, {}, _registry([], gameday)))
    pushed = []
    for job, key, registry in groups:
        try:
            push_to_gateway(url, job=job, registry=registry, grouping_key=key, timeout=_PUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - urllib's errors, and the gateway's refusal (an HTTP error)
            raise InfraError(f"pushing to {url} failed: {type(exc).__name__}: {exc}",
                             hint="is the Pushgateway up at that URL? the run's files are unchanged") from None
        pushed.append({"job": job, **key})
    return pushed


# -- reading -----------------------------------------------------------------------------


def _drill(result: dict[str, Any], folder: Path) -> Drill:
    if result.get("kind") == REPEAT_KIND:  # N samples: their medians stand for the scenario
        samples = result.get("samples") or []
        kinds = list(dict.fromkeys(k for s in samples for k in s.get("injected_kinds") or []))
        first = _load_quiet(folder / str(samples[0]["dir"]) / RESULT_FILE) if samples and samples[0].get("dir") else None
        phases = {k: (v or {}).get("p50") for k, v in (result.get("distribution") or {}).items()}
        return Drill(str(result.get("scenario")), _cluster(first, folder), "+".join(kinds) or "none",
                     str(result.get("verdict")), phases, result.get("duration_s"), parse_utc_iso(result.get("ended_at")))
    try:
        run = RunResult.model_validate(result)
    except ValueError as exc:  # pydantic's ValidationError: a JSON object, but not a run's result
        raise ScenarioError(f"{folder / RESULT_FILE}: not a chaoskit result: {exc}") from None
    return Drill(run.scenario, _cluster(run, folder), "+".join(run.injected_kinds) or "none", run.verdict,
                 run.phases.dump(), run.duration_s, parse_utc_iso(run.ended_at))


def _cluster(result: dict[str, Any] | RunResult | None, folder: Path) -> str:
    if result is not None and not isinstance(result, RunResult):
        result = RunResult.model_validate(result)
    cluster = result.cluster if result is not None else {}
    return str(cluster.get("id") or cluster.get("kind") or "unknown")


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: cannot read it: {exc}", hint="give a run folder or a game-day folder chaoskit wrote") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: not a chaoskit result (a JSON object expected)")
    return data


def _load_quiet(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_atomic(path: Path, data: bytes) -> None:
    """Into a random temp file beside it, then renamed over it (:func:`~chaoskit.core.files.write_new`): readers
    see the old file or the new one, never half, and a link planted at its name is replaced, never written
    through; a folder reached through another user's link is refused."""
    try:
        write_new(path, data, replace=True, make_folders=True)
    except UnsafePath as exc:
        raise ScenarioError(f"{path} was not written: {exc}",
                            hint="give a path whose folders are root's or your own") from None
