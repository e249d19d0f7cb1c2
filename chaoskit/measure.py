"""From a timeline to recovery phases, lost work and an SLO verdict.

Exactly the definitions of docs/architecture.md ("Recovery phases"), for one fault:

- ``t_fault``: the injector's timestamp, taken on the node;
- ``t_detect``: first event after ``t_fault`` showing the system noticed
  (``worker.exit`` seen by an agent, ``detect`` from a surviving rank, ...);
- ``t_realloc``: the replacement world is formed: every new worker started (for a job that names no
  workers, only its scheduler and its log: the scheduler started it again, ``job.running`` restarted);
- ``t_loaded``: the last rank of the new world finished loading its checkpoint;
- ``t_resumed``: the first training step after ``t_loaded``.

A phase whose signal never came is ``None`` with a reason, never zero, and it
fails its SLO. This module is pure: events in, numbers out.

Each instant has its finder, which returns the event it is read from or its "not observed" reason
(:func:`find_detection`, :func:`find_resume`, :func:`find_checkpoint_load`, :func:`find_reallocation`;
:func:`find_lost_work` for the steps lost); :func:`measure_fault` puts them together.

That is the ``restart`` recovery model (:func:`measure_fault`). A job that recovers without a restart is
measured on its own terms, by its recovery stack's own model in its module (``workload.recovery``,
:meth:`chaoskit.stacks.api.Stack.measure`: torchft's, NVRx's, NVRx in-process's), from the public pieces here
(the finders, :func:`span`, :func:`time_error`, :func:`phase_uncertainty`, :func:`who_noticed`,
:func:`detection_sources`); ``result.json`` says which model measured it (``recovery_model``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from chaoskit.core.phases import PHASE_TABLE, SLO_PHASES

__all__ = ["DETECT_KINDS", "HEARTBEAT_KINDS", "RESTART_MEANINGS", "detection_sources", "measure_fault",
           "Found", "CheckpointLoad", "Reallocation", "LostWork", "find_detection", "find_resume",
           "find_checkpoint_load", "find_reallocation", "find_lost_work", "span", "time_error", "phase_uncertainty", "who_noticed",
           "measure_slowdown", "measure_checkpoint_io", "reallocation_steps", "slo_verdict", "unseen_signals", "PHASES", "RESTORED_FROM",
           "READ_LATENCY_S", "steps_before", "relaunch_stop", "phase_spans", "baseline_restarts", "incident", "false_restart", "RESTART_SIGNS", "node_returns"]

DETECT_KINDS = frozenset({"detect", "worker.exit", "ckpt.save.failed", "oom.kill", "gpu.xid", "gpu.ecc",
                          "node.down", "node.drain", "job.node_fail", "job.requeued", "sdc.detected", "loss.anomaly"})
"""Events that show the system noticed a fault: a torchrun agent or a rank (``worker.exit``, ``detect``), a failed
checkpoint save (how a job notices a full disk, often without restarting), the kernel's OOM killer
(``observe/kmsg.py``), the GPU's own Xid and uncorrectable ECC reports (``observe/gpu.py``), Ray, or the scheduler
(``node.down``; ``node.drain``: a health check took the node out; ``job.requeued``: a preempted job, which no
node failure announced). An event marked ``injected`` (an Xid line ``gpu.xid`` wrote) is the fault itself, never
its detection."""
HEARTBEAT_KINDS = frozenset({"node.unreachable"})
"""chaoskit's own heartbeat detection (``observe/probes.ProcessWatcher``: a node silent for
``probes.heartbeat_timeout``). A detection source shown beside the job's and the scheduler's, but not what
``t_detect`` is: the detection phase measures the system under drill noticing, and chaoskit is not part of it
(a dropped management NIC silences a node for chaoskit while training never notices)."""
PHASES = tuple(p.name for p in SLO_PHASES)
"""The phases :func:`slo_verdict` judges in seconds (``core/phases.SLO_PHASES``); ``lost_steps`` is judged apart."""

Event = dict[str, Any]


def _rank_key(e: Event) -> Any:
    if e.get("rank") is not None:
        return ("rank", e["rank"])
    return ("node", e.get("node"), e.get("pid"))


RESTORED_FROM = {"load": "load line", "first step": "first step after the load", "none": "no checkpoint"}
"""Where a restored step comes from (``phases.restored_from``): the checkpoint load's own line naming its step; else
the first step after the load, less one (a job resumes with the step after the one its checkpoint holds; NVRx's
examples and many jobs name a file, not a step, when they load); ``0`` for a restart that loaded no checkpoint."""

READ_LATENCY_S = 0.5
"""How long after an in-process fault a step line the job wrote before it may be read: the fault is stamped inside
the process, a log line when chaoskit reads it. Such a line counts as before the fault only when its step is below
the one the fault's own answer says the process was training (:func:`steps_before`)."""

INJECTED_LINE_SLACK_S = 1.0
"""How long before its fault's time an injected kernel-log line may be stamped: the kernel's time of the record
(read back by the kernel-log probe) comes while chaoskit's write is in flight, before the write returns."""


@dataclass(frozen=True)
class Found:
    """What one finder found: the event its phase's instant is read from (``ts``), or ``reason``: why it was
    not observed, as ``reasons`` in result.json says it."""

    event: Event | None = None
    reason: str | None = None

    @property
    def ts(self) -> float | None:
        return self.event["ts"] if self.event is not None else None


@dataclass(frozen=True)
class CheckpointLoad(Found):
    """:func:`find_checkpoint_load`'s answer: the last rank's load, each rank's latest load before the resumed
    step (``per_rank``), and the step restored (the oldest of them; 0 for a restart without a checkpoint)."""

    per_rank: dict[Any, Event] = field(default_factory=dict)
    restored_step: int | None = None
    restored_from: str | None = None
    """Which line gave ``restored_step``: :data:`RESTORED_FROM` names each source."""


@dataclass(frozen=True)
class Reallocation(Found):
    """:func:`find_reallocation`'s answer, with ``ready``: when the new world's rendezvous was done (the end of
    ``startup_s``), ``None`` when not seen."""

    ready: float | None = None


@dataclass(frozen=True)
class LostWork:
    """:func:`find_lost_work`'s answer: the steps lost (``None`` with ``reason`` when not measurable), and the last
    step before the fault they count from."""

    steps: int | None = None
    last_step_before: int | None = None
    reason: str | None = None


def relaunch_stop(timeline: list[Event], t_fault: float, node: str | None = None) -> Event | None:
    """The first worker after ``t_fault`` that its launcher stopped and started again with no failure line: a
    ``process.gone`` on a node the fault did not touch (not ``node``), not a clean exit, followed by a
    ``worker.start`` on the same node. torchrun does this when its rendezvous loses a node (the dead node's
    keep-alive expired and a waiting spare moved up): each healthy agent SIGTERMs its workers and logs only at INFO,
    so a survivor's collective may never time out. Returned as its detection event (``who``/``why`` added), or
    ``None``. ``timeline``: the events in time order."""
    for i, e in enumerate(timeline):
        if (e["ts"] <= t_fault or e.get("kind") != "process.gone" or e.get("node") in (None, node)
                or e.get("exitcode") == 0):
            continue
        if any(later.get("kind") == "worker.start" and later.get("node") == e["node"] for later in timeline[i + 1:]):
            how = f"signal {e['signal']}" if e.get("signal") else (
                f"exit code {e['exitcode']}" if e.get("exitcode") is not None else "it ended")
            return {**e, "who": "launcher", "why": f"stopped its worker ({how}) and started it again with no "
                                                   "failure line, as torchrun does when its rendezvous loses a node"}
    return None


def find_detection(timeline: list[Event], t_fault: float, t_fault_uncertainty: float = 0.0,
                   node: str | None = None) -> Found:
    """The first event after ``t_fault`` that shows the system noticed (:data:`DETECT_KINDS`; an injected Xid line
    is the fault itself, never its detection); where there is none, a survivor's launcher restarting its workers
    (:func:`relaunch_stop`; ``node``: the fault's). ``timeline``: the events in time order."""
    detect = next((e for e in timeline if e["ts"] > t_fault and e.get("kind") in DETECT_KINDS and not e.get("injected")),
                  None)
    if detect is not None:
        return Found(detect)
    relaunched = relaunch_stop(timeline, t_fault, node)
    if relaunched is not None:
        return Found(relaunched)
    # the kernel stamps chaoskit's own line while its write is in flight, before the fault is stamped injected
    since = t_fault - INJECTED_LINE_SLACK_S - t_fault_uncertainty
    injected = next((e for e in timeline if e.get("kind") == "gpu.xid" and e.get("injected") and e["ts"] > since), None)
    if injected is not None:
        return Found(reason=f"not observed: the injected Xid {injected.get('code')} line was seen in the kernel "
                            f"log of {injected.get('node')}, but nothing drained the node (no node.drain) and "
                            "the job did not fail")
    return Found(reason="not observed: no worker.exit, detect, oom.kill or gpu event after the fault")


def _new_world(after: list[Event]) -> list[Event]:
    """The workers started after the fault; for a job seen only through its scheduler and its log, the scheduler's
    restart (``job.running`` with a ``restart_count``) starts the new world."""
    starts = [e for e in after if e.get("kind") == "worker.start"]
    return starts or [e for e in after if e.get("kind") == "job.running" and (e.get("restart_count") or 0) >= 1]


def _loads(after: list[Event]) -> list[Event]:
    return [e for e in after if e.get("kind") == "ckpt.load.end"]


def find_resume(after: list[Event]) -> Found:
    """The first training step after a checkpoint was loaded (after the new world started, for a job that loaded
    none). ``after``: the events after the fault, in time order."""
    loads, starts = _loads(after), _new_world(after)
    for e in after:
        if e.get("kind") != "step":
            continue
        if any(load["ts"] <= e["ts"] for load in loads) or (not loads and any(s["ts"] <= e["ts"] for s in starts)):
            return Found(e)
    return Found(reason="not observed: training did not resume after the fault")


def find_checkpoint_load(after: list[Event], resumed: Event | None) -> CheckpointLoad:
    """The last rank of the new world to finish loading its checkpoint before ``resumed`` (the step
    :func:`find_resume` found), and the step restored."""
    loads = _loads(after)
    if resumed is None:
        return CheckpointLoad(reason="not observed: no ckpt.load.end before a resumed step")
    if not loads:
        return CheckpointLoad(reason="not observed: the job restarted without loading a checkpoint", restored_step=0,
                              restored_from=RESTORED_FROM["none"])
    per_rank: dict[Any, Event] = {}
    for load in loads:
        if load["ts"] <= resumed["ts"]:
            per_rank[_rank_key(load)] = load
    last = max(per_rank.values(), key=lambda e: e["ts"])
    restored = [load.get("step") for load in per_rank.values() if isinstance(load.get("step"), int)]
    if restored:
        return CheckpointLoad(last, per_rank=per_rank, restored_step=min(restored), restored_from=RESTORED_FROM["load"])
    first = resumed.get("step")
    if isinstance(first, int) and not isinstance(first, bool):  # no load named its step: the job's next step says it
        return CheckpointLoad(last, per_rank=per_rank, restored_step=max(0, first - 1),
                              restored_from=RESTORED_FROM["first step"])
    return CheckpointLoad(last, per_rank=per_rank)


def find_reallocation(after: list[Event], resumed: Event | None, load: CheckpointLoad) -> Reallocation:
    """The last worker of the new world to start: before its own rank's load (``load``, from
    :func:`find_checkpoint_load`), or for a job that loaded none before ``resumed``; with the new world's
    rendezvous, when seen between it and the last load."""
    starts = _new_world(after)
    why = "not observed: no new workers started after the fault"
    if resumed is None:
        return Reallocation(reason=why)
    if load.event is None:  # restarted without a checkpoint: the last start before the resumed step
        pre = [s for s in starts if s["ts"] <= resumed["ts"]]
        return Reallocation(max(pre, key=lambda e: e["ts"])) if pre else Reallocation(reason=why)
    t_loaded = load.event["ts"]
    per_rank: dict[Any, Event] = {}
    for s in starts:
        key = _rank_key(s)
        if s["ts"] <= load.per_rank.get(key, {"ts": t_loaded})["ts"]:
            per_rank[key] = s
    if not per_rank:
        return Reallocation(reason=why)
    realloc = max(per_rank.values(), key=lambda e: e["ts"])
    ready = [e["ts"] for e in after if e.get("kind") == "rendezvous.done" and realloc["ts"] <= e["ts"] <= t_loaded]
    return Reallocation(realloc, ready=max(ready) if ready else None)


def find_lost_work(before: list[Event], restored_step: int | None, resumed: Event | None,
                   loads: int = 0) -> LostWork:
    """The steps lost: the last step before the fault (``before``: the events up to it) minus the step restored,
    once training resumed; ``loads``: how many ranks' checkpoint loads were seen (for the reason when none of
    them named its step)."""
    steps = [e["step"] for e in before if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    last = max(steps) if steps else None
    if resumed is None:
        return LostWork(None, last, "not observed: training did not resume after the fault")
    if last is None:
        return LostWork(None, last, "not observed: no step before the fault")
    if restored_step is None:
        return LostWork(None, last, "not observed: no restored step" + (
            f" (the checkpoint load of {loads} rank{'s' if loads != 1 else ''} seen, none naming its step, nor the first "
            "step after it)" if loads else ""))
    return LostWork(max(0, last - restored_step), last)


def measure_fault(events: Iterable[Event], t_fault: float, t_fault_uncertainty: float = 0.0,
                  node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """Measure the recovery from one fault injected at ``t_fault`` (on ``node``; the restart model does not need
    it: the whole world restarts), from one finder per phase (:func:`find_detection`, :func:`find_resume`,
    :func:`find_checkpoint_load`, :func:`find_reallocation`, :func:`find_lost_work`).

    Returns the phases in seconds (``detection_s``, ``reallocation_s``,
    ``checkpoint_load_s``, ``startup_s``, ``recovery_s``), ``lost_steps``, the
    instants they derive from, and ``reasons`` for every phase left ``None``.
    ``uncertainty_s`` gives, per phase, how far it may be off because its two ends were
    read on different machines' clocks: the sum of the ends' ``ts_uncertainty`` (events
    read on another node and corrected by its measured offset), ``t_fault_uncertainty``
    for the fault's own time. ``fault_step``: the step an in-process fault's own answer says its process was
    training when it fired (``None`` for any other fault): steps read up to :data:`READ_LATENCY_S` after the fault
    and below it were logged before it (:func:`steps_before`).

    ``restored_from`` says which line gave ``restored_step`` (:data:`RESTORED_FROM`); ``reallocation_from`` is
    ``"log line"`` when the new world's start was read from the job's own log line (a ``probes.log`` rule or a
    preset), which the workers print once Python and their imports are up: reallocation then includes their
    start-up (``None`` otherwise).
    """
    timeline = sorted(events, key=lambda e: e["ts"])
    before = steps_before(timeline, t_fault, fault_step)
    after = [e for e in timeline if e["ts"] > t_fault]

    detect = find_detection(timeline, t_fault, t_fault_uncertainty, node)
    resumed = find_resume(after)
    loaded = find_checkpoint_load(after, resumed.event)
    realloc = find_reallocation(after, resumed.event, loaded)
    lost = find_lost_work(before, loaded.restored_step, resumed.event, loads=len(loaded.per_rank))

    # the reasons in the order result.json has always had them
    reasons: dict[str, str] = {}
    if detect.reason:
        reasons["detection"] = detect.reason
    if realloc.reason:
        reasons["reallocation"] = realloc.reason
    if loaded.reason:
        reasons["checkpoint_load"] = loaded.reason
    if resumed.reason:
        reasons["recovery"] = resumed.reason
    if detect.event is None and realloc.event is not None:
        reasons["reallocation"] = "not measurable: detection was not observed"
    if lost.reason:
        reasons["lost_steps"] = lost.reason

    t_detect, t_realloc, t_loaded, t_resumed = detect.ts, realloc.ts, loaded.ts, resumed.ts
    detection = span(t_fault, t_detect)
    reallocation = span(t_detect, t_realloc)
    checkpoint_load = span(t_realloc, t_loaded)
    recovery = span(t_fault, t_resumed)
    return {
        "model": "restart",
        "detection_s": detection,
        "reallocation_s": reallocation,
        "checkpoint_load_s": checkpoint_load,
        "startup_s": span(t_realloc, realloc.ready),
        "recovery_s": recovery,
        "lost_steps": lost.steps,
        "last_step_before": lost.last_step_before,
        "restored_step": loaded.restored_step,
        "restored_from": loaded.restored_from,
        "reallocation_from": _read_from(realloc.event),
        "detected_by": who_noticed(detect.event),
        "detections": detection_sources(timeline, t_fault, detect.event),
        "t_fault": t_fault,
        "t_detect": t_detect,
        "t_realloc": t_realloc,
        "t_loaded": t_loaded,
        "t_resumed": t_resumed,
        "reasons": reasons,
        "uncertainty_s": {
            "detection": phase_uncertainty(detection, t_fault_uncertainty, time_error(detect.event)),
            "reallocation": phase_uncertainty(reallocation, time_error(detect.event), time_error(realloc.event)),
            "checkpoint_load": phase_uncertainty(checkpoint_load, time_error(realloc.event), time_error(loaded.event)),
            "recovery": phase_uncertainty(recovery, t_fault_uncertainty, time_error(resumed.event)),
        },
    }


def steps_before(timeline: list[Event], t_fault: float, fault_step: int | None = None) -> list[Event]:
    """The events up to ``t_fault`` (in time order), and the steps read up to :data:`READ_LATENCY_S` after it whose
    step is below ``fault_step`` (the step an in-process fault's answer says was being trained when it fired): the
    job logged them before the fault; chaoskit read them later."""
    before = [e for e in timeline if e["ts"] <= t_fault]
    if isinstance(fault_step, int) and not isinstance(fault_step, bool):
        before += [e for e in timeline if t_fault < e["ts"] <= t_fault + READ_LATENCY_S and e.get("kind") == "step"
                   and isinstance(e.get("step"), int) and e["step"] < fault_step]
    return before


LOG_LINE = "log line"
"""``reallocation_from`` when the new world's start was read from the job's log (:func:`measure_fault`)."""


def _read_from(e: Event | None) -> str | None:
    """``"log line"`` for a worker start read from the job's output (a log rule's ``source`` is ``log``, a preset's
    its own name); ``None`` for the SDK's (or a callback's) and for a scheduler's restart."""
    if e is None or e.get("kind") != "worker.start" or e.get("source") in (None, "sdk"):
        return None
    return LOG_LINE


def phase_spans(phases: dict[str, Any], meanings: dict[str, str] | None = None) -> dict[str, str]:
    """What each phase of ``phases`` spans, for the reports' "what it spans" column: the model's ``meanings`` (its
    stack's :attr:`chaoskit.stacks.api.Stack.phase_meanings`; the restart model's, :data:`RESTART_MEANINGS`, by
    default), saying where a phase was read from a line that changes what it holds (a new world's start from the
    job's log line includes the workers' start-up)."""
    out = dict(RESTART_MEANINGS if meanings is None else meanings)
    if phases.get("reallocation_from") == LOG_LINE:
        out["reallocation"] += (" (from the job's own log line: includes the new workers' start-up, Python and its "
                                "imports, up to that line)")
    return out


RESTART_GAP_S = 1.0
"""Worker exits this close together are one restart (every rank of the world goes at once)."""


def baseline_restarts(events: Iterable[Event], until: float, *, found: bool = False,
                      since: float | None = None) -> tuple[int, str | None]:
    """The job's restarts before ``until`` (the first fault), and what the first of them was (``None`` without
    one): worker exits (those within :data:`RESTART_GAP_S` of each other one restart), or a worker started with a
    ``restart_count`` (the larger of the two counts). A baseline with one was not steady. ``found``: the job was
    running before the run (attached), so its restart count counts from the lowest the run saw, not from 0.
    ``since``: when the run began; a line the job logged before then (an attached job's log file, read from its
    start, whose lines carry their own times) is its history, not this baseline's."""
    early = [e for e in sorted(events, key=lambda e: e["ts"]) if e["ts"] < until and (since is None or e["ts"] >= since)]
    exits = [e for e in early if e.get("kind") == "worker.exit"]
    starts = [e for e in early if e.get("kind") == "worker.start" and isinstance(e.get("restart_count"), int)
              and not isinstance(e.get("restart_count"), bool)]
    # a job found running (attached) has restarted before the run saw it: only the restarts seen count
    base = min((e["restart_count"] for e in starts), default=0) if found else 0
    restarted = [e for e in starts if e["restart_count"] > base]
    bursts, last = 0, None
    for e in exits:
        if last is None or e["ts"] - last > RESTART_GAP_S:
            bursts += 1
        last = e["ts"]
    count = max([bursts, *(e["restart_count"] - base for e in restarted)])
    first = min(exits[:1] + restarted[:1], key=lambda e: e["ts"], default=None)
    if first is None:
        return count, None
    what = (who_noticed(first) if first["kind"] == "worker.exit"
            else f"workers started again on {first.get('node', '?')} (restart {first['restart_count']})")
    return count, f"{what}, {until - first['ts']:.1f}s before the first fault"


def span(a: Event | float | None, b: Event | float | None) -> float | None:
    """``b - a`` in seconds (each an instant or the event it is read from), ``None`` when either is missing."""
    ta = a["ts"] if isinstance(a, dict) else a
    tb = b["ts"] if isinstance(b, dict) else b
    return round(tb - ta, 4) if ta is not None and tb is not None else None


def time_error(e: Event | None) -> float:
    """How far an event's time may be off (read on another node, corrected by its measured offset)."""
    return float(e.get("ts_uncertainty") or 0.0) if e is not None else 0.0


def phase_uncertainty(value: float | None, a: float, b: float) -> float | None:
    """A phase's uncertainty: its two ends' together; ``None`` for a phase not measured."""
    return None if value is None else round(a + b, 6)


RESTART_MEANINGS = {p.name: p.meaning for p in PHASE_TABLE if p.slo}
"""What each phase spans under the restart model (:func:`measure_fault`): the table's own words
(core/phases.Phase.meaning). A stack with a model of its own says its own (:attr:`chaoskit.stacks.api.Stack.phase_meanings`)."""

PHASE_SIGNALS = {"detection": ("worker.exit", "detect"), "reallocation": ("worker.start",),
                 "checkpoint_load": ("worker.start", "ckpt.load.end"), "recovery": ("step",)}
"""The events each phase of the restart model is measured from (:func:`measure_fault`)."""


def unseen_signals(phases: dict[str, Any], events: Iterable[Event], presets: dict[str, Iterable[str]]) -> dict[str, str]:
    """For each phase :func:`measure_fault` left unmeasured, the signals it needs that no event gave and that no
    log preset in use (``presets``: name -> the kinds it sees) can see: what a drill measured with presets alone
    misses, and why (``phases.unseen`` in result.json). Each is added to the phase's reason in ``phases``, so its
    SLO entry and the reports say it too."""
    if not presets or phases.get("model", "restart") != "restart":
        return {}
    kinds = {e.get("kind") for e in events}
    out: dict[str, str] = {}
    for phase, needs in PHASE_SIGNALS.items():
        if phases.get(f"{phase}_s") is not None:
            continue
        missing = [k for k in needs if k not in kinds and not any(k in set(sees) for sees in presets.values())]
        if missing:
            out[phase] = (f"{', '.join(missing)}: the job reported none (no callback or SDK) and the presets "
                          f"{', '.join(presets)} cannot see {'it' if len(missing) == 1 else 'them'}")
            reasons = phases.setdefault("reasons", {})
            reasons[phase] = f"{reasons.get(phase, 'not observed')} ({out[phase]})"
    if phases.get("lost_steps") is None and "step" not in kinds and not any("step" in set(s) for s in presets.values()):
        out["lost_steps"] = f"step: the job reported none and the presets {', '.join(presets)} cannot see it"
    return out


def detection_sources(events: Iterable[Event], t_fault: float, found: Event | None = None) -> list[dict[str, Any]]:
    """Every source that noticed the fault, first first: per source (its ``who``, else its ``source``) the
    first detection event after ``t_fault``, with its latency (``latency_s``) and how much later than the
    first source it came (``behind_s``). chaoskit's heartbeat (``node.unreachable``) is one of them; ``found``, the
    detection :func:`find_detection` read from another kind of event (:func:`relaunch_stop`'s), another."""
    first: dict[str, Event] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] <= t_fault or e.get("kind") not in DETECT_KINDS | HEARTBEAT_KINDS:
            continue
        first.setdefault(str(e.get("who") or e.get("source") or "sdk"), e)
    if found is not None and found.get("kind") not in DETECT_KINDS | HEARTBEAT_KINDS:
        first.setdefault(str(found.get("who") or found.get("source") or "sdk"), found)
    ordered = sorted(first.items(), key=lambda item: item[1]["ts"])
    t0 = ordered[0][1]["ts"] if ordered else None
    return [{"source": name, "kind": e["kind"], "node": e.get("node"), "detail": who_noticed(e),
             "latency_s": round(e["ts"] - t_fault, 4), "behind_s": round(e["ts"] - t0, 4)} for name, e in ordered]


def who_noticed(e: Event | None) -> str | None:
    if e is None:
        return None
    where = f"{e.get('node', '?')}" + (f"/rank{e['rank']}" if e.get("rank") is not None else "")
    why = e.get("why") or (f"exit code {e['exitcode']}" if "exitcode" in e else e.get("kind"))
    return f"{e.get('who') or e.get('source', 'sdk')} on {where}: {why}"


def slo_verdict(phases: dict[str, Any], slo: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One entry per SLO the scenario sets; a phase that was not observed fails."""
    out: dict[str, dict[str, Any]] = {}
    reasons = phases.get("reasons", {})
    for name in PHASES:
        limit = _single(slo.get(name))
        if limit is None:
            continue
        measured = phases.get(f"{name}_s")
        entry: dict[str, Any] = {"limit_s": limit, "measured_s": measured, "pass": measured is not None and measured <= limit}
        if measured is None:
            entry["reason"] = reasons.get(name, "not observed")
        out[name] = entry
    lost_limit = _single(slo.get("lost_steps"))
    if lost_limit is not None:
        measured = phases.get("lost_steps")
        entry = {"limit": lost_limit, "measured": measured, "pass": measured is not None and measured <= lost_limit}
        if measured is None:
            entry["reason"] = reasons.get("lost_steps", "not observed: no step before the fault or no restored step")
        out["lost_steps"] = entry
    return out


def _single(limit: Any) -> Any:
    """The limit one drill is held to: a plain limit, or for percentiles (``{p95: 60}``) the smallest of them,
    since one sample is its own every percentile."""
    if isinstance(limit, dict):
        values = [v for v in limit.values() if v is not None]
        return min(values) if values else None
    return limit


RESTART_SIGNS = frozenset({"detect", "worker.exit", "worker.start", "rendezvous.done", "inprocess.restart",
                           "job.requeued", "job.node_fail", "node.drain", "node.down", "oom.kill"})
"""What shows the job restarting, or its stack or scheduler deciding it must: a drill with ``expect: {restart:
false}`` fails on the first of these after its first fault (:func:`false_restart`). A failed checkpoint save, a
kernel's GPU report or chaoskit's own silent-fault probes are not: the job may ride through them."""


def false_restart(events: Iterable[Event], t_from: float) -> dict[str, Any] | None:
    """The first sign after ``t_from`` that the stack took a disturbance for a failure: a worker exit (not a clean
    ``0``), a new worker (a restart count past the baseline's), a new rendezvous, a requeue, an in-process restart,
    or a detection by the stack. ``None`` when it rode through. ``events``: the whole run, in time order."""
    events = list(events)
    before = [e.get("restart_count") for e in events if e["ts"] <= t_from and e.get("kind") == "worker.start"]
    base = max((c for c in before if isinstance(c, int) and not isinstance(c, bool)), default=0)
    for e in events:
        kind = e.get("kind")
        if e["ts"] <= t_from or kind not in RESTART_SIGNS or e.get("injected") or e.get("source") == "chaoskit":
            continue
        if kind == "worker.exit" and e.get("exitcode") == 0:
            continue  # a worker that finished its training
        count = e.get("restart_count")
        if kind == "worker.start" and not (isinstance(count, int) and count > base):
            continue
        who = e.get("who") or e.get("source") or "?"
        where = (e.get("node") or "?") + (f"/rank{e['rank']}" if e.get("rank") is not None else "")
        what = {"worker.exit": f"a worker exited (exit code {e.get('exitcode')})",
                "worker.start": f"workers started again (restart {count})",
                "rendezvous.done": "a new rendezvous", "job.requeued": "the job was requeued",
                "inprocess.restart": "an in-process restart"}.get(kind, f"{who} noticed ({e.get('why') or kind})")
        return {"event": kind, "node": e.get("node"), "ts": e["ts"], "after_s": round(e["ts"] - t_from, 3),
                "what": f"{what} on {where}", "who": who}
    return None


def node_returns(events: Iterable[Event], struck: list[dict[str, Any]], times: int | None) -> dict[str, Any]:
    """A fault that struck again each time the job came back to its node (``recur``): how often it came back, what
    each return cost, and whether and when something kept the node out.

    ``struck``: the fault's own measure and its returns' (``per_fault`` entries, ``f0`` then ``f0.r1``, ...), in
    order. Kept out: training resumed after the last strike and no worker of the job started on the node again;
    by the first drain or down of the node after the fault (a health check, the scheduler), else by a node the job
    had not run on before the fault (a spare), else the job went on without it."""
    events = sorted(events, key=lambda e: e["ts"])
    first, last = struck[0], struck[-1]
    nodes = {s["node"] for s in struck}
    before = {e.get("node") for e in events if e.get("kind") == "worker.start" and e["ts"] <= first["t_fault"]}
    returns = struck[1:]
    out: dict[str, Any] = {
        "fault": first["fault"], "nodes": sorted(nodes), "returns": len(returns), "times": times,
        "each": [{"fault": r["fault"], "node": r["node"], "t_fault": r["t_fault"], "recovery_s": r.get("recovery_s"),
                  "lost_steps": r.get("lost_steps")} for r in returns],
        "kept_out": None,
    }
    again = next((e for e in events if e.get("kind") == "worker.start" and e.get("node") in nodes
                  and e["ts"] > last["t_fault"]), None)
    resumed = last.get("t_resumed")
    if again is not None:
        stopped = times is not None and len(returns) >= times
        out["reason"] = (f"the job came back to {again.get('node')} after every failure ({len(returns)} returns): "
                         "nothing kept it out" + (f"; the fault stopped after its {times} returns" if stopped else ""))
        return out
    if resumed is None:
        out["reason"] = "training did not resume after the last strike"
        return out
    drain = next((e for e in events if e.get("kind") in ("node.drain", "node.down") and e.get("node") in nodes
                  and e["ts"] > first["t_fault"] and not e.get("injected")), None)
    spare = next((e for e in events if e.get("kind") == "worker.start" and e["ts"] > first["t_fault"]
                  and e.get("node") not in before and e.get("node") not in nodes), None)
    by = (f"{drain.get('who') or drain.get('source') or 'the scheduler'}: {drain.get('why') or drain['kind']}" if drain
          else f"the spare {spare.get('node')}, which took its place" if spare else "the job going on without it")
    out["kept_out"] = {"at": resumed, "after_s": round(resumed - first["t_fault"], 3), "by": by}
    return out


def incident(faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Several faults the job felt in one run, as one incident: from the first fault in effect to the first step
    after the last one's recovery (``recovery_s``), and the work lost over it all.

    ``faults``: each fault's own measure (``per_fault`` in result.json), in the order they struck. A fault that
    struck before the previous one's recovery had resumed training (``during_recovery``, a cascade) threw away no
    work of its own: the steps since the last checkpoint were lost already. One that struck after training resumed
    adds its own lost steps (those trained since the restored checkpoint, and before it, again)."""
    first, last = faults[0], faults[-1]
    t_resumed = last.get("t_resumed")
    lost: int | None = 0
    during = []
    for prev, cur in zip([None, *faults[:-1]], faults):
        if prev is not None and (prev.get("t_resumed") is None or cur["t_fault"] < prev["t_resumed"]):
            during.append(cur["fault"])
            continue
        lost = None if lost is None or cur.get("lost_steps") is None else lost + cur["lost_steps"]
    return {
        "faults": [f["fault"] for f in faults],
        "during_recovery": during,
        "t_first_fault": first["t_fault"],
        "t_resumed": t_resumed,
        "detection_s": first.get("detection_s"),
        "recovery_s": round(t_resumed - first["t_fault"], 4) if t_resumed is not None else None,
        "lost_steps": lost,
        **({} if t_resumed is not None else {"reason": "not observed: training did not resume after the last fault"}),
    }


def measure_slowdown(events: Iterable[Event], t_fault: float, t_revert: float | None,
                     window_s: float = 10.0, back_within: float = 1.25) -> dict[str, Any]:
    """A straggler's cost, from the job's ``step`` events (the highest rank-agnostic step sequence).

    Step time is the median interval between consecutive new steps: ``before`` over the
    ``window_s`` before the fault, ``during`` from the fault to the revert, ``after`` from
    the revert on. ``throughput_lost_pct`` = 1 - before / during (the share of steps the
    slow phase did not make). ``recovery_after_revert_s``: from the revert to the end of
    the first step interval that is back within ``back_within`` x the step time before;
    ``None`` (with a reason) when a value cannot be measured, never zero.
    """
    times: dict[int, float] = {}
    for e in events:
        if e.get("kind") == "step" and isinstance(e.get("step"), int):
            times[e["step"]] = max(times.get(e["step"], e["ts"]), e["ts"])  # a step is done when its last rank is
    seq = sorted(times.items())
    intervals = [(t1, t1 - t0) for (s0, t0), (s1, t1) in zip(seq, seq[1:]) if s1 == s0 + 1]
    end = t_revert if t_revert is not None else float("inf")

    def median(xs: list[float]) -> float | None:
        xs = sorted(xs)
        return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)

    before = median([d for t, d in intervals if t_fault - window_s <= t < t_fault])
    during = median([d for t, d in intervals if t_fault < t <= end])
    after = median([d for t, d in intervals if t_revert is not None and t > t_revert])
    reasons: dict[str, str] = {}
    lost = None
    if before and during:
        lost = round(max(0.0, 1 - before / during) * 100, 1)
    else:
        reasons["throughput_lost_pct"] = "no steps " + ("before the fault" if not before else "while the fault lasted")
    recovery = None
    if t_revert is None:
        reasons["recovery_after_revert_s"] = "the fault was not reverted"
    elif before is None:
        reasons["recovery_after_revert_s"] = "no step time before the fault to come back to"
    else:
        back = next((t for t, d in intervals if t > t_revert and d <= before * back_within), None)
        if back is None:
            reasons["recovery_after_revert_s"] = f"the step time never came back within {back_within:g}x of before"
        else:
            recovery = round(back - t_revert, 3)
    r = (lambda v: None if v is None else round(v, 4))
    return {"step_time_before_s": r(before), "step_time_during_s": r(during), "step_time_after_s": r(after),
            "throughput_lost_pct": lost, "recovery_after_revert_s": recovery, "reasons": reasons}


SCHEDULER_KINDS = frozenset({"node.down", "node.drain", "job.node_fail", "job.requeued", "job.pending", "job.allocated", "job.running"})


def reallocation_steps(events: Iterable[Event], t_detect: float | None, t_realloc: float | None,
                       settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Reallocation in the scheduler's steps (Slurm's events between detection and the new world's workers),
    each with the setting that bounds it (from ``settings``: the cluster's ``slurmd_timeout``, ``requeue_hold``,
    ``sched_interval`` in seconds, when known). Empty when the scheduler took no part (torchrun restarted in place)."""
    if t_detect is None or t_realloc is None:
        return []
    s = settings or {}

    def setting(key: str, name: str) -> str:
        return f"{name}={s[key]:g}s" if isinstance(s.get(key), (int, float)) else name

    window = [e for e in sorted(events, key=lambda e: e["ts"]) if t_detect <= e["ts"] <= t_realloc and e.get("kind") in SCHEDULER_KINDS]
    if not any(e["kind"].startswith("job.") for e in window):
        return []
    marks: list[tuple[str, float, str]] = [("detected", t_detect, "")]

    def first(pred) -> Event | None:
        return next((e for e in window if pred(e)), None)

    down = first(lambda e: e["kind"] == "node.down" and e.get("state") == "DOWN")
    requeued = first(lambda e: e["kind"] == "job.requeued")
    if down is not None:
        # slurmctld requeues the job as it marks the node DOWN; two polls may see the two apart
        t_down = min(down["ts"], requeued["ts"]) if requeued is not None and abs(down["ts"] - requeued["ts"]) < 1.0 else down["ts"]
        marks.append(("node DOWN", t_down, f"{setting('slurmd_timeout', 'SlurmdTimeout')}: a silent slurmd is DOWN after it"))
    drained = first(lambda e: e["kind"] == "node.drain" and not e.get("injected"))
    if requeued is not None:
        if drained is not None and drained["ts"] <= requeued["ts"]:
            marks.append(("job requeued", requeued["ts"], "the health check (HealthCheckProgram, every "
                                                          f"{setting('health_check_interval', 'HealthCheckInterval')}) "
                                                          "requeues the jobs of the node it drained"))
        else:
            marks.append(("job requeued", requeued["ts"], "--requeue (JobRequeue=1): immediate once the node is DOWN or on preemption"))
        t_req = requeued["ts"]
        eligible = first(lambda e: e["ts"] > t_req and (
            (e["kind"] == "job.pending" and e.get("reason") != "BeginTime") or e["kind"] in ("job.allocated", "job.running")))
        held = first(lambda e: e["ts"] >= t_req and e["kind"] == "job.pending" and e.get("reason") == "BeginTime")
        if held is not None and held["ts"] > t_req:
            marks.append(("held (BeginTime)", held["ts"], f"the old job's processes ending: {setting('kill_wait', 'KillWait')} "
                                                          "from SIGTERM to SIGKILL (COMPLETING)"))
        if held is not None and eligible is not None and eligible["kind"] == "job.pending":
            marks.append(("eligible again", eligible["ts"], f"the requeue hold: {setting('requeue_hold', 'AuthInfo=cred_expire')} "
                                                          "(pending, reason BeginTime)"))
    allocated = first(lambda e: e["kind"] == "job.allocated" and (requeued is None or e["ts"] >= requeued["ts"]))
    if allocated is not None:
        bound = f"scheduling: {setting('sched_interval', 'SchedulerParameters=sched_interval')}, and a free node"
        if any(m[0] == "held (BeginTime)" for m in marks) and not any(m[0] == "eligible again" for m in marks):
            bound = f"the requeue hold ({setting('requeue_hold', 'AuthInfo=cred_expire')}), then " + bound
        marks.append((f"allocated {','.join(allocated.get('nodes') or [])}".strip(), allocated["ts"], bound))
    running = first(lambda e: e["kind"] == "job.running" and (allocated is None or e["ts"] >= allocated["ts"]))
    if running is not None and (allocated is None or running["ts"] > allocated["ts"]):
        marks.append(("running", running["ts"], "job launch: prolog, credentials, the batch script starting"))
    marks.append(("workers started", t_realloc, "the batch script, srun and torchrun start-up on the new allocation"))
    # the detection itself is no step; but a health check that drains and requeues in one pass did two things
    keep = (lambda m: m[1] > t_detect or (m[0] == "job requeued" and drained is not None and m[1] >= t_detect))
    marks = [marks[0]] + sorted((m for m in marks[1:] if keep(m)), key=lambda m: m[1])
    steps = []
    for (a, ta, _), (b, tb, bound) in zip(marks, marks[1:]):
        steps.append({"step": f"{a} -> {b}", "seconds": round(tb - ta, 3), "bound_by": bound})
    return steps


def measure_checkpoint_io(events: Iterable[Event], t_fault: float, t_revert: float | None,
                          nodes: Iterable[str] | None = None) -> dict[str, Any]:
    """Checkpoint save and load times before, while and after a storage fault lasted, from the job's own
    ``ckpt.save.start``/``ckpt.save.end`` and ``ckpt.load.start``/``ckpt.load.end`` events.

    A save (a load) is a ``start`` and the next ``end`` (or ``failed``) of the same node and rank; it counts
    ``before`` the fault when it ended before it, ``during`` when the fault overlapped it (it ended after the fault
    and started before its revert: a save in progress when the storage turned slow went on through it), else
    ``after``. Each window
    gives ``count``, ``median_s``, ``max_s`` and ``failed`` (those that ended in ``ckpt.*.failed``), and
    ``save_slowdown_x``/``load_slowdown_x`` are the median during over the median before (or after, for loads, which
    rarely happen before a fault); ``None`` with a reason where a window saw none. ``nodes``: only the saves and
    loads of these nodes (the fault's: the other nodes' storage was not harmed)."""
    end = t_revert if t_revert is not None else float("inf")
    only = set(nodes) if nodes is not None else None
    spans: dict[str, dict[str, list[tuple[float, bool]]]] = {
        what: {"before": [], "during": [], "after": []} for what in ("save", "load")}
    open_: dict[tuple[str, Any, Any], float] = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0.0)):
        kind = e.get("kind", "")
        if not kind.startswith(("ckpt.save.", "ckpt.load.")) or (only is not None and e.get("node") not in only):
            continue
        what, stage = kind.split(".")[1], kind.split(".")[2]
        key = (what, e.get("node"), e.get("rank"))
        if stage == "start":
            open_[key] = e["ts"]
        elif stage in ("end", "failed") and key in open_:
            t0 = open_.pop(key)
            # one the fault overlapped is its: a save in progress when the mount took effect went on through it
            window = "before" if e["ts"] <= t_fault else "during" if t0 < end else "after"
            spans[what][window].append((e["ts"] - t0, stage == "failed"))
    out: dict[str, Any] = {"reasons": {}}
    for what, windows in spans.items():
        out[what] = {}
        for window, got in windows.items():
            times = sorted(d for d, failed in got if not failed)
            median = (times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2) if times else None
            out[what][window] = {"count": len(times), "failed": sum(1 for _, failed in got if failed),
                                 "median_s": None if median is None else round(median, 4),
                                 "max_s": round(times[-1], 4) if times else None}
        during = out[what]["during"]["median_s"]
        base = out[what]["before"]["median_s"] or out[what]["after"]["median_s"]
        if during and base:
            out[f"{what}_slowdown_x"] = round(during / base, 2)
        else:
            out[f"{what}_slowdown_x"] = None
            out["reasons"][f"{what}_slowdown_x"] = (f"no {what} completed while the fault lasted" if not during
                                                    else f"no {what} without the fault to compare with")
    return out
