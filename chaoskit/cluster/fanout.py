"""One request per node, concurrently, each with its own deadline: a silent node holds up nobody.

:func:`fan_out` runs one call per node on a bounded set of daemon threads and returns when every call has
answered, when ``enough`` says the answers so far suffice, or at the deadline, whichever comes first. A
call still running then is left to finish on its thread (its own transport deadline ends it) and is
reported as :class:`NoAnswer`; its result is never used. Every node gets its value or the exception its
call raised, in the order the calls were given: one node's failure is that node's, never the fan-out's.

Over SSH transports (:class:`~chaoskit.cluster.transports.ssh.SSHTransport`, the docker one included):
:func:`connect_all` connects every node at once; :func:`run_many` and :func:`ping_many` write one request
straight onto each running agent's channel (:class:`~chaoskit.cluster.transports.channel.Broadcast`: no
thread per node, one write each) and send the nodes without one through :func:`fan_out`, so that they
connect in parallel.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

from chaoskit.cluster.transports.api import CommandResult
from chaoskit.cluster.transports.channel import AgentGone, Broadcast, DeadlineMissed, OpFailed
from chaoskit.cluster.transports.ssh import GRACE_S, SSHTransport, checked_argv
from chaoskit.core.errors import InfraError, OutcomeUnknown

__all__ = ["fan_out", "NoAnswer", "MAX_PARALLEL", "connect_all", "run_many", "ping_many"]

T = TypeVar("T")

MAX_PARALLEL = 32
"""The most requests in flight at once in one fan-out."""


class NoAnswer(TimeoutError):
    """A node that did not answer within the fan-out's deadline."""


def fan_out(calls: Mapping[str, Callable[[], T]], deadline: float | None = None, *, max_workers: int = MAX_PARALLEL,
            enough: Callable[[dict[str, T | BaseException]], bool] | None = None) -> dict[str, T | BaseException]:
    """``{name: call()}`` for every call, run concurrently on at most ``max_workers`` threads; an exception a
    call raised is its value. ``deadline``: seconds from now after which calls still running (or not yet
    started) are :class:`NoAnswer`; ``None`` waits for all. ``enough(done)``: return early once it holds."""
    names = list(calls)
    done: dict[str, T | BaseException] = {}
    cond = threading.Condition()
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for name in names:
        todo.put(name)

    def worker() -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            with cond:
                if name in done:  # given up on already
                    continue
            try:
                value: T | BaseException = calls[name]()
            except BaseException as exc:  # noqa: BLE001 - the caller decides what a node's failure means
                value = exc
            with cond:
                done.setdefault(name, value)
                cond.notify_all()

    for _ in range(max(1, min(max_workers, len(names)))):
        threading.Thread(target=worker, daemon=True, name="chaoskit-fanout").start()
    end = None if deadline is None else time.monotonic() + deadline
    with cond:
        while len(done) < len(names) and not (enough is not None and enough(done)):
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            cond.wait(left)
        out = dict(done)
        for name in names:
            if name not in out:
                out[name] = NoAnswer(f"no answer within {deadline:g}s")
                done[name] = out[name]  # a late answer is not used
    return {name: out[name] for name in names}


def connect_all(transports: Iterable[SSHTransport], max_workers: int = 16) -> None:
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
    transports: Iterable[SSHTransport], argv: list[str], timeout: float = 30.0, max_workers: int = 64
) -> dict[str, CommandResult | BaseException]:
    """Run one command on many nodes at once; each node's result or exception.

    Nodes whose agent is up get their request written straight onto its channel
    (no thread per node, so the fan-out costs one write per node); the others go
    through a bounded pool of threads (:func:`fan_out`).
    """
    argv = checked_argv(argv)

    def result(t: SSHTransport, reply: dict[str, Any]) -> CommandResult | BaseException:
        if reply.get("timed_out"):
            return InfraError(f"{argv[0]}: no answer within {timeout:g}s on node {t.node}")
        return CommandResult(tuple(argv), reply["rc"], reply["stdout"], reply["stderr"], t.local_time(reply.get("t")))

    return _to_agents(transports, {"op": "run", "argv": argv, "timeout": timeout}, argv[0], timeout, result,
                      lambda t: t.run(argv, timeout), max_workers)


def ping_many(transports: Iterable[SSHTransport], timeout: float = 5.0) -> dict[str, float | BaseException]:
    """One agent round trip to each node at once; each node's clock (or exception)."""
    return _to_agents(transports, {"op": "ping"}, "ping", timeout, lambda t, reply: float(reply["t"]),
                      lambda t: t.ping(timeout))


def _to_agents(transports: Iterable[SSHTransport], fields: dict[str, Any], what: str, timeout: float,
               on_reply: Callable[[SSHTransport, dict[str, Any]], Any], fallback: Callable[[SSHTransport], Any],
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
