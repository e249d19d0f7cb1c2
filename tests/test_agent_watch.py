"""The node agent's ``watch`` stream, run here as the node would run it, against real processes.

The agent program (``chaoskit/nodeside/agent.py``) is started as a subprocess speaking its JSON-lines protocol on
stdin/stdout, exactly what the SSH transport drives over its exec channel; the workers are real
processes with torchrun's environment (``sleep`` with ``TORCHELASTIC_RUN_ID`` and ``RANK``), stopped,
continued, killed and left as zombies by the test.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaoskit.nodeside import agent as node_agent

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

AGENT = Path(node_agent.__file__)
RUN_ID = "watched-run"


class Agent:
    """One agent process; its replies read on a thread into a queue."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-u", str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": str(AGENT.parents[3])})
        self.replies: queue.Queue = queue.Queue()
        self.hello = json.loads(self.proc.stdout.readline())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))

    def send(self, **req) -> None:
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def watch(self, rid: int = 7, **fields) -> None:
        self.send(id=rid, op="watch", heartbeat=0.3, interval=0.1, **fields)

    def changes_until(self, predicate, timeout: float = 10.0) -> list[dict]:
        """Every change of the stream until ``predicate(changes so far)`` holds."""
        got: list[dict] = []
        end = time.monotonic() + timeout
        while not predicate(got):
            left = end - time.monotonic()
            assert left > 0, f"timed out; changes so far: {got}"
            try:
                reply = self.replies.get(timeout=left)
            except queue.Empty:
                continue
            assert reply.get("ok"), reply
            got.extend(reply.get("changes", []))
        return got

    def messages(self, seconds: float) -> list[dict]:
        out, end = [], time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                out.append(self.replies.get(timeout=left))
            except queue.Empty:
                break
        return out

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def agent():
    a = Agent()
    yield a
    a.close()


@pytest.fixture
def workers():
    started: list[subprocess.Popen] = []

    def start(rank: int, run_id: str = RUN_ID, prefix: list[str] | None = None, **env: str) -> subprocess.Popen:
        proc = subprocess.Popen([*(prefix or []), "sleep", "300"], env={
            "PATH": "/usr/bin:/bin", "TORCHELASTIC_RUN_ID": run_id, "RANK": str(rank),
            "TORCHELASTIC_RESTART_COUNT": "2", **env})
        started.append(proc)
        return proc

    yield start
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()


def _ev(changes: list[dict], pid: int) -> list[str]:
    return [c["ev"] for c in changes if c["pid"] == pid]


SCOPE = {"job": {"run_id": RUN_ID}}


def test_a_worker_appearing_stopping_resuming_turning_zombie_and_exiting_is_reported_once_each(agent, workers):
    w = workers(3)
    agent.watch(scope=SCOPE)
    [appeared] = agent.changes_until(lambda c: _ev(c, w.pid))
    assert (appeared["ev"], appeared["rank"], appeared["restart_count"], appeared["run_id"]) == ("appeared", 3, 2, RUN_ID)
    assert abs(appeared["t"] - time.time()) < 5  # the node's clock

    os.kill(w.pid, signal.SIGSTOP)
    assert [c["ev"] for c in agent.changes_until(lambda c: c)] == ["stopped"]
    os.kill(w.pid, signal.SIGCONT)
    assert [c["ev"] for c in agent.changes_until(lambda c: c)] == ["resumed"]

    os.kill(w.pid, signal.SIGKILL)
    killed = time.time()
    [zombie] = agent.changes_until(lambda c: c)  # it is our child: a zombie until we reap it
    assert (zombie["ev"], zombie["exitcode"], zombie["signal"]) == ("zombie", -9, 9)
    assert zombie["t"] - killed < 0.25  # the pidfd says so at once, not at the next scan
    w.wait()
    [exited] = agent.changes_until(lambda c: c)
    assert (exited["ev"], exited["pid"], exited["exitcode"]) == ("exited", w.pid, -9)

    later = workers(4)
    changes = agent.changes_until(lambda c: _ev(c, later.pid))
    assert [c["ev"] for c in changes] == ["appeared"] and changes[0]["rank"] == 4


def test_only_the_scopes_workers_are_reported_not_another_runs_or_users(agent, workers):
    """A process of another run id, one of our run id under another uid, and a plain process are never
    reported; the job's own worker is."""
    need_setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or need_setpriv is None:
        pytest.skip("needs root and setpriv to run a worker as another user")
    other_run = workers(1, run_id="someone-elses-run")
    other_user = workers(1, prefix=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    plain = subprocess.Popen(["sleep", "300"])
    try:
        ours = workers(2)
        agent.watch(scope={"job": {"run_id": RUN_ID, "uid": os.geteuid()}})
        changes = agent.changes_until(lambda c: _ev(c, ours.pid))
        extra = agent.messages(0.6)  # a few scans and heartbeats more
        changes += [c for m in extra for c in m.get("changes", [])]
    finally:
        plain.kill()
        plain.wait()
    reported = {c["pid"] for c in changes}
    assert reported == {ours.pid}, (changes, other_run.pid, other_user.pid, plain.pid)
    assert any(m.get("changes") == [] for m in extra)  # heartbeats came meanwhile


def test_heartbeats_come_about_as_often_as_asked_and_are_numbered(agent, workers):
    agent.watch(scope=SCOPE)
    msgs = []
    end = time.monotonic() + 30  # a loaded machine delays the agent, never the rule: judged on the node's own times
    while len(msgs) < 6 and time.monotonic() < end:
        msgs += agent.messages(0.5)
    assert len(msgs) >= 6, msgs
    seqs = [m["seq"] for m in msgs]
    assert seqs == list(range(1, len(seqs) + 1))
    assert all(m.get("more") for m in msgs)
    beats = [m["t"] for m in msgs if not m["changes"]]
    gaps = sorted(b - a for a, b in zip(beats, beats[1:]))
    assert len(gaps) >= 3 and gaps[0] >= 0.3 * 0.9, gaps  # never more often than asked (one every 0.3 s)
    assert gaps[len(gaps) // 2] < 1.5, gaps  # and about as often: the median gap is not a multiple of it


def test_a_new_stream_resumes_from_what_the_controller_knew_without_losing_or_doubling(agent, workers):
    """The first stream sees A, B and C; it ends (its agent gone: a dropped connection). Meanwhile A exits, B is
    stopped, D starts. A new agent given what the controller knew reports exactly: A exited, B stopped, D
    appeared, once each, and nothing of C, which did not change."""
    a, b, c = workers(0), workers(1), workers(2)
    agent.watch(scope=SCOPE)
    first = agent.changes_until(lambda ch: {a.pid, b.pid, c.pid} <= {x["pid"] for x in ch})
    known = [[x["pid"], x["start"], x["state"]] for x in first if x["ev"] == "appeared"]
    agent.proc.kill()  # the connection dropped: this agent is gone
    agent.proc.wait()

    a.kill()
    a.wait()
    os.kill(b.pid, signal.SIGSTOP)
    d = workers(3)
    time.sleep(0.2)

    again = Agent()
    try:
        again.watch(scope=SCOPE, known=known)
        changes = again.changes_until(lambda ch: ch)
        changes += [x for m in again.messages(0.6) for x in m.get("changes", [])]
    finally:
        again.close()
    got = sorted((x["pid"], x["ev"]) for x in changes)
    assert got == sorted([(a.pid, "exited"), (b.pid, "stopped"), (d.pid, "appeared")]), changes


def test_cancel_ends_the_stream_with_a_last_message(agent, workers):
    agent.watch(rid=9, scope=SCOPE)
    agent.changes_until(lambda c: True)
    agent.send(id=10, op="cancel", stream=9)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        reply = agent.replies.get(timeout=5)
        if reply["id"] == 9 and not reply.get("more"):
            return
    pytest.fail("the stream did not end after cancel")


def test_a_process_seen_not_to_be_a_worker_is_not_read_again_while_it_lives(monkeypatch):
    """The workers' poll (every 50 ms on each node) reads a process it has seen not to be a worker once, and
    then, while its start time stays the same, skips it. (Its start time was compared as bytes with an int, so
    every process was read again on every poll.) The agent's functions run here in-process."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        read: list[int] = []
        real = node_agent._proc
        monkeypatch.setattr(node_agent, "_proc", lambda pid: (read.append(pid), real(pid))[1])
        deadline = time.monotonic() + 5
        while child.pid not in node_agent._NOT_WORKERS and time.monotonic() < deadline:
            node_agent.op_procs({"workers": True})  # its cmdline and environment read empty while it execs
            time.sleep(0.02)
        assert child.pid in node_agent._NOT_WORKERS
        read.clear()
        node_agent.op_procs({"workers": True})
        assert child.pid not in read
    finally:
        child.kill()
        child.wait()
