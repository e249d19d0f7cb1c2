"""A node's clock against the controller's, measured NTP-style.

Events come from several machines: a fault's time from the node that ran it, log
lines from the node that wrote them. Each is put on the controller's clock by the
node's measured offset. :func:`measure_clock` takes several round trips to the node
and keeps the one with the smallest round trip: the node's reading is assumed to
fall in its middle, so the offset is known to within half that round trip.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from chaoskit.cluster.fanout import fan_out

__all__ = ["ClockOffset", "measure_clock", "ClockedTransport", "SAMPLES", "FAR_S", "sync_clocks", "far_clocks"]

SAMPLES = 5

FAR_S = 0.05
"""A node's clock this far off the controller's is worth a line in the run's progress (it is corrected either way)."""


@dataclass(frozen=True)
class ClockOffset:
    """``offset_s``: the node's clock minus the controller's; ``uncertainty_s``: half the round trip
    it was measured over (``None``: not measured, the node reads the controller's own clock)."""

    offset_s: float = 0.0
    uncertainty_s: float | None = None

    def to_controller(self, t: float) -> float:
        """A time read on the node's clock, on the controller's."""
        return t - self.offset_s

    @property
    def error_s(self) -> float:
        """How far a corrected time may be off: the uncertainty, or 0 on the controller's own clock."""
        return self.uncertainty_s or 0.0

    def as_dict(self) -> dict[str, float | None]:
        return {"offset_s": round(self.offset_s, 6),
                "uncertainty_s": None if self.uncertainty_s is None else round(self.uncertainty_s, 6)}


def measure_clock(ping: Callable[[], float], samples: int = SAMPLES,
                  now: Callable[[], float] = time.time) -> ClockOffset:
    """``ping()`` returns the node's clock; the offset from the sample with the smallest round trip."""
    best: tuple[float, float] | None = None
    for _ in range(max(1, samples)):
        t0 = now()
        node_time = ping()
        t1 = now()
        offset, half = node_time - (t0 + t1) / 2, (t1 - t0) / 2
        if best is None or half < best[1]:
            best = (offset, half)
    assert best is not None
    return ClockOffset(best[0], best[1])


@runtime_checkable
class ClockedTransport(Protocol):
    """A transport to a node with a clock of its own: it measures it and reports node times corrected."""

    clock: ClockOffset

    def sync_clock(self, samples: int = SAMPLES) -> ClockOffset:
        """Measure the node's clock offset now; later times the transport reports are corrected by it."""


def sync_clocks(conns: Mapping[str, Any]) -> dict[str, ClockOffset]:
    """The clock offset of each node whose transport (``conns``, by node) has a clock of its own (``has_own_clock``),
    measured on all of them at once: the times each reports from now on are on the controller's clock. Raises the
    first node's failure."""
    clocked = {name: conn for name, conn in conns.items() if conn is not None and conn.has_own_clock}
    found = fan_out({name: conn.sync_clock for name, conn in clocked.items()})
    for res in found.values():
        if isinstance(res, BaseException):
            raise res
    return dict(found)


def far_clocks(clocks: Mapping[str, ClockOffset]) -> str | None:
    """The nodes whose clocks are more than :data:`FAR_S` off the controller's, as ``n2 +0.120s, ...``; ``None``: none."""
    far = [f"{name} {c.offset_s:+.3f}s" for name, c in clocks.items() if abs(c.offset_s) > FAR_S]
    return ", ".join(far) or None
