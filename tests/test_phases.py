"""The one table of phases (``chaoskit/core/phases.py``) and what is built from it or must agree with it: the result
model's fields, the order of ``result.json``'s ``phases``, the scenario's ``slo:``, a cascade's phases, the
simulator's options and the exported metrics. Pure: recorded files and models; nothing is started."""

from __future__ import annotations

import json
from typing import Optional, get_args

import pytest
from pydantic import ValidationError

from chaoskit.cli.simulate_cmd import DEFAULT_PHASES
from chaoskit.core.phases import PHASE_TABLE, SLO_PHASES, phase
from chaoskit.core.result import FaultMeasure, Number, PhaseFigures, Phases, RunResult
from chaoskit.faults.api import During
from chaoskit.report.metrics import METRICS
from chaoskit.scenario.model import SLO
from chaoskit.sim.measured import PHASE_FIELDS
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def test_every_phase_has_one_row_with_its_own_name_key_and_label() -> None:
    for field in ("name", "key", "label"):
        values = [getattr(p, field) for p in PHASE_TABLE]
        assert len(set(values)) == len(values), field
    assert all(p.unit in ("s", "steps") for p in PHASE_TABLE)
    assert [p.name for p in SLO_PHASES] == ["detection", "reallocation", "checkpoint_load", "recovery"]
    assert phase("checkpoint_load").key == "checkpoint_load_s"
    with pytest.raises(KeyError):
        phase("checkpoint_load_s")


def test_the_result_model_has_a_field_per_phase_typed_by_its_unit() -> None:
    assert tuple(PhaseFigures.model_fields) == tuple(p.key for p in PHASE_TABLE)
    for model in (Phases, FaultMeasure):
        for p in PHASE_TABLE:
            field = model.model_fields[p.key]
            assert field.annotation == (Optional[Number] if p.unit == "s" else Optional[int]), p.key
            assert field.default is None
    figures = RunResult.model_validate({"phases": {"detection_s": 1.5, "lost_steps": 3}}).phases
    assert figures.detection_s == 1.5 and figures.lost_steps == 3 and figures.recovery_s is None


def test_a_recorded_run_gives_its_phases_in_the_tables_order() -> None:
    """What the runner writes (``assembler.assemble``: one figure per row, in order) is what a real run wrote before
    the table (``tests/data/result/kill-rank.json``) and what every reader of ``result.json`` finds."""
    recorded = json.loads((ROOT / "tests" / "data" / "result" / "kill-rank.json").read_text())
    keys = [p.key for p in PHASE_TABLE]
    headline = list(recorded["phases"])
    # the figures come first, in the table's order (a phase added since the recording is not in it)
    assert headline[:6] == [k for k in keys if k in headline] == ["detection_s", "reallocation_s", "checkpoint_load_s",
                                                                  "startup_s", "recovery_s", "lost_steps"]
    for fault in recorded["per_fault"]:
        assert [k for k in fault if k in keys] == [k for k in keys if k in fault]


def test_the_scenarios_slo_names_every_phase_with_an_slo_and_no_other() -> None:
    phase_fields = [name for name in SLO.model_fields if name != "returns"]
    assert phase_fields == [p.name for p in PHASE_TABLE if p.slo]


def test_a_cascade_strikes_during_the_phases_the_table_marks_and_no_other() -> None:
    cascade = [p.name for p in PHASE_TABLE if p.cascade]
    assert cascade == ["detection", "reallocation", "checkpoint_load"]
    assert get_args(During.model_fields["phase"].annotation) == tuple(cascade)
    for name in cascade:
        assert During.model_validate({"fault": "f0", "phase": name}).phase == name
    with pytest.raises(ValidationError):
        During.model_validate({"fault": "f0", "phase": "recovery"})


def test_the_simulator_fills_in_the_phases_its_model_has_a_term_for() -> None:
    assert PHASE_FIELDS == {p.name: (p.key, p.sim_flag) for p in PHASE_TABLE if p.sim_flag}
    assert set(DEFAULT_PHASES) == set(PHASE_FIELDS)


def test_every_exported_phase_is_a_metric_with_its_help() -> None:
    exported = [p for p in PHASE_TABLE if p.metric]
    assert [p.metric for p in exported] == list(METRICS)[:len(exported)]
    assert all(METRICS[p.metric] == p.metric_help and p.metric_help for p in exported)
    assert all(p.metric.endswith("_seconds") == (p.unit == "s") for p in exported)
