"""chaoskit, as root, never writes through a link another local user planted (issue 48, findings 9, 13, 14).

A second user (conftest's ``job_user``, made with ``useradd``) owns a folder under a root-owned one and plants, as
themself (``runuser``), a link where chaoskit writes: ``report.html``/``index.html`` when root rebuilds a report
(``chaoskit report``), the scenario and starter files of ``chaoskit init --out``, and a folder on the way to a run
folder (``--out``). Each link points into a folder of root's that the user cannot write (where a ``.pth`` file, say,
would run code in every root Python). chaoskit replaces or refuses the link, and the link's target is never made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import JOB_USER, need, run_cli
from tests.test_report import record_for, synth_gameday, synth_run


def _as_user(*argv: str) -> None:
    res = subprocess.run(["runuser", "-u", JOB_USER, "--", *argv], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


@pytest.fixture
def theirs(job_user_folders):
    """``(own, roots)``: ``own`` a folder of the other user's; ``roots`` a folder of root's (0700) their links aim at."""
    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    base, own = job_user_folders
    roots = base / "root-only"
    roots.mkdir(mode=0o700)
    return own, roots


def _report_folder(own: Path, name: str) -> Path:
    """A run folder of the user's, its files root's (as a run that root made and then gave them would leave it)."""
    _as_user("mkdir", str(own / name))
    synth_run(own / name)
    return own / name


def test_report_replaces_a_link_at_report_html_and_never_writes_where_it_points(theirs):
    own, roots = theirs
    run = _report_folder(own, "run")
    pth = roots / "evil.pth"  # dangling: root's write through the link would make it
    _as_user("ln", "-s", str(pth), str(run / "report.html"))
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    assert not pth.exists() and os.listdir(roots) == []
    page = run / "report.html"
    assert not page.is_symlink() and page.is_file() and "kill-rank" in page.read_text()
    assert os.lstat(page).st_uid == 0
    # a link to a file of root's that exists: the file is left as it was
    victim = roots / "keep.txt"
    victim.write_text("root's own\n")
    page.unlink()
    _as_user("ln", "-s", str(victim), str(page))
    assert run_cli("report", run).code == 0
    assert victim.read_text() == "root's own\n" and not page.is_symlink()
    assert [p for p in os.listdir(run) if p.endswith(".tmp")] == []  # no temp file left behind


def test_a_game_days_index_html_is_never_written_through_a_link(theirs):
    own, roots = theirs
    _as_user("mkdir", str(own / "gameday"))
    gd = own / "gameday"
    synth_gameday(gd, [record_for(1, synth_run(gd / "01-kill-rank"))])
    pth = roots / "index.pth"
    _as_user("ln", "-s", str(pth), str(gd / "index.html"))
    res = run_cli("report", gd)
    assert res.code == 0, res.stderr
    assert not pth.exists() and not (gd / "index.html").is_symlink() and (gd / "index.html").is_file()


def test_report_refuses_a_folder_reached_through_the_users_link(theirs):
    own, roots = theirs
    synth_run(roots / "run")  # a run of root's, in root's folder
    _as_user("ln", "-s", str(roots / "run"), str(own / "to-root"))
    res = run_cli("report", own / "to-root")
    assert res.code == 2, (res.code, res.stderr)
    assert "is a link of uid" in res.stderr and not (roots / "run" / "report.html").exists()
    # root's own link to the same folder is followed
    (roots / "mine").symlink_to(roots / "run")
    assert run_cli("report", roots / "mine").code == 0 and (roots / "run" / "report.html").is_file()


def test_init_never_writes_through_a_dangling_link_at_its_out(theirs):
    own, roots = theirs
    target = roots / "made.pth"
    out = own / "scenario.yaml"
    _as_user("ln", "-s", str(target), str(out))  # exists() is false for it
    res = run_cli("init", "--out", out)
    assert res.code == 2 and "exists" in res.stderr, res.stderr
    assert not target.exists() and out.is_symlink()
    res = run_cli("init", "--out", out, "--force")  # --force replaces the link itself
    assert res.code == 0, res.stderr
    assert not target.exists() and not out.is_symlink() and "launch: command" in out.read_text()
    assert run_cli("validate", out).code == 0


def test_init_keeps_a_link_at_a_starter_files_name_and_writes_nothing_through_it(theirs):
    own, roots = theirs
    target = roots / "train.pth"
    _as_user("mkdir", str(own / "drill"))
    _as_user("ln", "-s", str(target), str(own / "drill" / "train.py"))
    res = run_cli("init", "--out", own / "drill" / "scenario.yaml")
    assert res.code == 0, res.stderr
    assert not target.exists() and (own / "drill" / "train.py").is_symlink()
    assert "train.py" not in res.stdout and (own / "drill" / "scenario.yaml").is_file()
    # --out through a folder link of the user's: refused, nothing made where it points
    _as_user("ln", "-s", str(roots), str(own / "to-root"))
    res = run_cli("init", "--out", own / "to-root" / "scenario.yaml")
    assert res.code == 2 and "is a link of uid" in res.stderr, res.stderr
    assert os.listdir(roots) == []


def test_a_run_folder_is_never_made_through_a_link_or_below_a_folder_of_the_users(theirs, tmp_path):
    from chaoskit.core.errors import ScenarioError
    from chaoskit.core.files import make_run_dir

    own, roots = theirs
    # --out /tmp/NAME/r1, NAME the user's link in /tmp (sticky, root's): root's run folder would go where it points
    planted = Path("/tmp") / f"ck48-runs-{os.getpid()}"
    _as_user("ln", "-s", str(roots), str(planted))
    try:
        with pytest.raises(ScenarioError, match="is a link of uid"):
            make_run_dir(planted / "r1", 0o750, default=False)
    finally:
        planted.unlink()
    assert os.listdir(roots) == []
    _as_user("ln", "-s", str(roots), str(own / "runs"))  # in their own folder: that folder is refused first
    with pytest.raises(ScenarioError, match="belongs to uid"):
        make_run_dir(own / "runs" / "r1", 0o750, default=False)
    assert os.listdir(roots) == []
    # a folder of root's inside the user's: they could swap it for a link once the run folder is made
    (own / "roots-sub").mkdir()
    with pytest.raises(ScenarioError, match="belongs to uid"):
        make_run_dir(own / "roots-sub" / "r1", 0o750, default=False)
    assert os.listdir(own / "roots-sub") == []
    # root's own link, in root's folder, is followed; missing folders are made on the way
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    made = make_run_dir(tmp_path / "link" / "more" / "r1", 0o750, default=False)
    assert (real / "more" / "r1").is_dir() and os.path.samefile(made, real / "more" / "r1")
