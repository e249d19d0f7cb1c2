"""What the in-process fault channel costs: the reference job's step time without the bootstrap, with it
(no order), with an order armed (its hooks run every step), with the SDC checksum probe; and the probe's
cost per call at 10 M and 100 M parameters.

    python bench/bench_inproc.py [--steps N] [--runs R]

The job is chaoskit's reference job (``chaoskit.workloads.ddp_train``) in one process (a gloo world of 1),
with ``--step-time 0`` so that a step is its compute alone: the overhead is shown against that step and
against the reference job's usual 50 ms step. Variants run interleaved, R times each; each run's figure is
the median interval between its step events past a warm-up; the best run is printed (a shared machine's noise
only ever adds). Then the same model and step in this process with the hooks put on and off between rounds,
which sees a few microseconds where whole jobs started apart cannot. The armed
order is an ``inproc.hang`` with ``where: data``: its hooks are installed and consulted every step, and the
reference job has no DataLoader, so it never fires.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "chaoskit" / "sdk" / "_boot"
REFERENCE_STEP_S = 0.05


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_time(variant: str, steps: int, work: Path) -> float:
    """The median seconds per step of one run of the reference job under ``variant``."""
    events = work / f"events-{variant}-{time.monotonic_ns()}.jsonl"
    folder = Path(tempfile.mkdtemp(dir=work))  # 0700, this user's
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOSKIT_")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()),
               CHAOSKIT_EVENTS=str(events), OMP_NUM_THREADS="1")
    if variant != "no bootstrap":
        env.update(PYTHONPATH=os.pathsep.join([str(BOOT), str(ROOT)]), CHAOSKIT_INPROC_DIR=str(folder))
    if variant == "sdc probe every 10":
        env["CHAOSKIT_SDC_EVERY"] = "10"
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit.workloads.ddp_train", "--steps", str(steps), "--step-time", "0",
                             "--checkpoint-every", str(steps * 10), "--checkpoint-dir", str(work / "ckpt")],
                            env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    armed_at = 0
    if variant == "order armed":
        deadline = time.time() + 120
        while time.time() < deadline and not (events.exists() and '"kind":"step"' in events.read_text()):
            time.sleep(0.01)
        order = {"v": 1, "id": "b0", "kind": "inproc.hang", "pid": proc.pid, "params": {"where": "data"}}
        (folder / f"order-{proc.pid}.json").write_text(json.dumps(order))
        status = folder / f"status-{proc.pid}.json"
        while time.time() < deadline and not status.exists():
            time.sleep(0.01)
        armed_at = time.time()
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: the job failed: {err.strip().splitlines()[-1:]}")
    ts = [e["ts"] for e in map(json.loads, events.read_text().splitlines()) if e["kind"] == "step" and e["ts"] > armed_at]
    ts = ts[len(ts) // 5:]  # past the warm-up
    return statistics.median(b - a for a, b in zip(ts, ts[1:]))


def hook_cost(rounds: int, steps: int) -> dict[str, float]:
    """The reference job's model and step in this process, the hooks an armed order installs put on and taken off
    between rounds (interleaved, the best round of each: the machine's noise only ever adds): seconds per step."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from chaoskit.sdk import inproc

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    y = x.sum(dim=1, keepdim=True)

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    def variant(name: str) -> list:
        handles = []
        if name != "no hooks":
            handles += [register_optimizer_step_pre_hook(inproc._opt_pre), register_optimizer_step_post_hook(inproc._opt_post)]
        if name == "optimizer + forward hooks":
            handles.append(register_module_forward_pre_hook(inproc._forward_pre))
        inproc._sdc_every = 10 if name == "sdc probe every 10" else 0
        return handles

    names = ["no hooks", "optimizer hooks", "optimizer + forward hooks", "sdc probe every 10"]
    best = {n: float("inf") for n in names}
    run()  # warm
    for _ in range(rounds):
        for n in names:
            handles = variant(n)
            best[n] = min(best[n], run())
            for h in handles:
                h.remove()
    inproc._sdc_every = 0
    return best


def checksum_cost(params: int, runs: int) -> float:
    import torch

    from chaoskit.sdk.inproc import checksum

    tensors = [torch.randn(params // 4), torch.randn(params // 2), torch.randn(params - params // 4 - params // 2)]
    checksum(tensors)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        checksum(tensors)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    variants = ["no bootstrap", "bootstrap, no order", "order armed", "sdc probe every 10"]
    figures: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for v in variants:
                figures[v].append(step_time(v, args.steps, Path(tmp)))
    base = min(figures["no bootstrap"])
    print(f"reference job, one process, --step-time 0, {args.steps} steps: each run's median step, best of {args.runs} runs")
    print(f"{'variant':<26} {'step':>10} {'vs no bootstrap':>16} {'of a 50 ms step':>16}")
    for v in variants:
        m = min(figures[v])
        print(f"{v:<26} {m * 1e6:>8.1f}us {100 * (m - base) / base:>+15.2f}% {100 * (m - base) / REFERENCE_STEP_S:>+15.3f}%")
    best = hook_cost(rounds=15, steps=500)
    base = best["no hooks"]
    print(f"\nthe same step in this process, the hooks put on and off (best of 15 rounds of 500 steps)")
    for name, m in best.items():
        print(f"{name:<26} {m * 1e6:>8.1f}us {1e6 * (m - base):>+10.1f}us {100 * (m - base) / REFERENCE_STEP_S:>+15.3f}%")
    print("\nchecksum probe (chaoskit.sdk.inproc.checksum), one call, float32 parameters, median of 5")
    for n in (10_000_000, 100_000_000):
        cost = checksum_cost(n, 5)
        print(f"{n / 1e6:>5.0f} M parameters {cost * 1e3:>9.1f} ms  ({n * 4 / cost / 1e9:.1f} GB/s); "
              f"every 10 steps of 50 ms: {100 * cost / (10 * REFERENCE_STEP_S):.1f}% of the step time")


if __name__ == "__main__":
    main()
