"""A path an author names is opened once, checked on what was opened, and used as that (issue 48 item 1).

The author (a second, unprivileged user made here with ``useradd``) points a link at a file that passes chaoskit's
check, and swaps it for one to their own file right after the check: at the first open of the checked file (an
inotify watch, :mod:`tests.swap_fixtures`), after the check returned, or back and forth as fast as they can. Before,
root then read or ran the author's file by the path's name; now what is used is what was checked.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import need, need_root_tool
from tests.swap_fixtures import flipping_link, swap_on_open

AUTHOR = "ckauthor48"


def _sh(*argv: str, check: bool = True, stdin: str | None = None):
    res = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()}")
    return res


@pytest.fixture(scope="module")
def home():
    need_root_tool("useradd")
    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    need(os.geteuid() == 0, "root (chaoskit runs as root in CI)")
    need(Path("/usr/bin/python3").exists(), "the system's python3 (the author's link swapper)")
    _sh("userdel", "--remove", "--force", AUTHOR, check=False)
    _sh("useradd", "--create-home", "--shell", "/bin/sh", AUTHOR)
    try:
        yield Path(pwd.getpwnam(AUTHOR).pw_dir)
    finally:
        _sh("userdel", "--remove", "--force", AUTHOR, check=False)


@pytest.fixture()
def drill(home, tmp_path):
    """A fresh folder of the author's, and a marker path the author's program would create."""
    folder = home / f"drill-{tmp_path.name}"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", str(folder))
    marker = home / f"ran-{tmp_path.name}"
    yield folder, marker
    _sh("rm", "-rf", str(folder), str(marker), check=False)


@pytest.fixture()
def system_dir():
    """A folder only root can change that everyone can read (as /usr/bin is), for the programs root may run."""
    folder = Path(tempfile.mkdtemp(prefix="ck48-system-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _write(path: Path, text: str, mode: str = "644") -> Path:
    """``text`` written by the author themself."""
    _sh("runuser", "-u", AUTHOR, "--", "tee", str(path), stdin=text)
    _sh("runuser", "-u", AUTHOR, "--", "chmod", mode, str(path))
    return path


def _link(link: Path, to: Path) -> Path:
    """The author's link ``link`` -> ``to``."""
    _sh("runuser", "-u", AUTHOR, "--", "ln", "-sfn", str(to), str(link))
    return link


def _program(path: Path, text: str) -> Path:
    """A program of root's, nobody else can change."""
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


def test_an_ssh_config_swapped_after_its_check_is_not_what_paramiko_reads(drill):
    """#3: the config was checked, then paramiko opened the path again: a link swapped between the two made root run
    the author's ``Match exec``. Now paramiko parses the checked text (``SSHConfig.from_text``)."""
    from chaoskit.cluster.transports.ssh import SSHTransport

    folder, marker = drill
    good = _write(folder / "good_config", "Host *\n  Port 2222\n" + "# reviewed\n" * 100_000)  # a long check
    evil = _write(folder / "evil_config", f"Match exec \"id -u > {marker}\"\n  Port 22\n")
    link = _link(folder / "ssh_config", good)
    t = SSHTransport("n1", "127.0.0.1", ssh_config=str(link), ssh_roots=[str(folder)], explicit=("user",))
    with swap_on_open(good, link, evil, user=AUTHOR) as swap:
        t.route()
    assert swap["swapped"], swap
    assert os.readlink(link) == str(evil)
    assert not marker.exists(), "root ran the swapped config's Match exec"
    assert t.port == 2222  # what the checked config says


def test_a_known_hosts_folder_swapped_for_a_link_is_never_written_through(drill, tmp_path):
    """Suspected: trust on first use checked known_hosts' folder inside the roots, then opened the path again
    (``O_NOFOLLOW`` guards only the last name): a parent swapped for a link to a folder outside the roots took root's
    write there. Now the folders are walked with ``openat`` and the roots checked on the one written in."""
    from chaoskit.cluster.ssh_paths import append_known_host

    folder, _ = drill
    inside = folder / "inside"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", str(inside))
    victim = tmp_path / "victim"  # another account's folder, outside the roots
    victim.mkdir(mode=0o700)
    link = _link(folder / "d", inside)
    line = "[127.0.0.1]:22 ssh-ed25519 AAAA\n"
    with flipping_link(link, inside, victim, user=AUTHOR):
        for _ in range(400):
            try:
                append_known_host(str(link / "authorized_keys"), line, [str(folder)])
            except OSError:
                pass  # the walk met the link pointing outside: refused
    assert not (victim / "authorized_keys").exists(), "root wrote outside the roots through the swapped folder"
    assert (inside / "authorized_keys").read_text().count(line) >= 1


def test_an_authors_slurm_command_swapped_after_the_check_never_runs(drill, system_dir):
    """#4: ``cluster.slurm.bin`` was checked with its links resolved, then run by its unresolved path: a link swapped
    after the check made root run the author's ``squeue``. Now the program is opened once at each use, checked on
    the descriptor, and run as that file (``/proc/self/fd/N``)."""
    from chaoskit.backends.inventory import SLURM_TOOLS, InventorySpec
    from chaoskit.core.errors import InfraError

    folder, marker = drill
    bin_dir = folder / "bin"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", str(bin_dir))
    for tool in SLURM_TOOLS:
        _link(bin_dir / tool, _program(system_dir / tool, f"#!/bin/sh\necho root-{tool}\n"))
    evil = _write(folder / "squeue", f"#!/bin/sh\nid -u > {marker}\necho author\n", mode="755")
    spec = InventorySpec(inventory="inventory.yaml", scheduler="slurm", slurm={"bin": str(bin_dir)})
    access = spec.access(folder)  # the check: the links resolve to root's programs
    _link(bin_dir / "squeue", evil)  # after it
    try:
        res = access.run("squeue", check=False)
        ran = res.stdout
    except InfraError as exc:
        ran = str(exc)
    assert not marker.exists(), "root ran the author's squeue"
    assert "someone other than root" in ran, ran
    _link(bin_dir / "squeue", system_dir / "squeue")
    with swap_on_open(system_dir / "squeue", bin_dir / "squeue", evil, user=AUTHOR) as swap:
        res = access.run("squeue", check=False)
    assert swap["swapped"] and res.stdout == "root-squeue\n", (swap, res)
    assert not marker.exists()


def test_a_power_program_swapped_while_it_is_polled_never_runs(drill, system_dir):
    """#6 (a race): a power program was checked with its links resolved, then run by its path: with the link flipping
    between root's program and the author's, root ran the author's in some of the tries (10 of 30 of ``chaoskit
    audit``'s). Now it is opened once, checked on the descriptor, and run as that file."""
    from chaoskit.cluster.power import run_power_command
    from chaoskit.core.errors import InfraError

    folder, marker = drill
    status = _program(system_dir / "power-status", "#!/bin/sh\necho on\n")
    evil = _write(folder / "evil-status", f"#!/bin/sh\nid -u >> {marker}\necho on\n", mode="755")
    link = _link(folder / "status", status)
    ran_root = refused = 0
    with flipping_link(link, status, evil, user=AUTHOR):
        for _ in range(60):
            try:
                ran_root += run_power_command([str(link)], 5, "n1").stdout == "on\n"
            except InfraError as exc:
                assert "someone other than root" in str(exc), exc
                refused += 1
    assert not marker.exists(), f"root ran the author's program {marker.read_text().count(chr(10))} times"
    assert ran_root + refused == 60
    _link(link, status)
    with swap_on_open(status, link, evil, user=AUTHOR) as swap:  # swapped as the program is opened to be checked
        res = run_power_command([str(link)], 5, "n1")
    assert swap["swapped"] and res.stdout == "on\n" and not marker.exists(), (swap, res)
