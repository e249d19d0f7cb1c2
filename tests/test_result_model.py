"""result.json as a typed model (``chaoskit/core/result.py``): a real run's file reads into a :class:`RunResult` and
writes back byte for byte; a key the model does not know is kept where it was; a missing part reads as its
default; the committed JSON Schema is the model's. Pure: files in, files out; nothing is started."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from chaoskit.core.result import Check, RunResult, result_schema_dict
from tests.conftest import ROOT, run_cli
from tests.test_report import synth_run

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

RECORDED = sorted((ROOT / "tests" / "data" / "result").glob("*.json"))
"""Real runs' result.json, as the runner wrote them before the model (``chaoskit run scenarios/<name>.yaml`` at
524fc79, copied unchanged)."""


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_a_recorded_result_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    text = path.read_text()
    result = RunResult.read(path)
    assert result.text() == text
    # the parts the readers use are typed
    assert result.verdict in ("pass", "fail") and result.faults and result.per_fault
    assert result.per_fault[0].t_fault == result.faults[0].t_fault
    assert result.checks and all(isinstance(check, Check) for check in result.checks.values())
    assert all(isinstance(entry.passed, bool) for entry in result.slo.values())


def test_the_recorded_results_are_real_runs() -> None:
    assert RECORDED, "tests/data/result/ holds a real run's result.json"


def test_a_synthesized_run_reads_and_writes_back(tmp_path: Path) -> None:
    raw = synth_run(tmp_path / "run")
    assert RunResult.model_validate(raw).dump() == raw
    assert json.dumps(RunResult.model_validate(raw).dump()) == json.dumps(raw)  # the order too


def test_an_unknown_key_is_kept_where_it_was() -> None:
    raw = {"scenario": "s", "from_the_future": {"x": 1}, "verdict": "pass",
           "phases": {"detection_s": 1.5, "new_phase_s": 2, "lost_steps": 3},
           "checks": {"steady_state": {"pass": True, "step": 3, "also": "kept"}}}
    result = RunResult.model_validate(raw)
    assert json.dumps(result.dump()) == json.dumps(raw)
    assert result.model_extra == {"from_the_future": {"x": 1}}
    assert result.phases.detection_s == 1.5 and result.checks["steady_state"].passed


def test_only_the_given_keys_are_written_and_numbers_keep_their_type() -> None:
    result = RunResult.model_validate({"scenario": "s", "slo": {"detection": {"limit_s": 30, "measured_s": None,
                                                                              "pass": False, "reason": "not observed"}}})
    assert result.dump() == {"scenario": "s", "slo": {"detection": {"limit_s": 30, "measured_s": None, "pass": False,
                                                                     "reason": "not observed"}}}
    assert json.dumps(result.dump()["slo"]["detection"]["limit_s"]) == "30"  # not 30.0
    assert RunResult().dump() == {}
    assert RunResult().verdict == "error" and RunResult().phases.detection_s is None


def test_the_committed_result_schema_is_the_models() -> None:
    res = run_cli("schema", "--result")
    assert res.code == 0
    committed = json.loads((ROOT / "chaoskit.result.schema.json").read_text())
    assert json.loads(res.stdout) == committed == result_schema_dict(), \
        "run: chaoskit schema --result -o chaoskit.result.schema.json"


def test_the_schema_holds_the_recorded_and_the_synthesized_results(tmp_path: Path) -> None:
    schema = json.loads((ROOT / "chaoskit.result.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # once: jsonschema.validate() checks it again on every call (issue 52)
    validator = cls(schema)
    for path in RECORDED:
        validator.validate(json.loads(path.read_text()))
    validator.validate(synth_run(tmp_path / "run"))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"phases": {"detection_s": "soon"}})
