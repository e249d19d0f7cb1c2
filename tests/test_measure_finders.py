"""``measure_fault`` split into one finder per phase measures what it measured before, under every recovery model.

The reference is the function as it stood before the split (commit 2789637), copied here and nowhere else, with
``measure_torchft`` as it was (the split moved the helpers it shared with it to the module). A few thousand seeded
random timelines, under each recovery stack's model (:meth:`chaoskit.stacks.api.Stack.measure`), give the same dict, key order
included (result.json is written in that order). The ``nvrx`` models call ``measure_fault``: their reference is the
same function with the old ``measure_fault`` in its place. Pure: events in, numbers out; nothing is started.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any, Iterable

import pytest

from chaoskit.measure import (
    DETECT_KINDS,
    INJECTED_LINE_SLACK_S,
    _rank_key,
    detection_sources,
    find_checkpoint_load,
    find_detection,
    find_lost_work,
    find_reallocation,
    find_resume,
)
from chaoskit.measure import who_noticed as _who
from chaoskit.stacks.registry import STACKS, stack
from chaoskit.stacks.torchft import TORCHFT_DETECT_SOURCES

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

Event = dict[str, Any]

TIMELINES = 3000
"""Random timelines per recovery model."""


def old_measure_fault(events: Iterable[Event], t_fault: float, t_fault_uncertainty: float = 0.0,
                  node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """The function as it was before the finder split (reference only)."""
    timeline = sorted(events, key=lambda e: e["ts"])
    before = [e for e in timeline if e["ts"] <= t_fault]
    after = [e for e in timeline if e["ts"] > t_fault]
    reasons: dict[str, str] = {}

    steps_before = [e["step"] for e in before if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    last_step_before = max(steps_before) if steps_before else None

    detect = next((e for e in after if e.get("kind") in DETECT_KINDS and not e.get("injected")), None)
    t_detect = detect["ts"] if detect else None
    if detect is None:
        # the kernel stamps chaoskit's own line while its write is in flight, before the fault is stamped injected
        since = t_fault - INJECTED_LINE_SLACK_S - t_fault_uncertainty
        injected = next((e for e in timeline if e.get("kind") == "gpu.xid" and e.get("injected") and e["ts"] > since),
                        None)
        if injected is not None:
            reasons["detection"] = (f"not observed: the injected Xid {injected.get('code')} line was seen in the kernel "
                                    f"log of {injected.get('node')}, but nothing drained the node (no node.drain) and "
                                    "the job did not fail")
        else:
            reasons["detection"] = "not observed: no worker.exit, detect, oom.kill or gpu event after the fault"

    loads = [e for e in after if e.get("kind") == "ckpt.load.end"]
    starts = [e for e in after if e.get("kind") == "worker.start"]
    if not starts:  # a job seen only through its scheduler and its log: the scheduler's restart starts the new world
        starts = [e for e in after if e.get("kind") == "job.running" and (e.get("restart_count") or 0) >= 1]
    resumed = None
    for e in after:
        if e.get("kind") != "step":
            continue
        if any(load["ts"] <= e["ts"] for load in loads) or (not loads and any(s["ts"] <= e["ts"] for s in starts)):
            resumed = e
            break

    t_loaded = t_realloc = t_ready = None
    at: dict[str, Event | None] = {"detect": detect, "realloc": None, "loaded": None, "resumed": resumed}
    restored_step = None
    if resumed is not None and loads:
        latest_load: dict[Any, Event] = {}
        for load in loads:
            if load["ts"] <= resumed["ts"]:
                latest_load[_rank_key(load)] = load
        at["loaded"] = max(latest_load.values(), key=lambda e: e["ts"])
        t_loaded = at["loaded"]["ts"]
        restored = [load.get("step") for load in latest_load.values() if isinstance(load.get("step"), int)]
        restored_step = min(restored) if restored else None
        starts_by_rank: dict[Any, Event] = {}
        for s in starts:
            key = _rank_key(s)
            if s["ts"] <= latest_load.get(key, {"ts": t_loaded})["ts"]:
                starts_by_rank[key] = s
        if starts_by_rank:
            at["realloc"] = max(starts_by_rank.values(), key=lambda e: e["ts"])
            t_realloc = at["realloc"]["ts"]
        ready = [e["ts"] for e in after if e.get("kind") == "rendezvous.done" and t_realloc is not None and t_realloc <= e["ts"] <= t_loaded]
        t_ready = max(ready) if ready else None
    elif resumed is not None:
        reasons["checkpoint_load"] = "not observed: the job restarted without loading a checkpoint"
        restored_step = 0
        pre = [s for s in starts if s["ts"] <= resumed["ts"]]
        at["realloc"] = max(pre, key=lambda e: e["ts"]) if pre else None
        t_realloc = at["realloc"]["ts"] if pre else None

    if t_realloc is None:
        reasons.setdefault("reallocation", "not observed: no new workers started after the fault")
    if t_loaded is None:
        reasons.setdefault("checkpoint_load", "not observed: no ckpt.load.end before a resumed step")
    if resumed is None:
        reasons["recovery"] = "not observed: training did not resume after the fault"
        reasons.setdefault("reallocation", "not observed: training did not resume after the fault")
        t_realloc = t_loaded = None

    def span(a: float | None, b: float | None) -> float | None:
        return round(b - a, 4) if a is not None and b is not None else None

    detection = span(t_fault, t_detect)
    reallocation = span(t_detect, t_realloc)
    if detection is not None and t_realloc is not None and reallocation is None:
        reasons.setdefault("reallocation", "not observed")
    if t_detect is None and t_realloc is not None:
        reasons["reallocation"] = "not measurable: detection was not observed"
    def error(e: Event | None) -> float:
        return float(e.get("ts_uncertainty") or 0.0) if e is not None else 0.0

    def uncertainty(value: float | None, a: float, b: float) -> float | None:
        return None if value is None else round(a + b, 6)

    uncertainties = {
        "detection": uncertainty(detection, t_fault_uncertainty, error(at["detect"])),
        "reallocation": uncertainty(reallocation, error(at["detect"]), error(at["realloc"])),
        "checkpoint_load": uncertainty(span(t_realloc, t_loaded), error(at["realloc"]), error(at["loaded"])),
        "recovery": uncertainty(span(t_fault, resumed["ts"] if resumed else None), t_fault_uncertainty, error(resumed)),
    }
    lost = None
    if last_step_before is not None and restored_step is not None and resumed is not None:
        lost = max(0, last_step_before - restored_step)
    return {
        "model": "restart",
        "detection_s": detection,
        "reallocation_s": reallocation,
        "checkpoint_load_s": span(t_realloc, t_loaded),
        "startup_s": span(t_realloc, t_ready),
        "recovery_s": span(t_fault, resumed["ts"] if resumed else None),
        "lost_steps": lost,
        "last_step_before": last_step_before,
        "restored_step": restored_step,
        "detected_by": _who(detect),
        "detections": detection_sources(timeline, t_fault),
        "t_fault": t_fault,
        "t_detect": t_detect,
        "t_realloc": t_realloc,
        "t_loaded": t_loaded,
        "t_resumed": resumed["ts"] if resumed else None,
        "reasons": reasons,
        "uncertainty_s": uncertainties,
    }


def old_measure_torchft(events: Iterable[Event], t_fault: float, t_fault_uncertainty: float = 0.0,
                    node: str | None = None) -> dict[str, Any]:
    """The function as it was before the finder split (reference only)."""
    timeline = sorted(events, key=lambda e: e["ts"])
    after = [e for e in timeline if e["ts"] > t_fault]
    reasons: dict[str, str] = {}

    def survivor(e: Event) -> bool:
        return node is None or e.get("node") != node or e.get("source") == "torchft lighthouse"

    steps_before = [e for e in timeline if e["ts"] <= t_fault and e.get("kind") == "step" and isinstance(e.get("step"), int)]
    last_step_before = max((e["step"] for e in steps_before), default=None)
    group_before = max((e["step"] for e in steps_before if node is None or e.get("node") == node), default=None)

    detect = next((e for e in after if e.get("kind") in DETECT_KINDS and e.get("source") in TORCHFT_DETECT_SOURCES
                   and survivor(e)), None)
    if detect is None:
        reasons["detection"] = ("not observed: no survivor's collective error and no quorum change after the fault "
                                "(the torchft preset and the torchft.manager logger at INFO are needed)")
    t_detect = detect["ts"] if detect else None
    realloc = None
    if t_detect is not None:
        # the first survivor reconfigured after the fault; it may be read a moment before the lighthouse's line that
        # caused it (two pipes, two readers): then the two are one instant, and reallocation is 0
        realloc = next((e for e in after if e.get("kind") == "rendezvous.done" and e.get("source") == "torchft"
                        and survivor(e)), None)
        if realloc is None:
            reasons["reallocation"] = "not observed: no survivor reconfigured for a new quorum after the detection"
    else:
        reasons["reallocation"] = "not measurable: detection was not observed"

    mine = [e for e in after if node is None or e.get("node") == node]
    heal = next((e for e in mine if e.get("kind") == "ckpt.load.start" and e.get("source") == "torchft"), None)
    healed = next((e for e in mine if heal is not None and e.get("kind") == "ckpt.load.end"
                   and e.get("source") == "torchft" and e["ts"] >= heal["ts"]), None)
    if heal is None:
        reasons["checkpoint_load"] = (f"not observed: the group on {node or '?'} never healed from a peer after the "
                                      "fault (no 'healing required' line: did its torchrun restart it?)")
    elif healed is None:
        reasons["checkpoint_load"] = f"not observed: the group on {node or '?'} began healing but never loaded the state dict"
    resumed = next((e for e in mine if healed is not None and e.get("kind") == "step" and e["ts"] >= healed["ts"]), None)
    if resumed is None:
        reasons["recovery"] = f"not observed: the group on {node or '?'} did not commit a step after healing"

    restored_step = healed.get("step") if healed is not None and isinstance(healed.get("step"), int) else None
    if restored_step is None and heal is not None and isinstance(heal.get("step"), int):
        restored_step = heal["step"]  # "healing required ... max_step=N": the step it fetches
    end = resumed["ts"] if resumed is not None else float("inf")
    discarded = sorted({e.get("step") for e in after if e.get("kind") == "step.discarded" and survivor(e)
                        and e["ts"] <= end and isinstance(e.get("step"), int)})
    catch_up = (max(0, restored_step - group_before) if restored_step is not None and group_before is not None
                else None)
    lost = len(discarded) + catch_up if catch_up is not None and resumed is not None else None

    def span(a: Event | float | None, b: Event | float | None) -> float | None:
        ta = a["ts"] if isinstance(a, dict) else a
        tb = b["ts"] if isinstance(b, dict) else b
        return round(tb - ta, 4) if ta is not None and tb is not None else None

    def error(e: Event | None) -> float:
        return float(e.get("ts_uncertainty") or 0.0) if e is not None else 0.0

    def uncertainty(value: float | None, a: float, b: float) -> float | None:
        return None if value is None else round(a + b, 6)

    detection, reallocation = span(t_fault, detect), span(detect, realloc)
    if reallocation is not None and reallocation < 0:
        reallocation = 0.0
    checkpoint_load, recovery = span(heal, healed), span(t_fault, resumed)
    return {
        "model": "torchft",
        "detection_s": detection,
        "reallocation_s": reallocation,
        "checkpoint_load_s": checkpoint_load,
        "startup_s": None,
        "recovery_s": recovery,
        "lost_steps": lost,
        "discarded_steps": discarded,
        "catch_up_steps": catch_up,
        "healed_group": node,
        "last_step_before": last_step_before,
        "restored_step": restored_step,
        "detected_by": _who(detect),
        "detections": detection_sources(timeline, t_fault),
        "t_fault": t_fault,
        "t_detect": t_detect,
        "t_realloc": realloc["ts"] if realloc else None,
        "t_loaded": healed["ts"] if healed else None,
        "t_resumed": resumed["ts"] if resumed else None,
        "reasons": reasons,
        "uncertainty_s": {
            "detection": uncertainty(detection, t_fault_uncertainty, error(detect)),
            "reallocation": uncertainty(reallocation, error(detect), error(realloc)),
            "checkpoint_load": uncertainty(checkpoint_load, error(heal), error(healed)),
            "recovery": uncertainty(recovery, t_fault_uncertainty, error(resumed)),
        },
    }


NODES = ("n0", "n1", "n2")
SOURCES = (None, "torchrun", "torchft", "torchft lighthouse", "nvrx", "nvrx-inprocess", "sdk")


def random_timeline(rng: random.Random) -> tuple[list[Event], float, float]:
    """A timeline with every signal the models read, at random: steps before and after, exits, detections from
    every source, new workers (some with the old pids), loads (some per rank, some without a step), rendezvous,
    an injected Xid, a scheduler's restart, discarded steps, clock uncertainties; instants on a coarse grid so that
    ties happen. Returns ``(events, t_fault, t_fault_uncertainty)``."""
    t_fault = rng.choice((5.0, 6.5, 8.0))
    events: list[Event] = []
    grid = (lambda lo, hi: round(rng.uniform(lo, hi) * 2) / 2)
    pids = {r: 100 + r for r in range(rng.randint(1, 4))}

    def add(kind: str, ts: float, **fields: Any) -> None:
        e: Event = {"ts": ts, "kind": kind}
        for key, value in fields.items():
            if value is not None:
                e[key] = value
        if rng.random() < 0.15:
            e["ts_uncertainty"] = rng.choice((0.001, 0.02, 0.5))
        if rng.random() < 0.7:
            e.setdefault("node", rng.choice(NODES))
        src = rng.choice(SOURCES)
        if src is not None:
            e.setdefault("source", src)
        events.append(e)

    for rank, pid in pids.items():
        add("worker.start", grid(0, 1), rank=rank if rng.random() < 0.8 else None, pid=pid if rng.random() < 0.9 else None,
            world_size=len(pids) if rng.random() < 0.7 else None)
    for step in range(rng.randint(0, 12)):
        add("step", grid(1, 15), step=step if rng.random() < 0.95 else "x", rank=rng.choice((None, 0, 1)))
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(sorted(DETECT_KINDS) + ["node.unreachable", "detect", "worker.exit"])
        add(kind, grid(t_fault - 2, t_fault + 6), rank=rng.choice((None, 0, 1, 2)), why=rng.choice((None, "boom")),
            who=rng.choice((None, "the agent", "the lighthouse")), exitcode=rng.choice((None, -9, 1)),
            interruption=rng.choice((None, "RankShouldRestart")), ranks=rng.choice((None, "0, 1", 1)),
            timeout_s=rng.choice((None, "30", 12.5)), section=rng.choice((None, "step")),
            code=rng.choice((None, 79)), injected=rng.random() < 0.1 or None)
    if rng.random() < 0.2:
        add("gpu.xid", grid(t_fault - 1.5, t_fault + 1), injected=True, code=79)
    for _ in range(rng.randint(0, 5)):
        rank = rng.choice((None, 0, 1, 2, 3))
        add("worker.start", grid(t_fault, t_fault + 8), rank=rank, pid=rng.choice((None, 100, 101, 200, 201)),
            world_size=rng.choice((None, 1, 2, 3, 4)), restart_count=rng.choice((None, 1, 2)))
    if rng.random() < 0.2:
        add("job.running", grid(t_fault, t_fault + 8), restart_count=rng.choice((0, 1, None)))
    for _ in range(rng.randint(0, 3)):
        add("rendezvous.done", grid(t_fault, t_fault + 10))
    for _ in range(rng.randint(0, 2)):
        add("ckpt.load.start", grid(t_fault, t_fault + 10), step=rng.choice((None, 2, 4)))
    for _ in range(rng.randint(0, 5)):
        add("ckpt.load.end", grid(t_fault - 1, t_fault + 12), rank=rng.choice((None, 0, 1, 2)),
            step=rng.choice((None, 0, 2, 4, 6)), pid=rng.choice((None, 100, 200)))
    for _ in range(rng.randint(0, 3)):
        add("step.discarded", grid(t_fault, t_fault + 10), step=rng.choice((3, 4, 5, None)))
    rng.shuffle(events)
    return events, t_fault, rng.choice((0.0, 0.0, 0.01, 0.3))


def _old(model: str):
    """The reference for ``model``: the old function, or the model's own with the old ``measure_fault`` under it."""
    if model == "restart":
        return old_measure_fault
    if model == "torchft":
        return old_measure_torchft

    def reference(events, t_fault, t_fault_uncertainty=0.0, node=None):
        # the module of the stack's measure (its own, or the base's) calls measure_fault by that name
        module = sys.modules[type(stack(model)).measure.__module__]
        saved = module.measure_fault
        module.measure_fault = old_measure_fault
        try:
            return stack(model).measure(events, t_fault, t_fault_uncertainty, node=node)
        finally:
            module.measure_fault = saved
    return reference


def _since_issue_51(want: dict[str, Any], events: list[Event]) -> dict[str, Any]:
    """The reference's answer with issue 51's changes made on purpose since: a null lost work has its reason
    (``reasons["lost_steps"]``, last; its wording is :func:`find_lost_work`'s, checked in tests/test_measure.py),
    torchft's catch-up is one less (the step healed to is the next to run, not one the group missed), and under the
    restart models a checkpoint load that names no step restores the step before the first step after it, with
    ``restored_from`` and ``reallocation_from`` after ``restored_step`` (item 2, item 11)."""
    if want["model"] == "torchft" and want["catch_up_steps"] is not None:
        want["catch_up_steps"] = max(0, want["catch_up_steps"] - 1)
        if want["lost_steps"] is not None:
            want["lost_steps"] = len(want["discarded_steps"]) + want["catch_up_steps"]
    if want["model"] != "torchft":
        timeline = sorted(events, key=lambda e: e["ts"])
        restored_from = None
        if want["restored_step"] is not None:
            restored_from = "no checkpoint" if want["t_loaded"] is None else "load line"
        elif want["t_loaded"] is not None:
            resumed = next(e for e in timeline if e["kind"] == "step" and e["ts"] == want["t_resumed"])
            if isinstance(resumed.get("step"), int):
                want["restored_step"], restored_from = max(0, resumed["step"] - 1), "first step after the load"
                if want["last_step_before"] is not None:
                    want["lost_steps"] = max(0, want["last_step_before"] - want["restored_step"])
        realloc = next((e for e in timeline if e["ts"] == want["t_realloc"] and e["ts"] > want["t_fault"]
                        and e["kind"] in ("worker.start", "job.running")), None)
        if realloc is not None and len({json.dumps(e, sort_keys=True) for e in timeline if e["ts"] == want["t_realloc"]
                                        and e["kind"] in ("worker.start", "job.running")}) > 1:
            realloc = "?"  # several starts at that instant: which one the finder took is its own business
        from_log = ("?" if realloc == "?" else "log line" if realloc is not None and realloc["kind"] == "worker.start"
                    and realloc.get("source") not in (None, "sdk") else None)
        keys = list(want)
        at = keys.index("restored_step") + 1
        want = {**{k: want[k] for k in keys[:at]}, "restored_from": restored_from, "reallocation_from": from_log,
                **{k: want[k] for k in keys[at:]}}
    if want["lost_steps"] is None:
        want["reasons"]["lost_steps"] = "*"
    return want


def _reason_wildcard(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    if want["reasons"].get("lost_steps") == "*" and got["reasons"].get("lost_steps", "").startswith("not observed: "):
        got["reasons"]["lost_steps"] = "*"
    if want.get("reallocation_from") == "?":
        got["reallocation_from"] = "?"
    return got


@pytest.mark.parametrize("model", STACKS.names())
def test_the_finders_measure_what_measure_fault_measured(model: str) -> None:
    rng = random.Random(f"finders-{model}")
    old, new = _old(model), stack(model).measure
    seen_reasons: set[str] = set()
    for i in range(TIMELINES):
        events, t_fault, unc = random_timeline(rng)
        node = rng.choice((None, *NODES))
        want = _since_issue_51(old([dict(e) for e in events], t_fault, unc, node=node), events)
        got = _reason_wildcard(new([dict(e) for e in events], t_fault, unc, node=node), want)
        # json.dumps keeps the key order: result.json is written in it
        assert json.dumps(got, default=str) == json.dumps(want, default=str), f"timeline {i}: {events!r}, t_fault={t_fault}"
        seen_reasons.update(f"{k}: {v}" for k, v in want["reasons"].items())
    if model == "restart":  # the timelines reach every reason the restart model gives
        assert len({r.split(":")[0] for r in seen_reasons}) == 5  # the four phases and lost work
        assert any("not measurable" in r for r in seen_reasons)
        assert any("without loading" in r for r in seen_reasons)
        assert any("injected Xid" in r for r in seen_reasons)


def test_each_finder_returns_its_instant_or_its_reason() -> None:
    events = [{"ts": 1.0, "kind": "step", "step": 10}, {"ts": 2.0, "kind": "fault.injected"},
              {"ts": 3.0, "kind": "worker.exit", "node": "n0", "exitcode": -9},
              {"ts": 4.0, "kind": "worker.start", "rank": 0}, {"ts": 4.5, "kind": "rendezvous.done"},
              {"ts": 5.0, "kind": "ckpt.load.end", "rank": 0, "step": 8}, {"ts": 6.0, "kind": "step", "step": 9}]
    before, after = events[:2], events[2:]
    assert find_detection(events, 2.0).ts == 3.0
    resumed = find_resume(after)
    assert resumed.ts == 6.0 and resumed.reason is None
    load = find_checkpoint_load(after, resumed.event)
    assert (load.ts, load.restored_step) == (5.0, 8)
    realloc = find_reallocation(after, resumed.event, load)
    assert (realloc.ts, realloc.ready) == (4.0, 4.5)
    assert find_lost_work(before, load.restored_step, resumed.event).steps == 2

    nothing = find_resume(after[:3])
    assert nothing.event is None and nothing.reason == "not observed: training did not resume after the fault"
    assert find_detection(events[:2], 2.0).reason.startswith("not observed: no worker.exit")
    assert find_checkpoint_load(after, None).reason == "not observed: no ckpt.load.end before a resumed step"
    assert find_reallocation(after, None, find_checkpoint_load(after, None)).reason == (
        "not observed: no new workers started after the fault")
    assert find_lost_work([], 8, resumed.event).steps is None
