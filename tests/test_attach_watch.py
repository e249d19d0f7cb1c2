"""Attach discovery from the nodes' ``watch`` streams (issue 20): on the netns lab's real sshd nodes, with a job of
fake workers (``sleep`` with torchrun's environment, started by the test as a user's launcher would), an
:class:`AttachedJob` that uses the run's :class:`ProcessWatcher` reads a node's process table only when that
node's stream said something: looks in steady state read nothing, a killed worker makes the next look read its
node alone, and without a live stream every look reads every node as before."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytest_plugins = ["tests.netns_fixtures"]


class Bus:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def publish(self, event: dict) -> None:
        self.events.append(event)


class _Worker:
    """``sleep TAG`` with torchrun's environment under a stand-in torchrun agent (a shell named ``torchrun``, its
    parent, as attach requires); ``kill`` ends the worker, and the agent with it."""

    def __init__(self, lab, node: str, rank: int, run_id: str, tag: str) -> None:
        env = {"PATH": "/usr/bin:/bin", "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
               "RANK": str(rank), "LOCAL_RANK": "0", "GROUP_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
        assigns = " ".join(f"{k}={v}" for k, v in env.items())  # the worker's environment, not the agent's
        self.agent = subprocess.Popen(lab.exec_argv(node, ["bash", "-c", f"exec -a torchrun sh -c '{assigns} sleep {tag} & wait'"]),
                                      env={"PATH": "/usr/bin:/bin"}, start_new_session=True)
        children = Path(f"/proc/{self.agent.pid}/task/{self.agent.pid}/children")
        assert wait_until(lambda: children.exists() and children.read_text().split()
                          and Path(f"/proc/{children.read_text().split()[0]}/cmdline").read_bytes().startswith(b"sleep"), 10)
        self.pid = int(children.read_text().split()[0])

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self) -> None:
        self.agent.wait(timeout=10)

    def poll(self):
        return self.agent.poll()


@pytest.mark.slow
def test_attach_reads_a_nodes_table_only_after_its_watch_stream_spoke(netns_lab):
    from chaoskit.backends.inventory import InventoryBackend, InventorySpec
    from chaoskit.observe.probes import ProcessWatcher
    from chaoskit.scenario.model import Workload
    from chaoskit.workloads.attach import AttachedJob

    run_id = f"attach-watch-{secrets.token_hex(3)}"
    tag = str(600 + os.getpid() % 300)  # `sleep 6NN`: this test's job, matched by its command line
    workers = {n: _Worker(netns_lab, n, i, run_id, tag) for i, n in enumerate(("n0", "n1"))}
    cluster = InventoryBackend().open(InventorySpec(inventory=str(netns_lab.inventory_path)),
                                      Path(netns_lab.inventory_path).parent)
    watcher = None
    try:
        job = AttachedJob(cluster, Workload(launch="attach", process=f"^sleep {tag}$", run_id=run_id), Path("."), "t")
        assert wait_until(lambda: len(job.scan()) == 2, 15)  # found by reading every node (no watcher yet), two looks alike
        nodes = {n: cluster.inventory[n].conn for n in ("n0", "n1")}
        watcher = ProcessWatcher(Bus(), nodes, heartbeat_timeout=3.0)
        watcher.start()
        job.use_watch(watcher)
        assert wait_until(lambda: all(watcher.changes(n) is not None for n in nodes) and len(watcher.seen) == 2, 20)

        job.scan()  # the first look with the streams live reads each node once
        reads = job.reads
        for _ in range(5):
            found = job.scan()
            time.sleep(0.1)
        assert job.reads == reads  # steady state: nothing read, the job's workers still there
        assert sorted((w["node"], w["rank"]) for w in found) == [("n0", 0), ("n1", 1)] and job.running()

        gone = workers["n1"]
        gone.kill()
        gone.wait()
        assert wait_until(lambda: ("n1", gone.pid) not in watcher.seen, 10)
        found = job.scan()
        assert [(w["node"], w["rank"]) for w in found] == [("n0", 0)]
        assert job.reads == reads + 1  # n1 alone was read again
        job.scan()
        assert job.reads == reads + 1

        watcher.stop()  # no live stream: every look reads every node, as without a watcher
        assert wait_until(lambda: watcher.changes("n0") is None, 5)
        before = job.reads
        job.scan()
        job.scan()
        assert job.reads == before + 4

        workers["n0"].kill()
        workers["n0"].wait()
        assert wait_until(lambda: not job.running(), 5)  # the job is over once no process of it is left
    finally:
        if watcher is not None:
            watcher.stop()
        for w in workers.values():
            w.kill()
            if w.poll() is None:
                w.agent.kill()
            w.wait()
        cluster.teardown()
