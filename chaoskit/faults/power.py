"""Power faults: switch a node off with the inventory's power command, and back on.

Power commands run **on the controller** (they talk to a BMC, a PDU or, on the
netns lab, to the lab itself), never on the node, which is about to vanish. So
this fault's lease watchdog runs on the controller too, detached in its own
session: if the controller dies the watchdog still runs ``power.on`` when the
lease goes stale. A node whose inventory entry has no ``power.on`` can only be
switched off with an explicit ``allow_irreversible: true``.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import InfraError, ScenarioError
from chaoskit.faults.api import Action, Fault, FaultSpec, Injection
from chaoskit.scenario.durations import Duration

if TYPE_CHECKING:  # pragma: no cover
    from chaoskit.cluster.selectors import NodeTarget
    from chaoskit.runner import RunContext

__all__ = ["PowerOffFault", "PowerOffSpec", "run_power_command"]

BACK_ON_S = 60.0
"""How long :meth:`PowerOffFault.verify` waits for a node to answer again after power on."""


class PowerOffSpec(FaultSpec):
    """Power the selected nodes off; power them back on after ``duration``."""

    kind: Literal["node.poweroff"]
    duration: Duration | None = Field(None, description="How long the node stays off; its power.on command brings it back.")
    allow_irreversible: bool = Field(
        False, description="Power off even when the node cannot be powered back on by chaoskit (no duration or no power.on)."
    )

    @field_validator("duration")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("duration must be greater than zero")
        return v

    @model_validator(mode="after")
    def _revertible(self) -> "PowerOffSpec":
        if self.duration is None and not self.allow_irreversible:
            raise ValueError("give duration (how long the node stays off) or, to leave it off, allow_irreversible: true")
        return self


class PowerOffFault(Fault):
    kind = "node.poweroff"
    Spec = PowerOffSpec
    target_type: ClassVar[str] = "node"
    revert_runs_on: ClassVar[str] = "controller"
    """Where the revert command runs (rollback reads it): the controller, not the node."""

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        super().__init__(spec, fault_id)
        self.lasting = spec.duration is not None  # type: ignore[misc,attr-defined]

    def commands(self, target: "NodeTarget") -> tuple[list[str], list[str] | None, list[str] | None, float]:
        power = getattr(target.info, "power", None)
        if power is None or not power.off:
            raise ScenarioError(
                f"node {target.node} has no power.off command in the inventory",
                hint="add power: {off: ..., on: ..., status: ...} to the node (e.g. ipmitool against its BMC)",
            )
        if power.on is None and not self.spec.allow_irreversible:
            raise ScenarioError(
                f"node {target.node} has no power.on command, so chaoskit could not bring it back",
                hint="add power.on to the inventory, or set allow_irreversible: true on the fault",
            )
        return power.off, power.on, power.status, power.timeout

    def preflight(self, ctx: "RunContext", targets: list["NodeTarget"]) -> None:
        for t in targets:
            _, _, status, timeout = self.commands(t)
            if status is not None and run_power_command(status, timeout, t.node).returncode != 0:
                raise InfraError(f"node {t.node} is already powered off (its power.status command says so)")

    def plan(self, ctx: "RunContext", targets: list["NodeTarget"]) -> list[Action]:
        from chaoskit.faults.network import as_node_targets

        out = []
        for t in as_node_targets(ctx, targets):
            off, on, _, _ = self.commands(t)
            if self.lasting and on is not None:
                d = self.spec.duration
                out.append(Action(t.node, f"arm lease on the controller: watchdog runs '{_show(on)}' after {d:g}s or a stale lease", t.node))
                out.append(Action(t.node, f"on the controller: {_show(off)}", t.node))
                out.append(Action(t.node, f"after {d:g}s, on the controller: {_show(on)}", t.node))
            else:
                out.append(Action(t.node, f"on the controller: {_show(off)} (irreversible: the node stays off)", t.node))
        return out

    def inject(self, ctx: "RunContext", targets: list["NodeTarget"]) -> list[Injection]:
        from chaoskit.cluster.transports.local import LocalTransport

        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            off, on, _, timeout = self.commands(t)
            if self.lasting and on is not None:
                ctx.arm(LocalTransport(t.node), fid, self.kind, on, self.spec.duration, target=t.node)
            res = run_power_command(off, timeout, t.node)
            ts = time.time()
            _drop_connection(t.info)
            if res.returncode != 0:
                if self.lasting and on is not None:
                    run_power_command(on, timeout, t.node)
                    ctx.leases.release(fid)
                raise InfraError(f"power off of node {t.node} failed (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
            out.append(Injection(fid, self.kind, t.node, [t.node], ts, {"on": on}))
        return out

    def revert(self, ctx: "RunContext", injection: Injection) -> None:
        on = injection.detail.get("on")
        if on is None:
            return
        node = ctx.inventory[injection.node]
        res = run_power_command(on, getattr(node.power, "timeout", BACK_ON_S), injection.node)
        _drop_connection(node)
        if res.returncode != 0:
            raise InfraError(f"power on of node {injection.node} failed (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}")

    def verify(self, ctx: "RunContext", injection: Injection) -> str | None:
        """Back on (power.status exits 0) and answering over its transport again."""
        if injection.detail.get("on") is None:
            return None
        return check_powered_on(ctx.inventory[injection.node], BACK_ON_S)

    @classmethod
    def check_reverted(cls, transport: Any, revert: list[str], node: Any = None) -> str | None:
        return check_powered_on(node, BACK_ON_S) if node is not None else None


def check_powered_on(node: Any, timeout: float) -> str | None:
    power = getattr(node, "power", None)
    end = time.time() + timeout
    problem = None
    while time.time() < end:
        if power is not None and power.status is not None:
            res = run_power_command(power.status, power.timeout, node.name)
            if res.returncode != 0:
                problem = f"node {node.name} is still off (power.status exit {res.returncode})"
                time.sleep(0.2)
                continue
        ping = getattr(node.conn, "ping", None)
        if ping is None:
            return None
        try:
            ping(timeout=2.0)
            return None
        except InfraError as exc:
            problem = f"node {node.name} is on but does not answer: {exc}"
            _drop_connection(node)
            time.sleep(0.2)
    return problem


def run_power_command(argv: list[str], timeout: float, node: str) -> subprocess.CompletedProcess[str]:
    """Run a power command on the controller, without a shell, with a hard deadline."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InfraError(f"power command for node {node}: {argv[0]}: not found on the controller") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"power command for node {node} did not finish within {timeout:g}s: {_show(argv)}") from None


def _drop_connection(node: Any) -> None:
    """The node's sessions died with it; the next command reconnects."""
    close = getattr(getattr(node, "conn", None), "close", None)
    if close is not None:
        close()


def _show(argv: list[str]) -> str:
    from chaoskit.cluster.transports.api import shell_quote

    return shell_quote(argv)
