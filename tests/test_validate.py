"""Bad input: every malformed scenario exits 2 with file:line:col, and nothing is touched."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from chaoskit.cluster.transports.local import read_proc
from tests.conftest import ROOT, SCENARIOS, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

BAD = sorted((ROOT / "tests" / "scenarios" / "bad").glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, str]:
    m = re.match(r"# expect: (\d+:\d+) (.+)", path.read_text().splitlines()[0])
    assert m, f"{path} lacks an '# expect: LINE:COL message' header"
    return m.group(1), m.group(2).strip()


def test_there_are_enough_bad_scenarios():
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_validate_reports_file_line_col(path: Path):
    where, message = _expectation(path)
    res = run_cli("validate", path)
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert any(line.startswith(f"{path}:{where}: ") and message in line for line in lines), res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_run_refuses_bad_input_and_touches_nothing(path: Path, tmp_path: Path, monkeypatch):
    before = {p.pid for p in read_proc()}
    mark = f"refused-{os.getpid()}-{path.stem}"
    monkeypatch.setenv("CHAOSKIT_TEST_MARK", mark)  # what this run could start carries it (other runs may share the machine)
    res = run_cli("run", path, "--out", tmp_path / "run")
    assert res.code == 2, res.stderr
    where, _ = _expectation(path)
    assert res.stderr.startswith(f"error: {path}:{where}: ")
    assert len(res.stderr.strip().splitlines()) <= 2  # one line, plus at most a hint
    assert not (tmp_path / "run").exists()
    new = [p for p in read_proc() if p.pid not in before and (p.env.get("CHAOSKIT_TEST_MARK") == mark or p.ppid == os.getpid())]
    assert new == []


def test_shipped_scenarios_are_valid():
    res = run_cli("validate", SCENARIOS)
    assert res.code == 0, res.stderr
    assert "invalid" not in res.stderr
    assert re.search(r"(\d+) valid, 0 invalid", res.stdout)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_dry_run_with_no_lab_up(path: Path):
    """What a run would do, shown before any lab exists: the lab's own interfaces, power commands and
    containers, with placeholders only where the live lab alone can tell."""
    res = run_cli("run", path, "--dry-run", "--json")
    assert res.code == 0, res.stderr
    plan = res.json["plan"]
    assert plan and all(fault["actions"] for fault in plan)
    commands = " ".join(a["command"] for fault in plan for a in fault["actions"])
    assert "None" not in commands


def test_validate_folder_counts_and_fails_on_any_error(tmp_path: Path):
    good = (SCENARIOS / "kill-rank.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good)
    (tmp_path / "b.yaml").write_text(good.replace("signal: SIGKILL", "signal: SIGNOPE"))
    res = run_cli("validate", tmp_path)
    assert res.code == 2
    assert "1 valid, 1 invalid" in res.stdout
    assert f"{tmp_path / 'b.yaml'}:" in res.stderr


def test_validate_json_output(tmp_path: Path):
    res = run_cli("validate", "--json", SCENARIOS / "kill-rank.yaml", BAD[0])
    assert res.code == 2
    data = res.json
    assert data["errors"] == 1
    assert [f["ok"] for f in data["files"]] == [True, False]


def test_missing_file_is_bad_input(tmp_path: Path):
    res = run_cli("validate", tmp_path / "nope.yaml")
    assert res.code == 2
    assert "no such file" in res.stderr


def test_durations_accept_the_documented_forms():
    from chaoskit.core.durations import parse_duration

    assert parse_duration("250ms") == 0.25
    assert parse_duration("30s") == 30
    assert parse_duration("5m") == 300
    assert parse_duration("1h") == 3600
    assert parse_duration("1m30s") == 90
    assert parse_duration(12) == 12
    assert parse_duration("30d") == 30 * 86400
    for bad in ("5", "s", "-1s", "1w", True, None, "1.5.2s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_examples_are_valid_and_dry_run_without_a_connection():
    """The files the README's "Drill your own cluster" path starts from: an inventory template and an
    attach scenario over it; a dry run connects to nothing."""
    examples = ROOT / "examples"
    res = run_cli("validate", examples)
    assert res.code == 0, res.stderr
    assert "(inventory)" in res.stdout
    res = run_cli("run", examples / "own-cluster" / "kill-rank-attach.yaml", "--dry-run", "--json")
    assert res.code == 0, res.stderr
    assert res.json["cluster"]["kind"] == "inventory" and res.json["job"] == {}
    assert "never started or stopped" in res.json["attach"]
    [fault] = res.json["plan"]
    assert fault["nodes"] == ["gpu01", "gpu02"] and fault["actions"][0]["node"] == "gpu02"  # rank 9 of 8 per node


def test_a_dry_run_prints_the_scenarios_own_words_as_written_not_as_markup(tmp_path: Path):
    """The plan is printed through Rich: a pattern holding '[/.]' (a closing tag to Rich) and '[a-z]' (a style)
    is shown as the scenario wrote it (it was an internal error, exit 70, or silently cut)."""
    own = ROOT / "examples" / "own-cluster"
    shutil.copy(own / "inventory.yaml", tmp_path / "inventory.yaml")
    text = (own / "kill-rank-attach.yaml").read_text().replace("'train\\.py'", "'train[/.]py [a-z]+'")
    assert text.count("train[/.]py [a-z]+") == 2
    (tmp_path / "attach.yaml").write_text(text)
    res = run_cli("run", tmp_path / "attach.yaml", "--dry-run")
    assert res.code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("job: ") and "'train[/.]py [a-z]+'" in line for line in lines), res.stdout
    assert any(line.startswith("fault f0 ") and line.endswith("process=train[/.]py [a-z]+:") for line in lines), res.stdout
