"""The kernel-log stream: Xid lines in the driver's format read back, and the agent's ``kmsg`` op against this
machine's real ``/dev/kmsg`` (root): from now on, resumed by sequence number without a loss or a double, every
line once per kernel although several nodes share it, attributed by PCI id.

Every line these tests write carries chaoskit's drill marker (and a token of the test), so nothing reading
this machine's kernel log takes it for a real GPU failure.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

import pytest

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.cluster.xid import FATAL, XID_MESSAGES, format_xid, lab_pci, normalize_pci, parse_xid
from chaoskit.nodeside import agent
from chaoskit.observe.events import EventBus
from chaoskit.observe.kmsg import KmsgProbe
from tests.conftest import need, wait_until


def _kmsg_usable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK))
        return True
    except OSError:
        return False


def need_kmsg() -> None:
    need(os.geteuid() == 0 and _kmsg_usable(), "root and a readable, writable /dev/kmsg")


def write_kmsg(text: str) -> None:
    """One record, through a file of its own (userspace writes are rate-limited per open file)."""
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, text.encode() + b"\n")
    finally:
        os.close(fd)


# -- the line -------------------------------------------------------------------------------


def test_an_xid_line_has_the_drivers_format_and_reads_back_as_injected():
    line = format_xid("00000000:3B:00.0", 79, "0123abcd", pid=4242, name="python")
    assert line.startswith("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus. ")
    xid = parse_xid(line)
    assert (xid.pci, xid.code, xid.pid, xid.name, xid.injected, xid.token) == ("0000:3b:00", 79, "4242", "python", True, "0123abcd")
    assert xid.message == "GPU has fallen off the bus." and xid.fatal


def test_a_real_driver_line_is_not_injected():
    real = "NVRM: Xid (PCI:0000:b3:00): 48, pid=1911, name=python3, An uncorrectable double bit error (DBE) has been detected"
    xid = parse_xid(real)
    assert (xid.pci, xid.code, xid.injected, xid.token, xid.fatal) == ("0000:b3:00", 48, False, None, True)
    unknown_pid = "NVRM: Xid (PCI:0000:18:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x505648=0x1"
    assert parse_xid(unknown_pid).code == 13
    assert parse_xid("usb 1-1: new high-speed USB device") is None


@pytest.mark.parametrize("code", sorted(XID_MESSAGES))
def test_every_code_chaoskit_writes_parses_to_itself(code):
    xid = parse_xid(format_xid("0000:41:00.0", code, "feedbeef"))
    assert xid.code == code and xid.message == XID_MESSAGES[code] and xid.fatal == (code in FATAL)


def test_bad_codes_ids_and_tokens_are_refused():
    with pytest.raises(ValueError, match="Xid 80 is not one chaoskit writes"):
        format_xid("0000:41:00.0", 80, "feedbeef")
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci("41:00.0; reboot")
    with pytest.raises(ValueError, match="not a marker token"):
        format_xid("0000:41:00.0", 79, "x y")
    assert normalize_pci("0000:3b:00.0") == normalize_pci("00000000:3B:00.0") == normalize_pci("0000:3b:00") == "0000:3b:00"


def test_two_labs_give_their_nodes_different_emulated_ids():
    assert lab_pci("pl-aaaaaa", 1) != lab_pci("pl-bbbbbb", 1) != lab_pci("pl-bbbbbb", 2)
    assert normalize_pci(lab_pci("pl-aaaaaa", 1)).endswith(":01:00")


# -- the agent's stream against the real /dev/kmsg ----------------------------------------------


class _Stream:
    """``op_kmsg`` run as the agent runs it, on a thread; its messages collected."""

    def __init__(self, match: list[str], seq: int | None = None) -> None:
        self.rid = f"t-{secrets.token_hex(4)}"
        self.parts: list[dict] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=agent.op_kmsg, daemon=True, args=(
            {"id": self.rid, "op": "kmsg", "seq": seq, "match": match, "interval": 0.05}, self._emit))
        self.thread.start()
        assert wait_until(lambda: self.parts and self.parts[0].get("started"), 5)

    def _emit(self, part: dict) -> None:
        with self.lock:
            self.parts.append(dict(part))

    def texts(self) -> list[str]:
        with self.lock:
            return [r[3] for p in self.parts for r in p.get("records", [])]

    def seq(self) -> int | None:
        with self.lock:
            return next((p["seq"] for p in reversed(self.parts) if p.get("seq") is not None), None)

    def close(self) -> None:
        agent.op_cancel({"stream": self.rid})
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_the_stream_starts_now_and_resumes_after_its_last_record_without_a_loss_or_a_double():
    need_kmsg()
    tag = f"chaoskit-test-{secrets.token_hex(4)}"
    write_kmsg(f"{tag} before the stream (chaoskit drill 00000000: injected, not a hardware fault)")
    first = _Stream([tag])
    assert first.parts[0]["boot_id"] and first.parts[0]["seq"] is not None
    write_kmsg(f"{tag} one")
    assert wait_until(lambda: first.texts() == [f"{tag} one"], 5), first.texts()
    t_one = first.parts[-1]["records"][0][0]
    assert abs(t_one - time.time()) < 5  # the node's time the record was logged
    first.close()
    where = first.seq()
    write_kmsg(f"{tag} two")  # while no stream reads
    write_kmsg(f"{tag} three")
    second = _Stream([tag], seq=where)
    try:
        assert wait_until(lambda: second.texts() == [f"{tag} two", f"{tag} three"], 5), second.texts()
        write_kmsg(f"{tag} four")
        assert wait_until(lambda: second.texts()[-1:] == [f"{tag} four"], 5)
        time.sleep(0.3)
        assert second.texts() == [f"{tag} two", f"{tag} three", f"{tag} four"]
        seqs = [r[1] for p in second.parts for r in p.get("records", [])]
        assert seqs == sorted(set(seqs)) and seqs[0] > where
    finally:
        second.close()


def test_an_unreadable_log_is_one_clear_error():
    with pytest.raises(agent.OpError, match="cannot read the kernel log /nonexistent/kmsg"):
        agent.op_kmsg({"id": "x", "op": "kmsg", "path": "/nonexistent/kmsg"}, lambda part: None)


# -- the probe: attribution by PCI id, once per kernel --------------------------------------------


def test_an_xid_is_published_once_for_the_node_owning_its_pci_id():
    need_kmsg()
    token = secrets.token_hex(4)
    n0, n1 = lab_pci("kmsg-test", 0), lab_pci("kmsg-test", 1)
    nodes = [Node("n0", conn=LocalTransport("n0", "kmsg-test.n0"), gpu_pci=(n0,)),
             Node("n1", conn=LocalTransport("n1", "kmsg-test.n1"), gpu_pci=(n1,))]
    bus = EventBus()
    probe = KmsgProbe.for_nodes(bus, nodes)
    assert probe is not None
    probe.start()
    try:
        assert probe.ready(5)
        write_kmsg(format_xid(n1, 79, token, pid=1, name="python"))
        write_kmsg(format_xid(lab_pci("kmsg-test-other-lab", 1), 79, token))  # another lab's device: not ours
        write_kmsg(format_xid(n0, 13, token))
        assert wait_until(lambda: len([e for e in bus.events if e["kind"] == "gpu.xid"]) >= 2, 5)
        time.sleep(0.3)
    finally:
        probe.stop()
    xids = [(e["node"], e["code"], e["pci"], e["injected"], e["fatal"]) for e in bus.events if e["kind"] == "gpu.xid"
            and e.get("token") == token]
    assert xids == [("n1", 79, normalize_pci(n1), True, True), ("n0", 13, normalize_pci(n0), True, False)]
    assert probe.unattributed >= 1
