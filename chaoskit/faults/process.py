"""Process faults: kill a training process, or hang it (SIGSTOP) for a while."""

from __future__ import annotations

import signal
import time
from typing import Literal

from pydantic import Field, field_validator

from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.core.durations import PositiveDuration
from chaoskit.faults.api import (
    Action,
    Fault,
    FaultContext,
    FaultSpec,
    Injection,
    signal_number,
)

__all__ = ["KillFault", "HangFault", "KillSpec", "HangSpec"]


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
    Spec = KillSpec

    def plan(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Action]:
        sig = self.spec.signal
        return [Action(t.node, f"kill -s {sig[3:]} {t.pid}", t.label()) for t in targets]

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        signum = signal_number(self.spec.signal)
        out = []
        for t in targets:
            ts = ctx.transport(t.node).signal(t.pid, signum)
            out.append(Injection(self.fault_id, self.kind, t.node, [t.label()], ts, {"pid": t.pid, "signal": self.spec.signal}))
        return out

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        if self.spec.signal not in ("SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGSEGV"):
            return None
        pid = injection.detail["pid"]
        deadline = time.time() + 5
        while time.time() < deadline:
            if not ctx.transport(injection.node).in_scope(pid):
                return None
            time.sleep(0.05)
        return f"pid {pid} still alive 5s after {self.spec.signal}"


class HangFault(Fault):
    kind = "process.hang"
    Spec = HangSpec
    lasting = True

    def plan(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Action]:
        d = self.spec.duration
        out = []
        for t in targets:
            out.append(Action(t.node, f"arm lease: watchdog runs 'kill -s CONT {t.pid}' after {d:g}s or a stale lease", t.label()))
            out.append(Action(t.node, f"kill -s STOP {t.pid}", t.label()))
            out.append(Action(t.node, f"after {d:g}s: kill -s CONT {t.pid}", t.label()))
        return out

    def revert_argv(self, pid: int) -> list[str]:
        return ["kill", "-s", "CONT", str(int(pid))]

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            ctx.arm(transport, fid, self.kind, self.revert_argv(t.pid), self.spec.duration, target=t.label())
            ts = transport.signal(t.pid, signal.SIGSTOP)
            out.append(Injection(fid, self.kind, t.node, [t.label()], ts, {"pid": t.pid}))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        transport = ctx.transport(injection.node)
        pid = injection.detail["pid"]
        if transport.in_scope(pid):
            transport.signal(pid, signal.SIGCONT)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        state = ctx.transport(injection.node).state(injection.detail["pid"])
        return f"pid {injection.detail['pid']} is still stopped" if state == "T" else None
