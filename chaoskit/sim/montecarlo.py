"""Vectorised Monte Carlo of the cluster model: many trials at once, no Python loop per failure.

One trial is a window of ``model.window_s`` seconds cut from a long training
job (as the Llama 3 paper's 54-day snapshot is). Failures of the cluster form
a Poisson process: the superposition of ``N`` GPUs failing independently, so a
trial draws its failure count from Poisson(N rate T) and the times uniformly,
instead of rolling a die per GPU per hour (``N x hours x trials`` dice).

Failure epochs are where the job starts over (recovery, then cycles of
``tau`` compute + ``C`` checkpoint), so a trial is a matrix row of sorted
failure times and every quantity is arithmetic on the gaps between them:

- the window starts in the steady state: the last failure before it lies an
  ``Exp(Lambda)`` time back (the backward recurrence time of a Poisson
  process), so its expectations equal the long-run closed forms exactly;
- work counts as useful when its checkpoint completes inside the window;
- with a finite spare pool, the ``s``-th failure back decides whether a spare
  is free (repairs take ``repair_s`` each and run in parallel), which needs
  the failures of the ``repair_s`` before the window too.

Trials are processed in chunks so memory stays bounded for any trial count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chaoskit.sim.model import ClusterModel

__all__ = ["TrialResults", "run", "mean_ci", "ratio_ci", "proportion_ci"]

_CHUNK_ELEMENTS = 2_000_000  # failure-matrix cells per chunk (~16 MB per float array)


@dataclass
class TrialResults:
    """Per-trial outcomes (arrays of length ``trials``)."""

    model: ClusterModel
    seed: int
    failures: np.ndarray
    """Failures inside the window."""
    useful_s: np.ndarray
    """Compute whose checkpoint completed inside the window."""
    recovery_s: np.ndarray
    """Time inside the window spent recovering (detection, reallocation incl. spare waits, load)."""
    lost_work_s: np.ndarray
    """Compute thrown away by the window's failures."""
    waited: np.ndarray
    """Window failures that found no spare node free (and so waited for a repair)."""

    @property
    def trials(self) -> int:
        return int(self.failures.size)

    @property
    def goodput(self) -> np.ndarray:
        """Effective training time of each trial: useful time / elapsed time."""
        return self.useful_s / self.model.window_s


def run(model: ClusterModel, trials: int = 1000, seed: int = 0) -> TrialResults:
    """Simulate ``trials`` windows of ``model``; deterministic for a given ``seed``."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    rng = np.random.default_rng(seed)
    lam = model.cluster_rate_per_s
    per_trial = lam * model.window_s + 6.0 * math.sqrt(lam * model.window_s) + 8.0
    if model.spares:
        per_trial += lam * model.repair_s + model.spares
    chunk = max(1, min(trials, int(_CHUNK_ELEMENTS // per_trial)))
    parts = [_run_chunk(model, min(chunk, trials - start), rng) for start in range(0, trials, chunk)]
    return TrialResults(
        model=model,
        seed=seed,
        **{k: np.concatenate([p[k] for p in parts]) for k in ("failures", "useful_s", "recovery_s", "lost_work_s", "waited")},
    )


def _run_chunk(model: ClusterModel, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    lam, window = model.cluster_rate_per_s, model.window_s
    tau, cycle = model.ckpt_interval_s, model.ckpt_interval_s + model.ckpt_cost_s
    inf = np.inf

    # Failures inside the window, sorted; rows padded on the right with +inf.
    counts = rng.poisson(lam * window, n)
    kmax = int(counts.max())
    inside = rng.random((n, kmax)) * window
    inside[np.arange(kmax)[None, :] >= counts[:, None]] = inf
    inside.sort(axis=1)

    # The last failure before the window, `back` seconds before it.
    back = rng.exponential(1.0 / lam, n)

    # With a finite spare pool: the failures of the repair time before that one,
    # padded on the left with -inf, so that column c - spares is "s failures earlier".
    spares = model.spares
    if spares:
        hist_counts = rng.poisson(lam * model.repair_s, n)
        hcols = max(int(hist_counts.max()), spares)
        history = -back[:, None] - model.repair_s * rng.random((n, hcols))
        history[np.arange(hcols)[None, ::-1] >= hist_counts[:, None]] = -inf
        history.sort(axis=1)
    else:
        hcols = 0
        history = np.empty((n, 0))
    times = np.concatenate([history, -back[:, None], inside], axis=1)

    start = times[:, hcols:]  # each gap starts at a failure...
    end = np.concatenate([times[:, hcols + 1:], np.full((n, 1), inf)], axis=1)  # ...and ends at the next
    real = np.isfinite(start)

    det, realloc, load = _draw_phases(model, start.shape, rng)
    if spares is None:
        recovery = det + realloc + load
        waited = np.zeros(start.shape, dtype=bool)
    elif spares == 0:
        recovery = det + load + np.maximum(realloc, model.repair_s)
        waited = np.full(start.shape, model.repair_s > 0)
    else:
        earlier = times[:, hcols - spares: hcols - spares + start.shape[1]]
        with np.errstate(invalid="ignore"):
            wait = np.where(real, np.maximum(earlier + model.repair_s - start, 0.0), 0.0)
        recovery = det + load + np.maximum(realloc, wait)
        waited = wait > 0

    with np.errstate(invalid="ignore"):
        lo = np.maximum(start, 0.0)
        hi = np.minimum(end, window)
        in_window = real & (hi > lo)
        ready = start + recovery  # training resumes here unless the next failure comes first

        def cycles_done(t: np.ndarray) -> np.ndarray:
            return np.floor(np.maximum(t - ready, 0.0) / cycle)

        useful = np.where(in_window, cycles_done(hi) - cycles_done(lo), 0.0).sum(axis=1) * tau
        recovering = np.where(in_window, np.maximum(np.minimum(np.minimum(ready, end), window) - lo, 0.0), 0.0).sum(axis=1)

        # Failures inside the window end the gap before them; what they throw away
        # is the compute since the last completed checkpoint (all of tau if the
        # failure hits the checkpoint write).
        ends_inside = real & (end <= window)
        elapsed = end - ready
        since_ckpt = np.where(ends_inside & (elapsed > 0), np.mod(np.where(ends_inside, elapsed, 0.0), cycle), 0.0)
        lost = np.minimum(since_ckpt, tau).sum(axis=1)
        # The failure that "waited" is the one starting the gap; count those inside the window.
        waits = (waited & real & (start >= 0)).sum(axis=1)
    return {"failures": counts, "useful_s": useful, "recovery_s": recovering, "lost_work_s": lost, "waited": waits}


def _draw_phases(model: ClusterModel, shape: tuple[int, int], rng: np.random.Generator):
    """Detection, reallocation and load per failure: the one recovery, or one drawn per failure."""
    phases = model.phases
    if len(phases) == 1:
        p = phases[0]
        return p.detection_s, p.reallocation_s, p.checkpoint_load_s
    table = np.array([[p.detection_s, p.reallocation_s, p.checkpoint_load_s] for p in phases])
    pick = rng.integers(len(phases), size=shape)
    return table[pick, 0], table[pick, 1], table[pick, 2]


# -- summaries ----------------------------------------------------------------------


def mean_ci(values: np.ndarray, z: float = 1.96) -> tuple[float, float, float]:
    """Mean and its normal-approximation confidence interval ``(mean, low, high)``."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else 0.0
    return mean, mean - z * se, mean + z * se


def ratio_ci(num: np.ndarray, den: np.ndarray, z: float = 1.96) -> tuple[float, float, float]:
    """Ratio of sums ``sum(num) / sum(den)`` over trials, with a delta-method interval."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if den.sum() == 0:
        return math.nan, math.nan, math.nan
    r = float(num.sum() / den.sum())
    n = num.size
    if n < 2:
        return r, r, r
    resid = num - r * den
    se = float(math.sqrt(resid.var(ddof=1) / n) / den.mean())
    return r, r - z * se, r + z * se


def proportion_ci(hits: int, n: int, z: float = 1.96) -> tuple[float, float, float]:
    """Share ``hits / n`` with its Wilson score interval (sane at 0 and 1)."""
    p = hits / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)
