"""The timeline's vocabulary: every kind of event the run's bus carries (:mod:`chaoskit.observe.events`).

It lives this low because scenarios name event kinds at every layer: a log rule maps a line to one, and a
fault's trigger (``at: {event: ...}``) waits for one.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from chaoskit.core.errors import did_you_mean

__all__ = ["EVENT_KINDS", "EventKind"]

EVENT_KINDS = (
    "fault.injected", "fault.reverted", "worker.start", "worker.exit", "detect",
    "rendezvous.done", "ckpt.save.start", "ckpt.save.end", "ckpt.load.start",
    "ckpt.load.end", "step", "heartbeat",
    # A step whose work was thrown away without a restart (torchft's should_commit=False).
    "step.discarded", "process.gone", "job.end", "straggler",
    "ckpt.load.failed", "ckpt.save.failed",
    "oom.kill", "gpu.xid", "gpu.ecc",
    # A scheduler's view (chaoskit.observe.slurm): a node it gave up on, and the job's way back.
    "node.down", "node.drain", "job.node_fail", "job.requeued", "job.pending", "job.allocated", "job.running",
    # The site's monitoring (chaoskit.observe.prometheus): a stop condition that fired.
    "safety.stop",
    # chaoskit's own watch of the nodes (chaoskit.observe.probes.ProcessWatcher): a worker stopped or resumed
    # (state T), and a node silent for probes.heartbeat_timeout, and its return.
    "process.stopped", "process.resumed", "node.unreachable", "node.reachable",
    # Silent faults (chaoskit.observe.sdc): each rank's parameter checksum (probes.sdc), replicas that disagree,
    # a loss gone NaN/Inf or far off its recent steps.
    "sdc.checksum", "sdc.detected", "loss.anomaly",
    # NVRx's in-process restart (the nvrx-inprocess preset): a rank passed its health check and reruns its loop.
    "inprocess.restart",
)
"""Event kinds the measurement understands (log rules may map lines to these)."""


def _check_event_kind(v: str) -> str:
    if v not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {v!r}{did_you_mean(v, EVENT_KINDS)}; known: {', '.join(EVENT_KINDS)}")
    return v


EventKind = Annotated[str, AfterValidator(_check_event_kind)]
"""A field naming an event kind of the timeline (:data:`EVENT_KINDS`)."""
