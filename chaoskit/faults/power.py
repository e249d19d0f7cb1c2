"""Power faults: switch a node off with the inventory's power command, and back on.

Power commands run **on the controller** (they talk to a BMC, a PDU or, on the
netns lab, to the lab itself), never on the node, which is about to vanish. So
this fault's lease watchdog runs on the controller too, detached in its own
session: if the controller dies the watchdog still runs ``power.on`` when the
lease goes stale. A node whose inventory entry has no ``power.on`` can only be
switched off with an explicit ``allow_irreversible: true``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.power import run_power_command
from chaoskit.cluster.selectors import NodeTarget, node_targets
from chaoskit.core.durations import Duration
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.secrets import redact_argv, redact_text
from chaoskit.core.shell import shell_quote
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView

__all__ = ["PowerOffFault", "PowerOffSpec", "check_powered_on"]

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
    covers = ("hardware.host", "hardware.power")
    Spec = PowerOffSpec
    target_type = "node"
    revert_runs_on = "controller"
    revert_from_inventory = True

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        super().__init__(spec, fault_id)
        self.lasting = spec.duration is not None  # type: ignore[misc,attr-defined]

    def commands(self, target: NodeTarget) -> tuple[list[str], list[str] | None, list[str] | None, float]:
        power = target.info.power
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

    def unfit(self, node: Node) -> str | None:
        try:
            self.commands(NodeTarget(node))
        except ScenarioError as exc:
            return f"{exc.message} ({exc.hint})" if exc.hint else exc.message
        return None

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        for t in targets:
            _, _, status, timeout = self.commands(t)
            if status is not None and run_power_command(status, timeout, t.node).returncode != 0:
                raise InfraError(f"node {t.node} is already powered off (its power.status command says so)")

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        out = []
        for t in node_targets(ctx.inventory, targets):
            off, on, _, _ = self.commands(t)
            if self.lasting and on is not None:
                d = self.spec.duration
                out.append(Action(t.node, f"arm lease on the controller: watchdog runs '{shell_quote(redact_argv(on))}' after {d:g}s or a stale lease", t.node))
                out.append(Action(t.node, f"on the controller: {shell_quote(redact_argv(off))}", t.node))
                out.append(Action(t.node, f"after {d:g}s, on the controller: {shell_quote(redact_argv(on))}", t.node))
            else:
                out.append(Action(t.node, f"on the controller: {shell_quote(redact_argv(off))} (irreversible: the node stays off)", t.node))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            off, on, _, timeout = self.commands(t)
            if self.lasting and on is not None:
                ctx.arm(ctx.controller(t.node), fid, self.kind, on, self.spec.duration, target=t.node)
            res = run_power_command(off, timeout, t.node)
            ts = time.time()
            _drop_connection(t.info)
            if res.returncode != 0:
                if self.lasting and on is not None:
                    run_power_command(on, timeout, t.node)
                    ctx.leases.release(fid)
                raise InfraError(f"power off of node {t.node} failed (exit {res.returncode}): {redact_text(res.stderr.strip() or res.stdout.strip())}")
            out.append(Injection(fid, self.kind, t.node, [t.node], ts, {"on": on}))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        on = injection.detail.get("on")
        if on is None:
            return
        node = ctx.inventory[injection.node]
        res = run_power_command(on, node.power.timeout if node.power else BACK_ON_S, injection.node)
        _drop_connection(node)
        if res.returncode != 0:
            raise InfraError(f"power on of node {injection.node} failed (exit {res.returncode}): {redact_text(res.stderr.strip() or res.stdout.strip())}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        """Back on (power.status exits 0) and answering over its transport again."""
        if injection.detail.get("on") is None:
            return None
        return check_powered_on(ctx.inventory[injection.node], BACK_ON_S)

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Node | None = None) -> list[str]:
        """The node's ``power.on`` from the inventory (the journal's copy has its password redacted)."""
        if node is None or node.power is None or not node.power.on:
            raise ValueError("the inventory gives this node no power.on command; power it on by hand")
        return list(node.power.on)

    @classmethod
    def check_reverted(cls, transport: Any, revert: list[str], node: Node | None = None) -> str | None:
        return check_powered_on(node, BACK_ON_S) if node is not None else None

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """The node powered off, as its inventory's ``power.status`` tells (run on the controller)."""
        power = view.node.power
        if power is None or power.status is None:
            return []
        res = run_power_command(power.status, power.timeout, view.node.name)
        return [] if res.returncode == 0 else [f"powered off (power.status exit {res.returncode})"]


def check_powered_on(node: Node, timeout: float) -> str | None:
    """``None`` once the node is on (``power.status`` exits 0) and answers over its transport, else why not."""
    power = node.power
    end = time.time() + timeout
    problem = None
    while time.time() < end:
        if power is not None and power.status is not None:
            res = run_power_command(power.status, power.timeout, node.name)
            if res.returncode != 0:
                problem = f"node {node.name} is still off (power.status exit {res.returncode})"
                time.sleep(0.2)
                continue
        if node.conn is None:
            return None
        try:
            node.conn.ping(timeout=2.0)
            return None
        except InfraError as exc:
            problem = f"node {node.name} is on but does not answer: {exc}"
            _drop_connection(node)
            time.sleep(0.2)
    return problem


def _drop_connection(node: Node) -> None:
    """The node's sessions died with it; the next command reconnects."""
    if node.conn is not None:
        node.conn.close()
