"""Game days: a suite of scenarios, coverage, JUnit, the report and the trend.

The slow tests read the session's one real game day of the shipped process-lab
scenarios (tests/drill_fixtures.py: kill-uninstrumented and hang-rank on one shared lab, with
a history in which kill-uninstrumented recovered faster than it can); the others need no training job.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chaoskit.coverage import Capabilities
from chaoskit.gameday import GAMEDAY_FILE, HISTORY_FILE, summarize
from tests.conftest import SCENARIOS, run_cli
from tests.drill_fixtures import EARLIER, MIN_COVERAGE, SCENARIO_NAMES, copy_gameday

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

pytest_plugins = ["tests.drill_fixtures"]

# What each shipped scenario claims, and the real-world weight of those classes,
# worked out by hand from the catalog and the Llama 3 table.
# kill-rank would claim software.crash again; its drill to the end of training is tests/test_drills.py's (CI minutes)
CLAIMS = {"kill-uninstrumented": "software.crash", "hang-rank": "software.hang"}
assert tuple(CLAIMS) == SCENARIO_NAMES
WEIGHT = {"software.crash": 54 + 2, "software.hang": 7}
CATALOG_SIZE, INTERRUPTIONS = 18, 419  # 18 classes since degraded storage (storage.slow/error, weight 0: no Llama 3 row)


# -- without a training job -------------------------------------------------------------


BAD_YAML = "name: broken\nfaults: [\n"
NO_SUCH_RANK = """\
name: no-such-rank
faults:
  - kind: process.kill
    target: {ranks: [7]}
    at: {step: 10}
"""
WRONG_CLAIM = """\
name: wrong-claim
covers: [software.hang]
faults:
  - kind: process.kill
    target: {ranks: [1]}
    at: {step: 10}
"""


def test_gameday_goes_on_past_scenarios_that_cannot_start(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "a-broken.yaml").write_text(BAD_YAML)
    (suite / "b-rank.yaml").write_text(NO_SUCH_RANK)
    (suite / "c-claim.yaml").write_text(WRONG_CLAIM)
    out = tmp_path / "reports" / "night-1"
    res = run_cli("gameday", suite, "--out", out)
    assert res.code == 1, res.stderr
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    assert summary["finished"] is True and summary["exit_code"] == 1
    assert (summary["total"], summary["passed"], summary["errored"]) == (3, 0, 3)
    by_name = {r["scenario"]: r for r in summary["scenarios"]}
    assert set(by_name) == {"a-broken", "no-such-rank", "wrong-claim"}
    assert "YAML syntax error" in by_name["a-broken"]["error"]["message"]
    # the runner itself refused this one (exit 2), after the game day had started it
    assert "rank" in by_name["no-such-rank"]["error"]["message"]
    assert by_name["no-such-rank"]["exit_code"] == 2 and by_name["no-such-rank"]["covers"] == ["software.crash"]
    assert "covers: software.hang is not exercised by process.kill" in by_name["wrong-claim"]["error"]["message"]
    for r in summary["scenarios"]:
        error = json.loads((out / r["dir"] / "error.json").read_text())
        assert error["message"] == r["error"]["message"]
    assert summary["coverage"]["covered"] == [] and summary["coverage"]["plain"] == 0
    # every output is there, and the history gained a line
    assert (out / "index.html").is_file() and (out / "junit.xml").is_file()
    history = (tmp_path / "reports" / HISTORY_FILE).read_text().splitlines()
    assert len(history) == 1 and json.loads(history[0])["errored"] == 3
    assert "scenarios: 0 passed, 0 failed, 3 errored" in res.stdout
    for column in ("scenario", "phase", "elapsed"):
        assert column in res.stdout

    from junitparser import Error, JUnitXml

    [suite_xml] = list(JUnitXml.fromfile(str(out / "junit.xml")))
    assert (suite_xml.tests, suite_xml.errors) == (3, 3)
    assert all(isinstance(c.result[0], Error) for c in suite_xml)

    # a second game day into the same folder is refused; a new one extends the trend
    res = run_cli("gameday", suite, "--out", out)
    assert res.code == 2 and "already holds a game day" in res.stderr
    res = run_cli("gameday", suite / "a-broken.yaml", "--out", tmp_path / "reports" / "night-2")
    assert res.code == 1
    assert len((tmp_path / "reports" / HISTORY_FILE).read_text().splitlines()) == 2
    html = (tmp_path / "reports" / "night-2" / "index.html").read_text()
    assert "Trend over 2 game days" in html


@pytest.mark.parametrize("value", ["abc", "150", "-5%"])
def test_min_coverage_must_be_a_fraction(value: str, tmp_path: Path) -> None:
    res = run_cli("gameday", SCENARIOS, "--out", tmp_path / "gd", "--min-coverage", value)
    assert res.code == 2 and "--min-coverage" in res.stderr
    assert not (tmp_path / "gd").exists()


def test_gameday_without_scenarios_is_bad_input(tmp_path: Path) -> None:
    res = run_cli("gameday", tmp_path, "--out", tmp_path / "gd")
    assert res.code == 2 and "no scenario files" in res.stderr


# -- one real game day of the shipped scenarios -------------------------------------------


@pytest.fixture
def real_gameday(recorded_gameday):
    """(CLI result, game-day folder, the lab left in its state folder) of the session's game day."""
    return recorded_gameday.res, recorded_gameday.out, recorded_gameday.lab_left


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_gameday_scores_coverage_by_hand(real_gameday) -> None:
    res, out, left = real_gameday
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    records = {r["scenario"]: r for r in summary["scenarios"]}
    assert set(records) == set(CLAIMS), res.stderr
    for name, r in records.items():
        assert r["status"] in ("pass", "fail", "aborted"), (name, r["error"])
        assert r["covers"] == [CLAIMS[name]] and r["category"] == "software"
        assert r["injected_kinds"] == r["kinds"]  # the fault really went in
        assert json.loads((out / r["dir"] / "result.json").read_text())["verdict"] == r["status"]
    # by hand: a class is covered when one of its scenarios passed
    covered = sorted({CLAIMS[n] for n, r in records.items() if r["status"] == "pass"})
    plain = len(covered) / CATALOG_SIZE
    weighted = sum(WEIGHT[c] for c in covered) / INTERRUPTIONS
    cov = summary["coverage"]
    assert sorted(cov["covered"]) == covered
    assert cov["plain"] == pytest.approx(plain) and cov["weighted"] == pytest.approx(weighted)
    assert (cov["total"], cov["weight_total"]) == (CATALOG_SIZE, INTERRUPTIONS)
    all_passed = all(r["status"] == "pass" for r in records.values())
    # kill-uninstrumented recovered slower than the history's median by more than --fail-on-regression: the game day
    # fails for that (test_history.py looks at the regression); the same records without it pass or fail on their own
    assert [r["scenario"] for r in summary["regressions"]] == ["kill-uninstrumented"]
    assert res.code == summary["exit_code"] == 1
    assert summary["coverage_below_minimum"] is (plain < MIN_COVERAGE)
    alone = summarize("x", summary["scenarios"], Capabilities.from_dict(summary["capabilities"]), started=0,
                      min_coverage=MIN_COVERAGE)
    assert alone["exit_code"] == (0 if all_passed and plain >= MIN_COVERAGE else 1)
    statuses = {c["id"]: c for c in cov["classes"]}
    for cid in ("software.crash", "software.hang"):
        assert statuses[cid]["status"] == ("covered" if cid in covered else "failed")
    # a GPU failure runs here as an emulated crash loop, a driver error as its Xid line; neither was drilled
    assert statuses["hardware.gpu"]["status"] == "not attempted"
    assert statuses["software.driver"]["status"] == "not attempted"
    # the two process-lab scenarios shared one lab, verified clean between them, and it was taken down
    [lab] = summary["labs"]
    assert lab["kind"] == "process" and sorted(lab["scenarios"]) == sorted(CLAIMS) and lab["down_s"] is not None
    first, second = summary["scenarios"]
    assert first["lab"]["reused"] is False and second["lab"] == {"kind": "process", "reused": True, "ready_s": second["lab"]["ready_s"]}
    assert left is None
    # a game day stops each drill once recovery is measured: hang-rank's 15 s hang is reverted then if it is not
    # over yet (and the notes say so), else when it is; either way it was reverted and verified
    hang_dir = out / records["hang-rank"]["dir"]
    hang = json.loads((hang_dir / "result.json").read_text())
    events = [json.loads(line) for line in (hang_dir / "events.jsonl").read_text().splitlines()]
    [t_fault] = [e["ts"] for e in events if e["kind"] == "fault.injected"]
    [t_revert] = [e["ts"] for e in events if e["kind"] == "fault.reverted"]
    cut = [n for n in hang["notes"] if "once recovery was measured" in n]
    assert bool(cut) == (t_revert - t_fault < 14.5), (t_revert - t_fault, hang["notes"])
    assert hang["checks"]["faults_reverted"]["pass"] is True
    # the trend line carries the same figures, after the earlier game days
    lines = (out.parent / HISTORY_FILE).read_text().splitlines()
    assert len(lines) == len(EARLIER) + 1
    entry = json.loads(lines[-1])
    assert entry["plain"] == pytest.approx(plain) and entry["weighted"] == pytest.approx(weighted)
    # the terminal saw each scenario's progress and the final figures
    for name in CLAIMS:
        assert f"{name}: " in res.stdout and "inject" in res.stdout
    assert f"coverage: {len(covered)}/{CATALOG_SIZE} classes ({plain:.1%})" in res.stdout
    # below a minimum, the same records fail the game day
    strict = summarize("x", summary["scenarios"], Capabilities.from_dict(summary["capabilities"]), started=0, min_coverage=0.5)
    assert strict["coverage_below_minimum"] is True and strict["exit_code"] == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_gameday_junit_is_readable(real_gameday) -> None:
    from junitparser import Failure, JUnitXml

    _, out, _ = real_gameday
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    [suite] = list(JUnitXml.fromfile(str(out / "junit.xml")))
    cases = {c.name: c for c in suite}
    assert set(cases) == set(CLAIMS)
    failing = [r for r in summary["scenarios"] if r["status"] != "pass"]
    assert (suite.tests, suite.failures, suite.errors) == (len(CLAIMS), len(failing), 0)
    for r in summary["scenarios"]:
        case = cases[r["scenario"]]
        assert case.classname == "software" and case.time == pytest.approx(r["duration_s"], abs=0.001)
        if r["status"] == "pass":
            assert case.is_passed and "detection" in case.system_out
        else:
            assert isinstance(case.result[0], Failure) and "verdict:" in case.result[0].text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_rebuilds_and_twenty_scenarios_stay_small(recorded_gameday, tmp_path: Path) -> None:
    out = copy_gameday(recorded_gameday, tmp_path)  # the session's folder is read by other tests: rebuild a copy
    summary = json.loads((out / GAMEDAY_FILE).read_text())
    before = (out / "index.html").read_text()
    (out / "index.html").unlink()
    res = run_cli("report", out)
    assert res.code == 0 and res.stdout.strip() == str(out / "index.html"), res.stderr
    assert (out / "index.html").read_text().count('class="card"') == before.count('class="card"') == len(CLAIMS)
    cov = summary["coverage"]
    assert f"{cov['covered_count']}/{cov['total']}" in before

    # 20 scenarios: copies of the real run folders, as a nightly game day would have them
    big = tmp_path / "night-20"
    records = []
    for i in range(1, 21):
        src = summary["scenarios"][(i - 1) % len(summary["scenarios"])]
        dest = f"{i:02d}-{src['scenario']}-{i}"
        shutil.copytree(out / src["dir"], big / dest, ignore=shutil.ignore_patterns("checkpoints"))
        records.append({**src, "index": i, "dir": dest, "scenario": f"{src['scenario']}-{i}"})
    big_summary = summarize(big.name, records, Capabilities.from_dict(summary["capabilities"]), started=0, ended=2400)
    (big / GAMEDAY_FILE).write_text(json.dumps(big_summary))
    res = run_cli("report", big)
    assert res.code == 0, res.stderr
    html = (big / "index.html").read_text()
    assert html.count('class="card"') == 20
    assert (big / "index.html").stat().st_size < 1_000_000


def test_a_game_day_stopped_early_says_so_and_keeps_what_ran():
    """Ctrl-C after the first of three scenarios: gameday.json says it stopped early, why, and how far it got."""
    records = [{"index": i, "scenario": f"s{i}", "status": status, "exit_code": 0, "injected_kinds": [], "covers": [],
                "verdict": status} for i, status in enumerate(["pass", None, None])]
    summary = summarize("x", records, Capabilities.from_dict({}), started=0, finished=True, interrupted=True)
    assert summary["stopped"] == {"early": True, "why": "interrupted by Ctrl-C or SIGTERM", "ran": 1, "of": 3}
    assert summary["exit_code"] == 130 and summary["not_run"] == 2
    done = summarize("x", [{**records[0]}], Capabilities.from_dict({}), started=0)
    assert done["stopped"]["early"] is False and done["stopped"]["why"] is None
