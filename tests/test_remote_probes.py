"""Remote probes and clocks on real sshd nodes (the netns lab): a node's agent follows a log file
there and streams its lines; times from a node come back on the controller's clock.

The lab's nodes share this machine's file system, so the test writes the log file directly
and the node's agent (over SSH) reads it at the same path. They also share its clock: a per-node
clock is the one thing the lab cannot have, so the clock tests shift the agent's reported clock
on purpose (``CHAOSKIT_TEST_CLOCK_SKEW``) and check that chaoskit measures and removes the shift.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.conftest import wait_until

pytest_plugins = ["tests.netns_fixtures"]


class _Collector:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def publish(self, event: dict) -> None:
        with self.lock:
            self.events.append(event)

    def lines(self) -> list[int]:
        with self.lock:
            return [e["n"] for e in self.events]


def _probe(conn, path):
    from chaoskit.observe.probes import LogRegexProbe, RemoteLogProbe
    from chaoskit.observe.rules import LogRule

    bus = _Collector()
    rules = LogRegexProbe(bus, [LogRule.of(r"line (?P<n>\d+)$", "heartbeat")])
    return bus, RemoteLogProbe(rules, "n1", conn, str(path), retry_s=0.1)


def _write(path, numbers, mode="a"):
    with open(path, mode) as fh:
        for n in numbers:
            fh.write(f"line {n}\n")


@pytest.fixture
def n1(netns_lab):
    inventory = netns_lab.inventory()
    conn = inventory["n1"].conn
    conn.connect()
    yield conn
    inventory.close()


def test_lines_follow_rotation_truncation_and_a_dropped_connection_once_each(n1, tmp_path):
    path = tmp_path / "train.log"
    _write(path, range(0, 5), "w")
    bus, probe = _probe(n1, path)
    probe.start()
    try:
        assert wait_until(lambda: bus.lines() == list(range(5)), 30), bus.lines()
        _write(path, range(5, 10))
        # rotated (logrotate's default: rename, then a new file)
        os.rename(path, str(path) + ".1")
        _write(str(path) + ".1", [10])          # the writer still had the old file open
        _write(path, range(11, 15), "w")
        assert wait_until(lambda: bus.lines() == list(range(15)), 30), bus.lines()
        # truncated in place (copytruncate)
        _write(path, range(15, 18), "w")
        assert wait_until(lambda: bus.lines() == list(range(18)), 30), bus.lines()
        # the SSH connection drops: lines written meanwhile come once, after the reconnect
        n1.close()
        _write(path, range(18, 30))
        assert wait_until(lambda: bus.lines() == list(range(30)), 30), bus.lines()
        assert probe.streams >= 2
        # a partial line waits for its end
        with open(path, "a") as fh:
            fh.write("line 3")
        time.sleep(0.3)
        assert bus.lines() == list(range(30))
        with open(path, "a") as fh:
            fh.write("0\n")
        assert wait_until(lambda: bus.lines() == list(range(31)), 30), bus.lines()
    finally:
        probe.stop()
    assert not probe.is_alive()
    assert all(e["node"] == "n1" and e["kind"] == "heartbeat" for e in bus.events)


def test_a_file_that_appears_later_is_followed_from_its_start(n1, tmp_path):
    path = tmp_path / "late.log"
    bus, probe = _probe(n1, path)
    probe.start()
    try:
        time.sleep(0.3)
        _write(path, range(3), "w")
        assert wait_until(lambda: bus.lines() == [0, 1, 2], 30), bus.lines()
    finally:
        probe.stop()


def test_a_node_clock_seconds_off_is_measured_and_removed(netns_lab, monkeypatch, tmp_path):
    from chaoskit.cluster.clock import far_clocks, sync_clocks
    from chaoskit.cluster.transports.agent_transport import TEST_SKEW_ENV
    from chaoskit.cluster.transports.local import LocalTransport

    monkeypatch.setenv(TEST_SKEW_ENV, "n1=7.5")
    inventory = netns_lab.inventory()
    try:
        n0, n1 = inventory["n0"].conn, inventory["n1"].conn
        assert n1.ping() - time.time() == pytest.approx(7.5, abs=0.5)   # the shift is there
        clocks = sync_clocks({"n0": n0, "n1": n1, "here": LocalTransport("here")})  # as a run's preflight
        assert sorted(clocks) == ["n0", "n1"], "a transport on this machine's clock is not measured"
        c0, c1 = clocks["n0"], clocks["n1"]
        assert far_clocks(clocks) == f"n1 {c1.offset_s:+.3f}s", "n0 is this machine's clock, n1 7.5 s off"
        assert abs(c0.offset_s) <= c0.uncertainty_s + 0.005
        assert c1.offset_s == pytest.approx(7.5, abs=c1.uncertainty_s + 0.005)
        assert 0 < c1.uncertainty_s < 0.05
        # a command's end on n1 comes back on this machine's clock
        before = time.time()
        res = n1.run(["true"], 5)
        after = time.time()
        assert before - 0.05 <= res.finished_at <= after + 0.05
        # and so do the times of the lines n1's agent reads
        path = tmp_path / "skewed.log"
        bus, probe = _probe(n1, path)
        probe.start()
        try:
            written = time.time()
            _write(path, [1], "w")
            assert wait_until(lambda: bus.lines() == [1], 30)
        finally:
            probe.stop()
        [event] = bus.events
        assert written - 0.05 <= event["ts"] <= written + 2
        assert event["ts_uncertainty"] == pytest.approx(c1.uncertainty_s, abs=1e-6)
    finally:
        inventory.close()


def test_the_process_probe_sees_a_remote_worker_vanish_within_a_poll(netns_lab, n1):
    """Through n1's agent: only torchrun's workers travel (not every process with its environment),
    and a killed worker becomes ``process.gone`` within one poll plus a round trip."""
    import signal
    import subprocess

    from chaoskit.observe.probes import ProcessWatcher

    env = {"PATH": "/usr/bin:/bin", "TORCHELASTIC_RUN_ID": "someone-elses-job", "RANK": "3"}
    worker = subprocess.Popen(netns_lab.exec_argv("n1", ["sleep", "300"]), env=env, start_new_session=True)
    other = subprocess.Popen(netns_lab.exec_argv("n1", ["sleep", "301"]), start_new_session=True)
    bus = _Collector()
    watcher = ProcessWatcher(bus, {"n1": n1})
    try:
        assert wait_until(lambda: any(p.cmdline == "sleep 300" for p in n1.processes(workers_only=True)), 30)
        found = n1.processes(workers_only=True)
        assert [p.rank for p in found] == [3] and not any(p.cmdline == "sleep 301" for p in found)
        assert any(p.cmdline == "sleep 301" for p in n1.processes())
        watcher.start()
        assert wait_until(lambda: watcher.seen, 30)
        pid = next(iter(watcher.seen))[1]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        assert wait_until(lambda: bus.events, 30)
    finally:
        watcher.stop()
        for p in (worker, other):
            p.kill()
            p.wait()
    [gone] = bus.events
    assert gone["kind"] == "process.gone" and gone["rank"] == 3 and gone["node"] == "n1"
    assert gone["ts"] - killed <= 0.2  # one 50 ms poll and a round trip, with slack for a busy 2-core machine


def test_the_kernel_log_probe_on_ssh_nodes_sees_an_injected_xid_once_and_resumes_after_a_drop(netns_lab):
    """Each SSH node's agent streams its own /dev/kmsg. The lab's two nodes share this machine's kernel, so both
    send the line: it is published once, for the node that owns its PCI id; written while n1's connection is
    down, it still comes once, after the reconnect (the stream resumes after its last record's seq)."""
    import secrets

    from chaoskit.cluster.xid import format_xid, normalize_pci
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.kmsg import KmsgProbe
    from tests.test_kmsg_stream import need_kmsg, write_kmsg

    need_kmsg()
    inventory = netns_lab.inventory()
    for node in inventory.nodes:
        node.conn.connect()
        node.conn.sync_clock()  # as a run's preflight does: the records' times come with its uncertainty
    bus = EventBus()
    probe = KmsgProbe.for_nodes(bus, inventory.nodes)
    probe.retry_s = 0.1
    token = secrets.token_hex(4)
    n0_pci, n1_pci = (normalize_pci(inventory[n].gpu_pci[0]) for n in ("n0", "n1"))

    def xids():
        return [(e["node"], e["code"], e["pci"], e["injected"]) for e in bus.events
                if e["kind"] == "gpu.xid" and e.get("token") == token]

    probe.start()
    try:
        # deadlines are generous (each wait ends as soon as it holds): an SSH log-in on a loaded machine is slow
        assert probe.ready(60), probe.errors
        assert len({s.boot_id for s in probe.sources}) == 1  # one kernel for both nodes
        write_kmsg(format_xid(n1_pci, 79, token, pid=1, name="python"))
        assert wait_until(lambda: xids() == [("n1", 79, n1_pci, True)], 30), xids()
        inventory["n0"].conn.close()  # n0's stream drops; n1's still reads
        inventory["n1"].conn.close()  # and n1's: the line below is written while neither stream reads
        write_kmsg(format_xid(n0_pci, 48, token))
        assert wait_until(lambda: len(xids()) == 2, 60), (xids(), probe.errors)
        time.sleep(0.5)
        assert xids() == [("n1", 79, n1_pci, True), ("n0", 48, n0_pci, True)]
        assert min(probe.streams.values()) >= 2  # both resumed
        assert all(e.get("ts_uncertainty") is not None for e in bus.events if e.get("token") == token)
    finally:
        probe.stop()
        inventory.close()


def test_an_oom_kill_in_the_shared_kernel_is_attributed_to_the_ssh_node_whose_worker_it_was(netns_lab):
    """Issue 20's OOM case on SSH nodes sharing one kernel: the kill line names a pid; it is published once, for
    the node whose worker had it (n1's agent saw it in n1's namespace), never once per node. The line is written
    by the test (marked as such), for a real worker process of n1 that is then killed."""
    import subprocess
    import sys

    from chaoskit.observe.events import EventBus
    from chaoskit.observe.kmsg import KmsgProbe
    from tests.test_kmsg_stream import need_kmsg, write_kmsg

    need_kmsg()
    env = dict(os.environ, RANK="1", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="oom-test")
    worker = subprocess.Popen(netns_lab.exec_argv("n1", [sys.executable, "-c", "import time; time.sleep(60)"]), env=env)
    inventory = netns_lab.inventory()
    bus = EventBus()
    try:
        for node in inventory.nodes:
            node.conn.connect()
        probe = KmsgProbe.for_nodes(bus, inventory.nodes)
        probe.start()
        try:
            assert probe.ready(15), probe.errors
            assert wait_until(lambda: worker.pid in probe.known.get("n1", {}), 30)
            assert worker.pid not in probe.known.get("n0", {})
            write_kmsg(f"Memory cgroup out of memory: Killed process {worker.pid} (python) total-vm:1kB "
                       "(chaoskit test line: not a real OOM kill)")
            assert wait_until(lambda: any(e["kind"] == "oom.kill" for e in bus.events), 30)
            time.sleep(0.5)
        finally:
            probe.stop()
    finally:
        worker.kill()
        worker.wait()
        inventory.close()
    kills = [(e["node"], e["rank"], e["pid"]) for e in bus.events if e["kind"] == "oom.kill"]
    assert kills == [("n1", 1, worker.pid)]


def test_with_the_process_watcher_the_kernel_log_probe_polls_no_node_and_names_a_victim_already_gone(netns_lab):
    """In a run the kernel-log probe takes the nodes' workers from the process watcher (their ``watch`` streams)
    instead of reading every node's table twice a second: it reads none itself, and a kill line that arrives after
    the watcher has already reported the worker gone (pidfd exits come fast) is still the node's, with its rank."""
    import subprocess
    import sys

    from chaoskit.observe.events import EventBus
    from chaoskit.observe.kmsg import KmsgProbe
    from chaoskit.observe.probes import ProcessWatcher
    from tests.test_kmsg_stream import need_kmsg, write_kmsg

    need_kmsg()
    env = dict(os.environ, RANK="1", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="oom-watch-test")
    worker = subprocess.Popen(netns_lab.exec_argv("n1", [sys.executable, "-c", "import time; time.sleep(60)"]), env=env)
    inventory = netns_lab.inventory()
    bus = EventBus()
    watcher = probe = None
    try:
        for node in inventory.nodes:
            node.conn.connect()
        transports = {n.name: n.conn for n in inventory.nodes}
        watcher = ProcessWatcher(bus, transports)
        watcher.start()
        probe = KmsgProbe.for_nodes(bus, inventory.nodes, workers=watcher.ranks)
        probe.start()
        assert probe.ready(15), probe.errors
        assert wait_until(lambda: ("n1", worker.pid) in watcher.seen, 30)
        worker.kill()
        worker.wait()
        assert wait_until(lambda: any(e["kind"] == "process.gone" and e["pid"] == worker.pid for e in bus.events), 30)
        write_kmsg(f"Memory cgroup out of memory: Killed process {worker.pid} (python) total-vm:1kB "
                   "(chaoskit test line: not a real OOM kill)")
        assert wait_until(lambda: any(e["kind"] == "oom.kill" for e in bus.events), 30)
        time.sleep(0.5)
        assert probe.known == {}  # every node is watched: the probe read no table of its own
    finally:
        for t in (probe, watcher):
            if t is not None:
                t.stop()
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        inventory.close()
    kills = [(e["node"], e["rank"], e["pid"]) for e in bus.events if e["kind"] == "oom.kill"]
    assert kills == [("n1", 1, worker.pid)]
