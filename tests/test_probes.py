"""Probes on real files and real processes: SDK log, log regexes, log files, process watcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from chaoskit.lab.process import ProcessLab
from chaoskit.observe.events import EventBus
from chaoskit.observe.probes import FileLogProbe, LogRegexProbe, ProcessWatcher, SdkLogProbe
from chaoskit.observe.rules import TORCHRUN_RULES, LogRule
from tests.conftest import wait_exec, wait_until


def wait(bus: EventBus, predicate, timeout=5.0) -> bool:
    return bus.wait_for(lambda: predicate(bus.events), timeout)


def test_torchrun_failure_line_becomes_worker_exit():
    bus = EventBus()
    probe = LogRegexProbe(bus, TORCHRUN_RULES)
    line = ("E1129 13:59:34.662000 2335 torch/distributed/elastic/multiprocessing/api.py:1002] "
            "failed (exitcode: -9) local_rank: 0 (pid: 2368) of binary: /usr/bin/python3")
    probe.feed("n1", line, ts=12.5)
    probe.feed("n1", "[rank 0] step 3 loss 0.1", ts=13.0)
    assert bus.events == [{"ts": 12.5, "kind": "worker.exit", "node": "n1", "source": "torchrun",
                           "who": "torchrun agent", "exitcode": -9, "local_rank": 0, "pid": 2368}]


def test_named_groups_become_fields_and_constants_are_added():
    bus = EventBus()
    probe = LogRegexProbe(bus, [LogRule.of(r"Resuming training from snapshot at Epoch (?P<step>\d+)", "ckpt.load.end", {"unit": "epoch"})])
    probe.feed("n0", "Resuming training from snapshot at Epoch 7")
    [event] = bus.events
    assert event["kind"] == "ckpt.load.end" and event["step"] == 7 and event["unit"] == "epoch" and event["node"] == "n0"


def test_sdk_and_file_probes_follow_appends(tmp_path: Path):
    bus = EventBus(tmp_path / "timeline.jsonl")
    sdk_file, log_file = tmp_path / "sdk.jsonl", tmp_path / "job.log"
    sdk = SdkLogProbe(bus, sdk_file)
    logs = FileLogProbe(LogRegexProbe(bus, [LogRule.of(r"step (?P<step>\d+)", "step")]), "n2", log_file)
    sdk.start()
    logs.start()
    try:
        with open(sdk_file, "a") as fh:
            fh.write(json.dumps({"ts": 1.0, "kind": "step", "step": 1}) + "\n")
            fh.write('{"ts": 2.0, "kind": "st')  # a line still being written
            fh.flush()
            time.sleep(0.1)
            fh.write('ep", "step": 2}\nnot json\n')
        with open(log_file, "a") as fh:
            fh.write("step 5\nnoise\nstep 6\n")
        assert wait(bus, lambda ev: len(ev) == 4)
    finally:
        sdk.stop()
        logs.stop()
    steps = sorted((e["source"], e["step"]) for e in bus.events)
    assert steps == [("log", 5), ("log", 6), ("sdk", 1), ("sdk", 2)]
    assert len((tmp_path / "timeline.jsonl").read_text().splitlines()) == 4


def test_a_log_opened_again_with_o_trunc_is_read_again_from_its_start(tmp_path: Path):
    """A requeued Slurm job's output file is opened again with O_TRUNC; the restarted job's first lines
    (its steps from 0) are on the timeline, not skipped up to where the old file ended. So is a file
    replaced by a new one (rotation by rename)."""
    bus = EventBus()
    log_file = tmp_path / "slurm-3.out"
    logs = FileLogProbe(LogRegexProbe(bus, [LogRule.of(r"step (?P<step>\d+)", "step")]), "n0", log_file, interval=0.01)
    logs.start()
    try:
        log_file.write_text("".join(f"step {i}\n" for i in range(40)))
        assert wait(bus, lambda ev: len(ev) == 40)
        with open(log_file, "w") as fh:  # O_TRUNC, as slurmstepd
            for i in range(3):
                time.sleep(0.05)
                fh.write(f"step {i}\n")
                fh.flush()
        assert wait(bus, lambda ev: len(ev) == 43)
        (tmp_path / "new.out").write_text("step 100\n")
        os.replace(tmp_path / "new.out", log_file)
        assert wait(bus, lambda ev: len(ev) == 44)
    finally:
        logs.stop()
    assert [e["step"] for e in bus.events[40:]] == [0, 1, 2, 100]


def test_process_watcher_sees_a_worker_vanish():
    lab = ProcessLab.create(1)
    env = dict(os.environ, CHAOSKIT_SCOPE=lab.scope("n0"), RANK="0", TORCHELASTIC_RUN_ID="x")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    wait_exec(worker)
    bus = EventBus()
    watcher = ProcessWatcher(bus, {"n0": lab.inventory()["n0"].conn}, interval=0.02)
    watcher.start()
    try:
        assert wait_until(lambda: worker.pid in (watcher.ranks("n0") or {}), 10), "the watcher never saw the worker"
        worker.kill()
        killed = time.time()
        worker.wait()
        assert wait(bus, lambda ev: any(e["kind"] == "process.gone" for e in ev))
    finally:
        watcher.stop()
        lab.kill_all()
    [gone] = bus.events
    assert gone["pid"] == worker.pid and gone["rank"] == 0 and gone["node"] == "n0"
    assert 0 <= gone["ts"] - killed < 0.5
