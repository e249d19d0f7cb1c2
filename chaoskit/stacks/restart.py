"""``recovery: restart``: plain torchrun (torchelastic). The world stops, restarts and loads a checkpoint; its agent
sees a dead worker at once and a hang only at the collective timeout. Every launch runs under it."""

from __future__ import annotations

from chaoskit.stacks.api import Stack

__all__ = ["Restart"]


class Restart(Stack):
    name = "restart"
    scorecard_column = "torchrun"
    describe = "torchelastic: the agent sees a dead worker, a hang only at the collective timeout"
