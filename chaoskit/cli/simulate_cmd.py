"""``chaoskit simulate``: what measured recovery phases mean for goodput at cluster scale.

Imported when the command runs; numpy and the simulator load inside it, so that
bad flags are refused before numpy is imported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import typer

from chaoskit.cli.env import command_app, current_env
from chaoskit.core.durations import parse_duration
from chaoskit.core.errors import ScenarioError
from chaoskit.sim import require_numpy

__all__ = ["simulate_app"]

# Defaults reproduce the Llama 3 405B pre-training snapshot ("The Llama 3 Herd of
# Models", 2024, section 3.3.4): 419 unexpected interruptions over 54 days on
# 16,384 H100 GPUs, i.e. 419 / (16,384 x 54 x 24) failures per GPU-hour. The
# checkpoint and recovery figures are assumptions (the paper does not state
# them) under which the model gives its reported > 90% effective training time.
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
LLAMA3_GPU_RATE = 419 / (16_384 * 54 * 24)
DEFAULT_PHASES = {"detection": "1m", "reallocation": "4m", "checkpoint_load": "2m"}
DEFAULT_REPAIR = "24h"
SPAN_MAX_S = 100 * 365 * 86400.0
"""The simulator's spans (a GPU's MTBF is years) may be longer than a scenario's 30 days; a century bounds them."""

_EPILOG = (
    "Examples: 'chaoskit simulate' (the Llama 3 405B run: 16,384 GPUs, 54 days); "
    "'chaoskit simulate --from-run reports/<run>/result.json --gpus 4096 --days 30'; "
    "'chaoskit simulate --ckpt-interval 30m --svg goodput.svg'; 'chaoskit simulate --demo'. "
    "Exit codes: 0 done, 2 bad input."
)


def simulate(
    gpus: int = typer.Option(LLAMA3_GPUS, "--gpus", min=1, help="GPUs in the job. Any one failing stops the whole synchronous job."),
    gpu_rate: Optional[float] = typer.Option(
        None, "--gpu-rate",
        help="Failures per GPU per hour (all causes that interrupt the job). "
             f"Default {LLAMA3_GPU_RATE:.3g}: Llama 3's 419 interruptions / (16,384 GPUs x 54 days x 24 h).",
    ),
    gpu_mtbf: Optional[str] = typer.Option(
        None, "--gpu-mtbf", metavar="DURATION",
        help="Instead of --gpu-rate: mean time between failures of one GPU, e.g. 50000h. The cluster's MTBF is this / GPUs.",
    ),
    failures_per_node_day: Optional[float] = typer.Option(
        None, "--failures-per-node-day",
        help="Instead of --gpu-rate: failures per node per day, as cluster studies quote them (Meta's RSC study: 6.50 "
             "and 2.34 per 1,000 node-days, i.e. 0.0065 and 0.00234). Divided by --gpus-per-node and 24 h.",
    ),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per node, for --failures-per-node-day."),
    days: float = typer.Option(
        LLAMA3_DAYS, "--days", help="Length of the job (wall-clock days) over which failures are counted and goodput measured."),
    ckpt_interval: str = typer.Option(
        "10m", "--ckpt-interval", metavar="DURATION",
        help="Training time between checkpoints. Each failure loses about half of it; the Young and Daly rows say what is best.",
    ),
    ckpt_cost: str = typer.Option(
        "5s", "--ckpt-cost", metavar="DURATION",
        help="How long training stops to take one checkpoint (only the blocking part of an asynchronous save).",
    ),
    detection: Optional[str] = typer.Option(
        None, "--detection", metavar="DURATION",
        help=f"Recovery phase 1: fault -> the system notices (default {DEFAULT_PHASES['detection']}; with --from-run, fills it in where a drill did not observe it).",
    ),
    reallocation: Optional[str] = typer.Option(
        None, "--reallocation", metavar="DURATION",
        help=f"Recovery phase 2: noticed -> replacement world started (default {DEFAULT_PHASES['reallocation']}; with --from-run, fills it in where a drill did not observe it).",
    ),
    ckpt_load: Optional[str] = typer.Option(
        None, "--ckpt-load", metavar="DURATION",
        help=f"Recovery phase 3: started -> checkpoint loaded (default {DEFAULT_PHASES['checkpoint_load']}; with --from-run, fills it in where a drill did not observe it).",
    ),
    from_run: Optional[Path] = typer.Option(
        None, "--from-run", metavar="PATH",
        help="Take the recovery phases from a drill: a result.json (or its run directory) or a game day's gameday.json, "
             "whose recoveries are drawn one per failure. A phase a drill did not observe must be given by hand.",
    ),
    spares: Optional[int] = typer.Option(
        None, "--spares", min=0,
        help="Spare nodes. Each failure takes a node out for --repair; with none free, reallocation waits for a repair. "
             "Default: a healthy node is always ready.",
    ),
    repair: Optional[str] = typer.Option(
        None, "--repair", metavar="DURATION",
        help=f"Time to bring a failed node back into the spare pool (default {DEFAULT_REPAIR}; only with --spares).",
    ),
    replicas: int = typer.Option(2, "--replicas", min=1, help="Checkpoint storage: full copies kept, for the loss-probability table."),
    erasure: str = typer.Option(
        "4+2", "--erasure", metavar="K+M",
        help="Checkpoint storage: erasure code k+m (k data blocks, survives any m lost), compared with --replicas.",
    ),
    storage_mtbf: Optional[str] = typer.Option(
        None, "--storage-mtbf", metavar="DURATION",
        help="MTBF of a node that holds checkpoint copies. "
             "Default: an 8-GPU training node (checkpoints kept in the nodes' memory or local disks).",
    ),
    trials: Optional[int] = typer.Option(
        None, "--trials", min=1, max=1_000_000,
        help="Monte Carlo trials: whole jobs (default 1,000), or with --demo short runs (default 100,000).",
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives the same numbers."),
    svg: Optional[Path] = typer.Option(
        None, "--svg", metavar="FILE", help="Also write a plot of goodput against checkpoint interval, Young's and Daly's optima marked."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON instead of tables."),
    demo: bool = typer.Option(
        False, "--demo",
        help="Run the source material's example instead: 100 steps of work, checkpoint every 10, "
             "fault rate 0.03 per step, with and without checkpoints.",
    ),
) -> int:
    """Plan at scale: turn recovery phases into failures, availability and goodput for a whole cluster.

    Closed forms (E = N p, cluster MTBF, availability, lost work ~ tau/2, goodput,
    Young's and Daly's checkpoint intervals) next to a vectorised Monte Carlo.
    """

    env = current_env()
    console = env.console()
    require_numpy("chaoskit simulate")
    if demo:
        from chaoskit.sim.summary import render_demo, summarise_demo

        result = summarise_demo(trials=trials or 100_000, seed=seed)
        if as_json:
            env.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            render_demo(console, result)
        return 0

    from chaoskit.sim import model as m

    notes: list[str] = []
    rates = [flag for flag, v in (("--gpu-rate", gpu_rate), ("--gpu-mtbf", gpu_mtbf),
                                  ("--failures-per-node-day", failures_per_node_day)) if v is not None]
    if len(rates) > 1:
        raise ScenarioError(f"{' and '.join(rates)} say the same thing; give one",
                            hint="--gpu-rate 2e-5 is --gpu-mtbf 50000h; --failures-per-node-day 0.0065 with 8 GPUs a "
                                 "node is --gpu-rate 3.39e-5")
    if failures_per_node_day is not None and not failures_per_node_day > 0:
        raise ScenarioError(f"--failures-per-node-day must be above zero, got {failures_per_node_day:g}",
                            hint="with no failures there is nothing to simulate")
    if failures_per_node_day is not None:
        rate = m.gpu_rate_from_node_days(failures_per_node_day, gpus_per_node)
        notes.append(f"{failures_per_node_day:g} failures per node-day ({failures_per_node_day * 1000:g} per 1,000 "
                     f"node-days) on {gpus_per_node} GPUs a node: {rate:.3g} per GPU-hour")
    elif gpu_mtbf is not None:
        mtbf_s = _duration("--gpu-mtbf", gpu_mtbf)
        if mtbf_s <= 0:
            raise ScenarioError("--gpu-mtbf must be longer than zero")
        rate = m.HOUR / mtbf_s
    else:
        rate = LLAMA3_GPU_RATE if gpu_rate is None else gpu_rate
    if not rate > 0:
        raise ScenarioError(f"--gpu-rate must be above zero, got {rate:g}", hint="with no failures there is nothing to simulate")
    if not days > 0:
        raise ScenarioError(f"--days must be above zero, got {days:g}")

    given = {"detection": detection, "reallocation": reallocation, "checkpoint_load": ckpt_load}
    flags = {"detection": "--detection", "reallocation": "--reallocation", "checkpoint_load": "--ckpt-load"}
    by_hand = {k: (_duration(flags[k], v) if v is not None else None) for k, v in given.items()}
    if from_run is not None:
        from chaoskit.sim.measured import load_phases

        phases, more = load_phases(from_run, fallbacks=by_hand)
        notes.extend(more)
    else:
        values = {k: v if v is not None else _duration(flags[k], DEFAULT_PHASES[k]) for k, v in by_hand.items()}
        phases = [m.RecoveryPhases(values["detection"], values["reallocation"], values["checkpoint_load"])]
    if spares is None and repair is not None:
        notes.append("--repair has no effect without --spares (a healthy node is assumed always ready)")

    k_data, m_parity = _erasure(erasure)
    interval_s = _duration("--ckpt-interval", ckpt_interval)
    try:
        model = m.ClusterModel(
            gpus=gpus,
            gpu_rate_per_hour=rate,
            window_s=days * m.DAY,
            ckpt_interval_s=interval_s,
            ckpt_cost_s=_duration("--ckpt-cost", ckpt_cost),
            phases=tuple(phases),
            spares=spares,
            repair_s=_duration("--repair", repair or DEFAULT_REPAIR),
        )
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None

    from chaoskit.sim.summary import StorageSpec, render, summarise

    storage = StorageSpec(replicas, k_data, m_parity, _duration("--storage-mtbf", storage_mtbf) if storage_mtbf else None)
    trials = trials or 1000
    result = summarise(model, trials=trials, seed=seed, storage=storage, notes=notes)
    if svg is not None:
        _write_svg(svg, model, result, trials, seed)
        result["svg"] = str(svg)
    if as_json:
        env.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render(console, result)
        if svg is not None:
            console.print(f"plot: {svg}", markup=False, highlight=False)
    return 0


def _duration(flag: str, text: str) -> float:
    """Seconds from ``30s``/``10m``/``1h30m`` (chaoskit's durations), a bare number of
    seconds, or with a leading number of days (``2d``, ``1d12h``) for long spans."""
    value = text.strip()
    days = 0.0
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)d(.*)", value)
    if match:
        days, value = float(match.group(1)), match.group(2)
    try:
        if not value:
            seconds = days * 86400.0
        elif re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", value):
            seconds = days * 86400.0 + float(value)
        else:
            seconds = days * 86400.0 + parse_duration(value, maximum=SPAN_MAX_S)
        if not seconds <= SPAN_MAX_S:  # also refuses inf and nan
            raise ValueError(f"longer than a century ({SPAN_MAX_S / 86400 / 365:g} years)")
        return seconds
    except ValueError:
        raise ScenarioError(
            f"{flag}: invalid duration {text!r}", hint="durations read like 250ms, 30s, 10m, 1h, 1h30m, 2d, or a number of seconds"
        ) from None


def _erasure(text: str) -> tuple[int, int]:
    parts = text.replace(" ", "").split("+")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 1:
        raise ScenarioError(f"--erasure: expected k+m such as 4+2, got {text!r}", hint="k data blocks (at least 1) plus m parity blocks")
    return int(parts[0]), int(parts[1])


def _write_svg(path: Path, model, result: dict, trials: int, seed: int) -> None:
    import numpy as np

    from chaoskit.sim import montecarlo as mc
    from chaoskit.sim.plot import goodput_svg, interval_range

    ci = result["checkpoint_interval"]
    markers = {"young": ci["young_s"], "daly": ci["daly_s"], "yours": ci["yours_s"]}
    lo, hi = interval_range(markers.values())
    points = []
    for tau in np.exp(np.linspace(np.log(lo * 1.5), np.log(hi / 1.5), 9)):
        runs = mc.run(model.with_interval(float(tau)), trials=min(trials, 300), seed=seed)
        points.append((float(tau), *mc.mean_ci(runs.goodput)))
    text = goodput_svg(model, markers, points)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"--svg: cannot write {path} ({exc.strerror})") from None


simulate_app = command_app()
simulate_app.command("simulate", epilog=_EPILOG)(simulate)
