"""What ``chaoskit simulate`` reports: one plain dict (the ``--json`` output) and its Rich rendering."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaoskit.sim import model as m
from chaoskit.sim import montecarlo as mc
from chaoskit.sim import redundancy
from chaoskit.sim.plot import format_span

__all__ = ["StorageSpec", "summarise", "render", "summarise_demo", "render_demo"]

GPUS_PER_NODE = 8  # a DGX/HGX-class node; a failed GPU takes its node out of the job


@dataclass(frozen=True)
class StorageSpec:
    """How checkpoints are kept: ``replicas`` copies, or a ``k + m`` erasure code, on
    nodes with MTBF ``node_mtbf_s`` (``None``: a training node of ``GPUS_PER_NODE`` GPUs)."""

    replicas: int
    k: int
    m: int
    node_mtbf_s: float | None = None


def summarise(model: m.ClusterModel, trials: int, seed: int, storage: StorageSpec, notes: list[str]) -> dict[str, Any]:
    """Run the closed forms and the Monte Carlo; return everything as plain data."""
    p = model.hourly_failure_probability
    lam, window, tau = model.cluster_rate_per_s, model.window_s, model.ckpt_interval_s
    rec = m.recovery_stats(model)
    mtbf = model.cluster_mtbf_s
    young = m.young_interval(model.ckpt_cost_s, mtbf)
    daly = m.daly_interval(model.ckpt_cost_s, mtbf)
    best = m.best_interval(model)

    started = time.perf_counter()
    runs = mc.run(model, trials=trials, seed=seed)
    elapsed = time.perf_counter() - started
    good = runs.goodput
    fails = runs.failures
    total_failures = int(fails.sum())

    def summary(values: np.ndarray) -> dict[str, Any]:
        mean, lo, hi = mc.mean_ci(values)
        return {"mean": mean, "ci95": [lo, hi], "interval95": [float(v) for v in np.percentile(values, [2.5, 97.5])]}

    hit, hit_lo, hit_hi = mc.proportion_ci(int((fails > 0).sum()), runs.trials)
    lost_mean, lost_lo, lost_hi = mc.ratio_ci(runs.lost_work_s, fails)
    mc_out: dict[str, Any] = {
        "trials": runs.trials,
        "seed": seed,
        "seconds": elapsed,
        "failures": summary(fails.astype(float)),
        "prob_failure_within_window": {"value": hit, "ci95": [hit_lo, hit_hi]},
        "goodput": summary(good),
        "recovery_share": summary(runs.recovery_s / window),
        "lost_work_per_failure_s": {"mean": lost_mean, "ci95": [lost_lo, lost_hi]} if total_failures else None,
    }
    if model.spares is not None:
        share, lo, hi = mc.ratio_ci(runs.waited, fails)
        mc_out["waited_for_repair_share"] = {"mean": share, "ci95": [lo, hi]} if total_failures else None

    node_mtbf = storage.node_mtbf_s or model.gpu_mtbf_s / GPUS_PER_NODE
    lifetime = tau + model.ckpt_cost_s + rec.mean_s  # until the next checkpoint is written, or it has been read back
    checkpoints = m.goodput(model) * window / tau
    store = redundancy.compare(1.0 / node_mtbf, lifetime, checkpoints, storage.replicas, storage.k, storage.m)

    return {
        "inputs": {
            "gpus": model.gpus,
            "gpu_rate_per_hour": model.gpu_rate_per_hour,
            "gpu_mtbf_h": model.gpu_mtbf_s / m.HOUR,
            "window_days": window / m.DAY,
            "ckpt_interval_s": tau,
            "ckpt_cost_s": model.ckpt_cost_s,
            "recoveries": [
                {"detection_s": r.detection_s, "reallocation_s": r.reallocation_s, "checkpoint_load_s": r.checkpoint_load_s, "source": r.source}
                for r in model.phases
            ],
            "spares": model.spares,
            "repair_s": model.repair_s if model.spares is not None else None,
        },
        "closed_form": {
            "gpu_failure_probability_per_hour": p,
            "expected_failures_per_hour": m.expected_failures(model.gpus, p),
            "prob_failure_within_hour": m.prob_at_least_one(model.gpus, p),
            "expected_failures": lam * window,
            "prob_failure_within_window": -math.expm1(-lam * window),
            "cluster_mtbf_s": mtbf,
            "mttr_s": rec.mean_s,
            "spare_wait_share": rec.p_wait_for_repair if model.spares is not None else None,
            "availability": m.availability(mtbf, rec.mean_s),
            # With failures during recovery restarting it, the time lost per failure is
            # (exp(Lambda R) - 1) / Lambda, and availability becomes E[exp(-Lambda R)].
            "availability_exact": rec.survival,
            "lost_work_per_failure_s": {"first_order": tau / 2.0, "exact": m.lost_work_per_failure(model)},
            # the headline is "exact"; "first_order" is the form papers quote as ETTR (Meta's RSC study, Llama 3)
            "goodput": {"first_order": float(m.goodput_first_order(tau, model.ckpt_cost_s, mtbf, rec.mean_s)), "exact": m.goodput(model),
                        "headline": GOODPUT_HEADLINE},
            "time_budget": m.time_budget(model),
        },
        "monte_carlo": mc_out,
        "checkpoint_interval": {
            "yours_s": tau,
            "young_s": young,
            "daly_s": daly,
            "best_s": best,
            "goodput": {
                "yours": m.goodput(model),
                "young": m.goodput(model, young) if young > 0 else None,
                "daly": m.goodput(model, daly) if daly > 0 else None,
                "best": m.goodput(model, best) if best > 0 else m.goodput(model, 1e-9),
            },
        },
        "storage": {
            "node_mtbf_s": node_mtbf,
            "node_loss_probability": store["node_loss_probability"],
            "checkpoint_lifetime_s": lifetime,
            "checkpoints": checkpoints,
            "options": [
                {"scheme": o.name, "loss_probability": o.loss_probability, "overhead": o.overhead, "expected_lost": o.expected_lost}
                for o in store["options"]
            ],
        },
        "notes": notes,
    }


GOODPUT_HEADLINE = "exact (renewal form, Daly 2006)"
"""Which form of goodput (ETTR) the headline is: the exact renewal form, not the first-order one papers quote
(``1 - C/tau - (tau/2 + MTTR)/M``), which it exceeds by a few points at long intervals; both are in the output."""


def render(console, s: dict[str, Any]) -> None:
    """The terminal view of :func:`summarise`'s dict."""
    from rich import box
    from rich.table import Table

    inp, cf, mcs, ci = s["inputs"], s["closed_form"], s["monte_carlo"], s["checkpoint_interval"]
    rec = inp["recoveries"]
    recovery = (
        f"detection {format_span(rec[0]['detection_s'])} + reallocation {format_span(rec[0]['reallocation_s'])} "
        f"+ checkpoint load {format_span(rec[0]['checkpoint_load_s'])}" if len(rec) == 1
        else f"{len(rec)} measured recoveries, one drawn per failure"
    )
    spares = "a healthy node always ready" if inp["spares"] is None else f"{inp['spares']} spare node(s), repair {format_span(inp['repair_s'])}"
    console.print(
        f"[bold]{inp['gpus']:,} GPUs[/bold] for [bold]{inp['window_days']:g} days[/bold], "
        f"{inp['gpu_rate_per_hour']:.3g} failures per GPU-hour (GPU MTBF {inp['gpu_mtbf_h']:,.0f} h); "
        f"checkpoint every {format_span(inp['ckpt_interval_s'])} costing {_span0(inp['ckpt_cost_s'])}; "
        f"recovery = {recovery}; {spares}."
    )

    t = Table(title="at scale: closed forms and Monte Carlo", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("quantity")
    t.add_column("closed form", justify="right")
    t.add_column("Monte Carlo", justify="right")
    t.add_column("formula", style="dim")
    t.add_row("failures per hour", f"{cf['expected_failures_per_hour']:.3g}", "", "E = N p")
    t.add_row("P(failure within an hour)", _pct(cf["prob_failure_within_hour"]), "", "1 - (1 - p)^N")
    fm = mcs["failures"]
    t.add_row(f"failures in {inp['window_days']:g} days", f"{cf['expected_failures']:,.1f}",
              f"{fm['mean']:,.1f} ({fm['interval95'][0]:,.0f}-{fm['interval95'][1]:,.0f})", "N x rate x time")
    pw = mcs["prob_failure_within_window"]
    t.add_row("P(failure within the job)", _pct(cf["prob_failure_within_window"]), _pct(pw["value"]), "1 - (1 - p_job)^N")
    t.add_row("cluster MTBF (M)", format_span(cf["cluster_mtbf_s"]), "", "GPU MTBF / N")
    t.add_row("MTTR", format_span(cf["mttr_s"]), "", "detect + realloc + load" + (" + spare wait" if cf["spare_wait_share"] else ""))
    rs = mcs["recovery_share"]
    t.add_row("availability", _pct(cf["availability_exact"]), _pct(1 - rs["mean"]),
              f"MTBF/(MTBF+MTTR): {_pct(cf['availability'])}")
    lw = cf["lost_work_per_failure_s"]
    lw_mc = mcs["lost_work_per_failure_s"]
    t.add_row("work lost per failure", format_span(lw["exact"]), _ci_seconds(lw_mc) if lw_mc else "no failures",
              f"about tau / 2 = {format_span(lw['first_order'])}")
    gp = cf["goodput"]
    gm = mcs["goodput"]
    t.add_row("[bold]goodput (ETTR), exact renewal form[/bold]", f"[bold]{_pct(gp['exact'])}[/bold]",
              f"[bold]{_pct(gm['mean'])}[/bold] ±{(gm['ci95'][1] - gm['mean']) * 100:.2f} ({_pct(gm['interval95'][0])}-{_pct(gm['interval95'][1])})",
              "the renewal form (Daly 2006): restarts and failures during them counted exactly")
    t.add_row("goodput (ETTR), first order", _pct(gp["first_order"]), "",
              f"1 - C/tau - (tau/2 + MTTR)/M, as papers quote it; the exact form: {(gp['exact'] - gp['first_order']) * 100:+.1f} points")
    if mcs.get("waited_for_repair_share"):
        t.add_row("failures with no spare free", _pct(cf["spare_wait_share"]), _pct(mcs["waited_for_repair_share"]["mean"]),
                  "s earlier failures still in repair")
    console.print(t)
    console.print(
        "[dim]goodput = effective training time (ETTR): useful training / elapsed; the headline is the exact renewal "
        "form, the first-order row the one papers quote. "
        "Exact forms count a failure during recovery as restarting it (availability exp(-R/M)). "
        "Monte Carlo: mean ± 95% confidence; (a-b): the middle 95% of trials.[/dim]"
    )

    tb = cf["time_budget"]
    console.print(
        "where the time goes: "
        + ", ".join(f"{label} {_pct(tb[key])}" for key, label in
                    (("useful", "useful training"), ("checkpoint", "checkpoint writes"), ("recovery", "recovery"), ("lost_work", "lost work")))
    )

    t = Table(title="checkpoint interval", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("interval")
    t.add_column("every", justify="right")
    t.add_column("goodput (exact)", justify="right")
    t.add_column("", style="dim")
    rows = (
        ("yours", "yours_s", "the interval you gave"),
        ("Young", "young_s", "sqrt(2 C M): first-order optimum"),
        ("Daly", "daly_s", "higher-order optimum"),
        ("best", "best_s", "numerical optimum of the exact goodput"),
    )
    for label, key, how in rows:
        value = ci[key]
        g = ci["goodput"][label.lower()]
        t.add_row(label, format_span(value) if value > 0 else "0 (free checkpoints)", _pct(g) if g is not None else "-", how)
    console.print(t)

    st = s["storage"]
    title = (f"checkpoint storage: nodes with MTBF {format_span(st['node_mtbf_s'])}, "
             f"each checkpoint kept {format_span(st['checkpoint_lifetime_s'])}")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("scheme")
    t.add_column("P(checkpoint lost)", justify="right")
    t.add_column("storage", justify="right")
    t.add_column(f"lost of {st['checkpoints']:,.0f} checkpoints", justify="right")
    for o in st["options"]:
        t.add_row(o["scheme"], f"{o['loss_probability']:.3g}", f"{o['overhead']:g}x", f"{o['expected_lost']:.3g}")
    console.print(t)
    for note in s["notes"]:
        console.print(f"note: {note}")
    console.print(f"[dim]Monte Carlo: {mcs['trials']:,} trials in {mcs['seconds']:.2f}s, seed {mcs['seed']}[/dim]")


def summarise_demo(trials: int, seed: int) -> dict[str, Any]:
    """The source material's example: one replayed run each way, many runs, and the closed forms."""
    import random

    from chaoskit.sim import demo

    ex = demo.SEED_EXAMPLE
    rng = random.Random(42)  # the source seeds its global random with 42, then runs without, then with checkpoints
    out: dict[str, Any] = {"parameters": dict(ex), "trials": trials, "seed": seed, "cases": []}
    for has_ckpt in (False, True):
        loop = demo.SeedLoop(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt, rng)
        loop.train()
        runs = demo.simulate(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt, trials=trials, seed=seed)
        mean, lo, hi = mc.mean_ci(runs.time)
        out["cases"].append({
            "checkpoints": has_ckpt,
            "replay_seed_42": {"faults": loop.faults, "checkpoints_saved": loop.checkpoints, "time": loop.time},
            "monte_carlo": {"time": {"mean": mean, "ci95": [lo, hi], "interval95": [float(v) for v in np.percentile(runs.time, [2.5, 97.5])]},
                            "faults": float(runs.faults.mean()), "checkpoints_saved": float(runs.checkpoints.mean())},
            "closed_form": demo.expected(ex["total_work"], ex["ckpt_interval"], ex["fault_rate"], has_ckpt),
        })
    return out


def render_demo(console, s: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    ex = s["parameters"]
    console.print(
        f"The source material's example: {ex['total_work']} steps of work, a checkpoint every {ex['ckpt_interval']} steps, "
        f"a fault with probability {ex['fault_rate']} at every step. A fault spends its step and sends progress back "
        "to the last checkpoint, or to 0 without one (a fault before the first checkpoint loses everything)."
    )
    t = Table(title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("")
    t.add_column("run with random.seed(42)", justify="right")
    t.add_column(f"mean of {s['trials']:,} runs", justify="right")
    t.add_column("closed form", justify="right")
    for case in s["cases"]:
        label = "with checkpoints" if case["checkpoints"] else "without checkpoints"
        r, mcr, cf = case["replay_seed_42"], case["monte_carlo"], case["closed_form"]
        t.add_section()
        t.add_row(f"[bold]{label}[/bold]: time steps", str(r["time"]),
                  f"{mcr['time']['mean']:.1f} ±{mcr['time']['ci95'][1] - mcr['time']['mean']:.1f}", f"{cf['time']:.1f}")
        t.add_row("  faults", str(r["faults"]), f"{mcr['faults']:.2f}", f"{cf['faults']:.2f}")
        t.add_row("  checkpoints saved", str(r["checkpoints_saved"]), f"{mcr['checkpoints_saved']:.0f}", str(cf["checkpoints"]))
    console.print(t)
    no, yes = s["cases"][0]["closed_form"]["time"], s["cases"][1]["closed_form"]["time"]
    console.print(
        f"Checkpoints cut the expected time from {no:.0f} to {yes:.0f} steps ({no / yes:.1f}x): k fault-free steps in a row "
        "take (q^-k - 1) / p steps on average, which grows exponentially in k, so short stretches between checkpoints win."
    )


def _pct(v: float) -> str:
    return f"{v * 100:.2f}%"


def _span0(v: float) -> str:
    return format_span(v) if v > 0 else "nothing"


def _ci_seconds(d: dict[str, Any]) -> str:
    mean, half = d["mean"], d["ci95"][1] - d["mean"]
    if mean < 600:
        return f"{mean:.1f}s ±{half:.1f}s"
    return f"{format_span(mean)} ±{format_span(half)}"
