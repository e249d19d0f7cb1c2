"""Where a game day's time goes, read from its folder (gameday.json and each run's files).

    python bench/bench_gameday.py GAMEDAY_DIR [GAMEDAY_DIR ...]

Per scenario, in seconds: ``lab`` (the shared lab made ready before it: brought up, or
verified clean), ``start`` (from the run's start to the first worker's start: the lab
opened, when the run makes its own, and torchrun's agents started), ``import`` (to the
first step: torch imported, the rendezvous), ``warm`` (first step to the fault),
``recover`` (fault to training resumed), ``tail`` (resumed to the job's last event:
steps trained on, a fault's remaining duration), ``down`` (from there to the record's
end: the job stopped, the lab removed, the report), and the gap to the next scenario.
With two folders, the second's totals are also given as a ratio to the first's (the same
suite before and after a change, measured on the same machine).
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

COLUMNS = ("lab", "start", "import", "warm", "recover", "tail", "down", "gap", "total")


def _ts(iso: str | None) -> float | None:
    return None if iso is None else _dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _events(run: Path) -> list[dict]:
    paths = sorted(run.glob("sample-*/events.jsonl")) or [run / "events.jsonl"]
    out = []
    for path in paths:
        try:
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            pass
    return out


def breakdown(folder: Path) -> list[dict]:
    summary = json.loads((folder / "gameday.json").read_text())
    rows = []
    records = summary["scenarios"]
    for i, r in enumerate(records):
        start, end = _ts(r.get("started_at")), _ts(r.get("ended_at"))
        row = {"scenario": r["scenario"], "status": r["status"], **{c: None for c in COLUMNS}}
        row["lab"] = (r.get("lab") or {}).get("ready_s")
        if start is not None and end is not None:
            row["total"] = end - start + (row["lab"] or 0.0)
            ev = _events(folder / r["dir"])
            first_worker = min((e["ts"] for e in ev if e.get("kind") == "worker.start"), default=None)
            first_step = min((e["ts"] for e in ev if e.get("kind") == "step"), default=None)
            fault = min((e["ts"] for e in ev if e.get("kind") == "fault.injected"), default=None)
            last = max((e["ts"] for e in ev), default=None)
            rec = (r.get("phases") or {}).get("recovery_s")
            resumed = fault + rec if fault is not None and isinstance(rec, (int, float)) else None
            marks = [start, first_worker, first_step, fault, resumed, last, end]
            for name, a, b in zip(("start", "import", "warm", "recover", "tail", "down"), marks, marks[1:]):
                row[name] = b - a if a is not None and b is not None else None
            if i + 1 < len(records):
                nxt = _ts(records[i + 1].get("started_at"))
                if nxt is not None:
                    row["gap"] = nxt - end - ((records[i + 1].get("lab") or {}).get("ready_s") or 0.0)
        rows.append(row)
    return rows


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def report(folder: Path) -> float:
    summary = json.loads((folder / "gameday.json").read_text())
    rows = breakdown(folder)
    print(f"{folder}: {summary['total']} scenarios, {summary['duration_s']:.0f}s "
          f"({summary['passed']} passed, {summary['failed']} failed, {summary['errored']} errored); "
          f"coverage {summary['coverage']['covered_count']}/{summary['coverage']['total']} classes, "
          f"weighted {summary['coverage']['weight_covered']}/{summary['coverage']['weight_total']}")
    print(f"{'scenario':24} {'status':8} " + " ".join(f"{c:>7}" for c in COLUMNS))
    for row in rows:
        print(f"{row['scenario'][:24]:24} {str(row['status'])[:8]:8} " + " ".join(f"{_fmt(row[c]):>7}" for c in COLUMNS))
    sums = {c: sum(row[c] or 0.0 for row in rows) for c in COLUMNS}
    print(f"{'sum':24} {'':8} " + " ".join(f"{_fmt(sums[c]):>7}" for c in COLUMNS))
    for lab in summary.get("labs") or []:
        print(f"shared {lab['kind']} lab: up {lab['up_s']:.1f}s, down {_fmt(lab['down_s'])}s, {len(lab['scenarios'])} scenario(s): "
              f"{', '.join(lab['scenarios'])}")
    return float(summary["duration_s"])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    totals = [report(Path(a)) for a in argv]
    if len(totals) > 1:
        print(f"total: {totals[-1]:.0f}s against {totals[0]:.0f}s: {totals[-1] / totals[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
