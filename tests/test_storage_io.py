"""storage.slow and storage.error: a real FUSE mount over a real checkpoint folder, real reads and writes timed, a
real errno seen by a real process, the daemon SIGKILLed, the lease firing, a planted link refused, bad values.

Mounting needs root, /dev/fuse and the FUSE binding (mfusepy over libfuse3): those tests call ``need`` (skip here
without them, fail in CI)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.audit import NodeRead
from chaoskit.cluster.selectors import TargetSpec, resolve_nodes
from chaoskit.core.errors import ScenarioError
from chaoskit.faults.storage_io import FSTYPE, SOURCE_PREFIX, ErrorFault, ErrorSpec, SlowFault, SlowSpec
from chaoskit.lab.process import ProcessLab
from chaoskit.measure import measure_checkpoint_io
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal, read_journal
from chaoskit.safety.lease import LeaseManager
from tests.conftest import ROOT, need, need_torch, run_cli, short_form

SCENARIO = ROOT / "scenarios" / "slow-checkpoint-storage.yaml"


def need_fuse() -> None:
    import importlib.util

    need(os.geteuid() == 0, "root (mounting FUSE)")
    need(Path("/dev/fuse").exists(), "/dev/fuse")
    need(importlib.util.find_spec("mfusepy") is not None, "mfusepy (pip install 'chaoskit[fuse]'; apt-get install libfuse3-3)")


def ours_mounted(root: Path) -> list[str]:
    """Every chaoskit FUSE mount this machine shows at or under ``root`` (the test's own folder, where all its mounts
    are made), in any mount namespace. Not the whole machine's: a drill or soak run beside the suite (several
    engineers share a machine) has its own mounts, which this test neither made nor must see go."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            continue
        out.update(line for line in text.splitlines() if f" {FSTYPE} {SOURCE_PREFIX}" in line
                   and (line.split()[4] == str(root) or line.split()[4].startswith(f"{root}/")))
    return sorted(out)


@pytest.fixture
def lab():
    lab = ProcessLab.create(1)
    yield lab
    lab.kill_all()


@pytest.fixture
def folder(tmp_path):
    need_fuse()
    folder = tmp_path / "job" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "ckpt-00000025.pt").write_bytes(os.urandom(256 * 1024))
    (folder / "notes.txt").write_text("not a checkpoint")
    yield folder
    assert not ours_mounted(tmp_path), "a chaoskit FUSE mount was left behind"


def _ctx(lab, tmp_path, folder, ttl=10.0) -> RunContext:
    return RunContext(lab.inventory(), Journal(tmp_path / "j.jsonl"), LeaseManager(tmp_path / "leases", "r1", ttl=ttl),
                      checkpoint_dir=str(folder))


def _slow(**fields) -> SlowFault:
    return SlowFault(SlowSpec.model_validate({"kind": "storage.slow", "target": {"nodes": ["n0"]}, "duration": 60,
                                              "files": "ckpt-*", **fields}), "f0")


def _error(**fields) -> ErrorFault:
    return ErrorFault(ErrorSpec.model_validate({"kind": "storage.error", "target": {"nodes": ["n0"]}, "duration": 60,
                                                "files": "*.pt", **fields}), "f0")


def _inject(fault, ctx):
    return fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def test_slow_delays_real_reads_writes_and_opens_of_matching_files_and_revert_unmounts(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _slow(latency="300ms", ops=["open", "read", "write"])
    before = (folder / "ckpt-00000025.pt").read_bytes()
    [inj] = _inject(fault, ctx)
    try:
        assert read_journal(tmp_path / "j.jsonl")[0]["revert"] == inj.detail["revert"]  # armed before the mount
        assert len(ours_mounted(tmp_path)) == 1 and str(folder) in ours_mounted(tmp_path)[0]
        # a real read through the kernel: open (300 ms) and at least one read (300 ms)
        took = _timed(lambda: (folder / "ckpt-00000025.pt").read_bytes())
        assert took >= 0.6, took
        assert (folder / "ckpt-00000025.pt").read_bytes() == before  # the original contents, served through the fd
        took = _timed(lambda: (folder / "ckpt-00000050.pt").write_bytes(b"x" * 1000))
        assert took >= 0.6, took  # create (an open) and one write
        assert (folder / "notes.txt").read_text() == "not a checkpoint"  # not a match: passed through
        assert fault.verify(ctx, inj) is not None  # still in effect
    finally:
        fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None
    ctx.leases.release(inj.fault_id)
    ctx.leases.close()
    assert not ours_mounted(tmp_path)
    assert (folder / "ckpt-00000050.pt").read_bytes() == b"x" * 1000  # written into the real folder
    fault.revert(ctx, inj)  # idempotent


def test_slow_rate_caps_the_bandwidth_of_real_writes(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _slow(rate="1MiB", ops=["write"])
    [inj] = _inject(fault, ctx)
    try:
        data = os.urandom(2 * 1024 * 1024)

        def write():
            with open(folder / "ckpt-00000075.pt", "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        took = _timed(write)
        assert took >= 1.9, took  # 2 MiB at 1 MiB/s
    finally:
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        ctx.leases.close()
    assert (folder / "ckpt-00000075.pt").read_bytes() == data


def test_error_gives_a_real_errno_to_a_real_process(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _error(errno="ENOSPC", ops=["write"])
    [inj] = _inject(fault, ctx)
    try:
        save = subprocess.run([sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'wb') as fh:\n    fh.write(b'x' * 4096)",
                               str(folder / "ckpt-00000100.pt")], capture_output=True, text=True, timeout=30)
        assert save.returncode != 0 and "No space left on device" in save.stderr, save.stderr
        load = subprocess.run([sys.executable, "-c", "import sys; print(len(open(sys.argv[1], 'rb').read()))",
                               str(folder / "ckpt-00000025.pt")], capture_output=True, text=True, timeout=30)
        assert load.stdout.strip() == str(256 * 1024)  # reads are not chosen: they pass
        (folder / "notes.txt").write_text("still writable")  # not a match
    finally:
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        ctx.leases.close()
    with open(folder / "ckpt-00000100.pt", "wb") as fh:  # after the revert: the real folder, writable
        fh.write(b"y")


def test_error_share_fails_some_operations_not_all(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _error(errno="EIO", percent=50, ops=["open"])
    [inj] = _inject(fault, ctx)
    try:
        outcomes = []
        for _ in range(60):
            try:
                with open(folder / "ckpt-00000025.pt", "rb"):
                    outcomes.append(0)
            except OSError as exc:
                outcomes.append(exc.errno)
        assert set(outcomes) == {0, errno.EIO}, outcomes
    finally:
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        ctx.leases.close()


def _daemon_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [parent, *map(int, children)]


def test_a_killed_server_leaves_no_hung_mount_its_parent_detaches_it(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _slow(latency="50ms")
    [inj] = _inject(fault, ctx)
    try:
        parent, server = _daemon_pids(inj.detail["daemon_pid"])
        os.kill(server, signal.SIGKILL)
        end = time.time() + 10
        while ours_mounted(tmp_path) and time.time() < end:
            time.sleep(0.05)
        assert not ours_mounted(tmp_path)
        assert len((folder / "ckpt-00000025.pt").read_bytes()) == 256 * 1024  # the folder answers: no dead mount
    finally:
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        ctx.leases.close()
    assert fault.verify(ctx, inj) is None


def test_both_daemon_processes_killed_then_audit_names_the_mount_and_the_lease_cleans_it(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder, ttl=1.5)
    fault = _slow(latency="50ms")
    [inj] = _inject(fault, ctx)
    for pid in _daemon_pids(inj.detail["daemon_pid"]):  # parent first: nobody is left to detach it
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    assert ours_mounted(tmp_path)  # a dead mount (its connection aborted): reads fail at once, they never hang
    with pytest.raises(OSError) as exc:
        os.listdir(folder)
    assert exc.value.errno == errno.ENOTCONN
    node = lab.inventory()["n0"]
    found = SlowFault.leftovers(NodeRead(node, []))
    assert any(f"FUSE mount {SOURCE_PREFIX}" in line and str(folder) in line for line in found), found
    assert any("storage-io-" in line for line in found), found
    ctx.leases.abandon(inj.fault_id)  # the controller stops renewing, as a dead one does: the watchdog reverts
    fired = Path(ctx.leases.leases.get(inj.fault_id).directory if inj.fault_id in ctx.leases.leases
                 else tmp_path / "leases" / "r1" / inj.fault_id) / "fired"
    end = time.time() + 20
    while not fired.exists() and time.time() < end:
        time.sleep(0.1)
    assert fired.exists() and "lease expired" in fired.read_text()
    assert not ours_mounted(tmp_path)
    assert SlowFault.leftovers(NodeRead(node, [])) == []
    assert sorted(os.listdir(folder)) == ["ckpt-00000025.pt", "notes.txt"]
    ctx.leases.close()


def test_a_link_planted_at_the_folder_is_refused_and_nothing_is_mounted(lab, tmp_path, folder):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "sub").symlink_to(elsewhere)
    ctx = _ctx(lab, tmp_path, folder)
    with pytest.raises(ScenarioError, match="symbolic link"):
        _inject(_slow(latency="10ms", path="sub"), ctx)
    assert not ours_mounted(tmp_path)
    assert not (tmp_path / "j.jsonl").exists() or read_journal(tmp_path / "j.jsonl") == []
    ctx.leases.close()


def test_the_revert_runs_from_the_journal_only_in_the_shape_it_was_armed(lab, tmp_path, folder):
    ctx = _ctx(lab, tmp_path, folder)
    fault = _slow(latency="10ms")
    [inj] = _inject(fault, ctx)
    try:
        node = ctx.inventory["n0"]
        assert SlowFault.journaled_revert(inj.detail["revert"], node) == inj.detail["revert"]
        for bad in (inj.detail["revert"][:-1] + ["/etc/passwd"], inj.detail["revert"][:5] + ["../../x", "y"],
                    ["sh", "-c", "true"]):
            with pytest.raises(ValueError):
                SlowFault.journaled_revert(bad, node)
    finally:
        fault.revert(ctx, inj)
        ctx.leases.release(inj.fault_id)
        ctx.leases.close()


@pytest.mark.parametrize("line, replace, words", [
    ("    latency:", "    latency: fast", "latency"),
    ("    latency:", "    latency: -1s", "latency"),
    ("    jitter:", "    jitter: 10s", "jitter must not be larger than latency"),
    ("    ops:", "    ops: [open, seek]", "ops"),
    ("    files:", "    files: 'ckpt-*;rm'", "files"),
    ("    path:", "    path: ../elsewhere", "leaves the job's checkpoint folder"),
])
def test_bad_slow_values_are_positioned_errors(tmp_path, line, replace, words):
    text = SCENARIO.read_text()
    assert line in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(replace if l.startswith(line) else l for l in text.splitlines()) + "\n")
    res = run_cli("validate", bad)
    assert res.code == 2, res.stdout + res.stderr
    assert "bad.yaml:" in res.stderr and words in res.stderr, res.stderr


@pytest.mark.parametrize("fields, words", [
    ({"errno": "EWHATEVER"}, "errno"),
    ({"percent": 0}, "percent"),
    ({"percent": 101}, "percent"),
])
def test_bad_error_values_are_positioned_errors(tmp_path, fields, words):
    extra = "".join(f"\n    {k}: {v}" for k, v in fields.items())
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.read_text().replace("  - kind: storage.slow\n", f"  - kind: storage.error{extra}\n", 1)
                   .replace("    latency: 300ms\n", "").replace("    jitter: 50ms\n", ""))
    res = run_cli("validate", bad)
    assert res.code == 2, res.stdout + res.stderr
    assert "bad.yaml:" in res.stderr and words in res.stderr, res.stderr


def test_dry_run_plans_the_mount_and_its_lease():
    res = run_cli("run", SCENARIO, "--dry-run")
    assert res.code == 0, res.stdout + res.stderr
    assert "arm lease" in res.stdout and FSTYPE in res.stdout and "umount -l" in res.stdout, res.stdout


def test_checkpoint_times_are_split_at_the_fault_and_its_revert():
    ev = lambda ts, kind, **f: {"ts": ts, "kind": kind, "node": "n0", "rank": 0, **f}  # noqa: E731
    events = [ev(1, "ckpt.save.start"), ev(1.1, "ckpt.save.end"), ev(3, "ckpt.save.start"), ev(3.2, "ckpt.save.end"),
              ev(11, "ckpt.save.start"), ev(12.5, "ckpt.save.end"), ev(13, "ckpt.load.start"), ev(15, "ckpt.load.end"),
              ev(14, "ckpt.save.start"), ev(14.4, "ckpt.save.failed"),
              ev(31, "ckpt.save.start"), ev(31.1, "ckpt.save.end"), ev(33, "ckpt.load.start"), ev(33.5, "ckpt.load.end")]
    got = measure_checkpoint_io(events, t_fault=10, t_revert=30)
    assert got["save"]["before"] == {"count": 2, "failed": 0, "median_s": 0.15, "max_s": 0.2}
    assert got["save"]["during"]["count"] == 1 and got["save"]["during"]["failed"] == 1
    assert got["save_slowdown_x"] == 10.0 and got["load_slowdown_x"] == 4.0  # loads: against the one after
    assert measure_checkpoint_io(events[:4], 10, 30)["reasons"]["save_slowdown_x"].startswith("no save completed")


@pytest.mark.slow
def test_drill_slow_checkpoint_storage_measures_saves_and_loads_with_and_without(tmp_path):
    """The shipped drill in a short form (issue 52): one kill, at the end of the first save through the slow storage
    (an event trigger), not at step 100, and none at step 300 for a load after the storage is back; the storage is
    slow for up to 45 s, not 20 s (the job's end reverts it sooner), and the job is 110 steps, not 360 (the kill
    needs a save through the slow storage before the end: there are two, steps 75 and 100, after the mount landing
    47 steps late as below; on time, the restart from step 50 trains 60 steps, not 110, with 2 slow saves, not 4). Real saves
    before the mount, a real save and a real load through it are what only a drill shows; a load after the revert is
    sorted and set against the one during it by the same code (test_checkpoint_times_are_split_at_the_fault_and_its_
    revert). Following the mount instead of steps and the clock holds on a loaded machine: there the mount landed
    47 steps late (after the saves of steps 50 and 75) and a restart took 20 s to its load, so the shipped drill
    saw no slow save and loaded after the 20 s (HEAD's drill at load 43)."""
    need_torch()
    need_fuse()
    scenario = short_form(SCENARIO, tmp_path, ("steps: 360", "steps: 110"), ("duration: 20s", "duration: 45s"),
                          ("at: {step: 100}", "at: {event: ckpt.save.end}"),
                          ("""  - kind: process.kill
    target: {ranks: [0]}
    signal: SIGKILL
    at: {step: 300}
""", ""))
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stdout[-3000:] + res.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    io = result["checkpoint_io"]
    assert io["save"]["before"]["count"] and io["save"]["during"]["count"], io
    assert io["save"]["during"]["median_s"] >= 0.3, io  # at least the latency of one open
    assert io["load"]["during"]["count"] and io["load"]["during"]["median_s"] >= 0.3, io
    assert result["checks"]["faults_reverted"]["pass"] and not ours_mounted(tmp_path)
