"""Out of memory (``mem.oom``): a rank's memory capped through its cgroup, so the kernel's OOM killer ends it.

A memory cgroup of chaoskit's own is made for each fault
(``chaoskit-oom-<node>-<token>``): on a cgroup v2 hierarchy with the memory
controller, ``memory.max`` (and ``memory.swap.max`` 0) at the hierarchy's root, as
``node.slow`` does; else on the v1 ``memory`` hierarchy, ``memory.limit_in_bytes``
(and ``memory.memsw.limit_in_bytes`` where swap accounting exists), nested under
the rank's own memory cgroup so any limit above it still holds. The rank's
processes (the worker and its descendants) go in, their original cgroups written
down on the node first.

Moving a process into a cgroup does not move the memory it already holds (v2
never does; v1 only with ``move_charge_at_immigrate``, left off), so a cap alone
only bites once the rank allocates more than the limit, which a steady training
step may never do. The pressure therefore comes from a *ballast*: a small
process started detached in the same cgroup, with ``oom_score_adj`` -999, that
fills the cgroup up to its limit one MiB at a time. When the limit is reached the
kernel's OOM killer picks the task of that cgroup with the highest badness, which
is the rank (the ballast's adjustment puts it last); the kill is the kernel's own,
logged as ``Memory cgroup out of memory: Killed process PID`` (the ``oom.kill``
event of :mod:`chaoskit.observe.kmsg`). The ballast stops once every rank process
is gone, or when it is the next one killed.

The revert (armed as a lease first, so a SIGKILLed controller still ends with the
node restored) stops the ballast, moves whatever is left in the cgroup back to
where it came from and removes the cgroup. Torchrun's restarted workers start
from the agent, outside the cgroup. Everything on the node is done by
:data:`MEMORY_TOOL` and :data:`BALLAST`, stdlib-only scripts run as ``python3 -I -c``
through the node's transport (:mod:`chaoskit.faults.node_tool`); their state file
(``oom-<token>.json``) and the ballast's folder (``oom-<token>.ballast``) lie in the
node's state folder, made with ``O_EXCL|O_NOFOLLOW``, the folder checked by every
command that uses it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chaoskit import nodeside
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.faults.api import Action, FaultContext, FaultSpec, Injection
from chaoskit.faults.node_tool import (
    COMMAND_TIMEOUT_S,
    CgroupTool,
    helper_argv,
    helper_source,
    parse_started,
    read_node_file,
    wait_node_file,
)
from chaoskit.nodeside import cgroups

__all__ = ["OomFault", "OomSpec", "MEMORY_TOOL", "BALLAST", "BALLAST_NAME", "CGROUP_PREFIX"]

STARTED_S = 10.0
"""How long inject waits for the ballast to say it is in the cgroup."""
STATE = "oom-"
"""The state file is ``<state folder>/oom-<token>.json``, the ballast's folder ``oom-<token>.ballast`` beside it."""
CGROUP_PREFIX = "chaoskit-oom-"
"""Every cgroup this fault makes is named ``chaoskit-oom-<node>-<token>`` (the kmsg probe reads the node from it)."""
MAX_LIMIT_MIB = 1 << 20
BALLAST_NAME = "ck-oom-ballast"
"""The ballast's process name (``comm``), as the kernel's OOM lines show it."""

MEMORY_TOOL = helper_source(nodeside.source("memory_tool"), cgroups, CONTROLLER="memory")
"""``python3 -I -c MEMORY_TOOL probe | cap ... | restore STATE | check STATE CGROUP`` (:mod:`chaoskit.nodeside.memory_tool`)."""

BALLAST = helper_source(nodeside.source("ballast"), BALLAST_NAME=BALLAST_NAME)
"""``python3 -I -c BALLAST CGROUP_PROCS DIR DURATION_S RANK_PID...`` (:mod:`chaoskit.nodeside.ballast`)."""


class OomSpec(FaultSpec):
    """Cap the selected ranks' memory at ``limit_mib`` and fill it: the kernel's OOM killer ends the rank."""

    kind: Literal["mem.oom"]
    limit_mib: int = Field(
        64, ge=1, le=MAX_LIMIT_MIB,
        description="Memory limit of the rank's chaoskit cgroup in MiB (memory newly charged after the fault: what "
                    "the rank already holds stays charged where it was). A ballast fills it; at the limit the "
                    "kernel's OOM killer ends the rank.",
    )
    duration: PositiveDuration = Field(
        30.0, description="How long the cgroup stays; the node removes it by itself after that (the kill comes within "
                          "moments of the fault).")


class OomFault(CgroupTool):
    kind = "mem.oom"
    covers = ("software.oom",)
    Spec = OomSpec
    tool_source, state_prefix, controller, cgroup_what = MEMORY_TOOL, STATE, "memory", "memory cap"

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, limit = self.spec.duration, self.spec.limit_mib << 20
        out = []
        for t in targets:
            label = t.label()
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <memory tool> restore "
                                      f"<state folder>/{STATE}<token>.json' "
                                      f"after {d:g}s or a stale lease", label))
            out.append(Action(t.node, f"mkdir <memory cgroup>/{CGROUP_PREFIX}{t.node}-<token>; cgroup v2: memory.max {limit}, "
                                      f"memory.swap.max 0 (v1, under the rank's own cgroup: memory.limit_in_bytes {limit}); "
                                      f"move {t.pid} and its descendants in (cgroup.procs), their cgroups written down", label))
            out.append(Action(t.node, f"start detached: python3 -I -c <ballast> (joins the cgroup, oom_score_adj -999, fills "
                                      f"it a MiB at a time): the kernel's OOM killer ends {t.pid}", label))
            out.append(Action(t.node, f"after {d:g}s: stop the ballast, move what is left back to its own cgroups; "
                                      "rmdir the chaoskit cgroup", label))
        return out

    def inject(self, ctx: FaultContext, targets: list[Any]) -> list[Injection]:
        injections = super().inject(ctx, targets)
        for injection in injections:  # the OOM kills in the cgroup it made are this run's (the kernel-log probe's claim)
            injection.oom_cgroup = injection.detail.get("cgroup")
        return injections

    def move_in(self, transport: Transport, python: str, t: ProcessTarget, pids: list[int], state: str,
                token: str) -> dict[str, Any]:
        return self.run_tool(transport, python, ["cap", f"{CGROUP_PREFIX}{t.node}-{token}", str(self.spec.limit_mib << 20),
                                                 state, _ballast_of(state), *map(str, pids)])

    def after_move(self, ctx: FaultContext, transport: Transport, python: str, t: ProcessTarget, state: str,
                   done: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        ballast = _ballast_of(state)
        transport.spawn_detached(helper_argv(python, BALLAST, f"{done['cgroup']}/cgroup.procs", ballast,
                                             f"{self.spec.duration:g}", *map(str, done["moved"])))
        started = wait_node_file(transport, f"{ballast}/started", STARTED_S)
        if started is None:
            raise InfraError(f"mem.oom: the ballast did not start on node {t.node} within {STARTED_S:g}s")
        started_at, ballast_pid = parse_started(started, "mem.oom: the ballast's started file", t.node)
        # the fault's time: the ranks' move into the capped cgroup (the node's clock, as the ballast's), where the
        # kernel may already kill a rank that touches memory; the ballast's start where the tool gave no time
        moved_at = done.get("t")
        t_fault = min(float(moved_at), started_at) if isinstance(moved_at, (int, float)) else started_at
        return t_fault, {"ballast": ballast, "ballast_pid": ballast_pid, "pids": done["moved"],
                            "limit_bytes": done["limit_bytes"], "rank_oom_score_adj_raised": bool(done["victim_first"])}

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        transport = ctx.transport(injection.node)
        injection.detail["ballast_exit"] = read_node_file(transport, f"{injection.detail['ballast']}/exited").strip() or None
        res = transport.run(injection.detail["revert"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            raise InfraError(f"mem.oom: restoring the cgroups on node {injection.node} failed: {res.stderr.strip()}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        problem = super().verify(ctx, injection)
        if problem is None:
            ctx.transport(injection.node).run(["rm", "-rf", injection.detail["ballast"]], COMMAND_TIMEOUT_S)
        return problem

    state_prefixes = (STATE,)

    @classmethod
    def own_cgroup(cls, name: str) -> bool:
        return name.startswith(CGROUP_PREFIX)


def _ballast_of(state: str) -> str:
    """The ballast's folder beside the state file: ``oom-<token>.ballast``."""
    return state[: -len(".json")] + ".ballast"
