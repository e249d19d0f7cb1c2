"""A run's time, spent and lost: chaoskit's own badput buckets, and the same time in Google's words.

One accounting (:func:`account`) serves a drill's ``result.json`` and a campaign's ``campaign.json``: the wall time
from the job's first worker start to its last step, the time on steps that were kept (the highest step times the
job's own step time), and what the rest went to, in chaoskit's buckets (:data:`BUCKETS`: start-up, detection,
reallocation, checkpoint load, the first step after it, recomputed steps, checkpoint saves, unexplained). They add up
to the wall time.

:func:`goodput_terms` gives the same lost time in the buckets of Google's ml-goodput-measurement (``BadputType``
of ``ml_goodput_measurement``; the names are :class:`~chaoskit.core.result.BadputSeconds`'s fields), so that a
drill can sit beside a production goodput dashboard. docs/measuring.md ("Goodput in the field's words") has the
mapping. A bucket chaoskit cannot tell, or one that needs a phase a fault left unmeasured, is ``None`` with its
reason, never zero.

Pure: events and measured phases in, seconds out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from chaoskit.core.result import BadputSeconds

__all__ = ["BUCKETS", "BADPUT_TYPES", "GOODPUT_SOURCE", "CANNOT_TELL", "JobTime", "account", "goodput_terms",
           "step_time", "save_costs"]

Event = dict[str, Any]

BUCKETS = ("startup", "detection", "reallocation", "checkpoint_load", "first_step", "recomputed", "checkpoint_saves",
           "unexplained")
"""chaoskit's badput buckets, in the order of a recovery: each is seconds of the wall time not spent on kept steps."""

BADPUT_TYPES = tuple(BadputSeconds.model_fields)
"""ml-goodput-measurement's ``BadputType`` names, in the enum's order."""

GOODPUT_SOURCE = "ml-goodput-measurement BadputType"

CANNOT_TELL = {
    "TPU_INITIALIZATION": "chaoskit sees no accelerator-initialization signal apart from the workers' start-up: it is "
                          "inside PROGRAM_STARTUP",
    "TRAINING_PREP": "chaoskit sees no signal between the workers' start-up and their first step (model and optimizer "
                     "set-up): it is inside PROGRAM_STARTUP; a restart's checkpoint load is "
                     "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "DATA_LOADING_SYNC": "chaoskit sees no data-loading signal: a blocking load is inside the step time (productive) "
                         "or OTHER",
    "DATA_LOADING_ASYNC": "overlaps training (ml-goodput-measurement does not count it as badput either); chaoskit sees "
                          "no data-loading signal",
    "CUSTOM_BADPUT_EVENTS": "the job reports no custom badput events (evaluation, SDC checks) to chaoskit",
}
"""The buckets chaoskit has no signal for: always ``None``, with these reasons."""


@dataclass(frozen=True)
class JobTime:
    """:func:`account`'s answer: where the job's wall time went."""

    t_start: float | None
    """The first worker's start (the first step when no start was seen)."""
    wall_s: float | None
    """``t_start`` to the last step."""
    kept_s: float
    """Time on steps that were kept: the highest step times :attr:`step_s`."""
    final_step: int
    step_s: float | None
    startup_s: float | None
    """``t_start`` to the first step; ``None`` when no step was seen."""
    saves: list[float]
    buckets: dict[str, float]
    """chaoskit's buckets (:data:`BUCKETS`), in seconds."""
    steps: list[Event] = field(default_factory=list)


def account(events: Iterable[Event], per_fault: Sequence[Mapping[str, Any]]) -> JobTime:
    """Where the wall time of the job in ``events`` went, with each fault's measured phases (``per_fault``:
    ``detection_s``, ``reallocation_s``, ``checkpoint_load_s``, ``recovery_s``, ``lost_steps``). A phase not
    measured counts nothing in its bucket: its time is in ``unexplained``."""
    events = list(events)
    steps = sorted((e for e in events if e.get("kind") == "step" and isinstance(e.get("step"), int)),
                   key=lambda e: e["ts"])
    starts = [e["ts"] for e in events if e.get("kind") == "worker.start"]
    saves = save_costs(events)
    step_s = step_time(steps)
    t_start = min(starts) if starts else (steps[0]["ts"] if steps else None)
    t_end = steps[-1]["ts"] if steps else None
    wall = (t_end - t_start) if t_start is not None and t_end is not None else None
    final_step = max((e["step"] for e in steps), default=0)
    kept = final_step * step_s if step_s else 0.0
    startup = steps[0]["ts"] - t_start if steps and t_start is not None else None
    buckets = dict.fromkeys(BUCKETS, 0.0)
    buckets["startup"] = startup or 0.0
    for p in per_fault:
        buckets["detection"] += p.get("detection_s") or 0.0
        buckets["reallocation"] += p.get("reallocation_s") or 0.0
        buckets["checkpoint_load"] += p.get("checkpoint_load_s") or 0.0
        if p.get("recovery_s") is not None:
            buckets["first_step"] += max(0.0, p["recovery_s"] - sum(p.get(k) or 0.0 for k in (
                "detection_s", "reallocation_s", "checkpoint_load_s")))
        buckets["recomputed"] += (p.get("lost_steps") or 0) * (step_s or 0.0)
    buckets["checkpoint_saves"] = sum(saves)
    if wall:
        buckets["unexplained"] = wall - kept - sum(v for k, v in buckets.items() if k != "unexplained")
    return JobTime(t_start=t_start, wall_s=wall, kept_s=kept, final_step=final_step, step_s=step_s, startup_s=startup,
                   saves=saves, buckets={k: round(v, 3) for k, v in buckets.items()}, steps=steps)


def goodput_terms(spent: JobTime, per_fault: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's lost time in ml-goodput-measurement's buckets: ``{source, total_elapsed_s, productive_s, goodput,
    badput_s: {<BadputType>: seconds or None}, reasons: {<BadputType>: why None}, notes}``.

    Per fault, ``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION`` (detection + reallocation),
    ``UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME`` (the checkpoint load less the workers' start-up) and the restart's part
    of ``PROGRAM_STARTUP`` (the workers' start-up and the first step after the load) add up to its recovery; with
    ``WASTED_PROGRESS_FROM_DISRUPTION`` (lost steps times the step time), ``UNPRODUCTIVE_CHECKPOINT_SAVE_TIME`` and
    ``OTHER`` (the rest), every bucket that is not ``None`` and ``productive_s`` add up to ``total_elapsed_s``. A
    bucket that needs a phase a fault left unmeasured is ``None`` with the fault's reason; its time is then in
    ``OTHER``, and ``notes`` says so."""
    badput: dict[str, float | None] = dict.fromkeys(BADPUT_TYPES)
    reasons: dict[str, str] = {}
    notes: list[str] = []

    def missing(bucket: str, keys: tuple[str, ...], resumed_only: bool = False) -> bool:
        """Whether a fault (one whose training resumed, with ``resumed_only``) left a phase of ``bucket``
        unmeasured; its reason is then ``bucket``'s."""
        for i, p in enumerate(per_fault, 1):
            if resumed_only and p.get("recovery_s") is None:
                continue
            for key in keys:
                if p.get(key) is None:
                    phase = key.removesuffix("_s")
                    why = (p.get("reasons") or {}).get(phase, "not observed")
                    reasons[bucket] = f"fault {i} ({p.get('kind') or 'fault'}): {phase} not measured: {why}"
                    return True
        return False

    if not missing("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", ("detection_s", "reallocation_s")):
        badput["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] = sum(p["detection_s"] + p["reallocation_s"] for p in per_fault)
    if not missing("UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", ("checkpoint_load_s",)):
        badput["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] = sum(p["checkpoint_load_s"] - (p.get("startup_s") or 0.0)
                                                             for p in per_fault)
    resumed = [p for p in per_fault if p.get("recovery_s") is not None]
    if spent.startup_s is None:
        reasons["PROGRAM_STARTUP"] = "no step was seen: the job never started training"
    elif not missing("PROGRAM_STARTUP", ("detection_s", "reallocation_s", "checkpoint_load_s"), resumed_only=True):
        # a fault whose training never resumed ends the wall time before its recovery: it adds nothing here
        badput["PROGRAM_STARTUP"] = spent.startup_s + sum(
            (p.get("startup_s") or 0.0) + max(0.0, p["recovery_s"] - p["detection_s"] - p["reallocation_s"]
                                              - p["checkpoint_load_s"]) for p in resumed)
    if not per_fault:
        badput["WASTED_PROGRESS_FROM_DISRUPTION"] = 0.0
    elif spent.step_s is None:
        reasons["WASTED_PROGRESS_FROM_DISRUPTION"] = "no step time: no rank logged two consecutive steps"
    elif not missing("WASTED_PROGRESS_FROM_DISRUPTION", ("lost_steps",)):
        badput["WASTED_PROGRESS_FROM_DISRUPTION"] = sum(p["lost_steps"] for p in per_fault) * spent.step_s
    if spent.saves:
        badput["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] = sum(spent.saves)
    else:
        reasons["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] = ("no checkpoint save was seen (no ckpt.save.start and .end "
                                                        "of one rank): a job without chaoskit's SDK or callbacks "
                                                        "does not report its saves")
    reasons.update(CANNOT_TELL)
    for i, p in enumerate(per_fault, 1):
        if p.get("checkpoint_load_s") is not None and p.get("startup_s") is None:
            notes.append(f"fault {i}: the new workers' start-up was not seen apart from the checkpoint load: it is "
                         "inside UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME")
        if p.get("reallocation_from") == "log line":
            notes.append(f"fault {i}: the new world's start was read from the job's log line: the workers' start-up "
                         "is inside INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION")
    if spent.wall_s is None:
        reasons["OTHER"] = "no wall time: no step was seen"
    else:
        badput["OTHER"] = spent.wall_s - spent.kept_s - sum(v for k, v in badput.items() if v is not None and k != "OTHER")
        unknown = [k for k, v in badput.items() if v is None and k not in CANNOT_TELL]
        if unknown:
            notes.append(f"OTHER also holds the time of {', '.join(unknown)}, which chaoskit could not measure")
    return {
        "source": GOODPUT_SOURCE,
        "total_elapsed_s": None if spent.wall_s is None else round(spent.wall_s, 3),
        "productive_s": round(spent.kept_s, 3),
        "goodput": round(spent.kept_s / spent.wall_s, 4) if spent.wall_s else None,
        "badput_s": {k: None if v is None else round(v, 3) for k, v in badput.items()},
        "reasons": {k: reasons[k] for k in BADPUT_TYPES if k in reasons},
        "notes": notes,
    }


def step_time(steps: list[Event]) -> float | None:
    """The job's step time when nothing is wrong: the median gap between one rank's consecutive steps."""
    last: dict[Any, tuple[int, float]] = {}
    gaps = []
    for e in steps:
        key = e.get("rank", e.get("node"))
        prev = last.get(key)
        if prev is not None and e["step"] == prev[0] + 1:
            gaps.append(e["ts"] - prev[1])
        last[key] = (e["step"], e["ts"])
    return round(statistics.median(gaps), 5) if gaps else None


def save_costs(events: Iterable[Event]) -> list[float]:
    """Seconds each checkpoint save took (its start to its end, on the rank that saved)."""
    open_: dict[Any, float] = {}
    out = []
    for e in sorted(events, key=lambda e: e["ts"]):
        key = (e.get("rank"), e.get("step"))
        if e.get("kind") == "ckpt.save.start":
            open_[key] = e["ts"]
        elif e.get("kind") == "ckpt.save.end" and key in open_:
            out.append(e["ts"] - open_.pop(key))
    return out
