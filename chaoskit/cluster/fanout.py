"""One request per node, concurrently, each with its own deadline: a silent node holds up nobody.

:func:`fan_out` runs one call per node on a bounded pool of daemon threads (chaoskit's one such pool,
:class:`~chaoskit.core.threads.DaemonPool`) and returns when every call has answered, when ``enough`` says the
answers so far suffice, or at the deadline, whichever comes first. A call still running then is left to finish on its thread (its own transport deadline ends it) and is
reported as :class:`NoAnswer`; its result is never used. Every node gets its value or the exception its
call raised, in the order the calls were given: one node's failure is that node's, never the fan-out's.

It imports no transport: the selectors (and so ``validate``) use it. Over SSH transports, what writes one
request onto many agents' channels at once is :mod:`chaoskit.cluster.transports.ssh_many`.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from typing import Callable, Mapping, TypeVar

from chaoskit.core.threads import DaemonPool

__all__ = ["fan_out", "NoAnswer", "MAX_PARALLEL"]

T = TypeVar("T")

MAX_PARALLEL = 32
"""The most requests in flight at once in one fan-out."""


class NoAnswer(TimeoutError):
    """A node that did not answer within the fan-out's deadline."""


def fan_out(calls: Mapping[str, Callable[[], T]], deadline: float | None = None, *, max_workers: int = MAX_PARALLEL,
            enough: Callable[[dict[str, T | BaseException]], bool] | None = None) -> dict[str, T | BaseException]:
    """``{name: call()}`` for every call, run concurrently on a :class:`~chaoskit.core.threads.DaemonPool` of at
    most ``max_workers`` threads; an exception a call raised is its value. ``deadline``: seconds from now after
    which calls still running (or not yet started: those never start) are :class:`NoAnswer`; ``None`` waits for
    all. ``enough(done)``: return early once it holds."""
    names = list(calls)
    if not names:
        return {}
    done: dict[str, T | BaseException] = {}
    cond = threading.Condition()

    def answered(name: str, future: Future) -> None:
        if future.cancelled():  # given up on before it started
            return
        error = future.exception()
        with cond:
            done.setdefault(name, error if error is not None else future.result())
            cond.notify_all()

    pool = DaemonPool(max(1, min(max_workers, len(names))), "chaoskit-fanout")
    try:
        for name in names:
            pool.submit(calls[name]).add_done_callback(functools.partial(answered, name))
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
    finally:
        pool.shutdown(cancel_futures=True)  # calls still running finish on their daemon threads, unheard
    return {name: out[name] for name in names}
