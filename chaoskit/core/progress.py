"""A run's progress as structured events.

The runner emits a :class:`Progress` at each stage of a drill (the job started, steady state reached, a fault
injected, detected, recovered, reverted, the verdict); whoever shows progress subscribes to them: the terminal
(:class:`TerminalProgress`) and the game day's board each get the same events, and nobody reads the runner's
console text back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

__all__ = ["Progress", "ProgressFeed", "Subscriber", "TerminalProgress", "STAGES"]

STAGES = (
    "started",       # the job started, or chaoskit attached to one running
    "job_user",      # whom the job runs as
    "stop_conditions",  # safety.stop_when's queries watched
    "clocks",        # nodes whose clocks are off this machine's (corrected)
    "checkpoint_fs", # the job's checkpoint folder mounted as a file system of its own
    "steady",        # steady state reached
    "spares",        # spare nodes waiting to take over
    "waiting",       # a fault waits for its event trigger
    "holding",       # a fault held back by a campaign's gate
    "injected",      # a fault injected
    "strikes_again", # a recurring fault strikes the node the job came back to
    "detected", "reallocated", "loaded", "resumed",  # the recovery's phases, seconds after the fault
    "cut_short",     # recovery measured: a lasting fault reverted before its duration is up (a game day's default)
    "job_ended",     # the job ended with a fault still in effect
    "reverted",      # a fault reverted
    "trigger_missed", "aborted", "interrupted",
    "verdict",       # the run's verdict, once result.json is written (no line of its own on the terminal)
    "sample",        # a repeat's next sample begins
    "note",          # anything else worth a line (after the run, a teardown interrupted)
)
"""Every stage a :class:`Progress` may name."""


@dataclass(frozen=True)
class Progress:
    """One step of a run."""

    stage: str
    """What happened: one of :data:`STAGES`."""
    message: str
    """The terminal's line, Rich markup (a value from outside chaoskit in it is escaped); empty: no line."""
    elapsed_s: float | None = None
    """Seconds since the run started; ``None`` for a line outside a run's clock (a repeat's sample header)."""
    data: dict[str, Any] = field(default_factory=dict)
    """The figures behind the line (``fault_kind``, ``targets``, ``after_s``, ``step``, ``verdict``...)."""


Subscriber = Callable[[Progress], None]
"""Something that shows progress: called with each event, in order, from the thread that runs the drill."""


class ProgressFeed:
    """A run's progress: ``feed(message, stage, **data)`` stamps the event with the seconds since ``t0`` and hands
    it to each subscriber. Callable with a message alone (a note), as a teardown's ``say`` is."""

    def __init__(self, t0: float, subscribers: Iterable[Subscriber | None] = ()) -> None:
        self.t0 = t0
        self.subscribers = [s for s in subscribers if s is not None]

    def __call__(self, message: str, stage: str = "note", **data: Any) -> None:
        self.emit(Progress(stage, message, time.time() - self.t0, data))

    def emit(self, event: Progress) -> None:
        if event.stage not in STAGES:
            raise ValueError(f"unknown progress stage {event.stage!r}")
        for subscriber in self.subscribers:
            subscriber(event)


class TerminalProgress:
    """The terminal's subscriber: one line per event, ``  12.34s  message``; never wrapped (a CI log is read with
    grep): the terminal wraps what is too long for it."""

    def __init__(self, console) -> None:
        self.console = console

    def __call__(self, event: Progress) -> None:
        if not event.message:
            return
        if event.elapsed_s is None:
            self.console.print(event.message)
        else:
            self.console.print(f"[dim]{event.elapsed_s:7.2f}s[/dim]  {event.message}", soft_wrap=True)
