"""One request per node, concurrently, each with its own deadline: a silent node holds up nobody.

:func:`fan_out` runs one call per node on a bounded set of daemon threads and returns when every call has
answered, when ``enough`` says the answers so far suffice, or at the deadline, whichever comes first. A
call still running then is left to finish on its thread (its own transport deadline ends it) and is
reported as :class:`NoAnswer`; its result is never used. Every node gets its value or the exception its
call raised, in the order the calls were given: one node's failure is that node's, never the fan-out's.

It imports no transport: the selectors (and so ``validate``) use it. Over SSH transports, what writes one
request onto many agents' channels at once is :mod:`chaoskit.cluster.transports.ssh_many`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Mapping, TypeVar


__all__ = ["fan_out", "NoAnswer", "MAX_PARALLEL"]

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
