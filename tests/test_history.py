"""Game-day history: per-scenario figures, regressions against their median, coverage that decays.

The logic is checked on histories written by hand; the end-to-end test runs one real game day of a
kill-rank drill whose workers start 10 s slower (more than any load adds here) after three recorded ones,
and expects it to fail with --fail-on-regression naming the scenario.
"""

from __future__ import annotations

import json
import time

import pytest

from chaoskit.coverage import Capabilities
from chaoskit.history import find_regressions, fresh_coverage, scenario_figures
from tests.conftest import ROOT, run_cli


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


SLOW_START = '''\
import sys, time
time.sleep(float(sys.argv[1]))  # a worker that takes longer to start: heavier imports, a slower file system
from chaoskit.workloads.ddp_train import main
sys.exit(main(sys.argv[2:]))
'''


def _scenario(folder, delay):
    folder.mkdir()
    (folder / "slow_start.py").write_text(SLOW_START)
    (folder / "kill-rank.yaml").write_text(f"""\
name: kill-rank
cluster: {{kind: process, nodes: 2}}   # two ranks are enough to be slower: fewer torch start-ups than three
workload:
  launch: command
  steps: 80
  command: [{folder / "slow_start.py"}, "{delay}", --steps, "80", --step-time, "0.05", --checkpoint-every, "25"]
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 50}}
slo: {{recovery: 90s}}
safety: {{abort_after: 3m}}
""")
    return folder / "kill-rank.yaml"


@pytest.mark.slow
def test_a_slower_job_fails_the_game_day_with_fail_on_regression(tmp_path):
    """One real game day against a history of three earlier ones (written as the game day writes them, by hand
    here: running three more drills would only cost CI minutes) in which kill-rank recovered in 2 s; today its
    workers start 10 s slower, so it recovers in more than 10 s and fails the game day."""
    from tests.conftest import need_torch

    need_torch()
    reports = tmp_path / "reports"
    reports.mkdir()
    earlier = [{"started_at": f"2026-11-0{i}T03:00:00Z", "ended_at": f"2026-11-0{i}T03:01:00Z", "scenarios": 1,
                "passed": 1, "failed": 0, "errored": 0, "plain": 0.05, "weighted": 0.2, "covered": ["software.crash"],
                "exit_code": 0, "figures": {"kill-rank": {"status": "pass", "recovery_s": 2.0 + i / 10}}}
               for i in (1, 2, 3)]
    (reports / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in earlier))
    res = run_cli("gameday", _scenario(tmp_path / "slow", 10), "--out", reports / "gd", "--fail-on-regression", "25%",
                  "--json")
    assert res.code == 1, res.stdout[-2000:] + res.stderr[-2000:]
    gd = res.json
    assert gd["passed"] == 1  # the drill itself met its SLO: only the regression fails the game day
    (reg,) = gd["regressions"]
    assert reg["scenario"] == "kill-rank" and reg["baseline"] == 2.2 and reg["now"] > 10 and reg["runs"] == 3
    assert "regression: kill-rank recovered in" in res.stderr
    history = [json.loads(l) for l in (reports / "history.jsonl").read_text().splitlines()]
    assert len(history) == 4 and history[-1]["figures"]["kill-rank"]["recovery_s"] == reg["now"]  # today's, appended
    page = (reports / "gd" / "index.html").read_text()
    assert "Regression: kill-rank recovered in" in page and "recovery over time, per scenario" in page
