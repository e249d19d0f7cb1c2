"""One drill is one sample: the distribution of each recovery phase over repeated drills.

Pure functions, standard library only (no numpy at the CLI's start-up): percentiles with
linear interpolation between the closest ranks (numpy's default, so a reader can check a
figure with ``numpy.percentile``), a bootstrap 95% interval of the median with a fixed
seed (the same samples always give the same interval), and SLOs judged on the
distribution.

A phase that a sample did not observe (``None``: its signal never came) counts as
worse than any measured value: it is kept out of the figures, counted in ``missing``,
and fails every SLO on that phase, as it fails a single drill's.
"""

from __future__ import annotations

import math
import random
from typing import Any, Iterable, Mapping, Sequence

from chaoskit.core.phases import PHASE_TABLE, phase

__all__ = ["PHASE_KEYS", "PERCENTILES", "percentile", "bootstrap_median_ci", "summarize", "distribution",
           "slo_on_distribution"]

PHASE_KEYS = tuple(p.key for p in PHASE_TABLE)
"""The figures of ``result.json``'s ``phases`` that get a distribution, named as there: every phase of
``core/phases.PHASE_TABLE``."""
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
"""The names an SLO may give a percentile by (``slo: {recovery: {p95: 60s}}``)."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated between closest ranks.

    Raises ``ValueError`` on no values."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bootstrap_median_ci(values: Sequence[float], level: float = 0.95,
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """A percentile-bootstrap interval of the median at ``level``; ``None`` under two values (nothing to resample)."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    medians = [percentile([values[rng.randrange(n)] for _ in range(n)], 50.0) for _ in range(resamples)]
    tail = (1.0 - level) / 2 * 100.0
    return percentile(medians, tail), percentile(medians, 100.0 - tail)


def summarize(samples: Sequence[float | None]) -> dict[str, Any]:
    """``{n, missing, p50, p95, max, ci95, samples}`` of one phase; figures are ``None`` when no sample measured it."""
    measured = [float(s) for s in samples if s is not None]
    out: dict[str, Any] = {"n": len(samples), "missing": len(samples) - len(measured)}
    if measured:
        ci = bootstrap_median_ci(measured)
        out.update(p50=_r(percentile(measured, 50)), p95=_r(percentile(measured, 95)), max=_r(max(measured)),
                   ci95=None if ci is None else [_r(ci[0]), _r(ci[1])])
    else:
        out.update(p50=None, p95=None, max=None, ci95=None)
    out["samples"] = list(samples)
    return out


def distribution(phases: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase key (:data:`PHASE_KEYS`), the summary over every sample's ``phases``."""
    rows = list(phases)
    return {key: summarize([row.get(key) for row in rows]) for key in PHASE_KEYS}


def slo_on_distribution(dist: Mapping[str, Mapping[str, Any]], slo: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One entry per SLO the scenario sets, judged on the samples.

    A plain limit holds for every sample (the worst one is what is compared); a mapping
    (``{p95: 60}``) holds for each named percentile. A sample that did not observe the
    phase fails the SLO whatever the others measured."""
    out: dict[str, dict[str, Any]] = {}
    for name, limit in slo.items():
        if limit is None:
            continue
        try:
            row = dist.get(phase(name).key)
        except KeyError:  # an SLO on no phase (returns)
            continue
        if row is None:
            continue
        measured = [float(s) for s in row["samples"] if s is not None]
        limits = {"max": float(limit)} if not isinstance(limit, Mapping) else {
            p: float(v) for p, v in limit.items() if v is not None}
        checks = {}
        for pname, lim in limits.items():
            value = _r(percentile(measured, PERCENTILES[pname])) if measured else None
            checks[pname] = {"limit": lim, "measured": value,
                             "pass": row["missing"] == 0 and value is not None and value <= lim}
        entry: dict[str, Any] = {"pass": all(c["pass"] for c in checks.values()), "every_sample": not isinstance(limit, Mapping),
                                 "percentiles": checks, "n": row["n"]}
        if row["missing"]:
            entry["reason"] = f"{row['missing']} of {row['n']} samples did not observe it"
        out[name] = entry
    return out


def _r(x: float) -> float:
    return round(x, 4)
