"""CLI start-up and validation speed, beside `python -c pass` and Chaos Toolkit measured in the same run.

    python bench/bench_cli.py [--runs N] [--chaos PATH | --no-chaostoolkit] [--here]

Prints the median wall time of `chaoskit --help`, of `chaoskit validate` on one
scenario and on 100, and of the interpreter doing nothing (the floor no Python
CLI goes under). Beside them, Chaos Toolkit's `chaos --help` and `chaos validate`
of a one-action experiment, with chaoskit's ratios to those: the targets are
validate <= 0.8x and --help <= 0.5x. `chaos` is taken from --chaos, $CHAOS or
PATH; otherwise it is installed into a throw-away virtual environment (pip,
PyPI) that is removed afterwards.

chaoskit is timed the same way: installed with pip into a throw-away virtual
environment of its own, with no extras, as a user installs it. A development
venv holds more (the dev extras' nvidia-resiliency-ext puts a `.pth` file
into site-packages that every Python start there runs: about 28 ms), which
would be a figure of that venv and not of chaoskit. `--here` times chaoskit
with this interpreter instead.

Every command runs once before it is timed, with bytecode caching on, so the
figures are those of an installed tool and not of compiling it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
EXPERIMENT = {
    "version": "1.0.0", "title": "one action", "description": "the smallest experiment chaos validate accepts",
    "method": [{"type": "action", "name": "noop", "provider": {"type": "process", "path": "true"}}],
}


def timed(argv: list[str], runs: int, expect: int = 0) -> float:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)  # warm the bytecode cache
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        samples.append(time.perf_counter() - t0)
        if proc.returncode != expect:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return statistics.median(samples)


def find_chaos(explicit: str | None, tmp: Path, install: bool) -> str | None:
    found = explicit or os.environ.get("CHAOS") or shutil.which("chaos")
    if found or not install:
        return found
    venv = tmp / "chaostoolkit"
    print("installing chaostoolkit into a throw-away venv ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "chaostoolkit"], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"chaostoolkit could not be installed: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return str(venv / "bin" / "chaos")


def fresh_chaoskit(tmp: Path) -> str | None:
    """The Python of a new venv with chaoskit installed from this checkout (no extras), or None if pip failed."""
    venv = tmp / "chaoskit"
    print("installing chaoskit into a throw-away venv ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(ROOT)], capture_output=True, text=True)
    for left in [ROOT / "build" / "lib", *(ROOT / "build").glob("bdist.*")]:  # what setuptools leaves behind
        shutil.rmtree(left, ignore_errors=True)
    if res.returncode != 0:
        print(f"chaoskit could not be installed: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return str(venv / "bin" / "python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--chaos", help="the chaos command of an installed Chaos Toolkit")
    parser.add_argument("--no-chaostoolkit", action="store_true", help="do not install Chaos Toolkit to compare with")
    parser.add_argument("--here", action="store_true", help="time chaoskit with this interpreter, not a fresh venv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        py = sys.executable if args.here else fresh_chaoskit(tmp_path) or sys.executable
        where = "this interpreter" if py == sys.executable else "a fresh venv, no extras"
        chaoskit = [py, "-m", "chaoskit"]
        scenarios = tmp_path / "scenarios"
        scenarios.mkdir()
        shipped = sorted((ROOT / "scenarios").glob("*.yaml"))
        for i in range(100):
            shutil.copy(shipped[i % len(shipped)], scenarios / f"s{i:03d}.yaml")
        shutil.copy(ROOT / "docker-compose.yml", tmp_path)  # the docker scenarios' cluster
        one = ROOT / "scenarios" / "kill-rank.yaml"
        experiment = tmp_path / "experiment.json"
        experiment.write_text(json.dumps(EXPERIMENT))
        chaos = find_chaos(args.chaos, tmp_path, install=not args.no_chaostoolkit)

        baseline = timed([py, "-c", "pass"], args.runs)
        help_s = timed([*chaoskit, "--help"], args.runs)
        validate_1 = timed([*chaoskit, "validate", str(one)], args.runs)
        validate_100 = timed([*chaoskit, "validate", str(scenarios)], max(3, args.runs // 2))
        chaos_help = timed([chaos, "--no-version-check", "--help"], args.runs) if chaos else None
        chaos_validate = timed([chaos, "--no-version-check", "--no-log-file", "validate", str(experiment)], args.runs) if chaos else None

    def row(label: str, seconds: float, extra: str = "") -> None:
        print(f"{label:34} {seconds * 1000:8.1f} ms   {seconds / baseline:5.1f}x baseline{extra}")

    print(f"chaoskit: {where} ({py})")
    row("python -c pass", baseline)
    row("chaoskit --help", help_s, f", {help_s / chaos_help:.2f}x chaos --help (target <= 0.5x)" if chaos_help else "")
    row("chaoskit validate kill-rank.yaml", validate_1,
        f", {validate_1 / chaos_validate:.2f}x chaos validate (target <= 0.8x)" if chaos_validate else "")
    row("chaoskit validate (100 files)", validate_100, f", {(validate_100 - validate_1) / 99 * 1000:.2f} ms per extra file")
    if chaos:
        row("chaos --help", chaos_help)
        row("chaos validate (one action)", chaos_validate)
    else:
        print("Chaos Toolkit: not measured (no chaos command, and none installed)")


if __name__ == "__main__":
    main()
