"""A bounded pool of daemon threads for calls to nodes that may never answer.

:class:`concurrent.futures.ThreadPoolExecutor` joins its worker threads when the interpreter exits, whatever
``shutdown(wait=False)`` said: one call that never returns (a node's transport wedged past its own deadline,
as a Ray driver's ``get`` can spin once its cluster is gone) then keeps chaoskit from ever exiting, and a CI
job from ever ending. :class:`DaemonPool` is the same bounded pool on daemon threads: a call left running
when the process ends is abandoned with it. It is chaoskit's one bounded pool: the leases' renewals, the process
watch and every fan-out to nodes (:func:`chaoskit.cluster.fanout.fan_out`) run on it.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

__all__ = ["DaemonPool"]


class DaemonPool:
    """At most ``max_workers`` daemon threads named ``name``, started as calls need them and reused.

    :meth:`submit` returns a :class:`~concurrent.futures.Future` as an executor's does; :meth:`shutdown` takes
    no new calls, cancels those not started yet (``cancel_futures``) and never waits for those running."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers, self.name = max_workers, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a thread of the pool; ``RuntimeError`` after :meth:`shutdown`."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: no new calls after shutdown")
            self._queue.put((future, fn, args))
            if self._idle:
                self._idle -= 1  # a thread that is free takes it
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, cancel_futures: bool = False) -> None:
        """Take no new calls; cancel the queued ones with ``cancel_futures``; the threads end once idle."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in range(threads):
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                with self._lock:
                    self._idle += 1
                continue
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the caller reads it from the future
                error = exc
            with self._lock:  # free before the caller hears: its next call finds this thread, not a new one
                self._idle += 1
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
