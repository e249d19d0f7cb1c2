"""Game-day history: per-scenario figures, regressions against their median, coverage that decays.

The logic is checked on histories written by hand; the end-to-end test reads the session's real game day
(tests/drill_fixtures.py), run after three recorded ones in which kill-uninstrumented recovered faster than a torchrun
restart can, and expects it to fail with --fail-on-regression naming the scenario.
"""

from __future__ import annotations

import json
import time

import pytest

from chaoskit.coverage import Capabilities
from chaoskit.history import find_regressions, fresh_coverage, scenario_figures
from tests.conftest import ROOT, run_cli
from tests.drill_fixtures import EARLIER

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

pytest_plugins = ["tests.drill_fixtures"]


def _entry(started_at, figures, covered=()):
    return {"started_at": started_at, "figures": {n: {"status": "pass", "recovery_s": v} for n, v in figures.items()},
            "covered": list(covered)}


def test_recovery_more_than_the_threshold_above_the_median_of_the_last_runs_is_a_regression():
    history = [_entry(f"2026-11-0{i}T00:00:00Z", {"kill-rank": v, "hang-rank": 12.0}) for i, v in
               enumerate((100.0, 6.0, 7.0, 6.5, 7.5, 6.0), 1)]  # the 100 s run is older than the window of 5
    now = {"kill-rank": {"recovery_s": 8.5}, "hang-rank": {"recovery_s": 14.0}, "new-one": {"recovery_s": 3.0}}
    found = find_regressions(now, history, 0.25)
    assert [r["scenario"] for r in found] == ["kill-rank"]  # median 6.5 -> 8.5 is +31%; hang-rank +17%
    assert found[0]["baseline"] == 6.5 and found[0]["runs"] == 5 and found[0]["ratio"] == pytest.approx(8.5 / 6.5, abs=1e-3)
    assert find_regressions(now, history, 0.40) == []
    assert find_regressions({"kill-rank": {"recovery_s": None}}, history, 0.0) == []  # not observed: its SLO judges it


def test_figures_keep_each_scenario_that_ran_with_its_samples():
    records = [{"scenario": "a", "status": "pass", "phases": {"recovery_s": 5.0, "detection_s": 0.1}, "samples": 3},
               {"scenario": "b", "status": None, "phases": None}]
    figures = scenario_figures(records)
    assert set(figures) == {"a"} and figures["a"]["recovery_s"] == 5.0 and figures["a"]["samples"] == 3


def test_fresh_coverage_counts_a_class_only_while_a_game_day_proved_it_within_the_window():
    now = time.time()
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    history = [_entry(iso(now - 40 * 86400), {}, ["network.nic"]), _entry(iso(now - 10 * 86400), {}, ["software.hang"])]
    records = [{"scenario": "kill-rank", "covers": ["software.crash"], "injected_kinds": ["process.kill"], "status": "pass"}]
    caps = Capabilities.from_dict({})
    fresh = fresh_coverage(records, caps, history, 30 * 86400, now)
    assert set(fresh["covered"]) == {"software.crash", "software.hang"}  # the 40-day-old proof has decayed
    assert fresh["proven_at"]["software.hang"] == history[1]["started_at"]
    assert set(fresh_coverage(records, caps, history, 60 * 86400, now)["covered"]) >= {"network.nic"}


def test_bad_flags_are_one_line_and_exit_2(tmp_path):
    s = ROOT / "scenarios" / "kill-rank.yaml"
    for args, text in ((["--fail-on-regression", "abc"], "is not a number"), (["--fresh", "thirty"], "--fresh 'thirty'"),
                       (["--fail-on-regression", "-5%"], "outside")):
        res = run_cli("gameday", s, "--out", tmp_path / "gd", *args)
        assert res.code == 2 and text in res.stdout + res.stderr, res.stdout + res.stderr
        assert not (tmp_path / "gd").exists()


@pytest.mark.slow
def test_a_slower_job_fails_the_game_day_with_fail_on_regression(recorded_gameday):
    """The session's real game day (tests/drill_fixtures.py) ran against a history of three earlier ones (written as
    the game day writes them) in which kill-uninstrumented recovered in 0.6-0.8 s, faster than a torchrun restart can
    be: today it recovers slower than their median by more than --fail-on-regression 25%, which fails the game day
    though every drill met its SLO and the coverage its minimum."""
    res, summary = recorded_gameday.res, recorded_gameday.summary()
    assert res.code == summary["exit_code"] == 1, res.stdout[-2000:] + res.stderr[-2000:]
    # only the regression fails it: every drill passed, the coverage is above --min-coverage
    assert summary["passed"] == summary["total"] == 2 and not summary["coverage_below_minimum"], summary["scenarios"]
    (reg,) = summary["regressions"]
    now = recorded_gameday.result("kill-uninstrumented")["phases"]["recovery_s"]
    assert reg["scenario"] == "kill-uninstrumented" and reg["baseline"] == 0.7 and reg["runs"] == len(EARLIER)
    assert now > 0.7 * 1.25 and reg["now"] == pytest.approx(now, abs=1e-4)
    assert reg["ratio"] == pytest.approx(now / 0.7, abs=1e-3)
    assert "regression: kill-uninstrumented recovered in" in res.stdout + res.stderr
    history = [json.loads(l) for l in (recorded_gameday.out.parent / "history.jsonl").read_text().splitlines()]
    assert history[:-1] == EARLIER  # today's appended after them
    assert history[-1]["figures"]["kill-uninstrumented"]["recovery_s"] == pytest.approx(now, abs=1e-4)
    assert history[-1]["exit_code"] == 1
    page = (recorded_gameday.out / "index.html").read_text()
    assert "Regression: kill-uninstrumented recovered in" in page and "recovery over time, per scenario" in page
