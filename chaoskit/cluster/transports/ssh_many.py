"""Many agent transports at once (:class:`~chaoskit.cluster.transports.agent_transport.AgentTransport`: SSH and docker).

:func:`connect_all` connects every node at once; :func:`run_many` and :func:`ping_many` write one request
straight onto each running agent's channel (:class:`~chaoskit.cluster.transports.channel.Broadcast`: no
thread per node, one write each) and send the nodes without one through :func:`~chaoskit.cluster.fanout.fan_out`,
so that they connect in parallel.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from chaoskit.cluster.fanout import fan_out
from chaoskit.cluster.transports.api import CommandResult
from chaoskit.cluster.transports.channel import AgentGone, Broadcast, DeadlineMissed, OpFailed
from chaoskit.cluster.transports.agent_transport import GRACE_S, AgentTransport, checked_argv
from chaoskit.core.errors import InfraError, OutcomeUnknown

__all__ = ["connect_all", "run_many", "ping_many"]


def connect_all(transports: Iterable[AgentTransport], max_workers: int = 16) -> None:
    """Connect to every node (host keys verified, agents started) in parallel.

    Raise the first :class:`InfraError` (in the given order) after all attempts finished.
    """
    ts = list(transports)
    results = fan_out({t.node: t.connect for t in ts}, max_workers=max_workers)
    for t in ts:
        res = results[t.node]
        if isinstance(res, BaseException):
            raise res


def run_many(
    transports: Iterable[AgentTransport], argv: list[str], timeout: float = 30.0, max_workers: int = 64
) -> dict[str, CommandResult | BaseException]:
    """Run one command on many nodes at once; each node's result or exception.

    Nodes whose agent is up get their request written straight onto its channel
    (no thread per node, so the fan-out costs one write per node); the others go
    through a bounded pool of threads (:func:`fan_out`).
    """
    argv = checked_argv(argv)

    def result(t: AgentTransport, reply: dict[str, Any]) -> CommandResult | BaseException:
        if reply.get("timed_out"):
            return InfraError(f"{argv[0]}: no answer within {timeout:g}s on node {t.node}")
        return CommandResult(tuple(argv), reply["rc"], reply["stdout"], reply["stderr"], t.local_time(reply.get("t")))

    return _to_agents(transports, {"op": "run", "argv": argv, "timeout": timeout}, argv[0], timeout, result,
                      lambda t: t.run(argv, timeout), max_workers)


def ping_many(transports: Iterable[AgentTransport], timeout: float = 5.0) -> dict[str, float | BaseException]:
    """One agent round trip to each node at once; each node's clock (or exception)."""
    return _to_agents(transports, {"op": "ping"}, "ping", timeout, lambda t, reply: float(reply["t"]),
                      lambda t: t.ping(timeout))


def _to_agents(transports: Iterable[AgentTransport], fields: dict[str, Any], what: str, timeout: float,
               on_reply: Callable[[AgentTransport, dict[str, Any]], Any], fallback: Callable[[AgentTransport], Any],
               max_workers: int = 64) -> dict[str, Any]:
    """One request to every node: one :class:`Broadcast` onto the running agents' channels; nodes without a
    running agent (not connected yet, agent restarting, exec mode) go through ``fallback`` on a bounded pool
    of threads, so they connect in parallel. ``what`` names the request in errors."""
    ts = list(transports)
    running = {t.node: agent for t in ts if (agent := t.running_agent) is not None}
    broadcast = Broadcast(fields, running)
    slow = [t for t in ts if t.node not in running or t.node in broadcast.unsent]
    end = time.monotonic() + timeout + GRACE_S
    pooled = fan_out({t.node: (lambda t=t: fallback(t)) for t in slow}, max_workers=max_workers) if slow else {}
    by_node = {t.node: t for t in ts}
    out: dict[str, Any] = {}
    for node, reply in broadcast.collect(end - time.monotonic()).items():
        if isinstance(reply, DeadlineMissed):
            out[node] = InfraError(f"{what}: no answer from node {node} within {timeout:g}s")
        elif isinstance(reply, OpFailed):
            out[node] = InfraError(f"{what} on node {node} failed: {reply}")
        elif isinstance(reply, AgentGone):
            out[node] = OutcomeUnknown(f"{what} on node {node}: the agent went away while it ran ({reply}); its outcome is unknown")
        else:
            out[node] = on_reply(by_node[node], reply)
    out.update(pooled)
    return {t.node: out[t.node] for t in ts}
