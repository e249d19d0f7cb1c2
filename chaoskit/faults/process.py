"""Process faults: kill a training process, or hang it (SIGSTOP) for a while."""

from __future__ import annotations

import signal
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from chaoskit import nodeside
from chaoskit.cluster.fanout import fan_out
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.faults.api import (
    Action,
    Fault,
    FaultContext,
    FaultSpec,
    Injection,
    NodeView,
    signal_number,
)
from chaoskit.faults.node_tool import journaled_python, node_python

__all__ = ["KillFault", "HangFault", "KillSpec", "HangSpec", "CONT_IF_SAME"]


class KillSpec(FaultSpec):
    """Send a signal (default SIGKILL) to the selected processes."""

    kind: Literal["process.kill"]
    signal: str = Field("SIGKILL", description="Signal name or number: SIGKILL, SIGTERM, 9, ...")

    @field_validator("signal", mode="before")
    @classmethod
    def _signal(cls, v: object) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str):
            raise ValueError("signal must be a name such as SIGKILL or a number")
        return signal.Signals(signal_number(v)).name


class HangSpec(FaultSpec):
    """Freeze the selected processes with SIGSTOP, then SIGCONT them after ``duration``."""

    kind: Literal["process.hang"]
    duration: PositiveDuration = Field(..., description="How long the processes stay frozen.")


class KillFault(Fault):
    kind = "process.kill"
    covers = ("software.crash",)
    Spec = KillSpec

    def plan(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Action]:
        sig = self.spec.signal
        return [Action(t.node, f"kill -s {sig[3:]} {t.pid}", t.label()) for t in targets]

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        """Signal every target at once (a bounded fan-out, each signal with its node's own deadline), so that
        one slow node delays no other target; the first failure is raised once all have answered."""
        signum = signal_number(self.spec.signal)
        sent = fan_out({str(i): (lambda t=t: ctx.transport(t.node).signal(t.pid, signum, getattr(t, "start_time", None)))
                        for i, t in enumerate(targets)})
        out = []
        for i, t in enumerate(targets):
            ts = sent[str(i)]
            if isinstance(ts, BaseException):
                raise ts
            out.append(Injection(self.fault_id, self.kind, t.node, [t.label()], ts,
                                 {"pid": t.pid, "start_time": getattr(t, "start_time", None), "signal": self.spec.signal}))
        return out

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        if self.spec.signal not in ("SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGSEGV"):
            return None
        pid, start = injection.detail["pid"], injection.detail.get("start_time")
        deadline = time.time() + 5
        while time.time() < deadline:
            if ctx.transport(injection.node).state(pid, start) in (None, "Z"):
                return None
            time.sleep(0.05)
        return f"pid {pid} still alive 5s after {self.spec.signal}"


class HangFault(Fault):
    kind = "process.hang"
    covers = ("software.hang",)
    Spec = HangSpec
    lasting = True

    def plan(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Action]:
        d = self.spec.duration
        out = []
        for t in targets:
            out.append(Action(t.node, f"arm lease: watchdog runs 'kill -s CONT {t.pid}' after {d:g}s or a stale lease "
                                      "(only while the pid is still that process: its start time is checked)", t.label()))
            out.append(Action(t.node, f"kill -s STOP {t.pid}", t.label()))
            out.append(Action(t.node, f"after {d:g}s: kill -s CONT {t.pid}", t.label()))
        return out

    def revert_argv(self, pid: int, start_time: int | None = None, python: str = "python3") -> list[str]:
        """What the lease's watchdog runs: SIGCONT to ``pid`` only while it is still the process that was
        stopped (its start time unchanged; through a pidfd where the node has them), so a late revert never
        reaches a stranger that reused the pid. Without a start time (a transport that cannot read it): kill."""
        if start_time is None:
            return ["kill", "-s", "CONT", str(int(pid))]
        return [python, "-I", "-c", CONT_IF_SAME, str(int(pid)), str(int(start_time))]

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """A pid (and its start time) continued by the same start-time check, with a Python of this node."""
        if len(revert) == 4 and revert[:3] == ["kill", "-s", "CONT"] and revert[3].isascii() and revert[3].isdigit():
            return ["kill", "-s", "CONT", str(int(revert[3]))]
        if (len(revert) == 6 and revert[1:4] == ["-I", "-c", CONT_IF_SAME]
                and all(a.isascii() and a.isdigit() for a in revert[4:])):
            return [journaled_python(revert[0], node), "-I", "-c", CONT_IF_SAME, str(int(revert[4])), str(int(revert[5]))]
        raise ValueError("not a process.hang revert chaoskit arms (SIGCONT of one pid, its start time checked)")

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """The node's job processes (its scope) that are stopped: a SIGSTOP nobody continued."""
        if not view.reachable:
            return []
        try:
            procs = view.transport.processes(node_wide=True)
        except InfraError:
            return []
        return [f"pid {p.pid} is stopped (SIGSTOP): {p.cmdline[:80]}" for p in procs if p.state == "T"]

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            start = getattr(t, "start_time", None)
            revert = self.revert_argv(t.pid, start, node_python(ctx, transport, t.node))
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=t.label())
            ts = transport.signal(t.pid, signal.SIGSTOP, start)
            out.append(Injection(fid, self.kind, t.node, [t.label()], ts, {"pid": t.pid, "start_time": start}))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        transport = ctx.transport(injection.node)
        pid, start = injection.detail["pid"], injection.detail.get("start_time")
        if transport.state(pid, start) not in (None, "Z"):
            transport.signal(pid, signal.SIGCONT, start)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        state = ctx.transport(injection.node).state(injection.detail["pid"], injection.detail.get("start_time"))
        return f"pid {injection.detail['pid']} is still stopped" if state == "T" else None


CONT_IF_SAME = nodeside.source("cont_if_same")
"""The hang's revert, ``python3 -I -c CONT_IF_SAME PID START_TIME`` (:mod:`chaoskit.nodeside.cont_if_same`): SIGCONT
only to the process that was stopped (its start time), never to a reused pid."""


