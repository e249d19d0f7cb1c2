"""Benchmark: ``validate`` and ``--dry-run`` of an attach drill on inventories of 3 to 2,048 nodes.

    .venv/bin/python bench/bench_scale.py [--runs 5] [--json]

A real site's inventory lists hundreds of nodes; checking a scenario against it must stay
interactive. For each size this prints the CPU time (this process, min of ``--runs``) of
loading and checking the scenario with its inventory (what ``validate`` does after start-up)
and of planning it (what ``--dry-run`` adds), the cost per node, and the ratio to the 3-node
inventory measured in the same run. Then the whole ``chaoskit validate`` and ``chaoskit run
--dry-run`` commands on the 512-node inventory, start-up included (CPU of the child, min of
``--runs``). Target (issue 12): 512 nodes well under a second, start-up included.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaoskit.runner import plan_scenario  # noqa: E402
from chaoskit.scenario import load_scenario  # noqa: E402
from chaoskit.scenario.checks import check_scenario  # noqa: E402

SIZES = (3, 64, 512, 2048)
SCENARIO = """\
name: scale
cluster: {inventory: inventory.yaml}
workload: {launch: attach, process: 'train\\.py', nproc_per_node: 8}
probes: {sdk: false, log: [{match: 'step (?P<step>\\d+)', event: step}]}
faults:
  - kind: process.kill
    target: {process: 'train\\.py', ranks: [9]}
  - kind: network.link_down
    target: {labels: {rack: r0}, count: 1}
    interface: data
    duration: 30s
"""


def write_site(folder: Path, nodes: int) -> Path:
    lines = ["name: scale", "ssh: {user: ck, become: sudo, known_hosts: ./known_hosts}", "nodes:"]
    for i in range(nodes):
        lines.append(f"  - {{name: gpu{i:04d}, address: 10.{i // 250}.{i % 250}.1, labels: {{rack: r{i // 16}}}, "
                     f"interfaces: {{data: ib0, mgmt: eno1}}, gpus: 8}}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inventory.yaml").write_text("\n".join(lines) + "\n")
    (folder / "drill.yaml").write_text(SCENARIO)
    return folder / "drill.yaml"


def cpu(fn, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def child_cpu(argv: list[str], runs: int) -> float:
    best = float("inf")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, check=True, capture_output=True, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: write_site(Path(tmp) / str(n), n) for n in SIZES}
        for n, path in paths.items():
            check = cpu(lambda: check_scenario(load_scenario(path)), args.runs)

            def plan(path: Path = path) -> None:
                loaded = load_scenario(path)
                plan_scenario(loaded, check_scenario(loaded))

            rows.append({"nodes": n, "check_s": round(check, 4), "dry_run_s": round(cpu(plan, args.runs), 4)})
        base = rows[0]
        for row in rows:
            row["us_per_node"] = round(1e6 * (row["dry_run_s"] - base["dry_run_s"]) / max(1, row["nodes"] - base["nodes"]), 1)
            row["vs_3_nodes"] = round(row["dry_run_s"] / base["dry_run_s"], 2)
        cli = [sys.executable, "-m", "chaoskit"]
        whole = {
            "validate_512_s": round(child_cpu([*cli, "validate", str(paths[512])], args.runs), 3),
            "dry_run_512_s": round(child_cpu([*cli, "run", "--dry-run", str(paths[512])], args.runs), 3),
            "validate_3_s": round(child_cpu([*cli, "validate", str(paths[3])], args.runs), 3),
        }
    if args.json:
        print(json.dumps({"sizes": rows, "commands": whole}, indent=2))
        return 0
    print(f"{'nodes':>6} {'check (CPU)':>12} {'+ plan (CPU)':>13} {'per node':>10} {'vs 3 nodes':>11}")
    for r in rows:
        print(f"{r['nodes']:>6} {r['check_s'] * 1000:>10.1f}ms {r['dry_run_s'] * 1000:>11.1f}ms "
              f"{r['us_per_node']:>8.1f}us {r['vs_3_nodes']:>10.2f}x")
    print(f"whole commands, start-up included (CPU): validate 3 nodes {whole['validate_3_s']:.3f}s, "
          f"validate 512 nodes {whole['validate_512_s']:.3f}s, run --dry-run 512 nodes {whole['dry_run_512_s']:.3f}s "
          f"(target: well under 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
