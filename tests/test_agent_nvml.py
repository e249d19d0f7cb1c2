"""NVML read inside the agent (issue 20, item 4): the agent's ``nvml`` stream loads ``libnvidia-ml.so.1`` with ctypes
and streams Xid and uncorrectable ECC events with the node's time.

There is no GPU here, so the library is a RECORDING STAND-IN (``tests/data/fake_nvml.c``, compiled by the test
with gcc): NVML's own function names, signatures and struct layouts for two GPUs, its events taken from a file the
test appends to, every call recorded. What is real: the agent's ctypes code against a real shared library, the
stream protocol, cancel and cleanup, and the probe publishing the events for the node.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from chaoskit.cluster.transports.api import NvmlBatch
from chaoskit.nodeside import agent
from chaoskit.observe.gpu import RemoteNvmlProbe
from tests.conftest import need, wait_until

SOURCE = Path(__file__).with_name("data") / "fake_nvml.c"


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """The stand-in library compiled, the agent pointed at it; (events file, calls file)."""
    need(shutil.which("gcc") is not None, "gcc (apt-get install gcc libc6-dev)")
    lib = tmp_path / "libnvidia-ml-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(lib), str(SOURCE)], check=True)
    events, calls = tmp_path / "events", tmp_path / "calls"
    events.write_text("")
    monkeypatch.setattr(agent, "NVML_LIB", str(lib))
    monkeypatch.setenv("CHAOSKIT_FAKE_NVML_EVENTS", str(events))
    monkeypatch.setenv("CHAOSKIT_FAKE_NVML_CALLS", str(calls))
    return events, calls


class Stream:
    """The agent's ``nvml`` op on a thread of this process, as a node's agent runs it."""

    def __init__(self, on_part) -> None:
        self.rid = f"nvml-test-{id(self)}"
        self.done = threading.Event()
        self.error: str | None = None
        self.result: dict | None = None
        self._on_part = on_part
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = agent.op_nvml({"id": self.rid, "op": "nvml"}, self._on_part)
        except agent.OpError as exc:
            self.error = str(exc)
        self.done.set()

    def cancel(self) -> None:
        agent.op_cancel({"stream": self.rid})


def test_the_agent_streams_xid_and_ecc_events_from_nvml_with_the_nodes_time(fake_nvml):
    events, calls = fake_nvml
    parts: list[dict] = []
    stream = Stream(parts.append)
    try:
        assert wait_until(lambda: parts, 5), stream.error
        assert parts[0]["started"] and parts[0]["gpus"] == [[0, "00000000:18:00.0"], [1, "00000000:19:00.0"]]
        t0 = time.time()
        with events.open("a") as fh:
            fh.write("1 8 79\n0 2 0\n0 1 0\n")  # Xid 79 on GPU 1, a double-bit ECC error on GPU 0, a single-bit one
        assert wait_until(lambda: len(parts) >= 3, 5), parts
        time.sleep(0.3)
    finally:
        stream.cancel()
    assert stream.done.wait(3) and stream.error is None
    got = [e for p in parts[1:] for e in p["events"]]
    assert [e[1:] for e in got] == [[1, "00000000:19:00.0", "xid", 79], [0, "00000000:18:00.0", "ecc", 0]]
    assert all(t0 - 1 <= e[0] <= time.time() for e in got)  # the node's time of each event
    asked = calls.read_text().splitlines()
    assert asked[0] == "nvmlInit_v2"
    assert "nvmlDeviceRegisterEvents 0 10" in asked and "nvmlDeviceRegisterEvents 1 10" in asked  # Xid | double-bit
    assert asked[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]  # cleaned up once cancelled


def test_a_node_without_nvml_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(agent, "NVML_LIB", str(tmp_path / "libnvidia-ml.so.1"))
    with pytest.raises(agent.OpError, match="NVML is not on this node"):
        agent.op_nvml({"id": "x", "op": "nvml"}, lambda part: None)


class AgentNvmlNode:
    """A GPU node's transport as far as the probe uses it (``nvml``), with the agent's op run in this process
    instead of behind SSH (the SSH agent loads the node's own libnvidia-ml.so.1, which this machine lacks)."""

    clock = None

    def nvml(self, on_batch):
        def part(p: dict) -> None:
            on_batch(NvmlBatch([(float(t), i, pci, kind, int(d)) for t, i, pci, kind, d in p.get("events", [])],
                               [tuple(g) for g in p["gpus"]] if p.get("gpus") else None, bool(p.get("started"))))
        return Stream(part)


def test_the_probe_publishes_each_nodes_gpu_events_for_that_node(fake_nvml):
    from chaoskit.observe.events import EventBus

    events, _ = fake_nvml
    bus = EventBus()
    probe = RemoteNvmlProbe(bus, {"n3": AgentNvmlNode()})
    probe.start()
    try:
        assert probe.started["n3"].wait(5), probe.errors
        assert probe.gpus["n3"] == [(0, "00000000:18:00.0"), (1, "00000000:19:00.0")]
        events.write_text("1 8 79\n0 2 0\n")
        assert wait_until(lambda: len(bus.events) >= 2, 5)
    finally:
        probe.stop()
    got = [(e["kind"], e["node"], e["device"], e.get("xid"), e["pci"], e["source"]) for e in bus.events]
    assert got == [("gpu.xid", "n3", 1, 79, "00000000:19:00.0", "nvml"), ("gpu.ecc", "n3", 0, None, "00000000:18:00.0", "nvml")]


def test_a_node_where_nvml_does_not_load_is_said_once_and_not_asked_again(monkeypatch, tmp_path):
    from chaoskit.observe.events import EventBus

    monkeypatch.setattr(agent, "NVML_LIB", str(tmp_path / "missing.so"))
    probe = RemoteNvmlProbe(EventBus(), {"n3": AgentNvmlNode()}, retry_s=0.05)
    probe.start()
    try:
        assert wait_until(lambda: probe.errors, 5)
        time.sleep(0.3)
        assert len(probe.errors) == 1 and "NVML is not on this node" in probe.errors[0]
        assert not probe._threads[0].is_alive()
    finally:
        probe.stop()
