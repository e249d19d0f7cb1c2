"""Benchmark of the simulator: ``.venv/bin/python bench/bench_simulate.py``.

1. The source material's example (100 steps of work, a checkpoint every 10,
   fault rate 0.03 per step), with and without checkpoints: its step-by-step
   loop (``chaoskit.sim.demo.SeedLoop``, a pure-Python re-implementation) against
   the vectorised sampler on the same parameters: means (should agree within
   1%), the closed form, and the speed ratio.
2. The cluster Monte Carlo at Llama 3 scale: 16,384 GPUs x 54 days x 1,000
   trials (target: under 2 s on 2 cores).

Seeds are fixed, so the figures are the same from run to run (timings aside).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from chaoskit.sim import demo, montecarlo  # noqa: E402
from chaoskit.sim import model as m  # noqa: E402

LOOP_RUNS = 50_000
VECTOR_RUNS = 1_000_000


def bench_seed_example() -> None:
    ex = demo.SEED_EXAMPLE
    print(f"source material's example: work {ex['total_work']}, checkpoint every {ex['ckpt_interval']}, fault rate {ex['fault_rate']}/step")
    print(f"{'':22}{'loop mean':>12}{'vector mean':>13}{'closed form':>13}{'diff':>9}{'(se)':>8}{'loop':>10}{'vector':>10}{'speed-up':>10}")
    for has_ckpt in (True, False):
        rng = random.Random(2024)
        t0 = time.perf_counter()
        loop = [demo.SeedLoop(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt, rng).train() for _ in range(LOOP_RUNS)]
        t_loop = time.perf_counter() - t0

        t0 = time.perf_counter()
        demo.simulate(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt, trials=LOOP_RUNS, seed=1)
        t_vec = time.perf_counter() - t0  # same number of runs as the loop: the fair speed comparison
        big = demo.simulate(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt, trials=VECTOR_RUNS, seed=2)

        closed = demo.expected(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt)["time"]
        loop_mean, vec_mean = statistics.fmean(loop), float(big.time.mean())
        diff = (vec_mean - loop_mean) / loop_mean
        se = math.sqrt(statistics.pvariance(loop) / LOOP_RUNS + float(big.time.var()) / VECTOR_RUNS) / loop_mean
        label = "with checkpoints" if has_ckpt else "without checkpoints"
        print(
            f"{label:22}{loop_mean:12.2f}{vec_mean:13.2f}{closed:13.2f}{diff:+9.2%}{se:8.2%}"
            f"{t_loop:9.2f}s{t_vec:9.3f}s{t_loop / t_vec:9.0f}x"
            f"   {'within 1%' if abs(diff) < 0.01 else 'NOT within 1%'}"
        )
    print(f"(loop: {LOOP_RUNS:,} runs; vector mean: {VECTOR_RUNS:,} runs, timed on {LOOP_RUNS:,}; se: standard error of the difference)")


def bench_llama3_scale() -> None:
    gpus, days, trials = 16_384, 54, 1_000
    rate = 419 / (gpus * days * 24)
    cases = {
        "a healthy node always ready": dict(spares=None),
        "16 spare nodes, 24 h repair": dict(spares=16, repair_s=24 * m.HOUR),
    }
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print()
    print(f"cluster Monte Carlo: {gpus:,} GPUs x {days} days x {trials:,} trials ({cores} cores available; target < 2 s on 2)")
    for label, extra in cases.items():
        model = m.ClusterModel(gpus, rate, days * m.DAY, 600, 5, (m.RecoveryPhases(60, 240, 120),), **extra)
        montecarlo.run(model, trials=10, seed=0)  # warm-up
        times = []
        for seed in range(3):
            t0 = time.perf_counter()
            runs = montecarlo.run(model, trials=trials, seed=seed)
            times.append(time.perf_counter() - t0)
        failures = int(runs.failures.sum())
        g, lo, hi = montecarlo.mean_ci(runs.goodput)
        print(
            f"  {label:30} {min(times):6.3f}s best of 3 ({statistics.median(times):.3f}s median), "
            f"{failures / min(times) / 1e6:5.1f}M failures/s; failures/trial {runs.failures.mean():.1f} "
            f"(closed form {model.cluster_rate_per_s * model.window_s:.1f}), goodput {g:.4f} [{lo:.4f}, {hi:.4f}] "
            f"(closed form {m.goodput(model):.4f})   {'under 2 s' if min(times) < 2 else 'OVER 2 s'}"
        )


if __name__ == "__main__":
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}")
    bench_seed_example()
    bench_llama3_scale()
