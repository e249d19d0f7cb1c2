"""Goodput in the field's words: a run's lost time in the buckets of Google's ml-goodput-measurement.

On a recorded run folder (``tests/data/goodput/kill-rank/``: ``chaoskit run scenarios/kill-rank.yaml`` on the process
lab, result.json and events.jsonl copied unchanged) and on the campaign's hand-made timeline
(``tests/test_campaign._timeline``): the buckets add up as docs/measuring.md says, each is the phases it is
documented to be, and what chaoskit cannot tell, or a phase a fault left unmeasured, is null with its reason.
Pure: files in, numbers out; nothing is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.campaign import measure_campaign
from chaoskit.core.result import Goodput, RunResult
from chaoskit.goodput import BADPUT_TYPES, CANNOT_TELL, account, goodput_terms, save_costs
from chaoskit.observe.events import read_events
from tests.conftest import ROOT
from tests.test_campaign import _timeline

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

RUN = ROOT / "tests" / "data" / "goodput" / "kill-rank"


def _recorded() -> tuple[RunResult, list[dict], list[dict]]:
    result = RunResult.read(RUN / "result.json")
    return result, read_events(RUN / "events.jsonl"), [f.model_dump() for f in result.per_fault]


def _adds_up(g: dict) -> None:
    """Every bucket that is not null and the productive time add up to the wall time; a null one has its reason."""
    known = sum(v for v in g["badput_s"].values() if v is not None)
    assert known + g["productive_s"] == pytest.approx(g["total_elapsed_s"], abs=0.01)
    assert list(g["badput_s"]) == list(BADPUT_TYPES)
    assert {k for k, v in g["badput_s"].items() if v is None} == set(g["reasons"])


def test_a_drill_gives_its_lost_time_in_ml_goodput_measurements_buckets():
    result, events, per_fault = _recorded()
    g = result.goodput
    assert isinstance(g, Goodput) and g.source == "ml-goodput-measurement BadputType"
    assert RunResult.read(RUN / "result.json").text() == (RUN / "result.json").read_text()  # typed, byte for byte
    spent = account(events, per_fault)
    assert g.dump() == goodput_terms(spent, per_fault)  # what the runner wrote is what the files give
    _adds_up(g.dump())
    b, [fault] = g.badput_s, per_fault
    assert b.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION == pytest.approx(fault["detection_s"] + fault["reallocation_s"], abs=1e-3)
    assert b.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME == pytest.approx(fault["checkpoint_load_s"] - fault["startup_s"], abs=1e-3)
    # the job's start to its first step, then the restart's own: with the two above, the fault's recovery
    restart_part = b.PROGRAM_STARTUP - spent.startup_s
    assert (b.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION + b.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME + restart_part
            == pytest.approx(fault["recovery_s"], abs=0.01))
    assert fault["lost_steps"] == 10 and spent.step_s == pytest.approx(0.05, abs=0.01)
    assert b.WASTED_PROGRESS_FROM_DISRUPTION == pytest.approx(10 * spent.step_s, abs=1e-3)
    assert b.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME == pytest.approx(sum(save_costs(events)), abs=1e-3) and len(spent.saves) == 8
    assert g.productive_s == pytest.approx(result.final_step * spent.step_s, abs=1e-3)
    for name, why in CANNOT_TELL.items():  # never zero: null, and why
        assert getattr(b, name) is None and g.reasons[name] == why
    assert g.notes == []


def test_a_phase_not_observed_leaves_its_bucket_null_with_the_reason():
    _, events, per_fault = _recorded()
    why = "no worker.exit or detect event after the fault"
    blind = [{**per_fault[0], "detection_s": None, "reasons": {"detection": why}}]
    g = goodput_terms(account(events, blind), blind)
    _adds_up(g)
    assert g["badput_s"]["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] is None
    assert g["reasons"]["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == f"fault 1 (process.kill): detection not measured: {why}"
    # the restart's first step is the recovery less the phases before it: without detection it cannot be told
    assert g["badput_s"]["PROGRAM_STARTUP"] is None and why in g["reasons"]["PROGRAM_STARTUP"]
    assert g["badput_s"]["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] is not None
    assert any("OTHER also holds the time of PROGRAM_STARTUP, INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION" in n for n in g["notes"])

    never = [{**per_fault[0], "checkpoint_load_s": None, "recovery_s": None, "lost_steps": None, "startup_s": None,
              "reasons": {"checkpoint_load": "not observed", "recovery": "training never resumed",
                          "lost_steps": "training never resumed"}}]
    g = goodput_terms(account(events, never), never)
    assert g["badput_s"]["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] is None
    assert g["badput_s"]["WASTED_PROGRESS_FROM_DISRUPTION"] is None
    assert g["reasons"]["WASTED_PROGRESS_FROM_DISRUPTION"].endswith("lost_steps not measured: training never resumed")

    unsaved = [e for e in events if not e["kind"].startswith("ckpt.save")]  # a job that reports no saves
    g = goodput_terms(account(unsaved, per_fault), per_fault)
    assert g["badput_s"]["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] is None
    assert "no checkpoint save was seen" in g["reasons"]["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"]


def test_a_campaign_gives_its_badput_in_the_same_buckets(tmp_path):
    c = measure_campaign(tmp_path / "run", _timeline(tmp_path))
    g, b = c["goodput"], c["badput"]
    _adds_up(g)
    assert g["total_elapsed_s"] == c["wall_s"] and g["productive_s"] == c["kept_s"]
    gb = g["badput_s"]
    assert gb["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(b["detection"] + b["reallocation"])
    assert gb["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(b["recomputed"])
    assert gb["PROGRAM_STARTUP"] + gb["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] == pytest.approx(
        b["startup"] + b["checkpoint_load"] + b["first_step"], abs=0.002)
    assert gb["OTHER"] == pytest.approx(b["unexplained"], abs=0.002)
    # the timeline has no checkpoint save events: chaoskit's own bucket says 0 s, Google's says it cannot tell
    assert b["checkpoint_saves"] == 0.0 and gb["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] is None
    assert json.loads(json.dumps(c))["goodput"] == g
