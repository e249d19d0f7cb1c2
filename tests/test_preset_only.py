"""A Lightning job measured with the presets alone, on its real output.

tests/data/lightning/kill-rank1.jsonl was recorded in this repository's session (2026-12-01) from the real
lightning 2.6.6 running examples/frameworks/lightning_train.py unchanged (--no-callback) under torchrun, two
workers, rank 1 SIGKILLed after the step-20 checkpoint; each line with the moment it arrived, read as chaoskit's
job reader reads a job (tests/data/lightning/record.py says how). Lightning prints no step line and no worker
start, and its restore line names last.ckpt: what the torchrun + lightning presets can and cannot measure of that
drill is what result.json says (``phases.unseen``, ``presets``). The HF job is measured with its callback end to end,
and by the presets alone from its recorded drill, in tests/test_framework_drills.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.measure import measure_fault, slo_verdict, unseen_signals
from chaoskit.observe.events import EventBus
from chaoskit.observe.probes import LogRegexProbe
from chaoskit.stacks.registry import log_presets, preset_rules

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

RECORDING = Path(__file__).parent / "data" / "lightning" / "kill-rank1.jsonl"


def _recorded():
    lines = [json.loads(line) for line in RECORDING.read_text().splitlines()]
    meta = lines[0]["meta"]
    bus = EventBus()
    rules, tee = preset_rules(["torchrun", "lightning"])
    probe = LogRegexProbe(bus, rules, tee_prefixes=tee)
    for entry in lines[1:]:
        probe.feed("n0", entry["line"], ts=1000.0 + entry["t"])
    return meta, 1000.0 + meta["t_fault"], bus.snapshot()


def test_what_the_lightning_preset_sees_of_a_real_killed_rank():
    meta, t_fault, events = _recorded()
    assert meta["exit"] == 0 and "epoch=0-step=20.ckpt" in meta["checkpoints"]
    kinds = [e["kind"] for e in events if e["ts"] > t_fault]
    # the agent's failure line, and rank 0's restore lines (Lightning's default level: no verbosity to set)
    assert kinds == ["worker.exit", "ckpt.load.start", "ckpt.load.end"]
    loads = [e for e in events if e["kind"].startswith("ckpt.load")]
    assert all(e["path"].endswith("/last.ckpt") and "step" not in e for e in loads)
    assert "a checkpoint named last.ckpt gives no step" in log_presets()["lightning"].cannot_see
    assert not [e for e in events if e["kind"] in ("step", "worker.start")]  # no step line, no start line


def test_the_phases_the_presets_cannot_measure_say_which_signal_is_missing():
    _, t_fault, events = _recorded()
    phases = measure_fault(events, t_fault)
    assert phases["detection_s"] is not None and phases["detected_by"].startswith("torchrun agent on n0: exit code -9")
    assert phases["reallocation_s"] is None and phases["checkpoint_load_s"] is None and phases["recovery_s"] is None
    assert phases["lost_steps"] is None
    unseen = unseen_signals(phases, events, {p: log_presets()[p].sees for p in ("torchrun", "lightning")})
    assert set(unseen) == {"reallocation", "checkpoint_load", "recovery", "lost_steps"}
    assert unseen["reallocation"].startswith("worker.start:") and unseen["recovery"].startswith("step:")
    assert "presets torchrun, lightning cannot see it" in unseen["recovery"]
    # the reasons (what the SLO entries and the reports show) carry it
    slo = slo_verdict(phases, {"detection": 60, "recovery": 600})
    assert slo["detection"]["pass"] and not slo["recovery"]["pass"]
    assert "step: the job reported none" in slo["recovery"]["reason"]


def test_a_signal_some_event_gave_is_not_called_unseen():
    events = [{"ts": 1.0, "kind": "step", "step": 3}, {"ts": 2.0, "kind": "worker.exit"},
              {"ts": 3.0, "kind": "worker.start"}]
    phases = measure_fault(events, 1.5)  # no load, no step after it: nothing after detection is measured
    # worker.start and step came (the SDK, say): only the load end is a signal nothing gave or could see
    unseen = unseen_signals(phases, events, {"torchrun": log_presets()["torchrun"].sees})
    assert set(unseen) == {"checkpoint_load"} and unseen["checkpoint_load"].startswith("ckpt.load.end:")
    assert unseen_signals(phases, events, {}) == {}  # no preset: nothing to explain
