"""JUnit XML of a game day, for CI test-report readers (GitHub, GitLab, Jenkins).

One ``<testsuite>`` per game day, one ``<testcase>`` per scenario with
``classname`` its fault category (``software``, ``network``, ...). A scenario
that failed its SLOs or aborted is a ``<failure>``; one that could not load or
start, or died with an error, is an ``<error>``; one the game day never reached
(interrupted) is ``<skipped>``. The failure body holds the verdict and the
phases against their SLOs; ``<system-out>`` holds the same for passing ones.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from chaoskit.core.files import write_new
from chaoskit.core.phases import SLO_PHASES, phase

__all__ = ["junit_xml", "write_junit", "phase_lines"]


def write_junit(summary: dict[str, Any], path: Path) -> Path:
    """Write :func:`junit_xml` of a game-day summary (``gameday.json``) to ``path``, replacing it without following a
    link (:func:`~chaoskit.core.files.write_new`)."""
    return write_new(path, junit_xml(summary), replace=True)


def junit_xml(summary: dict[str, Any]) -> str:
    records = summary["scenarios"]
    cov = summary["coverage"]
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    suite = ET.Element("testsuite", {
        "name": f"chaoskit gameday {summary['name']}",
        "timestamp": summary["started_at"][:19],  # the Ant/Jenkins schema wants no zone or fraction
        "hostname": summary.get("host") or "localhost",
    })
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("coverage", f"{cov['plain']:.4f}"),
        ("coverage.weighted", f"{cov['weighted']:.4f}"),
        ("coverage.classes", f"{cov['covered_count']}/{cov['total']}"),
        ("coverage.covered", " ".join(cov["covered"])),
        ("min_coverage", "" if summary.get("min_coverage") is None else f"{summary['min_coverage']:.4f}"),
    ):
        ET.SubElement(props, "property", {"name": name, "value": value})
    total_time = 0.0
    for r in records:
        seconds = float(r.get("duration_s") or 0)
        total_time += seconds
        case = ET.SubElement(suite, "testcase", {
            "name": r["scenario"], "classname": r.get("category") or "uncategorised",
            "time": f"{seconds:.3f}", "file": r["file"],
        })
        body = "\n".join(_body(r))
        status = r.get("status")
        if status is None:
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", {"message": "not run: the game day was interrupted before it"})
        elif status == "error":
            counts["errors"] += 1
            err = r.get("error") or {}
            el = ET.SubElement(case, "error", {"message": _clean(err.get("message", "error"))[:500], "type": err.get("type", "Error")})
            el.text = _clean(body)
        elif status != "pass":
            counts["failures"] += 1
            el = ET.SubElement(case, "failure", {"message": _clean(_failure_message(r))[:500], "type": f"verdict.{status}"})
            el.text = _clean(body)
        ET.SubElement(case, "system-out").text = _clean(f"run folder: {r['dir']}\n" + (body if status == "pass" else ""))
    suite.set("tests", str(len(records)))
    for key, n in counts.items():
        suite.set(key, str(n))
    suite.set("time", f"{total_time:.3f}")
    coverage_line = (
        f"coverage {cov['covered_count']}/{cov['total']} classes ({cov['plain']:.1%}), "
        f"weighted {cov['weight_covered']}/{cov['weight_total']} ({cov['weighted']:.1%})"
    )
    ET.SubElement(suite, "system-out").text = coverage_line
    ET.SubElement(suite, "system-err").text = ""
    root = ET.Element("testsuites", {"name": "chaoskit", "tests": suite.get("tests"), "failures": suite.get("failures"),
                                     "errors": suite.get("errors"), "skipped": suite.get("skipped"), "time": suite.get("time")})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def phase_lines(phases: dict[str, Any] | None, slo: dict[str, Any] | None) -> list[str]:
    """The phases against their SLOs, one aligned line each (also used by the HTML)."""
    phases, slo = phases or {}, slo or {}
    reasons = phases.get("reasons") or {}
    lines = []
    for p in SLO_PHASES:
        value = phases.get(p.key)
        entry = slo.get(p.name)
        measured = f"{value:.3f}s" if value is not None else (entry or {}).get("reason") or reasons.get(p.name) or "not observed"
        limit = f"<= {entry['limit_s']:g}s" if entry else "no SLO"
        mark = ("ok" if entry["pass"] else "FAIL") if entry else ""
        lines.append(f"{p.label:<16} {measured:<12} {limit:<10} {mark}".rstrip())
    lost_work = phase("lost_steps")
    lost = phases.get(lost_work.key)
    entry = slo.get(lost_work.name)
    measured = "not observed" if lost is None else f"{lost} steps"
    limit = f"<= {entry['limit']}" if entry else "no SLO"
    mark = ("ok" if entry["pass"] else "FAIL") if entry else ""
    lines.append(f"{lost_work.label:<16} {measured:<12} {limit:<10} {mark}".rstrip())
    return lines


def _body(r: dict[str, Any]) -> list[str]:
    lines = [f"scenario: {r['scenario']} ({r['file']})", f"verdict: {(r.get('verdict') or r.get('status') or 'not run').upper()}"]
    if r.get("covers"):
        lines.append(f"covers: {', '.join(r['covers'])}")
    if r.get("error"):
        lines.append(f"error: {r['error'].get('type')}: {r['error'].get('message')}")
        if r["error"].get("hint"):
            lines.append(f"hint: {r['error']['hint']}")
    if r.get("phases") is not None or r.get("slo"):
        lines.append("phases:")
        lines += [f"  {line}" for line in phase_lines(r.get("phases"), r.get("slo"))]
        if (r.get("phases") or {}).get("detected_by"):
            lines.append(f"detected by: {r['phases']['detected_by']}")
    for name, check in (r.get("checks") or {}).items():
        if not check.get("pass"):
            lines.append(f"check failed: {name}")
    lines += [f"note: {n}" for n in r.get("notes") or []]
    return lines


def _failure_message(r: dict[str, Any]) -> str:
    failing = []
    for name, entry in (r.get("slo") or {}).items():
        if entry.get("pass"):
            continue
        measured = entry.get("measured_s", entry.get("measured"))
        limit = entry.get("limit_s", entry.get("limit"))
        unit = "s" if "limit_s" in entry else " steps"
        failing.append(f"{name} not observed" if measured is None else f"{name} {measured:g}{unit} > {limit:g}{unit}")
    failing += [f"check {name} failed" for name, c in (r.get("checks") or {}).items() if not c.get("pass")]
    return f"verdict {r.get('verdict') or r.get('status')}" + (": " + "; ".join(failing) if failing else "")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    """XML 1.0 cannot carry most control characters; a job's log line may hold them."""
    return _CONTROL.sub("?", text)
