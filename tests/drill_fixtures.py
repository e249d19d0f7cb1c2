"""One real game day for the whole session: kill-uninstrumented and hang-rank on one shared process lab (issue 52).

Load it in a test module with::

    pytest_plugins = ["tests.drill_fixtures"]

(a plugin module, so the game day runs once for every module that uses it). It is where the stories "a rank of a job
that never imports chaoskit is killed, and it is measured from its logs" and "a rank hangs past the collective
timeout" are drilled end to end; what is derived from a drill is tested on its run folders: the phases and files of
each run (test_drills.py), coverage, JUnit and the report (test_gameday.py), the history and its regressions
(test_history.py). kill-rank, the same kill with chaoskit's SDK, is test_drills.py's ``chaoskit run`` to the end
of training (a game day stops each drill once recovery is measured).

The game day is run as a nightly one is: into ``reports/night`` beside a ``reports/history.jsonl`` that already
holds :data:`EARLIER` (three earlier game days in which kill-uninstrumented recovered in 0.6-0.8 s, faster than a
torchrun restart can be: a real one restarts the workers, which import torch again), with
``--fail-on-regression 25%`` and ``--min-coverage 10%``. So kill-uninstrumented's recovery today is a regression
however loaded the machine is, and when both drills pass the game day exits 1 for that alone.

Tests read what it wrote and never change it: one that rewrites a file works on a copy (:func:`copy_gameday`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, CliResult, lab_fixture, need_torch, run_cli

SCENARIO_NAMES = ("kill-uninstrumented", "hang-rank")
"""The shipped process-lab scenarios the game day runs, in this order."""

EARLIER = [{"started_at": f"2026-11-0{i}T03:00:00Z", "ended_at": f"2026-11-0{i}T03:01:00Z", "scenarios": 1,
            "passed": 1, "failed": 0, "errored": 0, "plain": 0.05, "weighted": 0.2, "covered": ["software.crash"],
            "exit_code": 0, "figures": {"kill-uninstrumented": {"status": "pass", "recovery_s": 0.5 + i / 10}}}
           for i in (1, 2, 3)]
"""The history before the game day, as the game day writes it (median kill-uninstrumented recovery 0.7 s)."""

REGRESSION_THRESHOLD = "25%"
MIN_COVERAGE = 0.10
"""``--min-coverage``: below the 2 of 18 classes (11.1%) the two drills cover when they pass, so a game day of two
passing drills fails for its regression alone."""


@dataclass
class RecordedGameday:
    res: CliResult
    """What ``chaoskit gameday`` printed and its exit code."""
    out: Path
    """The game-day folder (``reports/night``); its history is ``out.parent / "history.jsonl"``."""
    lab_left: object
    """The process lab found in the state folder after the game day (``None``: it was taken down)."""

    def summary(self) -> dict:
        return json.loads((self.out / "gameday.json").read_text())

    def record(self, scenario: str) -> dict:
        [record] = [r for r in self.summary()["scenarios"] if r["scenario"] == scenario]
        return record

    def run_dir(self, scenario: str) -> Path:
        """The run folder of one scenario's drill."""
        return self.out / self.record(scenario)["dir"]

    def result(self, scenario: str) -> dict:
        return json.loads((self.run_dir(scenario) / "result.json").read_text())


@lab_fixture(scope="session")
def recorded_gameday(tmp_path_factory: pytest.TempPathFactory) -> RecordedGameday:
    """The session's game day of kill-rank and hang-rank (see the module's docstring), run once."""
    from chaoskit.lab.process import ProcessLab

    need_torch()
    base = tmp_path_factory.mktemp("gameday")
    reports = base / "reports"
    reports.mkdir()
    (reports / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EARLIER))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHAOSKIT_STATE_DIR", str(base / "state"))
        files = [SCENARIOS / f"{name}.yaml" for name in SCENARIO_NAMES]
        res = run_cli("gameday", *files, "--out", reports / "night", "--min-coverage", f"{MIN_COVERAGE:.0%}",
                      "--fail-on-regression", REGRESSION_THRESHOLD)
        # both run on one shared process lab, which is gone afterwards: nothing of it left in the state folder
        left = ProcessLab.load(base / "state" / "lab" / "process.json")
    return RecordedGameday(res, reports / "night", left)


def copy_gameday(gameday: RecordedGameday, dest: Path) -> Path:
    """A copy of the game day (its folder and the history beside it, without checkpoints) under ``dest``, for a
    test that rewrites files; the copy's game-day folder."""
    shutil.copy(gameday.out.parent / "history.jsonl", dest / "history.jsonl")
    shutil.copytree(gameday.out, dest / gameday.out.name, ignore=shutil.ignore_patterns("checkpoints"))
    return dest / gameday.out.name
