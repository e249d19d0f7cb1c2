"""What the benchmarks share: percentiles and the timed inject/revert loop."""

from __future__ import annotations

import time

INJECT = ["ip", "link", "set", "dev", "eth0", "down"]
REVERT = ["ip", "link", "set", "dev", "eth0", "up"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds."""
    return {"p50": round(1000 * pct(values, 0.5), 3), "p95": round(1000 * pct(values, 0.95), 3)}


def time_run(transport, samples: int, inject: list[str] = INJECT, revert: list[str] = REVERT) -> list[float]:
    """Seconds from sending ``inject`` through ``transport`` until it returned (the fault is then in
    effect), ``samples`` times; ``revert`` runs between samples, untimed."""
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        res = transport.run(inject, 10)
        out.append(time.perf_counter() - t0)
        assert res.returncode == 0, res.stderr
        transport.run(revert, 10)
    return out
