"""Wall time of a full scorecard, beside the drills' own time measured in the same run.

    python bench/bench_scorecard.py [--stacks torchrun,nvrx,nvrx-inprocess,torchft,ray,slurm] [--repeat 1] [--out DIR]

Runs ``chaoskit scorecard examples/scorecard/`` (every row on every stack; the netns rows need root) and prints
its wall time against the target (25 min), the sum of the drills' own durations (the game day's per-scenario
``duration_s``: the baseline of what the drills cost, so that the scorecard's own overhead, its labs brought up
and down, is the rest), and every cell. A benchmark, not a CI test: it runs for many minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 25 * 60


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", default="torchrun,nvrx,nvrx-inprocess,torchft,ray,slurm")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rows", default=str(ROOT / "examples" / "scorecard"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-scorecard-"))
    chaoskit = Path(sys.executable).with_name("chaoskit")
    t0 = time.monotonic()
    proc = subprocess.run([str(chaoskit), "scorecard", args.rows, "--stacks", args.stacks, "--repeat", str(args.repeat),
                           "--out", str(out / "card")], cwd=ROOT)
    wall = time.monotonic() - t0
    card = json.loads((out / "card" / "scorecard.json").read_text())
    gameday = out / "card" / "gameday" / "gameday.json"
    drills = json.loads(gameday.read_text())["scenarios"] if gameday.is_file() else []
    drill_s = sum(d.get("duration_s") or 0 for d in drills)
    cells = card["cells"]
    print(f"\nscorecard: {len(card['faults'])} faults x {len(card['stacks'])} stacks, repeat {args.repeat}: "
          f"{len(cells)} cells, {sum(c['verdict'] not in ('cannot run',) for c in cells)} run, exit {proc.returncode}")
    print(f"wall time        {wall:8.1f} s  ({wall / 60:.1f} min; target {TARGET_S / 60:.0f} min: "
          f"{'met' if wall <= TARGET_S else 'MISSED'}, {wall / TARGET_S:.2f}x)")
    print(f"drills' own time {drill_s:8.1f} s  (baseline, same run: {len(drills)} drills)")
    print(f"scorecard overhead {wall - drill_s:6.1f} s  ({(wall - drill_s) / wall:.0%} of the wall time: labs up/down, "
          "validation, reports)")
    for c in cells:
        det = "-" if c["detection_s"] is None else f"{c['detection_s']:.2f}s"
        rec = "-" if c["recovery_s"] is None else f"{c['recovery_s']:.2f}s"
        print(f"  {c['fault']:>9} x {c['stack']:<9} {c['verdict']:<13} detect {det:>7} recover {rec:>7} "
              f"lost {c['lost_steps'] if c['lost_steps'] is not None else '-':>4}  {c['why'][:110]}")
    print(f"files: {out / 'card'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
