"""``probes.log_files`` reaches only the job's own files (issue 48, finding 10).

chaoskit reads a scenario's log files as root and puts what their lines capture in ``events.jsonl``. A path was
joined to the job's folder, so ``/etc/shadow`` or ``../../etc/shadow`` read anything on the controller. Now a log
file is a path inside the job's folder (an absolute path only for an attached job, read on its node by chaoskit's
agent, or inside the site policy's ``log_roots``), refused at its line by ``validate`` and ``run`` (exit 2, nothing
started); and at run time the job's folder is read without following any link in it, and only the job's own files:
a link its user planted to a file only root may read, or a hard link to one, never reaches the events.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import JOB_USER, need, run_cli, wait_until

LAB = """\
name: read-logs
cluster: {{kind: process, nodes: 2}}
workload: {{launch: reference, steps: 100}}
probes:
  log: [{{match: 'step (?P<step>[0-9]+) (?P<leak>.+)', event: step}}]
  log_files:
    - {{node: n1, path: '{path}'}}
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 20}}
"""

ATTACH = """\
name: read-logs
cluster: {{inventory: {inventory}}}
workload: {{launch: attach, process: 'train\\.py'}}
probes:
  log: [{{match: 'step (?P<step>\\d+)', event: step}}]
  log_files:
    - {{node: a, path: '{path}'}}
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
"""


@pytest.mark.parametrize("path, says", [
    ("/etc/shadow", "/etc/shadow is outside the job's folder"),
    ("../../../etc/shadow", "climbs out with '..'"),
    ("logs/../../../../etc/shadow", "climbs out with '..'"),
])
def test_a_log_file_outside_the_jobs_folder_is_refused_at_its_line(tmp_path, path, says):
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(LAB.format(path=path))
    res = run_cli("validate", scenario)
    assert res.code == 2, (res.code, res.stdout, res.stderr)
    assert f"{scenario}:7:24: " in res.stderr and says in res.stderr, res.stderr
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 2 and f"{scenario}:7:24: " in res.stderr, res.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.job").exists()  # nothing started
    # the control: a file inside the job's folder validates
    scenario.write_text(LAB.format(path="logs/train.log"))
    assert run_cli("validate", scenario).code == 0


def test_an_absolute_log_file_is_read_only_inside_the_policys_log_roots_or_on_an_attached_jobs_node(tmp_path, monkeypatch):
    folder = tmp_path / "etc-chaoskit"
    folder.mkdir(mode=0o755)
    policy = folder / "policy.yaml"
    policy.write_text("log_roots: [/var/log/train]\n")
    policy.chmod(0o644)
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(LAB.format(path="/var/log/train/n1.log"))
    assert run_cli("validate", scenario).code == 2  # no policy here: not a file of the job's folder
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(policy))
    res = run_cli("validate", scenario)
    assert res.code == 0, res.stderr
    monkeypatch.delenv("CHAOSKIT_SITE_POLICY")
    # an attached job's log, read on its node: absolute, but never climbing out with '..'
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("name: site\nnodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n")
    scenario.write_text(ATTACH.format(inventory=inventory, path="/var/log/train/a.log"))
    assert run_cli("validate", scenario).code == 0
    scenario.write_text(ATTACH.format(inventory=inventory, path="/var/log/train/../../../etc/shadow"))
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"{scenario}:7:23: " in res.stderr and "climbs out with '..'" in res.stderr, res.stderr


class _Lines:
    """What a :class:`FileLogProbe` hands its lines to (the runner's regex probe), kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def feed(self, node: str, line: str, *rest) -> None:
        self.lines.append(line)


def _as_user(*argv: str) -> None:
    res = subprocess.run(["runuser", "-u", JOB_USER, "--", *argv], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_the_jobs_folder_is_read_without_following_a_link_and_only_its_users_files(job_user_folders, job_user):
    """As the runner follows a relative log file: from the job's folder (its user's), with that user's and
    chaoskit's uids as owners. The user's own log is read; a link of theirs to a file only root may read, a folder
    link, a link root left in the folder, a hard link to root's file (what the user can make where
    fs.protected_hardlinks is 0; root makes it here) and a path climbing out are refused, their lines never read."""
    from chaoskit.observe.probes import FileLogProbe

    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    base, own = job_user_folders
    secret = base / "secret"
    secret.write_text("root-only line\n")
    secret.chmod(0o600)
    _as_user("sh", "-c", f"echo 'step 3' > {own / 'out.log'}")
    _as_user("ln", "-s", str(secret), str(own / "secret.log"))
    _as_user("ln", "-s", str(base), str(own / "up"))
    (own / "root-link.log").symlink_to(secret)
    os.link(secret, own / "hard.log")
    cases = {"secret.log": "is a link", "up/secret": "up is a link", "root-link.log": "is a link",
             "hard.log": "has other names", "../secret": "not a path inside"}
    owners = (job_user.pw_uid, os.geteuid())
    followers = {name: FileLogProbe(_Lines(), "n0", Path(name), interval=0.02, folder=own, owners=owners)
                 for name in [*cases, "out.log"]}
    for f in followers.values():
        f.start()
    try:
        assert wait_until(lambda: followers["out.log"].probe.lines == ["step 3"], 10), followers["out.log"].probe.lines
        assert wait_until(lambda: all(followers[n].errors for n in cases), 10), {n: f.errors for n, f in followers.items()}
        for name, says in cases.items():
            assert says in followers[name].errors[0] and followers[name].probe.lines == [], (name, followers[name].errors)
    finally:
        started = time.monotonic()
        for f in followers.values():
            f.stop()
        assert time.monotonic() - started < 5
    # an absolute path on this machine: only inside the policy's log_roots (none: never), and only the job's files
    outside = FileLogProbe(_Lines(), "n0", secret, interval=0.02, owners=owners, roots=[])
    outside.start()
    try:
        assert wait_until(lambda: outside.errors, 10)
        assert "log_roots" in outside.errors[0] and outside.probe.lines == []
    finally:
        outside.stop()
