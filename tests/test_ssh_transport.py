"""The SSH transport against real sshd servers in the netns lab: host keys, the
agent fast path, deadlines, agent restarts, the exec fallback, fan-out."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from chaoskit.core.errors import InfraError, TargetGone

pytest_plugins = ["tests.netns_fixtures"]


def wait_until(*args, **kwargs):
    from tests.netns_fixtures import (
        wait_until,  # imported by pytest as a plugin first, so asserts are rewritten
    )

    return wait_until(*args, **kwargs)


def ns_run(*args, **kwargs):
    from tests.netns_fixtures import ns_run

    return ns_run(*args, **kwargs)


def transport(lab, node="n0", **kwargs):
    from chaoskit.cluster.transports.ssh import SSHTransport

    opts = dict(key_file=lab.key_path, known_hosts=lab.known_hosts_path, process_scope="netns",
                workdir=str(lab.node_dir(node) / "work"), connect_timeout=5)
    opts.update(kwargs)
    return SSHTransport(node, lab.mgmt_address(node), **opts)


def host_fingerprint(lab, node: str) -> str:
    pub = lab.node_dir(node) / "ssh_host_ed25519_key.pub"
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def agent_pids(lab, node: str) -> list[int]:
    out = []
    for pid in lab.pids(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"chaoskit-agent" in fh.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def test_an_unknown_host_key_is_refused_naming_host_and_fingerprint(netns_lab, tmp_path):
    from chaoskit.cluster.transports.ssh import HostKeyError

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        transport(netns_lab, known_hosts=empty).connect()
    text = str(info.value)
    assert "unknown host key for node n0 (10.77." in text
    assert host_fingerprint(netns_lab, "n0") in text
    assert "ssh-ed25519" in text and info.value.exit_code == 3


def test_a_changed_host_key_is_refused(netns_lab, tmp_path):
    from chaoskit.cluster.transports.ssh import HostKeyError

    other = (netns_lab.node_dir("n1") / "ssh_host_ed25519_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{netns_lab.mgmt_address('n0')} {other[0]} {other[1]}\n")
    with pytest.raises(HostKeyError) as info:
        transport(netns_lab, known_hosts=wrong).connect()
    assert "does not match" in str(info.value)
    assert host_fingerprint(netns_lab, "n0") in str(info.value) and host_fingerprint(netns_lab, "n1") in str(info.value)


def test_trust_on_first_use_pins_the_key(netns_lab, tmp_path):
    pinned = tmp_path / "pinned_hosts"
    first = transport(netns_lab, known_hosts=pinned, trust_on_first_use=True)
    with first:
        assert first.ping() > 0
    line = pinned.read_text().split()
    assert line[0] == netns_lab.mgmt_address("n0") and line[1] == "ssh-ed25519"
    assert line[2] == (netns_lab.node_dir("n0") / "ssh_host_ed25519_key.pub").read_text().split()[1]
    with transport(netns_lab, known_hosts=pinned) as again:  # RejectPolicy now accepts the pinned key
        assert again.ping() > 0


def test_commands_travel_over_the_agent_with_exit_codes_and_node_time(lab_inventory):
    t = lab_inventory["n0"].conn
    before = time.time()
    res = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 5)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert before <= res.finished_at <= time.time()
    assert t.mode == "agent" and t._agent is not None
    lat = []
    for _ in range(50):
        start = time.perf_counter()
        t.ping()
        lat.append(time.perf_counter() - start)
    assert sorted(lat)[25] < 0.02, f"agent round trip p50 {sorted(lat)[25] * 1e3:.2f} ms"
    with pytest.raises(InfraError, match="command not found on node n0"):
        t.run(["no-such-command-chaoskit"], 5)
    assert t._client.get_transport().remote_cipher == "aes128-gcm@openssh.com"  # AEAD offered first


def test_replies_larger_than_the_channel_window_keep_flowing(lab_inventory):
    # 1 MiB of NULs is 6 MiB of JSON, three times paramiko's 2 MiB window: the
    # controller must tell the server there is room again as it consumes replies
    t = lab_inventory["n0"].conn
    for _ in range(2):
        res = t.run(["head", "-c", "3000000", "/dev/zero"], 20)
        assert (res.returncode, len(res.stdout)) == (0, 1 << 20)
    assert t.ping() > 0


def test_a_command_past_its_deadline_is_killed_on_the_node(netns_lab, lab_inventory):
    t = lab_inventory["n0"].conn
    start = time.time()
    with pytest.raises(InfraError, match="no answer within 0.5s on node n0"):
        t.run(["sleep", "7.25"], 0.5)
    assert time.time() - start < 2.5
    assert wait_until(lambda: "sleep 7.25" not in ns_run(netns_lab, "n0", "ps", "-eo", "args").stdout, 3)


def test_the_client_deadline_holds_when_the_agent_hangs_and_the_agent_is_restarted(netns_lab):
    t = transport(netns_lab)
    with t:
        old = t._agent.hello["pid"]
        os.kill(old, signal.SIGSTOP)  # the agent is wedged: the socket stays open, no answer comes
        try:
            start = time.time()
            with pytest.raises(InfraError, match="no answer from node n0 within 0.5s"):
                t.ping(timeout=0.5)
            assert time.time() - start < 0.5 + 2.0 + 0.5
        finally:
            os.kill(old, signal.SIGKILL)
        assert t.ping() > 0
        assert t._agent.hello["pid"] != old


def test_a_dead_agent_is_restarted_transparently(netns_lab):
    t = transport(netns_lab)
    with t:
        first = t._agent.hello["pid"]
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: t._agent.dead, 3)
        assert t.run(["true"], 5).returncode == 0
        assert t._agent.hello["pid"] != first
    assert wait_until(lambda: not agent_pids(netns_lab, "n0") or all(p != first for p in agent_pids(netns_lab, "n0")), 3)


def test_exec_fallback_runs_one_session_per_command(netns_lab):
    t = transport(netns_lab, use_agent=False)
    with t:
        assert t.mode == "exec" and t._agent is None
        res = t.run(["sh", "-c", "echo hi; exit 4"], 5)
        assert (res.returncode, res.stdout) == (4, "hi\n")
        names = [p.cmdline for p in t.processes()]
        assert any("sshd" in c for c in names)
        with pytest.raises(InfraError, match="no answer within 0.5s"):
            t.run(["sleep", "5"], 0.5)


def test_without_python_on_the_node_the_transport_falls_back_to_exec(netns_lab):
    t = transport(netns_lab, python="/nonexistent/python3")
    with t:
        res = t.run(["sh", "-c", "echo fallback"], 5)
        assert res.stdout == "fallback\n"
        assert t.mode == "exec" and any("one exec per command" in n for n in t.notes)
        assert t.run(["true"], 5).returncode == 0


def test_processes_are_scoped_to_the_node_and_signals_outside_are_refused(netns_lab, lab_inventory):
    t0, t1 = lab_inventory["n0"].conn, lab_inventory["n1"].conn
    mine = {p.pid for p in t0.processes()}
    assert mine
    stray = [p for p in mine - set(netns_lab.pids("n0")) if os.path.exists(f"/proc/{p}")]  # short-lived ones may be gone
    assert not stray
    assert not mine & {p.pid for p in t1.processes()}
    with pytest.raises(InfraError, match="refusing to signal pid"):
        t0.signal(os.getpid(), signal.SIGTERM)
    pid = t0.spawn_detached(["sleep", "30"])
    assert t0.in_scope(pid) and not t1.in_scope(pid)
    assert t0.state(pid) in ("S", "R")
    t0.signal(pid, signal.SIGKILL)
    assert wait_until(lambda: not t0.in_scope(pid), 3)


def test_a_process_gone_before_its_signal_is_told_apart_from_one_out_of_scope(netns_lab, lab_inventory):
    """The agent says a selected process exited before its signal (the runner then looks for the target again
    within a trigger's window: the agents stopping the old world's workers in a recovery); a process outside the
    scope stays a plain refusal."""
    t0 = lab_inventory["n0"].conn
    pid = t0.spawn_detached(["sleep", "30"])
    start = next(p.start_time for p in t0.processes() if p.pid == pid)
    t0.signal(pid, signal.SIGKILL, start)
    assert wait_until(lambda: t0.state(pid) in (None, "Z"), 3)
    with pytest.raises(TargetGone, match="exited before it was signalled"):
        t0.signal(pid, signal.SIGTERM, start)
    with pytest.raises(InfraError, match="refusing to signal pid") as refused:
        t0.signal(os.getpid(), signal.SIGTERM)
    assert not isinstance(refused.value, TargetGone)


def test_a_fan_out_to_nodes_not_connected_yet_connects_them_in_parallel(netns_lab):
    from chaoskit.cluster.transports.ssh_many import ping_many, run_many
    from chaoskit.cluster.transports.ssh import SSHTransport

    spans: dict[str, tuple[float, float]] = {}

    class Timed(SSHTransport):
        def _open_client(self):
            start = time.monotonic()
            try:
                return super()._open_client()
            finally:
                spans[self.node] = (start, time.monotonic())

    conns = [Timed(node, netns_lab.mgmt_address(node), key_file=netns_lab.key_path,
                   known_hosts=netns_lab.known_hosts_path, connect_timeout=5) for node in ("n0", "n1")]
    try:
        results = run_many(conns, ["true"], 10)
        assert [r.returncode for r in results.values()] == [0, 0]
        (a_start, a_end), (b_start, b_end) = spans.values()
        assert a_start < b_end and b_start < a_end, f"handshakes one after the other: {spans}"
        assert all(c.mode == "agent" and c._agent is not None for c in conns)
        assert all(isinstance(v, float) for v in ping_many(conns).values())  # now straight to the agents
    finally:
        for c in conns:
            c.close()


def test_files_and_fan_out(netns_lab, lab_inventory):
    from chaoskit.cluster.fanout import fan_out
    from chaoskit.cluster.transports.ssh_many import ping_many, run_many

    t = lab_inventory["n0"].conn
    path = str(netns_lab.node_dir("n0") / "work" / "probe.txt")
    t.write_file(path, "hello")
    assert t.read_file(path) == "hello"
    assert t.read_file(path + ".missing") is None
    conns = [n.conn for n in lab_inventory.nodes]
    results = run_many(conns, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], 5)
    assert [r.returncode for r in results.values()] == [0, 0]
    assert netns_lab.data_address("n1") in results["n1"].stdout
    pings = fan_out({c.node: c.ping for c in conns})
    assert all(isinstance(v, float) for v in ping_many(conns).values())
    assert all(isinstance(v, float) for v in pings.values())


def test_a_stream_opened_as_the_agents_channel_closes_is_an_infra_error_its_probe_retries_on():
    """A node powered off mid-drill closes its agent's channel; a probe that reopens its stream at that moment
    got the transport's private _AgentGone (now channel.AgentGone), which ended the kernel-log probe's thread for good (seen on the
    full suite's Slurm power-off drill). It is now an InfraError naming the stream, which every probe retries.
    A real socket, closed: what a dead node's channel is."""
    import socket

    from chaoskit.cluster.transports.channel import AgentChannel, start_stream
    from chaoskit.core.errors import InfraError

    mine, theirs = socket.socketpair()
    theirs.close()
    mine.close()
    agent = AgentChannel(mine, "n1")
    with pytest.raises(InfraError, match=r"cannot read the kernel log of node n1: the agent's connection closed"):
        start_stream(agent, "read the kernel log of node n1", {"op": "kmsg"}, lambda reply: None, lambda why: None)
    assert agent.dead
    with pytest.raises(InfraError, match="the agent's connection closed"):  # and again, once known dead
        start_stream(agent, "read the kernel log of node n1", {"op": "kmsg"}, lambda reply: None, lambda why: None)
