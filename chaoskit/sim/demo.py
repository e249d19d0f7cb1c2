"""The source material's example: training in discrete time steps, with and without checkpoints.

Its rules, kept exactly:

- each time step first rolls a die: with probability ``fault_rate`` a fault
  happens, the step is spent, and progress falls back to the last checkpoint
  (to 0 without checkpoints, and also with checkpoints when none was saved
  yet: a fault before any checkpoint loses everything);
- otherwise progress grows by one;
- a checkpoint is saved as soon as progress is ``ckpt_interval`` past the last
  one; saving is free;
- training stops when progress reaches ``total_work``; the cost is the number
  of time steps spent.

:class:`SeedLoop` is that loop in plain Python (one ``random()`` call per
step, in the same order, so ``random.Random(42)`` replays the source's run).
:func:`simulate` is the same process vectorised: between checkpoints the job
must string together ``k`` fault-free steps; the number of failed attempts is
geometric and each failed attempt's length a truncated geometric, so all trials
are drawn at once. :func:`expected` gives the closed forms.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

__all__ = ["SEED_EXAMPLE", "SeedLoop", "SeedRuns", "simulate", "expected", "segments"]

SEED_EXAMPLE = {"total_work": 100, "ckpt_interval": 10, "fault_rate": 0.03}
"""The parameters of the source material's example."""


class SeedLoop:
    """One training run under the source material's rules, step by step."""

    def __init__(self, total_work: int = 100, ckpt_interval: int = 10, fault_rate: float = 0.03,
                 has_ckpt: bool = True, rng: random.Random | None = None) -> None:
        _check(total_work, ckpt_interval, fault_rate)
        self.total_work, self.ckpt_interval, self.fault_rate = total_work, ckpt_interval, fault_rate
        self.has_ckpt = has_ckpt
        self.rng = rng or random.Random()
        self.progress = self.last_ckpt = self.time = self.faults = self.checkpoints = 0

    def step(self) -> None:
        if self.rng.random() < self.fault_rate:
            self.faults += 1
            self.progress = self.last_ckpt if self.has_ckpt else 0
        else:
            self.progress += 1
        self.time += 1
        if self.has_ckpt and self.progress - self.last_ckpt >= self.ckpt_interval:
            self.last_ckpt = self.progress
            self.checkpoints += 1

    def train(self) -> int:
        """Step until the work is done; return the time steps spent."""
        while self.progress < self.total_work:
            self.step()
        return self.time


@dataclass
class SeedRuns:
    """Per-trial outcomes of many runs (arrays of length ``trials``)."""

    time: np.ndarray
    faults: np.ndarray
    checkpoints: np.ndarray


def segments(total_work: int, ckpt_interval: int, has_ckpt: bool) -> list[int]:
    """The stretches of fault-free steps the job must string together, one per checkpoint."""
    if not has_ckpt:
        return [total_work]
    full, rest = divmod(total_work, ckpt_interval)
    return [ckpt_interval] * full + ([rest] if rest else [])


def simulate(total_work: int = 100, ckpt_interval: int = 10, fault_rate: float = 0.03,
             has_ckpt: bool = True, trials: int = 10_000, seed: int = 0) -> SeedRuns:
    """``trials`` runs of :class:`SeedLoop`, drawn at once (same distribution, other random numbers)."""
    _check(total_work, ckpt_interval, fault_rate)
    rng = np.random.default_rng(seed)
    q = 1.0 - fault_rate
    time = np.zeros(trials, dtype=np.int64)
    faults = np.zeros(trials, dtype=np.int64)
    for k, n_seg in _count(segments(total_work, ckpt_interval, has_ckpt)).items():
        success = q**k  # one attempt at k steps in a row succeeds
        # Failed attempts before the successful one, per trial summed over its n_seg segments:
        # a sum of n_seg geometrics is negative binomial.
        failed = rng.negative_binomial(n_seg, success, trials) if success < 1.0 else np.zeros(trials, dtype=np.int64)
        total_failed = int(failed.sum())
        # A failed attempt makes j fault-free steps (0 <= j < k) and then spends one step on the fault:
        # P(j) is proportional to q^j, so invert its CDF (1 - q^(j+1)) / (1 - q^k).
        u = rng.random(total_failed)
        made = np.floor(np.log1p(-u * -math.expm1(k * math.log(q))) / math.log(q)) if total_failed else u
        made = np.minimum(made, k - 1)
        owner = np.repeat(np.arange(trials), failed)
        time += n_seg * k + failed + np.bincount(owner, weights=made, minlength=trials).astype(np.int64)
        faults += failed
    checkpoints = np.full(trials, total_work // ckpt_interval if has_ckpt else 0, dtype=np.int64)
    return SeedRuns(time=time, faults=faults, checkpoints=checkpoints)


def expected(total_work: int = 100, ckpt_interval: int = 10, fault_rate: float = 0.03, has_ckpt: bool = True) -> dict:
    """Closed forms: ``k`` fault-free steps in a row take ``(q^-k - 1) / p`` steps on average,
    with ``q^-k - 1`` faults on the way; a run is the sum over its segments."""
    _check(total_work, ckpt_interval, fault_rate)
    p, q = fault_rate, 1.0 - fault_rate
    time = faults = var = 0.0
    for k in segments(total_work, ckpt_interval, has_ckpt):
        if p == 0:
            time += k
            continue
        qk = q**-k
        time += (qk - 1.0) / p
        faults += qk - 1.0
        # Variance of the time to k successes in a row (Feller): (1 - (2k+1) p q^k - q^(2k+1)) / (p q^k)^2
        var += (1.0 - (2 * k + 1) * p * q**k - q ** (2 * k + 1)) / (p * q**k) ** 2
    return {"time": time, "faults": faults, "time_sd": math.sqrt(max(var, 0.0)),
            "checkpoints": total_work // ckpt_interval if has_ckpt else 0}


def _count(items: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return out


def _check(total_work: int, ckpt_interval: int, fault_rate: float) -> None:
    if total_work < 1:
        raise ValueError(f"total work must be at least 1 step, got {total_work}")
    if ckpt_interval < 1:
        raise ValueError(f"the checkpoint interval must be at least 1 step, got {ckpt_interval}")
    if not 0.0 <= fault_rate < 1.0:
        raise ValueError(f"the fault rate per step must be in [0, 1), got {fault_rate}")
