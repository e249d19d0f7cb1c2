"""CLI start-up and validation speed, each beside `python -c pass` measured in the same run.

    python bench/bench_cli.py [--runs N]

Prints the median wall time of `chaoskit --help`, of `chaoskit validate` over 100
scenario files, and of the interpreter doing nothing, with the ratios. The
interpreter's own start-up is the floor no Python CLI can go under.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], runs: int, expect: int = 0) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        samples.append(time.perf_counter() - t0)
        if proc.returncode != expect:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        shipped = sorted((ROOT / "scenarios").glob("*.yaml"))
        for i in range(100):
            shutil.copy(shipped[i % len(shipped)], Path(tmp) / f"s{i:03d}.yaml")
        baseline = timed([py, "-c", "pass"], args.runs)
        help_s = timed([py, "-m", "chaoskit", "--help"], args.runs)
        validate_1 = timed([py, "-m", "chaoskit", "validate", str(Path(tmp) / "s000.yaml")], args.runs)
        validate_s = timed([py, "-m", "chaoskit", "validate", tmp], max(3, args.runs // 2))
    print(f"python -c pass                 {baseline * 1000:8.1f} ms   (baseline)")
    print(f"chaoskit --help                {help_s * 1000:8.1f} ms   {help_s / baseline:5.1f}x baseline")
    print(f"chaoskit validate (1 file)     {validate_1 * 1000:8.1f} ms   {validate_1 / baseline:5.1f}x baseline")
    print(f"chaoskit validate (100 files)  {validate_s * 1000:8.1f} ms   {validate_s / baseline:5.1f}x baseline, "
          f"{(validate_s - validate_1) / 99 * 1000:.2f} ms per extra file")


if __name__ == "__main__":
    main()
