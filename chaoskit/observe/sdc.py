"""Silent faults seen from the timeline: DDP replicas that disagree, and a loss that goes wrong.

:class:`SilentWatch` subscribes to the run's :class:`~chaoskit.observe.events.EventBus`:

- ``sdc.checksum`` (``probes.sdc``: each rank's checksum of its parameters every N steps,
  :func:`chaoskit.sdk.inproc.checksum`): DDP keeps replicas identical bit for bit, so two ranks with different
  sums at the same step are corrupt; the first such step is one ``sdc.detected`` (the ranks in the minority
  named). Checksums with ``final`` (written at exit when a bit flip was drilled) are never a detection: they
  only tell whether the replicas still disagreed at the end (:attr:`SilentWatch.disagree_at_end`).
- ``step`` with a ``loss``: NaN or Inf, or a value more than :data:`SPIKE_SIGMA` standard deviations from the
  rank's last :data:`WINDOW` losses, is one ``loss.anomaly`` per rank (again after the rank restarts).

A new world (``worker.start``) starts the comparison over: a restarted rank's old sums are not compared.
"""

from __future__ import annotations

import math
import statistics
import threading
from typing import Any

from chaoskit.observe.events import Event, EventBus, make_event

__all__ = ["SilentWatch", "SPIKE_SIGMA", "WINDOW"]

SPIKE_SIGMA = 6.0
WINDOW = 20
MIN_HISTORY = 10


class SilentWatch:
    """Publish ``sdc.detected`` and ``loss.anomaly`` from the checksums and losses the job's ranks report."""

    def __init__(self, bus: EventBus, *, spike_sigma: float = SPIKE_SIGMA) -> None:
        self.bus, self.spike_sigma = bus, spike_sigma
        self._lock = threading.Lock()
        self._sums: dict[int, dict[int, int]] = {}
        self._final: dict[int, int] = {}
        self._losses: dict[int, list[float]] = {}
        self._flagged: set[int] = set()
        self.detected: Event | None = None

    def start(self) -> None:
        self.bus.subscribe(self._on_event)

    def stop(self) -> None:
        """Nothing runs of its own: it acts in the publisher's thread."""

    @property
    def disagree_at_end(self) -> bool | None:
        """Whether the ranks' checksums at exit differed (``None``: fewer than two ranks reported one)."""
        with self._lock:
            sums = set(self._final.values())
            return None if len(self._final) < 2 else len(sums) > 1

    def _on_event(self, event: Event) -> None:
        kind = event.get("kind")
        if kind == "worker.start":
            rank = event.get("rank")
            with self._lock:
                if isinstance(rank, int):
                    self._losses.pop(rank, None)
                    self._flagged.discard(rank)
                self._sums.clear()
        elif kind == "sdc.checksum":
            self._checksum(event)
        elif kind == "step" and "loss" in event:
            self._loss(event)

    def _checksum(self, event: Event) -> None:
        rank, step = event.get("rank"), event.get("step")
        try:
            value = int(str(event.get("sum")))
        except ValueError:
            return
        if not isinstance(rank, int) or not isinstance(step, int):
            return
        with self._lock:
            if event.get("final"):
                self._final[rank] = value
                return
            at = self._sums.setdefault(step, {})
            at[rank] = value
            if self.detected is not None or len(set(at.values())) < 2:
                return
            counts: dict[int, int] = {}
            for v in at.values():
                counts[v] = counts.get(v, 0) + 1
            majority = max(counts, key=lambda v: counts[v])
            odd = sorted(r for r, v in at.items() if v != majority)
            self.detected = make_event("sdc.detected", event["ts"], step=step, ranks=odd, node=event.get("node"),
                                       source="sdc probe", who="the checksum probe (probes.sdc)",
                                       why=f"replica checksums disagree at step {step}: rank {', '.join(map(str, odd))} "
                                           f"differ from the others")
        self.bus.publish(self.detected)

    def _loss(self, event: Event) -> None:
        rank, loss = event.get("rank"), event.get("loss")
        if not isinstance(rank, int) or isinstance(loss, bool) or not isinstance(loss, (int, float)):
            return
        why = None
        with self._lock:
            if rank in self._flagged:
                return
            history = self._losses.setdefault(rank, [])
            if not math.isfinite(loss):
                why = f"loss is {loss} on rank {rank} at step {event.get('step')}"
            elif len(history) >= MIN_HISTORY:
                mean, sd = statistics.fmean(history), statistics.pstdev(history)
                if sd > 0 and abs(loss - mean) > self.spike_sigma * sd:
                    why = (f"loss {loss:.4g} on rank {rank} at step {event.get('step')} is "
                           f"{abs(loss - mean) / sd:.1f} sigma from its last {len(history)} steps")
            if why is None:
                history.append(float(loss))
                del history[:-WINDOW]
                return
            self._flagged.add(rank)
        self.bus.publish(make_event("loss.anomaly", event["ts"], rank=rank, node=event.get("node"), step=event.get("step"),
                                    loss=loss, source="loss watch", who="the loss watch", why=why))


def silent_summary(events: list[Event], t_fault: float, fault_step: int | None, disagree_at_end: bool | None,
                   described: str) -> dict[str, Any]:
    """A silent fault's own phases: ``detection_s`` (injection to the first ``sdc.detected``, ``loss.anomaly`` or
    job ``detect``), ``corrupt_steps`` (steps trained on corrupt state before it), whether the job recovered (a new
    world restored a checkpoint from before the fault), the checkpoints saved since marked corrupt, the work lost
    counted back to the last clean one, and a ``reason`` when nothing noticed."""
    timeline = sorted(events, key=lambda e: e["ts"])
    after = [e for e in timeline if e["ts"] >= t_fault]
    detect = next((e for e in after if e.get("kind") in ("sdc.detected", "loss.anomaly", "detect", "worker.exit")), None)
    saves = list({e["step"]: e for e in reversed(timeline)  # one per step: every rank of a Trainer reports its save
                  if e.get("kind") == "ckpt.save.end" and isinstance(e.get("step"), int)}.values())[::-1]
    start = fault_step if fault_step is not None else None
    checkpoints = [{"step": e["step"], "ts": e["ts"],
                    "corrupt": start is not None and e["step"] >= start and e["ts"] >= t_fault} for e in saves]
    clean = [c["step"] for c in checkpoints if not c["corrupt"]]
    last_clean = max(clean) if clean else 0
    steps_after = [e["step"] for e in after if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    detect_step = None
    if detect is not None:
        detect_step = detect.get("step") if isinstance(detect.get("step"), int) else max(
            [e["step"] for e in after if e.get("kind") == "step" and e["ts"] <= detect["ts"] and isinstance(e.get("step"), int)]
            or [start or 0])
    corrupt_steps = (detect_step - start) if detect_step is not None and start is not None else (
        (max(steps_after) - start) if steps_after and start is not None else None)
    loads = [e for e in after if e.get("kind") == "ckpt.load.end" and isinstance(e.get("step"), int)]
    recovered = any(start is not None and e["step"] < start for e in loads)
    out: dict[str, Any] = {
        "detected": detect is not None,
        "detection_s": round(detect["ts"] - t_fault, 3) if detect is not None else None,
        "detected_by": (detect.get("who") or detect.get("source") or detect.get("kind")) if detect is not None else None,
        "fault_step": start,
        "detect_step": detect_step,
        "corrupt_steps": corrupt_steps,
        "recovered": recovered,
        "checkpoints": checkpoints,
        "last_clean_checkpoint": last_clean,
        "lost_steps": (detect_step if detect_step is not None else (max(steps_after) if steps_after else start or 0)) - last_clean
        if start is not None else None,
        "disagree_at_end": disagree_at_end,
    }
    if detect is None:
        end = ("replicas still disagree at the end" if disagree_at_end else "replicas agreed at the end"
               if disagree_at_end is False else "whether replicas still disagree at the end is not known")
        out["reason"] = f"{described}; {end}; no probe or job line noticed"
    return out
