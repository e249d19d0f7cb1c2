"""Trigger latency: from the event on a node to the fault in effect (issue 49, item 1; aim: p50 <= 100 ms).

    python bench/bench_triggers.py [--pairs N] [--out DIR]

One drill on the process lab (the reference job, 3 nodes x 1 worker), with 2N faults that change nothing: a
SIGCONT to rank 1, a running process (the signal is a no-op, so the job trains on and every trigger is timed on
a healthy job). They alternate:

- the baseline: ``at: {step: S}``, chaoskit's step trigger, timed from the job's first step event at or past S;
- the event trigger: ``at: {event: ckpt.save.start}``, the next checkpoint save after the previous fault, timed
  from that event (``per_fault[].trigger.latency_s``).

Both are read from the run's own files: the event's ``ts`` is the job's (the SDK stamps it in the process, and
chaoskit reads it from the job's events file), the fault's time is when the signal was sent. So each figure is
what a drill sees: the job writing its event, chaoskit reading it, matching it, and the kill. Prints p50, p99 and
max of each (with 2N samples p99 is close to the max) and the event trigger's p50 against the step trigger's.
Needs torch (``pip install torch==2.13.0``) and runs as the user that runs the process lab.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import pct  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVERY = 10
"""Checkpoint interval, in steps: a save every half second at the reference job's 50 ms step."""


def scenario(pairs: int) -> str:
    faults = []
    for k in range(pairs):
        step = 12 + 2 * EVERY * k  # the next save after it is at 20 + 20k: every pair fits in two intervals
        faults.append(f"  - {{kind: process.kill, signal: SIGCONT, target: {{ranks: [1]}}, at: {{step: {step}}}}}")
        faults.append("  - {kind: process.kill, signal: SIGCONT, target: {ranks: [1]}, "
                      "at: {event: ckpt.save.start, within: 60s}}")
    steps = 12 + 2 * EVERY * pairs + 2 * EVERY
    return (f"name: bench-triggers\ncluster: lab\nworkload: {{launch: reference, steps: {steps}, step_time: 50ms, "
            f"checkpoint_every: {EVERY}}}\nsafety: {{max_nodes: 1, abort_after: 10m}}\nfaults:\n"
            + "\n".join(faults) + "\n")


def latencies(run: Path) -> tuple[list[float], list[float]]:
    """(step trigger, event trigger) latencies in seconds, from the run's result and timeline."""
    result = json.loads((run / "result.json").read_text())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = sorted((e["ts"], e["step"]) for e in events if e.get("kind") == "step" and isinstance(e.get("step"), int))
    sc_faults = scenario_faults(result)
    by_step, by_event = [], []
    for f, spec in zip(result["per_fault"], sc_faults):
        if "trigger" in f:
            by_event.append(f["trigger"]["latency_s"])
        else:
            first = next(ts for ts, s in steps if s >= spec)
            by_step.append(f["t_fault"] - first)
    return by_step, by_event


def scenario_faults(result: dict) -> list[int | None]:
    """Each fault's step trigger (``None`` for an event trigger), in order."""
    import yaml

    data = yaml.safe_load(Path(result["scenario_file"]).read_text())
    return [f["at"].get("step") for f in data["faults"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="step-triggered and event-triggered faults, each")
    parser.add_argument("--out", type=Path, default=None, help="keep the run's folder here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-triggers-"))
    path = work / "bench-triggers.yaml"
    path.write_text(scenario(args.pairs))
    run = args.out or work / "run"
    res = subprocess.run([sys.executable, "-m", "chaoskit", "run", str(path), "--out", str(run), "--json"],
                         capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 1: a check failed (a SIGCONT has nothing to recover from): still timed
        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
        return 1
    by_step, by_event = latencies(run)
    row = "{:<30} {:>4} {:>9} {:>9} {:>9}"
    print(row.format("trigger", "n", "p50 ms", "p99 ms", "max ms"))
    for name, values in (("step (baseline)", by_step), ("event: ckpt.save.start", by_event)):
        print(row.format(name, len(values), f"{1000 * pct(values, 0.5):.1f}", f"{1000 * pct(values, 0.99):.1f}",
                         f"{1000 * max(values):.1f}"))
    print(f"event trigger p50 / step trigger p50: {pct(by_event, 0.5) / pct(by_step, 0.5):.2f}x; "
          f"aim p50 <= 100 ms: {'met' if pct(by_event, 0.5) <= 0.1 else 'NOT met'}")
    print(f"run folder: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
