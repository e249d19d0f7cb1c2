"""Benchmark: the Ray lab's start-up and memory, and inject latency through Ray actors.

    .venv/bin/python bench/bench_ray.py [--nodes 3] [--samples 200] [--ssh auto|yes|no] [--json]

Measures, in one run on the process lab joined into Ray:

1. Start-up: wall time of ``RayLab.start`` (head + one ``ray start`` per node, until
   every node is alive in Ray's node table), and the resident memory (RSS) of every
   Ray process of the lab, per node and in total, before and after the ChaosAgents
   started.
2. "inject -> fault in effect" for a cheap fault (``process.hang``'s SIGSTOP of a
   process of the node, in effect when the signal is sent), p50 and p95:
   - through the node's ChaosAgent actor (RayTransport, agent already started);
   - the baseline: the same signal from the controller (LocalTransport, same node,
     same process), the floor any transport adds to.
   The revert (SIGCONT) runs between samples and is not timed. The agent's first
   call (actor start-up, bounded by ``start_timeout``) and arming a lease (shipping
   and starting the watchdog) are printed apart.
3. Fan-out: the same inject on every node at once (median wall time until every
   node answered).

4. With root (``--ssh auto``, the default, or ``yes``): Ray beside SSH on the same
   nodes. A netns lab (an sshd per namespace) gets a Ray node started inside each
   namespace; ``ip link set dev eth0 down`` (``network.link_down``'s command) is
   injected through chaoskit's SSH agent and through the node's ChaosAgent, p50/p95.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import INJECT, ms, pct, time_run  # noqa: E402


def rss_by_node(lab) -> dict[str, float]:
    """MiB of resident memory of the lab's processes, by node (scope)."""
    out: dict[str, float] = {}
    for node, pid, _ in lab.processes():
        try:
            with open(f"/proc/{pid}/status") as fh:
                kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        out[node] = out.get(node, 0.0) + kb / 1024
    return out


def time_signal(transport, pid: int, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        transport.signal(pid, signal.SIGSTOP)
        out.append(time.perf_counter() - t0)
        os.kill(pid, signal.SIGCONT)
    return out


def ray_beside_ssh(nodes: int, samples: int) -> dict:
    """The netns lab (root): each namespace node gets an sshd (the lab's) and a Ray node;
    the same NIC fault is injected through chaoskit's SSH agent and through the ChaosAgent."""
    import json as _json
    import tempfile

    from chaoskit.cluster.transports.ray import RayTransport, node_resource
    from chaoskit.cluster.transports.ssh_many import connect_all
    from chaoskit.lab.netns import NetnsLab
    from chaoskit.lab.ray import HEALTH_ENV, _free_port, _ray_cli, _stop_scopes

    own_dir = tempfile.mkdtemp(prefix="chaoskit-bench-ray-")
    lab = NetnsLab.create(nodes, directory=Path(own_dir) / "lab")
    head = f"{lab.controller_address}:{_free_port()}"
    try:
        def ray_start(scope: str, argv: list[str], prefix: list[str]) -> None:
            env = {**os.environ, **HEALTH_ENV, "CHAOSKIT_SCOPE": scope}
            env.pop("RAY_ADDRESS", None)
            subprocess.run([*prefix, _ray_cli(), "start", "--object-store-memory=83886080", "--include-log-monitor=false",
                            "--disable-usage-stats", *argv], env=env, check=True, capture_output=True, timeout=120)

        ray_start(f"{lab.lab_id}.ray-head", ["--head", f"--port={head.rsplit(':', 1)[1]}",
                                             f"--node-ip-address={lab.controller_address}", "--num-cpus=0",
                                             "--include-dashboard=false"], [])
        for node in lab.node_names():
            ray_start(f"{lab.lab_id}.{node}", [f"--address={head}", f"--node-ip-address={lab.mgmt_address(node)}",
                                              "--num-cpus=1", f"--resources={_json.dumps({node_resource(node): 1})}"],
                      lab.exec_argv(node, []))
        inventory = lab.inventory()
        connect_all([n.conn for n in inventory.nodes])
        name = inventory.nodes[0].name
        ssh = inventory.nodes[0].conn
        ray_t = RayTransport(name, f"{lab.lab_id}.{name}", address=head, resource=node_resource(name))
        ray_t.connect()
        # The agent must be inside the node's namespace before a NIC goes down through it.
        shown = ray_t.run(["ip", "-o", "-4", "addr", "show", "dev", "eth1"], 10).stdout
        if f" {lab.mgmt_address(name)}/" not in shown:
            raise SystemExit(f"the ChaosAgent of {name} is not in the node's namespace ({shown.strip()!r}); not injecting")
        ssh_times, ray_times = time_run(ssh, samples), time_run(ray_t, samples)
        for n in inventory.nodes:
            n.conn.close()
        return {"nodes": nodes, "samples": samples,
                "ssh": ms(ssh_times),
                "ray": ms(ray_times)}
    finally:
        import shutil

        import ray

        ray.shutdown()
        _stop_scopes(set(), prefix=f"{lab.lab_id}.")
        lab.down()
        shutil.rmtree(own_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--json", action="store_true")
    p.add_argument("--ssh", choices=["auto", "yes", "no"], default="auto",
                   help="also inject through SSH and Ray on the same netns lab nodes (needs root); auto: when root")
    args = p.parse_args(argv)

    import importlib.util

    if importlib.util.find_spec("ray") is None:
        print("ray is not installed (pip install 'chaoskit[ray]'): nothing to measure")
        return 0
    from chaoskit.cluster.transports.local import LocalTransport
    from chaoskit.lab.process import ProcessLab
    from chaoskit.lab.ray import HEAD_NODE, RayLab
    from chaoskit.safety.lease import LeaseManager

    lab = ProcessLab.create(args.nodes)
    t0 = time.perf_counter()
    ray_lab = RayLab.start(lab)
    startup_s = time.perf_counter() - t0
    procs: list[subprocess.Popen] = []
    result: dict = {"nodes": args.nodes, "samples": args.samples, "startup_s": round(startup_s, 2)}
    try:
        time.sleep(2)  # let each raylet's own agents finish starting
        mem_idle = rss_by_node(lab)
        inv = ray_lab.inventory()
        for name in lab.node_names():
            env = dict(os.environ, CHAOSKIT_SCOPE=lab.scope(name))
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env))
        time.sleep(0.3)
        first_call = []
        for node in inv.nodes:
            t = time.perf_counter()
            node.conn.connect()
            first_call.append(time.perf_counter() - t)
        mem_agents = rss_by_node(lab)
        result["memory_mib"] = {
            "head": round(mem_idle.get(HEAD_NODE, 0.0), 1),
            "per_node_idle": round(statistics.mean(mem_idle.get(n, 0.0) for n in lab.node_names()), 1),
            "per_node_with_agent": round(statistics.mean(mem_agents.get(n, 0.0) for n in lab.node_names()), 1),
            "total_with_agents": round(sum(mem_agents.values()), 1),
        }
        result["agent_first_call_s"] = round(max(first_call), 3)

        node0, pid0 = inv.nodes[0], procs[0].pid
        ray_times = time_signal(node0.conn, pid0, args.samples)
        local_times = time_signal(LocalTransport(node0.name, lab.scope(node0.name)), pid0, args.samples)
        result["inject_ms"] = {
            "ray": ms(ray_times),
            "local": ms(local_times),
        }
        result["ray_over_local_p50"] = round(pct(ray_times, 0.5) / pct(local_times, 0.5), 1)

        leases = LeaseManager(Path("/tmp") / f"chaoskit-bench-{os.getpid()}", "bench", ttl=30)
        t = time.perf_counter()
        leases.arm(node0.conn, "f0", ["true"], 60)
        result["arm_lease_ms"] = round(1000 * (time.perf_counter() - t), 1)
        leases.release("f0")
        leases.close()

        fan = []
        with ThreadPoolExecutor(max_workers=len(inv.nodes)) as pool:
            for _ in range(max(5, args.samples // 20)):
                t = time.perf_counter()
                list(pool.map(lambda ip: ip[0].conn.signal(ip[1], signal.SIGSTOP), zip(inv.nodes, [p.pid for p in procs])))
                fan.append(time.perf_counter() - t)
                for proc in procs:
                    os.kill(proc.pid, signal.SIGCONT)
        result["fanout_ms"] = {"nodes": len(inv.nodes), "p50": round(1000 * statistics.median(fan), 3)}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        import ray

        ray.shutdown()
        ray_lab.down()
        lab.kill_all()

    if args.ssh == "yes" or (args.ssh == "auto" and os.geteuid() == 0):
        import ray

        ray.shutdown()
        result["netns_ssh_vs_ray_ms"] = ray_beside_ssh(args.nodes, max(20, args.samples // 4))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["memory_mib"]
    print(f"Ray lab, {args.nodes} nodes: up in {result['startup_s']:.1f}s; memory: head {m['head']:.0f} MiB, "
          f"{m['per_node_idle']:.0f} MiB per node ({m['per_node_with_agent']:.0f} with its ChaosAgent), "
          f"{m['total_with_agents']:.0f} MiB in all")
    print(f"first call to an agent (actor start): {result['agent_first_call_s'] * 1000:.0f} ms; "
          f"arming a lease through it: {result['arm_lease_ms']:.0f} ms")
    i = result["inject_ms"]
    print(f"inject -> in effect (SIGSTOP), {args.samples} samples:")
    print(f"  through the ChaosAgent  p50 {i['ray']['p50']:8.3f} ms  p95 {i['ray']['p95']:8.3f} ms")
    print(f"  local floor             p50 {i['local']['p50']:8.3f} ms  p95 {i['local']['p95']:8.3f} ms")
    print(f"  ratio (Ray / local, p50): {result['ray_over_local_p50']:.1f}x")
    print(f"fan-out to {result['fanout_ms']['nodes']} nodes at once: p50 {result['fanout_ms']['p50']:.3f} ms")
    both = result.get("netns_ssh_vs_ray_ms")
    if both:
        print(f"same netns lab nodes, inject -> in effect ({' '.join(INJECT)}), {both['samples']} samples:")
        print(f"  chaoskit SSH agent      p50 {both['ssh']['p50']:8.3f} ms  p95 {both['ssh']['p95']:8.3f} ms")
        print(f"  Ray ChaosAgent          p50 {both['ray']['p50']:8.3f} ms  p95 {both['ray']['p95']:8.3f} ms")
        print(f"  ratio (Ray / SSH, p50): {both['ray']['p50'] / both['ssh']['p50']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
