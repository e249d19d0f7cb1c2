"""The phases of a recovery, in one table: :data:`PHASE_TABLE`.

Every reader of a phase reads its row here: the measurement's SLO verdict (``measure.py``), the result model's
fields (``core/result.Phases``), the runner's copy into ``result.json`` (``assembler.assemble``), the terminal
summary, JUnit, the HTML report, the OpenMetrics export, the history, the distributions of a repeat, the
simulator's ``--from-run`` and a cascade's ``at: {during: {phase: ...}}``. Adding a phase is one row here plus its
measurement: the recovery models of ``measure.py`` give its ``key`` in the dict they return.

The order of the table is the order of ``result.json``'s ``phases`` and of every table and chart of them.

This module is core: the standard library only, so every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

__all__ = ["Phase", "PHASE_TABLE", "SLO_PHASES", "phase"]


@dataclass(frozen=True)
class Phase:
    """One phase of a recovery, and what each reader needs of it."""

    name: str
    """What the scenario's ``slo:`` and ``result.json``'s ``reasons``, ``uncertainty_s`` and ``slo`` call it."""
    key: str
    """Its figure in ``result.json``'s ``phases`` (and each ``per_fault`` entry)."""
    label: str
    """Its name in words, in the reports' tables and charts and JUnit's phase lines."""
    meaning: str
    """What it spans under the restart model (the reports' "what it spans"; ``measure.phase_spans`` gives the
    other recovery models' words)."""
    unit: Literal["s", "steps"] = "s"
    """Seconds (``Optional[Number]`` in the result model) or training steps (``Optional[int]``)."""
    slo: bool = False
    """A scenario may set an SLO on it (``slo.<name>``)."""
    metric: Optional[str] = None
    """Its OpenMetrics gauge (``report/metrics.py``), ``None`` when it is not exported."""
    metric_help: str = ""
    cascade: bool = False
    """A cascade's second fault may strike during it (``at: {during: {phase: <name>}}``, ``faults/api.During``)."""
    sim_flag: Optional[str] = None
    """The ``chaoskit simulate`` option that fills it in where a drill given by ``--from-run`` did not observe it
    (``sim/measured.py``); ``None`` when the simulator's model has no term for it."""


PHASE_TABLE: tuple[Phase, ...] = (
    Phase("detection", "detection_s", "detection", "fault -> the system noticed", slo=True,
          metric="chaoskit_detection_seconds",
          metric_help="Seconds from the fault to the first sign the system noticed it.",
          cascade=True, sim_flag="--detection"),
    Phase("reallocation", "reallocation_s", "reallocation", "noticed -> new world started", slo=True,
          metric="chaoskit_reallocation_seconds",
          metric_help="Seconds from detection to every worker of the new world started.",
          cascade=True, sim_flag="--reallocation"),
    Phase("checkpoint_load", "checkpoint_load_s", "checkpoint load", "started -> last rank loaded", slo=True,
          metric="chaoskit_checkpoint_load_seconds",
          metric_help="Seconds from the new world's start to its last rank's checkpoint loaded.",
          cascade=True, sim_flag="--ckpt-load"),
    Phase("startup", "startup_s", "start-up", "new world started -> its process group ready (inside checkpoint load)"),
    Phase("recovery", "recovery_s", "recovery", "fault -> first step after load", slo=True,
          metric="chaoskit_recovery_seconds",
          metric_help="Seconds from the fault to the first training step after the checkpoint load (MTTR)."),
    Phase("lost_steps", "lost_steps", "lost work", "the last step before the fault - the step restored", unit="steps",
          slo=True, metric="chaoskit_lost_steps",
          metric_help="Training steps lost: the last step before the fault minus the step restored."),
)
"""Every phase, in ``result.json``'s order."""

SLO_PHASES: tuple[Phase, ...] = tuple(p for p in PHASE_TABLE if p.slo and p.unit == "s")
"""The phases judged in seconds against ``slo.<name>`` (``limit_s``/``measured_s``): the rows of every phase
table, in order. Lost work, judged in steps, has a row of its own after them."""

_BY_NAME = {p.name: p for p in PHASE_TABLE}


def phase(name: str) -> Phase:
    """The row of the phase called ``name`` (:attr:`Phase.name`). Raises ``KeyError`` for no such phase."""
    return _BY_NAME[name]
