"""The daemon-thread pool behind the process watch and the lease renewals: a call that never returns never
keeps chaoskit from exiting (CI's pytest hung after its last test with a watch's poll spinning in a Ray driver's
``get`` whose cluster was gone: ``ThreadPoolExecutor`` joins its threads at exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from chaoskit.core.threads import DaemonPool

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def test_results_and_exceptions_come_back_through_the_futures():
    pool = DaemonPool(2, "t")
    ok, bad = pool.submit(lambda a, b: a + b, 2, 3), pool.submit(lambda: 1 / 0)
    assert ok.result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        bad.result(timeout=5)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="no new calls after shutdown"):
        pool.submit(lambda: None)


def test_at_most_max_workers_calls_run_at_once_and_queued_ones_can_be_cancelled():
    pool = DaemonPool(2, "t")
    release, running, peak, lock = threading.Event(), [], [0], threading.Lock()

    def call(i: int) -> int:
        with lock:
            running.append(i)
            peak[0] = max(peak[0], len(running))
        release.wait(10)
        with lock:
            running.remove(i)
        return i

    futures = [pool.submit(call, i) for i in range(5)]
    deadline = time.monotonic() + 5
    while len(running) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a third thread, if the pool made one, would have started by now
    assert peak[0] == 2 and sum(f.running() for f in futures) == 2
    pool.shutdown(cancel_futures=True)
    release.set()
    assert sorted(f.result(timeout=5) for f in futures[:2]) == [0, 1]
    assert all(f.cancelled() for f in futures[2:])


def test_threads_are_reused_when_free():
    pool = DaemonPool(4, "reuse")
    for i in range(20):
        assert pool.submit(lambda i=i: i).result(timeout=5) == i
    assert len([t for t in threading.enumerate() if t.name.startswith("reuse_")]) == 1
    pool.shutdown()


def test_a_process_watch_whose_node_never_answers_does_not_keep_chaoskit_from_exiting():
    """A real ProcessWatcher polls a node whose transport never answers. That transport is a stand-in: a Ray
    driver's get that spins past its deadline once its cluster is gone (what CI saw) cannot be made to happen
    on demand. The watch is stopped and the interpreter must exit; on a ThreadPoolExecutor it never did."""
    code = textwrap.dedent("""
        import threading, time
        from chaoskit.observe.events import EventBus
        from chaoskit.observe.probes import ProcessWatcher

        class Wedged:
            scope = None
            def processes(self, workers_only=False, node_wide=False):
                threading.Event().wait()  # never answers

        watcher = ProcessWatcher(EventBus(), {"n0": Wedged()}, interval=0.05, streams=False)
        watcher.start()
        time.sleep(0.3)
        watcher.stop()
        print("stopped", flush=True)
    """)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "stopped\n", proc.stderr
    assert time.monotonic() - t0 < 30


def test_a_fan_out_runs_on_the_pool_and_a_silent_node_holds_up_nobody():
    """fan_out, the one request per node of selectors, faults, doctor and audit, runs on a DaemonPool: each node
    gets its value or its exception in the order given, a node that never answers is NoAnswer at the deadline,
    calls not started by then never start, and at most max_workers run at once."""
    from chaoskit.cluster.fanout import NoAnswer, fan_out

    wedged, started, lock, running, peak = threading.Event(), [], threading.Lock(), [0], [0]

    def node(name: str, value):
        def call():
            with lock:
                started.append(name)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            try:
                if name == "silent":
                    wedged.wait(30)
                if isinstance(value, BaseException):
                    raise value
                time.sleep(0.05)
                return value
            finally:
                with lock:
                    running[0] -= 1
        return call

    calls = {"a": node("a", 1), "silent": node("silent", 2), "b": node("b", ZeroDivisionError("b")), "c": node("c", 3)}
    t0 = time.monotonic()
    out = fan_out(calls, deadline=1.0, max_workers=2)
    assert time.monotonic() - t0 < 3
    assert list(out) == ["a", "silent", "b", "c"]
    assert out["a"] == 1 and out["c"] == 3 and isinstance(out["b"], ZeroDivisionError)
    assert isinstance(out["silent"], NoAnswer) and peak[0] == 2
    assert any(t.name.startswith("chaoskit-fanout_") and t.daemon for t in threading.enumerate())

    late = {"first": node("silent", 0), "never": node("never", 1)}
    out = fan_out(late, deadline=0.3, max_workers=1)
    assert isinstance(out["first"], NoAnswer) and isinstance(out["never"], NoAnswer)
    time.sleep(0.2)
    assert "never" not in started  # given up on before it started: it never runs
    wedged.set()
    assert fan_out({}) == {}
    assert fan_out({"x": lambda: 7}, enough=lambda done: "x" in done) == {"x": 7}
