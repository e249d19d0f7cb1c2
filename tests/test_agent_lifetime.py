"""How long a node's agent lives: as long as its controller is heard, and no longer.

The agents here are real processes running the program a node runs (:func:`agent_program`), spoken to over a
real socket the way the SSH transport speaks to one over its channel; nothing is mocked. The idle limit and the
keepalive period are shortened so that the test waits seconds, not the minute a node's agent waits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from chaoskit.cluster.transports import channel
from chaoskit.cluster.transports.channel import (
    AGENT_TAG, AgentChannel, agent_program, boot_argv, controller_alive, controller_tag, parse_controller_tag,
)
from chaoskit.nodeside.agent import BOOT


class _Socket:
    """A socket as the channel's reader wants it (the docker transport's exec socket has the same face)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        self.sock.close()


def _agent(idle_exit_s: float) -> tuple[subprocess.Popen, socket.socket]:
    mine, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-I", "-u", "-c", BOOT, AGENT_TAG, controller_tag()],
                            stdin=theirs, stdout=theirs)
    theirs.close()
    return proc, mine


def test_an_agent_that_hears_nothing_ends_itself():
    proc, sock = _agent(1.0)
    try:
        program = agent_program(None, idle_exit_s=1.0)
        t0 = time.monotonic()
        sock.sendall(f"{len(program)}\n".encode() + program)
        hello = json.loads(sock.makefile("rb").readline())
        assert hello["hello"] == 1
        assert proc.wait(timeout=15) == 0  # the connection is still open: only the silence ends it
        assert time.monotonic() - t0 >= 1.0
    finally:
        proc.kill()
        sock.close()


def test_a_live_controller_keeps_its_agent_heard(monkeypatch):
    monkeypatch.setattr(channel, "KEEPALIVE_S", 0.2)
    proc, sock = _agent(1.5)
    agent = AgentChannel.over(_Socket(sock), 15.0, "n1", agent_program(None, idle_exit_s=1.5))
    try:
        time.sleep(4.0)  # well past the agent's idle limit, with nothing asked of it
        assert proc.poll() is None, "the agent ended although its controller kept sending keepalives"
        assert agent.request({"op": "ping"}, 10.0)["ok"]
    finally:
        agent.close()
        proc.wait(timeout=15)  # EOF: it ends at once


def test_an_agents_command_line_names_its_controller():
    argv = boot_argv("/usr/bin/python3")
    assert argv[:5] == ["/usr/bin/python3", "-I", "-u", "-c", BOOT] and argv[5] == AGENT_TAG
    host, pid, start = parse_controller_tag(" ".join(argv))
    assert pid == os.getpid() and start > 0
    assert controller_alive(host, pid, start) is True
    assert controller_alive(host, pid, start + 1) is False  # the pid used again by another process
    assert controller_alive(host + "-elsewhere", pid, start) is None  # another machine's: not ours to judge
    gone = subprocess.Popen(["sleep", "30"])
    tag = controller_tag(gone.pid)
    gone.kill()
    gone.wait()
    assert controller_alive(*parse_controller_tag(f"python3 -I -u -c {BOOT} {AGENT_TAG} {tag}")) is False
    assert parse_controller_tag(f"python3 -c {BOOT}") is None
    assert parse_controller_tag(f"vim {AGENT_TAG} {tag}") is None  # the tag alone, not after the boot line
