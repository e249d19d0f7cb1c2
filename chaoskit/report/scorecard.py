"""A scorecard's page and metrics, from its ``scorecard.json`` alone (:mod:`chaoskit.scorecard` makes it).

- :func:`write_scorecard_html`: ``index.html``, one self-contained page (no script, no outside file): faults as
  rows, stacks as columns, each cell its detection, recovery and lost work, its verdict, why, the stack's
  timeouts as configured and a warning where one makes detection take minutes;
- :func:`write_scorecard_metrics`: ``metrics.prom``, OpenMetrics text (``prometheus_client``, imported here only
  when used) labelled ``stack`` and ``fault``: ``chaoskit_scorecard_detection_seconds``,
  ``chaoskit_scorecard_recovery_seconds``, ``chaoskit_scorecard_lost_steps`` (no sample where not measured,
  never zero) and ``chaoskit_scorecard_cell{verdict=...}`` (1 for the cell's verdict).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from chaoskit.core.files import write_new

__all__ = ["VERDICTS", "SCORECARD_METRICS", "render_scorecard_html", "write_scorecard_html", "scorecard_metrics",
           "write_scorecard_metrics"]

VERDICTS = ("pass", "fail", "rode through", "false restart", "not detected", "cannot run", "error", "aborted", "interrupted")
SCORECARD_METRICS = {
    "chaoskit_scorecard_detection_seconds": ("detection_s", "Seconds from the fault to the stack noticing it."),
    "chaoskit_scorecard_recovery_seconds": ("recovery_s", "Seconds from the fault to the first step after recovery."),
    "chaoskit_scorecard_lost_steps": ("lost_steps", "Training steps lost to the fault on this stack."),
}
_COLOURS = {"pass": "#d9f2dc", "fail": "#fbd9d3", "rode through": "#d9f2dc", "false restart": "#fbd9d3", "not detected": "#fde7c2", "cannot run": "#e6e6e6",
            "error": "#f3c4e0"}


def _fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "–"
    return f"{v:.1f}{unit}" if isinstance(v, float) and unit == "s" else f"{v:g}{unit}"


def _cell_html(cell: dict[str, Any]) -> str:
    e = html.escape
    verdict = cell.get("verdict") or "error"
    figures = ""
    if verdict not in ("cannot run",):
        figures = (f'<div class="fig">detect <b>{_fmt(cell.get("detection_s"))}</b> · recover '
                   f'<b>{_fmt(cell.get("recovery_s"))}</b> · lost <b>{_fmt(cell.get("lost_steps"), " steps")}</b></div>')
        if cell.get("p95"):
            p50, p95 = cell.get("p50") or {}, cell["p95"]
            figures += (f'<div class="dist">detect p50 {_fmt(p50.get("detection_s"))} / p95 {_fmt(p95.get("detection_s"))}'
                        f' · recover p50 {_fmt(p50.get("recovery_s"))} / p95 {_fmt(p95.get("recovery_s"))}'
                        f' ({cell.get("samples")} samples)</div>')
    timeouts = "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in (cell.get("timeouts") or {}).items())
    warnings = "".join(f'<div class="warn">&#9888; {e(w)}</div>' for w in cell.get("warnings") or [])
    b = cell.get("blame") or {}
    counts = ", ".join(f"{v} {(b.get('verdicts') or []).count(v)}" for v in dict.fromkeys(b.get("verdicts") or []))
    blamed = (f'<div class="blame {e(str(b.get("verdict")))}"><b>blame: {e(str(b.get("verdict")))}</b>'
              f'{f" ({e(counts)})" if counts else ""} · {e(b.get("line") or "")}</div>' if b else "")
    return (f'<td class="cell" style="background:{_COLOURS.get(verdict, "#fff")}">'
            f'<div class="verdict">{e(verdict.upper())}</div>{figures}'
            f'<div class="why">{e(cell.get("why") or "")}</div>{blamed}{warnings}'
            f'{f"<ul class=t>{timeouts}</ul>" if timeouts else ""}</td>')


def render_scorecard_html(card: dict[str, Any]) -> str:
    """The page of ``card`` (a ``scorecard.json``)."""
    e = html.escape
    stacks, faults = card.get("stacks") or [], card.get("faults") or []
    by = {(c["stack"], c["fault"]): c for c in card.get("cells") or []}
    notes = card.get("stack_notes") or {}
    head = "".join(f"<th>{e(s)}" + (f'<div class="note">{e(notes[s])}</div>' if s in notes else "") + "</th>"
                   for s in stacks)
    rows = []
    for fault in faults:
        cells = "".join(_cell_html(by.get((s, fault)) or {"verdict": "error", "why": "no cell"}) for s in stacks)
        rows.append(f'<tr><th class="fault">{e(fault)}</th>{cells}</tr>')
    counts = {}
    for c in card.get("cells") or []:
        counts[c.get("verdict")] = counts.get(c.get("verdict"), 0) + 1
    tally = " · ".join(f"{n} {e(str(v))}" for v, n in counts.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chaoskit scorecard</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
.meta {{ color: #555; margin-bottom: 16px; }}
table {{ border-collapse: collapse; width: 100%; table-layout: fixed; }}
th, td {{ border: 1px solid #bbb; padding: 8px; vertical-align: top; text-align: left; }}
thead th {{ background: #333; color: #fff; }}
th.fault {{ background: #f4f4f4; }}
.verdict {{ font-weight: 700; letter-spacing: .04em; }}
.fig {{ margin: 4px 0; }} .dist {{ color: #444; font-size: 12px; }}
.why {{ font-size: 12px; color: #333; margin: 4px 0; word-wrap: break-word; }}
.warn {{ font-size: 12px; color: #8a3b00; font-weight: 600; }}
.blame {{ font-size: 12px; margin: 4px 0; word-wrap: break-word; }} .blame.wrong b, .blame.mixed b {{ color: #a11; }}
.blame.right b {{ color: #156b27; }} .blame.none b {{ color: #666; }}
thead .note {{ font-size: 11px; font-weight: 400; color: #ddd; }}
ul.t {{ margin: 4px 0 0; padding-left: 16px; font-size: 11px; color: #555; }}
</style></head><body>
<h1>Recovery stacks scorecard</h1>
<div class="meta">rows {e(str(card.get("rows")))} · {len(faults)} faults × {len(stacks)} stacks · repeat {card.get("repeat")}
· {e(str(card.get("started_at")))} → {e(str(card.get("ended_at")))} ({card.get("duration_s", 0) / 60:.1f} min) · {tally}</div>
<table><colgroup><col style="width:120px">{"<col>" * len(stacks)}</colgroup>
<thead><tr><th>fault \\ stack</th>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
<p class="meta">Each cell: detection (fault → the stack noticed), recovery (fault → training resumed), lost work,
the verdict against the row's SLOs, who noticed or why not, whom the stack itself named as the failed rank or node
(blame: right, wrong or none, in its own words), and the stack's timeouts as configured.</p>
</body></html>
"""


def write_scorecard_html(out: Path, card: dict[str, Any]) -> Path:
    return write_new(Path(out) / "index.html", render_scorecard_html(card), replace=True)


def scorecard_metrics(card: dict[str, Any]) -> bytes:
    """OpenMetrics text of ``card``: per cell, its phases and its verdict, labelled ``stack`` and ``fault``."""
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.openmetrics.exposition import generate_latest

    registry = CollectorRegistry()
    gauges = {name: Gauge(name, help_, ["stack", "fault"], registry=registry)
              for name, (_, help_) in SCORECARD_METRICS.items()}
    verdict = Gauge("chaoskit_scorecard_cell", "1 for the cell's verdict (label verdict), 0 for the others.",
                    ["stack", "fault", "verdict"], registry=registry)
    for cell in card.get("cells") or []:
        labels = {"stack": cell["stack"], "fault": cell["fault"]}
        for name, (key, _) in SCORECARD_METRICS.items():
            if isinstance(cell.get(key), (int, float)):
                gauges[name].labels(**labels).set(cell[key])
        for v in VERDICTS:
            verdict.labels(**labels, verdict=v).set(1 if cell.get("verdict") == v else 0)
    return generate_latest(registry)


def write_scorecard_metrics(out: Path, card: dict[str, Any]) -> Path:
    return write_new(Path(out) / "metrics.prom", scorecard_metrics(card), replace=True)
