"""chaoskit, as root, never reads through another user's link, nor copies a file only root may read into a file
they read, and never writes the files it leaves through a link (issue 48: "reads stay in bounds", "writes follow
no link").

``chaoskit report DIR`` runs as root on a folder a second user (conftest's ``job_user``) controls: what it renders
(``result.json``, ``events.jsonl``, ``gameday.json``, ``history.jsonl``) must be a regular file not reached through
their link, and one they could read themselves, since they read the page. The writers that still wrote by name
(``gameday --out``, ``export --openmetrics``, JUnit, the scorecard, the job folder's parent) make or replace their
file from its folder's descriptor, never following a link planted at its name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_no_link_writes import _as_user, theirs  # noqa: F401 - the fixture
from tests.test_report import record_for, synth_gameday, synth_run

SECRET = "root-only-secret"


def _root_only_run(roots: Path) -> Path:
    """A run of root's whose files only root may read (0600, in root's 0700 folder), named :data:`SECRET`."""
    run = roots / "run"
    synth_run(run, SECRET)
    for f in run.iterdir():
        f.chmod(0o600)
    return run


def _user_run(own: Path, name: str = "run", result: bool = True) -> Path:
    _as_user("mkdir", str(own / name))
    synth_run(own / name, write_result=result)
    return own / name


def _page(folder: Path) -> str:
    for name in ("report.html", "index.html"):
        if (folder / name).is_file():
            return (folder / name).read_text()
    return ""


@pytest.mark.parametrize("name", ["result.json", "events.jsonl"])
def test_report_never_reads_through_the_users_link_to_a_root_only_file(theirs, name):
    own, roots = theirs
    secret = _root_only_run(roots)
    run = _user_run(own, result=name != "result.json")
    if (run / name).exists():
        (run / name).unlink()
    _as_user("ln", "-s", str(secret / name), str(run / name))
    res = run_cli("report", run)
    assert res.code == 2, (res.code, res.stderr)
    assert "is a link of uid" in res.stderr and name in res.stderr
    assert SECRET not in _page(run) and "n1" not in _page(run)


def test_report_never_copies_a_root_only_file_the_user_renamed_into_their_page(theirs):
    own, roots = theirs
    run = _user_run(own, result=False)
    left = run / "journal.jsonl"  # a file root left in the user's folder, 0600: only root may read it
    left.write_text(json.dumps(synth_run(roots / "src", SECRET)))
    left.chmod(0o600)
    _as_user("mv", str(left), str(run / "result.json"))
    res = run_cli("report", run)
    assert res.code == 2, (res.code, res.stderr)
    assert "could read" in res.stderr and "result.json" in res.stderr
    assert SECRET not in _page(run)
    # made readable by all, it is the user's to see and renders
    (run / "result.json").chmod(0o644)
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    assert SECRET in _page(run)


def test_a_game_day_of_the_users_never_renders_a_run_only_root_may_reach(theirs):
    own, roots = theirs
    synth_run(roots / "run", SECRET)  # files 0644, but in root's 0700 folder
    _as_user("mkdir", str(own / "gameday"))
    gd = own / "gameday"
    record = record_for(1, json.loads((roots / "run" / "result.json").read_text()))
    record["dir"] = os.path.relpath(roots / "run", gd)
    synth_gameday(gd, [record])
    res = run_cli("report", gd)
    assert res.code == 2, (res.code, res.stderr)
    assert "could read" in res.stderr
    assert SECRET not in _page(gd)


def test_a_game_days_history_is_never_read_through_the_users_link(theirs):
    own, roots = theirs
    history = roots / "history.jsonl"
    history.write_text(json.dumps({"started_at": "2027-01-12T02:00:00.000Z", "plain": 0.5, "weighted": 0.5,
                                   "passed": 1, "scenarios": 1}) + "\n")
    history.chmod(0o600)
    _as_user("mkdir", str(own / "days"))
    gd = own / "days" / "gameday"
    _as_user("mkdir", str(gd))
    synth_gameday(gd, [record_for(1, synth_run(gd / "01-kill-rank"))])
    _as_user("ln", "-s", str(history), str(own / "days" / "history.jsonl"))
    res = run_cli("report", gd)
    assert res.code == 2, (res.code, res.stderr)
    assert "history.jsonl" in res.stderr and "is a link of uid" in res.stderr


def test_root_reports_its_own_root_only_run(tmp_path):
    """Nobody else can change root's own folder: its 0600 files render, the page in that folder."""
    run = tmp_path / "run"
    synth_run(run, SECRET)
    for f in run.iterdir():
        f.chmod(0o600)
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    assert SECRET in _page(run)


def test_a_fifo_at_events_jsonl_is_never_opened(theirs):
    own, _ = theirs
    run = _user_run(own)
    (run / "events.jsonl").unlink()
    _as_user("mkfifo", str(run / "events.jsonl"))
    res = run_cli("report", run)  # opening it would block until the user writes
    assert res.code == 2, (res.code, res.stderr)
    assert "a FIFO" in res.stderr and "events.jsonl" in res.stderr


# -- the writers: each file made or replaced from its folder's descriptor, never through a link ---------------


def test_export_openmetrics_never_writes_through_the_users_folder_link(theirs):
    own, roots = theirs
    run = _user_run(own)
    _as_user("ln", "-s", str(roots), str(own / "to-root"))
    res = run_cli("export", run, "--openmetrics", own / "to-root" / "metrics.prom")
    assert res.code == 2 and "is a link of uid" in res.stderr, (res.code, res.stderr)
    assert os.listdir(roots) == []
    # a link at the file's own name is replaced, its target never made
    _as_user("ln", "-s", str(roots / "evil.pth"), str(own / "metrics.prom"))
    res = run_cli("export", run, "--openmetrics", own / "metrics.prom")
    assert res.code == 0, res.stderr
    assert os.listdir(roots) == [] and not (own / "metrics.prom").is_symlink()
    assert "chaoskit_" in (own / "metrics.prom").read_text()


def test_junit_and_the_scorecards_files_replace_a_link_and_never_write_where_it_points(theirs):
    from chaoskit.report.junit import write_junit
    from chaoskit.report.scorecard import write_scorecard_html, write_scorecard_metrics

    own, roots = theirs
    _as_user("mkdir", str(own / "gd"))
    gd = own / "gd"
    summary = synth_gameday(gd, [record_for(1, synth_run(gd / "01-kill-rank"))])
    card = {"stacks": ["torchrun"], "faults": ["hang"], "cells": [], "duration_s": 1}
    for name in ("junit.xml", "index.html", "metrics.prom"):
        _as_user("ln", "-s", str(roots / f"{name}.pth"), str(gd / name))
    write_junit(summary, gd / "junit.xml")
    write_scorecard_html(gd, card)
    write_scorecard_metrics(gd, card)
    assert os.listdir(roots) == []
    for name in ("junit.xml", "index.html", "metrics.prom"):
        assert not (gd / name).is_symlink() and (gd / name).stat().st_size > 0


def test_gameday_out_through_the_users_link_is_refused_before_anything_is_written(theirs, tmp_path):
    own, roots = theirs
    (tmp_path / "broken.yaml").write_text("name: broken\nfaults: [\n")
    _as_user("ln", "-s", str(roots), str(own / "to-root"))
    res = run_cli("gameday", tmp_path / "broken.yaml", "--out", own / "to-root" / "night")
    assert res.code == 2 and "uid" in res.stderr, (res.code, res.stderr)  # their folder, or their link in it
    assert os.listdir(roots) == []


def test_a_game_days_history_is_never_appended_through_a_link_in_a_shared_folder(theirs, tmp_path):
    """``--out /tmp/night``: ``history.jsonl`` goes in ``/tmp``, where anyone may plant a link at that name."""
    own, roots = theirs
    shared = own.parent / "shared"  # root's, in a folder anyone may pass through
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: anyone may add a file, none may replace another's
    (tmp_path / "broken.yaml").write_text("name: broken\nfaults: [\n")
    victim = roots / "keep.txt"
    victim.write_text("root's own\n")
    _as_user("ln", "-s", str(victim), str(shared / "history.jsonl"))
    res = run_cli("gameday", tmp_path / "broken.yaml", "--out", shared / "night")
    assert res.code == 2 and "history.jsonl" in res.stderr, (res.code, res.stderr)
    assert victim.read_text() == "root's own\n"


def test_a_repeat_or_campaign_out_and_the_jobs_folder_are_never_made_through_the_users_link(theirs, job_user):
    from chaoskit.core.errors import ScenarioError
    from chaoskit.core.files import empty_out_dir, make_folder_for

    own, roots = theirs
    _as_user("ln", "-s", str(roots), str(own / "to-root"))
    with pytest.raises(ScenarioError, match="uid"):
        empty_out_dir(own / "to-root" / "x5", "repeat")
    # the runner's RUN.job folder for a job of another user's, below a folder reached through their link
    with pytest.raises(ScenarioError, match="is a link of uid"):
        make_folder_for(own / "to-root" / "runs" / "r1.job", job_user.pw_uid, job_user.pw_gid, dirs=("checkpoints",))
    assert os.listdir(roots) == []
