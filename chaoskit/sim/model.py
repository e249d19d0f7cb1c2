"""The cluster-scale model and its closed forms.

The model, in the words of the source material, made exact:

- ``N`` GPUs, each failing at ``gpu_rate_per_hour`` (failures per GPU-hour);
  failed parts are replaced, so the cluster fails as a Poisson process of rate
  ``Lambda = N * rate`` and its MTBF is ``M = 1 / Lambda``.
- Every failure stops the whole synchronous job. Recovery takes
  ``R = detection + reallocation + checkpoint load`` (the phases chaoskit
  measures); a failure during recovery starts recovery again.
- Training runs in cycles of ``tau`` seconds of compute followed by a blocking
  checkpoint of ``C`` seconds. A failure loses everything since the last
  completed checkpoint (about ``tau / 2``).
- With a finite pool of ``spares`` nodes, a failure takes its node away for
  ``repair_s``; when no spare is free the reallocation waits until enough
  nodes come back from repair.

Goodput (the Llama 3 paper's "effective training time": time spent on useful
training over elapsed time) is then, exactly (a renewal argument; Daly 2006):

    goodput = Lambda * tau * E[exp(-Lambda * R)] / (exp(Lambda * (tau + C)) - 1)

and to first order ``1 - C / tau - (tau / 2 + MTTR) / M``. Young's optimum
``sqrt(2 C M)`` minimises the first-order loss; Daly's higher-order form is
closer to the optimum of the exact expression.

Units: seconds everywhere, except the per-GPU rate (per GPU-hour, as failure
rates are quoted). This module imports numpy; the CLI imports it lazily.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HOUR",
    "DAY",
    "RecoveryPhases",
    "ClusterModel",
    "RecoveryStats",
    "expected_failures",
    "prob_at_least_one",
    "availability",
    "young_interval",
    "daly_interval",
    "goodput_first_order",
    "gpu_rate_from_node_days",
    "goodput",
    "recovery_stats",
    "lost_work_per_failure",
    "best_interval",
    "time_budget",
]

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class RecoveryPhases:
    """One measured (or assumed) recovery: the three phases of docs/architecture.md, in seconds."""

    detection_s: float
    reallocation_s: float
    checkpoint_load_s: float
    source: str = "by hand"

    @property
    def total_s(self) -> float:
        return self.detection_s + self.reallocation_s + self.checkpoint_load_s


@dataclass(frozen=True)
class ClusterModel:
    """Everything the closed forms and the Monte Carlo need.

    ``phases`` holds one recovery or several (a game day); each failure draws
    one of them with equal weight. ``spares=None`` means a healthy node is
    always ready (reallocation takes just its measured time).

    Raises ``ValueError`` on values the model cannot take.
    """

    gpus: int
    gpu_rate_per_hour: float
    window_s: float
    ckpt_interval_s: float
    ckpt_cost_s: float
    phases: tuple[RecoveryPhases, ...]
    spares: int | None = None
    repair_s: float = DAY

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"the cluster needs at least one GPU, got {self.gpus}")
        if not (self.gpu_rate_per_hour > 0 and math.isfinite(self.gpu_rate_per_hour)):
            raise ValueError(f"the per-GPU failure rate must be a positive number, got {self.gpu_rate_per_hour}")
        if not self.window_s > 0:
            raise ValueError(f"the job length must be positive, got {self.window_s}s")
        if not self.ckpt_interval_s > 0:
            raise ValueError(f"the checkpoint interval must be positive, got {self.ckpt_interval_s}s")
        if self.ckpt_cost_s < 0:
            raise ValueError(f"the checkpoint cost must not be negative, got {self.ckpt_cost_s}s")
        if not self.phases:
            raise ValueError("at least one recovery (detection, reallocation, checkpoint load) is needed")
        for p in self.phases:
            if min(p.detection_s, p.reallocation_s, p.checkpoint_load_s) < 0:
                raise ValueError(f"recovery phases must not be negative ({p.source})")
        if self.spares is not None and self.spares < 0:
            raise ValueError(f"spares must be 0 or more, got {self.spares}")
        if self.repair_s < 0:
            raise ValueError(f"the repair time must not be negative, got {self.repair_s}s")

    @property
    def cluster_rate_per_s(self) -> float:
        """Failures of the whole cluster per second (``Lambda``)."""
        return self.gpus * self.gpu_rate_per_hour / HOUR

    @property
    def cluster_mtbf_s(self) -> float:
        """Mean time between failures of the whole cluster (``M = MTBF_gpu / N``)."""
        return 1.0 / self.cluster_rate_per_s

    @property
    def gpu_mtbf_s(self) -> float:
        return HOUR / self.gpu_rate_per_hour

    @property
    def hourly_failure_probability(self) -> float:
        """``p``: the probability that one GPU fails within an hour."""
        return -math.expm1(-self.gpu_rate_per_hour)

    def with_interval(self, ckpt_interval_s: float) -> "ClusterModel":
        from dataclasses import replace

        return replace(self, ckpt_interval_s=ckpt_interval_s)


# -- the source material's formulas -------------------------------------------------


def expected_failures(gpus: int, p: float) -> float:
    """``E = N p``: expected failures per period when each GPU fails with probability ``p``."""
    return gpus * p


def prob_at_least_one(gpus: int, p: float) -> float:
    """``1 - (1 - p)^N``, computed without cancellation for tiny ``p``."""
    if p >= 1:
        return 1.0
    return -math.expm1(gpus * math.log1p(-p))


def availability(mtbf_s: float, mttr_s: float) -> float:
    """``MTBF / (MTBF + MTTR)``."""
    return mtbf_s / (mtbf_s + mttr_s)


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): ``tau = sqrt(2 C M)``, compute time between checkpoints."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006), higher-order estimate of the optimum of the exact goodput.

    ``sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` for ``C < 2M``,
    else ``M``.
    """
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def gpu_rate_from_node_days(failures_per_node_day: float, gpus_per_node: int) -> float:
    """Failures per GPU-hour from failures per node-day, as cluster studies quote them (Meta's RSC study:
    6.50 per 1,000 node-days is ``0.0065``): ``f / gpus_per_node / 24``. A node's failure stops its job whichever
    of its GPUs it came from, so the rate is spread evenly over them."""
    return failures_per_node_day / gpus_per_node / 24.0


def goodput_first_order(tau_s, cost_s: float, mtbf_s: float, mttr_s: float):
    """``1 - C / tau - (tau / 2 + MTTR) / M``: checkpoint overhead plus, per failure,
    half an interval of lost work and one recovery. Good while all three are small."""
    tau = np.asarray(tau_s, dtype=float)
    return 1.0 - cost_s / tau - (tau / 2.0 + mttr_s) / mtbf_s


# -- exact forms of the model -------------------------------------------------------


@dataclass(frozen=True)
class RecoveryStats:
    """What the goodput needs to know about recovery, spares included."""

    mean_s: float
    """MTTR: mean of detection + max(reallocation, wait for a spare) + checkpoint load."""
    survival: float
    """``E[exp(-Lambda R)]``: the chance that a recovery finishes before the next failure."""
    p_wait_for_repair: float
    """Share of failures that find no spare and wait for a node to come back from repair."""
    mean_wait_s: float
    """Mean extra time those waits add to reallocation, over all failures."""


def recovery_stats(model: ClusterModel) -> RecoveryStats:
    """Exact recovery moments under the model (equal weight on each ``phases`` entry).

    With ``s >= 1`` spares and deterministic repair ``D``, a failure finds no
    spare when ``s`` earlier failures happened within ``D``; it then waits
    ``W = (D - G)+`` with ``G ~ Gamma(s, Lambda)``, the time back to the ``s``-th
    earlier failure. The expectations below are closed forms of that.
    """
    lam = model.cluster_rate_per_s
    means, survivals, waits = [], [], []
    p_wait = 0.0
    for ph in model.phases:
        base = ph.detection_s + ph.checkpoint_load_s
        realloc = ph.reallocation_s
        if model.spares is None:
            eff_mean, eff_surv, extra = realloc, math.exp(-lam * realloc), 0.0
        elif model.spares == 0:
            eff = max(realloc, model.repair_s)
            eff_mean, eff_surv, extra = eff, math.exp(-lam * eff), eff - realloc
            p_wait = 1.0 if model.repair_s > 0 else 0.0
        else:
            s, d = model.spares, model.repair_s
            p_wait = 1.0 - _poisson_cdf(s - 1, lam * d)  # P(G < D)
            x0 = d - realloc  # waiting beats reallocation when G < x0
            if x0 <= 0:
                eff_mean, eff_surv = realloc, math.exp(-lam * realloc)
            else:
                p_long = _poisson_cdf(s - 1, lam * x0)  # P(G >= x0)
                f_s = 1.0 - p_long  # P(G < x0)
                f_s1 = 1.0 - _poisson_cdf(s, lam * x0)  # P(Gamma(s+1) < x0)
                eff_mean = realloc * p_long + d * f_s - (s / lam) * f_s1
                # E[exp(-lam (D - G)); G < x0] = exp(-lam D) (lam x0)^s / s!
                tail = math.exp(s * math.log(lam * x0) - math.lgamma(s + 1) - lam * d)
                eff_surv = p_long * math.exp(-lam * realloc) + tail
            extra = eff_mean - realloc
        means.append(base + eff_mean)
        survivals.append(math.exp(-lam * base) * eff_surv)
        waits.append(extra)
    return RecoveryStats(
        mean_s=float(np.mean(means)),
        survival=float(np.mean(survivals)),
        p_wait_for_repair=p_wait,
        mean_wait_s=float(np.mean(waits)),
    )


def goodput(model: ClusterModel, tau_s=None):
    """Exact long-run goodput of the model at checkpoint interval ``tau_s``
    (default: the model's); accepts an array of intervals."""
    lam = model.cluster_rate_per_s
    tau = np.asarray(model.ckpt_interval_s if tau_s is None else tau_s, dtype=float)
    surv = recovery_stats(model).survival
    with np.errstate(over="ignore"):  # intervals far beyond the MTBF: goodput 0
        out = lam * tau * surv / np.expm1(lam * (tau + model.ckpt_cost_s))
    return float(out) if out.ndim == 0 else out


def lost_work_per_failure(model: ClusterModel) -> float:
    """Exact mean compute thrown away per failure (zero for a failure that hits a
    recovery). The first-order answer is ``tau / 2``."""
    lam, tau = model.cluster_rate_per_s, model.ckpt_interval_s
    s = tau + model.ckpt_cost_s
    # Elapsed time in the current cycle at the failure: exponential truncated to [0, s).
    e_tau = math.exp(-lam * tau)
    within = (-math.expm1(-lam * tau) - lam * tau * e_tau) / lam  # E[y; y < tau] for y ~ Exp(lam)
    beyond = tau * (e_tau - math.exp(-lam * s))  # a failure during the checkpoint loses all of tau
    return recovery_stats(model).survival * (within + beyond) / -math.expm1(-lam * s)


def best_interval(model: ClusterModel) -> float:
    """The interval that maximises the exact goodput (golden-section search on log tau)."""
    m, c = model.cluster_mtbf_s, model.ckpt_cost_s
    if c == 0:
        return 0.0  # free checkpoints: checkpoint continuously
    lo, hi = math.log(max(c, m) * 1e-6), math.log(max(c, m) * 50.0)

    def f(x: float) -> float:
        return -goodput(model, math.exp(x))

    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    for _ in range(200):
        if b - a < 1e-10:
            break
        if f1 < f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
    return math.exp((a + b) / 2.0)


def time_budget(model: ClusterModel) -> dict[str, float]:
    """Where the elapsed time goes in the long run, as shares that sum to 1:
    useful training, checkpoint writes, recovery (spare waits included), lost work."""
    tau, c = model.ckpt_interval_s, model.ckpt_cost_s
    rec = recovery_stats(model)
    useful = goodput(model)
    checkpoint = useful * c / tau
    # Per failure, time in recovery is E[min(gap, R)] = E[1 - exp(-lam R)] / lam with
    # gap ~ Exp(lam); failures come at rate lam.
    recovery = 1.0 - rec.survival
    lost = max(0.0, 1.0 - useful - checkpoint - recovery)
    return {"useful": useful, "checkpoint": checkpoint, "recovery": recovery, "lost_work": lost}


# -- helpers ------------------------------------------------------------------------


def _poisson_cdf(k: int, mu: float) -> float:
    """P(Poisson(mu) <= k), summed in log space (k may be in the thousands)."""
    if k < 0:
        return 0.0
    if mu <= 0:
        return 1.0
    ks = np.arange(k + 1, dtype=float)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, k + 1, dtype=float)))))
    logpmf = ks * math.log(mu) - mu - log_fact
    top = logpmf.max()
    return float(min(1.0, math.exp(top) * np.exp(logpmf - top).sum()))
