"""The torchft recovery model (``measure.measure_torchft``) and the ``torchft`` preset, on torchft's real output.

tests/data/torchft/ holds what a real torchft 0.2.0 job printed in this repository's session (2026-12-01), run by
hand on this machine as examples/frameworks/torchft_train.py runs under chaoskit: torchft_lighthouse
--min_replicas 1, two replica groups (one torchrun each), the worker of group 1 SIGKILLed at 15:32:28.020 while
the groups trained; group 0 carried on, torchrun restarted group 1 and it healed from group 0. To keep the files
small, only the time around the fault and the heal is kept, and torchft's per-step Rust chatter (quorum requests,
"Start quorum", "should_commit request") is left out; every line kept is verbatim.
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import pytest

from chaoskit.measure import measure_fault, slo_verdict
from chaoskit.observe.events import EVENT_KINDS, EventBus
from chaoskit.observe.probes import LogRegexProbe
from chaoskit.stacks.registry import log_presets, preset_rules
from chaoskit.stacks.torchft import measure_torchft

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

DATA = Path(__file__).parent / "data" / "torchft"
FILES = {"survivor-n0.log": "n0", "lighthouse.log": "n0", "restarted-n1.log": "n1"}
T_FAULT = calendar.timegm(time.strptime("2026-12-01 15:32:28", "%Y-%m-%d %H:%M:%S")) + 0.020
_TS = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)[.,](\d+)|^[EWI]\d{4} (\d\d:\d\d:\d\d)\.(\d+)")


def _recorded_timeline() -> list[dict]:
    """The recorded lines through the torchrun + torchft presets, each at the time its own line gives (a line
    without one at the previous line's)."""
    bus = EventBus()
    rules, tee = preset_rules(["torchrun", "torchft"])
    probe = LogRegexProbe(bus, rules, tee_prefixes=tee)
    for name, node in FILES.items():
        ts = None
        for line in (DATA / name).read_text().splitlines():
            m = _TS.match(line)
            if m:
                day, clock, frac = (m.group(1), m.group(2), m.group(3)) if m.group(1) else ("2026-12-01", m.group(4), m.group(5))
                ts = calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")) + float("0." + frac)
            if ts is not None:
                probe.feed(node, line, ts=ts)
    return bus.snapshot()


def test_the_torchft_preset_reads_torchfts_real_lines():
    events = _recorded_timeline()
    kinds = {e["kind"] for e in events}
    assert {"step", "detect", "rendezvous.done", "ckpt.load.start", "ckpt.load.end", "worker.exit"} <= kinds
    assert set(log_presets()["torchft"].sees) <= set(EVENT_KINDS)
    heal = [e for e in events if e["kind"] in ("ckpt.load.start", "ckpt.load.end") and e["ts"] > T_FAULT]
    assert [(e["kind"], e["node"], e["step"]) for e in heal] == [("ckpt.load.start", "n1", 368), ("ckpt.load.end", "n1", 368)]
    lighthouse = [e for e in events if e.get("source") == "torchft lighthouse"]
    assert [e["quorum_id"] for e in lighthouse] == [3, 4] and all(e["kind"] == "detect" for e in lighthouse)
    steps = [e["step"] for e in events if e["kind"] == "step" and e["node"] == "n1" and e["ts"] < T_FAULT]
    assert max(steps) == 102  # group 1's last commit before the kill


def test_a_killed_replica_group_measured_with_the_torchft_model():
    events = _recorded_timeline()
    m = measure_torchft(events, T_FAULT, node="n1")
    assert m["model"] == "torchft" and m["reasons"] == {}
    # nothing failed mid-collective: the survivor waited in its quorum until the lighthouse dropped the silent group
    # (torchft's heartbeat_timeout_ms, 5 s) and reconfigured at once
    assert m["detected_by"].startswith("torchft lighthouse on n0")
    assert 4.5 < m["detection_s"] < 5.5
    assert 0 <= m["reallocation_s"] < 0.1
    # group 1's heal: "healing required ... max_step=368" at 15:32:59.789 .. "Loaded state dict." at 15:33:00.049
    assert abs(m["checkpoint_load_s"] - 0.26) < 0.001
    assert m["restored_step"] == 368 and m["last_step_before"] == 102
    # it last committed step 102 and healed to 368, the next step to run (it commits 368 itself): 103..367 missed
    assert m["discarded_steps"] == [] and m["catch_up_steps"] == 367 - 102 and m["lost_steps"] == 265
    assert m["t_resumed"] > m["t_loaded"] and m["recovery_s"] > 31
    slo = slo_verdict(m, {"detection": 15, "reallocation": 10, "checkpoint_load": 30, "recovery": 60, "lost_steps": 300})
    assert all(v["pass"] for v in slo.values())
    # the restart model on the same timeline finds no restart of the world to measure: the wrong model
    restart = measure_fault(events, T_FAULT)
    assert restart["model"] == "restart" and restart["detected_by"].startswith("torchrun agent on n1")


def test_discarded_steps_and_a_survivors_collective_error_come_first():
    base = [{"ts": 10.0, "kind": "step", "step": 5, "node": "n0", "source": "torchft"},
            {"ts": 10.0, "kind": "step", "step": 5, "node": "n1", "source": "torchft"}]
    after = [
        {"ts": 11.0, "kind": "worker.exit", "node": "n1", "source": "torchrun", "who": "torchrun agent"},
        {"ts": 11.2, "kind": "detect", "node": "n0", "source": "torchft", "who": "torchft manager", "why": "allreduce"},
        {"ts": 11.3, "kind": "step.discarded", "step": 6, "node": "n0", "source": "torchft"},
        {"ts": 15.0, "kind": "detect", "node": "n0", "source": "torchft lighthouse", "who": "torchft lighthouse"},
        {"ts": 15.1, "kind": "rendezvous.done", "node": "n0", "source": "torchft", "quorum_id": 3},
        {"ts": 15.2, "kind": "step", "step": 6, "node": "n0", "source": "torchft"},
        {"ts": 20.0, "kind": "ckpt.load.start", "step": 30, "node": "n1", "source": "torchft"},
        {"ts": 20.5, "kind": "ckpt.load.end", "step": 30, "node": "n1", "source": "torchft"},
        {"ts": 20.7, "kind": "step", "step": 30, "node": "n1", "source": "torchft"},
    ]
    m = measure_torchft(base + after, 10.5, node="n1")
    assert m["detection_s"] == 0.7 and m["detected_by"] == "torchft manager on n0: allreduce"
    assert m["reallocation_s"] == 3.9 and m["checkpoint_load_s"] == 0.5 and m["recovery_s"] == 10.2
    assert m["discarded_steps"] == [6] and m["catch_up_steps"] == 24 and m["lost_steps"] == 25
    # a group that never came back: no heal, no recovery, no lost work, each with its reason; never zero
    gone = measure_torchft(base + after[:6], 10.5, node="n1")
    assert gone["checkpoint_load_s"] is None and gone["recovery_s"] is None and gone["lost_steps"] is None
    assert "never healed" in gone["reasons"]["checkpoint_load"] and "did not commit" in gone["reasons"]["recovery"]
    assert gone["reasons"]["lost_steps"] == "not observed: the healed group did not commit a step"
    silent = measure_torchft(base, 10.5, node="n1")
    assert silent["detection_s"] is None and "torchft preset" in silent["reasons"]["detection"]


def test_the_catch_up_is_the_steps_between_the_last_commit_and_the_step_healed_to():
    """Issue 51, item 8: group n1 last committed step 20, was killed, and healed to max_step=57 (the peers' next
    step, which it then commits itself): it missed steps 21..56, 36 of them, not 57 - 20 = 37."""
    events = [*({"ts": 1.0 + i * 0.1, "kind": "step", "step": i, "node": node, "source": "torchft"}
                for i in range(1, 21) for node in ("n0", "n1")),
              {"ts": 3.5, "kind": "detect", "node": "n0", "source": "torchft lighthouse", "who": "torchft lighthouse"},
              {"ts": 3.5, "kind": "rendezvous.done", "node": "n0", "source": "torchft", "quorum_id": 2},
              *({"ts": 3.6 + i * 0.1, "kind": "step", "step": i, "node": "n0", "source": "torchft"} for i in range(21, 57)),
              {"ts": 8.0, "kind": "ckpt.load.start", "step": 57, "node": "n1", "source": "torchft"},
              {"ts": 8.2, "kind": "ckpt.load.end", "step": 57, "node": "n1", "source": "torchft"},
              {"ts": 8.3, "kind": "step", "step": 57, "node": "n0", "source": "torchft"},
              {"ts": 8.3, "kind": "step", "step": 57, "node": "n1", "source": "torchft"}]
    m = measure_torchft(events, 3.05, node="n1")
    assert m["restored_step"] == 57 and m["catch_up_steps"] == 36 and m["lost_steps"] == 36
    assert "lost_steps" not in m["reasons"]


def test_recovery_torchft_is_refused_with_a_launch_that_chaoskit_does_not_start(tmp_path):
    from tests.conftest import run_cli

    bad = tmp_path / "s.yaml"
    bad.write_text("name: ft\ncluster: {kind: process, nodes: 2}\nworkload:\n  launch: reference\n  recovery: torchft\n"
                   "faults:\n  - kind: process.kill\n    target: {ranks: [1]}\n    at: {step: 5}\n")
    res = run_cli("validate", bad)
    assert res.code == 2 and "recovery: torchft is only used with launch: command" in res.stderr, res.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text(bad.read_text().replace("launch: reference", "launch: command\n  command: [-m, json.tool]"))
    assert run_cli("validate", ok).code == 0
