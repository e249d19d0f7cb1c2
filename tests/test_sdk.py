"""The SDK: stdlib only, one line per event, concurrent ranks never interleave."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

WRITER = r"""
import os, sys
from chaoskit import probe
rank = int(sys.argv[1])
for i in range(2000):
    probe.step(i, rank_tag=rank, padding="x" * 300)
"""


def test_sdk_imports_without_torch():
    code = "import sys; from chaoskit import probe; print('torch' in sys.modules, probe.enabled())"
    env = {k: v for k, v in os.environ.items() if k != "CHAOSKIT_EVENTS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "False"]


def test_disabled_sdk_is_a_no_op(monkeypatch):
    from chaoskit import probe

    monkeypatch.delenv("CHAOSKIT_EVENTS", raising=False)
    assert probe.step(3) is None
    with probe.checkpoint_load(step=3) as info:
        info["bytes"] = 1


def test_concurrent_writers_never_interleave(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    env = dict(os.environ, CHAOSKIT_EVENTS=str(path), CHAOSKIT_NODE="n0")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(r)], env={**env, "RANK": str(r)}) for r in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 4 * 2000
    per_rank = {r: [] for r in range(4)}
    for line in lines:
        event = json.loads(line)  # a torn or interleaved line would not parse
        assert event["rank"] == event["rank_tag"]
        per_rank[event["rank"]].append(event["step"])
    for steps in per_rank.values():
        assert steps == list(range(2000))


def test_events_carry_the_design_fields(tmp_path: Path, monkeypatch):
    from chaoskit import probe

    path = tmp_path / "e.jsonl"
    monkeypatch.setenv("CHAOSKIT_EVENTS", str(path))
    monkeypatch.setenv("CHAOSKIT_NODE", "n7")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    probe.worker_start()
    with probe.checkpoint_load() as info:
        info["step"] = 50
    probe.step(51)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["kind"] for e in events] == ["worker.start", "ckpt.load.start", "ckpt.load.end", "step"]
    assert all(e["node"] == "n7" and e["rank"] == 3 and isinstance(e["ts"], float) for e in events)
    assert events[0]["restart_count"] == 2 and events[0]["world_size"] == 4
    assert events[2]["step"] == 50
    assert events[0]["ts"] <= events[1]["ts"] <= events[2]["ts"] <= events[3]["ts"]
