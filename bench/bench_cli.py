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
figures are those of an installed tool and not of compiling it. The commands
are timed in turn, round after round, so a machine that slows down for a while
slows them all alike. A last row is the stack's floor: the same venv's Python
importing typer, pydantic and PyYAML and validating a one-field model, with
nothing of chaoskit; what validate takes over it is chaoskit's own share.
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


def timed(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """The median wall time of each command, the commands taken in turn in every round: a machine that slows down
    for a while (a neighbour's load) slows every command alike, and the ratios stay true."""
    for argv in commands.values():
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)  # warm the bytecode cache
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            t0 = time.perf_counter()
            proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
            samples[name].append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return {name: statistics.median(s) for name, s in samples.items()}


FLOOR = """import typer, yaml
from pydantic import BaseModel

class One(BaseModel):
    a: int = 1

One.model_validate(yaml.safe_load("a: 2"))
"""
"""What no CLI on chaoskit's stack goes under: its CLI framework, model library and YAML loader imported, and one
one-field model built and validated."""


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

        floor = tmp_path / "floor.py"
        floor.write_text(FLOOR)
        commands = {"baseline": [py, "-c", "pass"], "floor": [py, str(floor)], "help": [*chaoskit, "--help"],
                    "validate_1": [*chaoskit, "validate", str(one)]}
        if chaos:
            commands["chaos_help"] = [chaos, "--no-version-check", "--help"]
            commands["chaos_validate"] = [chaos, "--no-version-check", "--no-log-file", "validate", str(experiment)]
        t = timed(commands, args.runs)
        t["validate_100"] = timed({"v": [*chaoskit, "validate", str(scenarios)]}, max(3, args.runs // 2))["v"]
        baseline, help_s, validate_1, validate_100 = t["baseline"], t["help"], t["validate_1"], t["validate_100"]
        chaos_help, chaos_validate = t.get("chaos_help"), t.get("chaos_validate")

    def row(label: str, seconds: float, extra: str = "") -> None:
        print(f"{label:34} {seconds * 1000:8.1f} ms   {seconds / baseline:5.1f}x baseline{extra}")

    print(f"chaoskit: {where} ({py})")
    row("python -c pass", baseline)
    row("chaoskit --help", help_s, f", {help_s / chaos_help:.2f}x chaos --help (target <= 0.5x)" if chaos_help else "")
    row("chaoskit validate kill-rank.yaml", validate_1,
        f", {validate_1 / chaos_validate:.2f}x chaos validate (target <= 0.8x)" if chaos_validate else "")
    row("chaoskit validate (100 files)", validate_100, f", {(validate_100 - validate_1) / 99 * 1000:.2f} ms per extra file")
    row("floor: typer, pydantic, PyYAML", t["floor"],
        f", {t['floor'] / chaos_validate:.2f}x chaos validate" if chaos_validate else "")
    print(f"{'':34} chaoskit's own share of validate (validate minus the floor): {(validate_1 - t['floor']) * 1000:.0f} ms")
    if chaos:
        row("chaos --help", chaos_help)
        row("chaos validate (one action)", chaos_validate)
    else:
        print("Chaos Toolkit: not measured (no chaos command, and none installed)")


if __name__ == "__main__":
    main()
