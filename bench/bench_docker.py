"""Benchmark: the Docker lab's start-up and teardown, and inject latency into a container.

    .venv/bin/python bench/bench_docker.py [--samples 100] [--json]

Needs a docker engine and the node image (docker/build-offline.sh). Measures, on the
repository's docker-compose.yml brought up under a project name of its own:

1. ``DockerLab.up`` (networks + 3 containers created and started, each answering an
   exec) and ``down``, wall time.
2. "inject -> fault in effect" for a NIC fault (``ip link set dev eth0 down``, in
   effect when the command returns; the revert runs between samples, untimed), p50
   and p95:
   - through the docker transport's agent (one long-lived docker exec, requests as
     JSON lines on the hijacked socket);
   - the transport's fallback, one exec per command through the SDK;
   - the baseline: the docker CLI, ``docker exec CONTAINER ip link ...`` (what a
     script would do), measured in the same run.
   The ratio agent / CLI is the figure to watch (target: <= 0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import INJECT, REVERT, ms, pct, time_run  # noqa: E402


def time_cli(container: str, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run(["docker", "exec", container, *INJECT], check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
        subprocess.run(["docker", "exec", container, *REVERT], check=True, capture_output=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from chaoskit.core.errors import ChaoskitError
    from chaoskit.lab.docker import DockerLab, load_compose

    compose = Path(__file__).resolve().parents[1] / "docker-compose.yml"
    env = {**os.environ, "COMPOSE_PROJECT_NAME": f"ckbench{os.getpid()}", "CHAOSKIT_DOCKER_SHARED": f"/tmp/ckbench-{os.getpid()}"}
    try:
        t0 = time.perf_counter()
        lab = DockerLab.up(project=load_compose(compose, environ=env))
        up_s = time.perf_counter() - t0
    except ChaoskitError as exc:  # no engine or no image here: say so, and let `make bench` go on
        print(f"bench_docker: skipped: {exc}" + (f" ({exc.hint})" if getattr(exc, "hint", None) else ""))
        return 0
    try:
        inventory = lab.inventory()
        node = inventory.nodes[1]
        transport = node.conn
        t0 = time.perf_counter()
        transport.connect()
        first_s = time.perf_counter() - t0
        agent = time_run(transport, args.samples)
        transport.mode = "exec"
        oneshot = time_run(transport, max(10, args.samples // 4))
        transport.mode = "agent"
        cli = time_cli(node.address, max(10, args.samples // 4))
        transport.close()
    finally:
        t0 = time.perf_counter()
        lab.down()
        down_s = time.perf_counter() - t0
    result = {
        "lab_up_s": round(up_s, 2), "lab_down_s": round(down_s, 2), "agent_start_ms": round(1000 * first_s, 1),
        "inject_ms": {"agent": ms(agent), "sdk_exec_per_command": ms(oneshot), "docker_exec_cli": ms(cli)},
        "ratio_agent_vs_cli_p50": round(pct(agent, 0.5) / pct(cli, 0.5), 4),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"docker lab up (3 containers, each answering):  {up_s:6.2f} s      down: {down_s:.2f} s")
    print(f"agent start (first docker exec + hello):        {1000 * first_s:6.1f} ms")
    print(f"inject -> in effect (ip link set dev eth0 down), {args.samples} samples:")
    for label, key in (("docker transport, agent", "agent"), ("docker transport, one SDK exec each", "sdk_exec_per_command"),
                       ("baseline: docker exec (CLI)", "docker_exec_cli")):
        v = result["inject_ms"][key]
        print(f"  {label:38s} p50 {v['p50']:8.3f} ms   p95 {v['p95']:8.3f} ms")
    ratio = result["ratio_agent_vs_cli_p50"]
    print(f"ratio agent / docker exec CLI (p50): {ratio:.4f}  (target <= 0.1: {'met' if ratio <= 0.1 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
