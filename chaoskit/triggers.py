"""Event triggers: which event on the run's timeline fires a fault (``at: {event: ...}``, ``at: {during: ...}``).

A fault with an event trigger waits, after the faults before it are injected, for the
``nth`` event of its kind that its filters let through, counted from the previous
fault's injection (from the steady-state baseline for the first fault). A cascade's
``during: {fault: ID, phase: P}`` is read on the same timeline, from that fault's
injection on:

- ``detection``: the fault's own ``fault.injected``: the next fault strikes before
  anything noticed the first;
- ``reallocation``: the first event after it that shows the system noticed
  (:data:`~chaoskit.measure.DETECT_KINDS`: a worker exit, a detect, a drain): the job
  now tears down and gathers a new world;
- ``checkpoint_load``: the first ``ckpt.load.start`` after it: a rank loads a
  checkpoint.

:class:`TriggerWatch` scans each event once, as the bus publishes it, so it fires on the
publish that brings its event (what the trigger latency benchmark measures:
``bench/bench_triggers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaoskit.faults.api import TRIGGER_WITHIN_S, Trigger
from chaoskit.measure import DETECT_KINDS

__all__ = ["TriggerWatch", "Fired", "TriggerMissed", "what_it_waits_for"]

Event = dict[str, Any]


@dataclass(frozen=True)
class Fired:
    """A trigger that fired: its event, and how long the run waited for it."""

    event: Event
    waited_s: float

    def record(self, trigger: Trigger, t_fault: float) -> dict[str, Any]:
        """``per_fault[].trigger`` in result.json: the event and its latency to the fault in effect (less the
        trigger's own ``after``: the latency is chaoskit's, not the author's delay)."""
        e = self.event
        return {"at": trigger.describe(), "event": e.get("kind"), "node": e.get("node"),
                **({"rank": e["rank"]} if e.get("rank") is not None else {}),
                **({"step": e["step"]} if isinstance(e.get("step"), int) else {}),
                "ts": e["ts"], "waited_s": round(self.waited_s, 3),
                "latency_s": round(t_fault - e["ts"] - (trigger.after or 0.0), 4)}


class TriggerMissed(Exception):
    """A trigger whose event did not come in time (or before the job ended): the drill says which, and how long
    it waited, and injects nothing more."""


def what_it_waits_for(trigger: Trigger) -> str:
    """The event a trigger waits for, in words, for the verdict of one that never fired."""
    if trigger.during is not None:
        ref = trigger.during.fault
        return {"detection": f"{ref} to take effect",
                "reallocation": f"a detection of {ref} (a worker exit, detect or drain after it)",
                "checkpoint_load": f"a ckpt.load.start after {ref}"}[trigger.during.phase]
    return trigger.describe().split(", then ")[0]


class TriggerWatch:
    """One fault's event trigger, fed the bus's events in the order they were published."""

    def __init__(self, trigger: Trigger, fault_ids: dict[str, str], since: float, ref_t_fault: float | None = None) -> None:
        """``fault_ids``: each fault's name (its ``id``, ``f<index>``) to ``f<index>``; ``since``: events before
        it do not count; ``ref_t_fault``: a cascade's fault's time in effect."""
        if not trigger.waits_for_event:
            raise ValueError("not an event trigger")
        self.trigger, self.fault_ids, self.since = trigger, fault_ids, since
        self.ref_t_fault = ref_t_fault
        self.seen = 0
        self.count = 0
        self.fired: Event | None = None

    @property
    def within(self) -> float:
        return self.trigger.within if self.trigger.within is not None else TRIGGER_WITHIN_S

    def feed(self, events: list[Event]) -> Event | None:
        """Look at the events not yet seen (``events`` is the bus's whole list, which only grows); return the one
        that fires the trigger, once it has come."""
        while self.fired is None and self.seen < len(events):
            e = events[self.seen]
            self.seen += 1
            if self._counts(e):
                self.count += 1
                if self.count >= (self.trigger.nth or 1):
                    self.fired = e
        return self.fired

    def _counts(self, e: Event) -> bool:
        during = self.trigger.during
        if during is None:
            return e.get("ts", 0.0) >= self.since and self.trigger.matches(e, self.fault_ids)
        ref = self.fault_ids.get(during.fault, during.fault)
        if during.phase == "detection":
            got = str(e.get("fault") or "")
            return e.get("kind") == "fault.injected" and (got == ref or got.startswith(ref + "."))
        if self.ref_t_fault is None or e.get("ts", 0.0) <= self.ref_t_fault:
            return False
        if during.phase == "reallocation":
            return e.get("kind") in DETECT_KINDS and not e.get("injected")
        return e.get("kind") == "ckpt.load.start"
