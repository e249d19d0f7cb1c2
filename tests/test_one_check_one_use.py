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

from tests.conftest import need, need_root_tool, need_torch, wait_until, lab_fixture
from tests.swap_fixtures import flipping_link, swap_on_open
from tests.test_slurm import may_submit

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


# -- the paths left: a launch: command script, a batch script, a compose file (issue 48 #5, #7, compose) ----------

@pytest.fixture()
def policy(system_dir, monkeypatch):
    """This machine's policy (root's, as a site's is), with ``script_roots`` = the system folder: what a drill may
    run of an author's lies there."""
    folder = system_dir / "etc"
    folder.mkdir(mode=0o755)
    path = folder / "policy.yaml"
    path.write_text(f"faults: [process.*]\nscript_roots: [{system_dir}]\n")
    os.chmod(path, 0o644)
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(path))
    return path


@lab_fixture(scope="module")
def slurm_lab():
    """A Slurm lab of one node that another local user can submit to (slurm.conf and munge's socket reachable)."""
    from tests.test_slurm import require_slurm

    require_slurm()
    from chaoskit.lab.slurm import SlurmLab

    root = Path(tempfile.mkdtemp(prefix="ck48-slurm-"))
    root.chmod(0o711)
    lab = None
    try:
        lab = SlurmLab.create(1, 0, directory=root / "slurm")
        yield lab
    finally:
        if lab is not None:
            lab.down()
        shutil.rmtree(root, ignore_errors=True)


def _checked(scenario: Path):
    """What ``chaoskit validate`` and every run do before anything starts: the scenario checked against its
    cluster's preview and the site policy (``script_roots``); the preview is returned."""
    from chaoskit.scenario import load_scenario
    from chaoskit.scenario.checks import check_scenario

    loaded = load_scenario(scenario)
    return loaded, check_scenario(loaded)


@pytest.mark.slow
def test_a_command_script_swapped_after_its_check_is_not_what_torchrun_runs(drill, system_dir, policy, tmp_path):
    """#5: ``launch: command``'s script was checked against ``script_roots`` with its links resolved, then torchrun
    (root's) ran it by its path: a link swapped after the check ran the author's script as root. Now the job's
    start opens it once inside the roots and the workers run a copy of the bytes read there."""
    need_torch()
    from chaoskit.backends.api import ClusterHandle
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.core.errors import ScenarioError
    from chaoskit.workloads.launch import TorchrunJob

    folder, marker = drill
    _program(system_dir / "helper.py", "WORD = 'reviewed'\n")
    good = _program(system_dir / "train.py", "import pathlib, helper\nprint(helper.WORD, pathlib.Path(__file__).name, "
                                            "flush=True)\n")
    evil = _write(folder / "evil.py", f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n")
    link = _link(folder / "train.py", good)
    scenario = folder / "lab.yaml"
    scenario.write_text("name: ck48\ncluster: {kind: process, nodes: 1}\nworkload: {launch: command, command: "
                        "[train.py]}\nfaults:\n  - {kind: process.kill, target: {ranks: [0]}, at: {after: 1s}}\n"
                        "probes:\n  log:\n    - {event: step, match: 'step (?P<step>[0-9]+)'}\n")
    loaded, preview = _checked(scenario)  # the check: the link resolves inside script_roots

    def job(name: str) -> TorchrunJob:
        run_dir = tmp_path / name
        run_dir.mkdir()
        cluster = ClusterHandle(id=f"ck48-{name}", kind="process", inventory=Inventory("ck48", [Node("n0", "127.0.0.1")]),
                                job_nodes=["n0"], rdzv_host="127.0.0.1", scope=lambda node: f"ck48-{tmp_path.name}.{node}")
        cluster.inventory.policy = preview.inventory.policy  # the policy the checks applied binds the run
        return TorchrunJob(cluster, loaded.model.workload, run_dir, f"ck48-{name}", None, base=folder)

    def ran(j: TorchrunJob) -> str:
        assert wait_until(lambda: not j.running(), 90), "the job did not end"
        j.stop()
        return (j.log_dir / "n0.log").read_text()

    _link(link, evil)  # after the check
    swapped = job("after")
    refused = ""
    try:
        swapped.start()
    except ScenarioError as exc:
        refused = str(exc)
    else:
        ran(swapped)
    assert not marker.exists(), f"root's torchrun ran the author's script (uid {marker.read_text()})"
    assert "outside the allowed roots" in refused, refused
    _link(link, good)
    opened = job("at-open")
    with swap_on_open(good, link, evil, user=AUTHOR) as swap:  # swapped as the script is opened to be checked
        opened.start()
    log = ran(opened)
    assert swap["swapped"] and not marker.exists(), swap
    assert "reviewed train.py" in log, log  # the checked bytes, beside their module, under their own name


def test_a_batch_script_swapped_after_its_owner_was_taken_is_not_submitted_as_that_owner(
        slurm_lab, drill, job_user, job_user_folders):
    """#7 (a race): ``launch: sbatch`` submits the script as its owner, taken from the file the path resolved to;
    sbatch then opened the path again, as that user: a link swapped between the two submitted the author's script as
    the other user. Now the script is opened once, its owner taken from that descriptor (it must still be the user
    the job's folder was made for) and its checked text goes to sbatch's standard input."""
    from chaoskit.backends.api import ClusterHandle
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.core.errors import ScenarioError
    from chaoskit.core.files import make_folder_for
    from chaoskit.scenario.model import Workload
    from chaoskit.workloads.slurm import SlurmJob

    may_submit(job_user.pw_name)  # the lab's slurm.conf and munge socket: the lab accounts' group's (issue 48)
    folder, marker = drill
    base, own = job_user_folders
    good = own / "train.sbatch"
    good.write_text("#!/bin/bash\necho the-users-own-job\n")
    os.chown(good, job_user.pw_uid, job_user.pw_gid)
    evil = _write(folder / "evil.sbatch", f"#!/bin/bash\nid -u > {marker}\necho the-authors-job\n")
    link = _link(folder / "train.sbatch", good)
    access = slurm_lab.access()
    cluster = ClusterHandle(id="ck48-slurm", kind="slurm", inventory=Inventory("ck48", [Node("n0", "127.0.0.1")]),
                            job_nodes=["n0"], rdzv_host="127.0.0.1", scope=lambda node: f"ck48.{node}", scheduler=access)

    def job(name: str) -> SlurmJob:
        run_dir = base / name
        run_dir.mkdir()
        j = SlurmJob(cluster, Workload(launch="sbatch", script="train.sbatch"), run_dir, f"ck48-{name}", base=folder)
        assert j.owner is not None and j.owner.uid == job_user.pw_uid  # the link's file's owner, as the run begins
        make_folder_for(j.job_dir, j.owner.uid, j.owner.gid, dirs=("checkpoints",))  # what the runner makes
        return j

    def submitted(j: SlurmJob) -> str:
        res = access.run("scontrol", "write", "batch_script", str(j.job_id), "-", check=False)
        access.run("scancel", str(j.job_id), check=False)
        return res.stdout + res.stderr

    swapped = job("after")
    _link(link, evil)  # after the owner was taken
    refused = ""
    try:
        swapped.start()
    except ScenarioError as exc:
        refused = str(exc)
    else:
        script = submitted(swapped)
        assert "the-authors-job" not in script, f"the author's script was submitted as {job_user.pw_name}: {script}"
    assert "not of ckjobuser" in refused, refused
    _link(link, good)
    opened = job("at-open")
    with swap_on_open(good, link, evil, user=AUTHOR) as swap:  # swapped as the script is opened to be checked
        opened.start()
    script = submitted(opened)
    assert swap["swapped"] and "the-users-own-job" in script and "the-authors-job" not in script, (swap, script)
    assert access.job_field(opened.job_id, "Name") == "train.sbatch"  # named as a script file's job is


@pytest.mark.slow
def test_a_compose_file_swapped_after_its_check_is_not_what_the_lab_is_made_of(drill, system_dir, policy):
    """Suspected (a compose file): it was checked inside ``script_roots`` with its links resolved, then the run read
    it again by its path to bring the lab up: a link swapped after the check made root's engine run the author's
    services. Now the file is read once (through the descriptor checked) and the checks and the run use that one
    project: the lab brought up is the checked file's (here: its image, which this engine does not have)."""
    from tests.docker_fixtures import docker_problem

    problem = docker_problem()
    need(problem is None, problem or "")
    from chaoskit.backends.registry import backend
    from chaoskit.core.errors import InfraError

    folder, _ = drill
    services = "services:\n" + "".join(f"  n{i}:\n    image: {{image}}\n    labels: {{{{io.chaoskit.role: worker}}}}\n"
                                       for i in range(2))
    good = system_dir / "docker-compose.yml"
    good.write_text("name: ck48good\n" + services.format(image="ck48-reviewed-image:none"))
    evil = _write(folder / "evil-compose.yml", "name: ck48evil\n" + services.format(image="ck48-authors-image:none"))
    link = _link(folder / "docker-compose.yml", good)
    scenario = folder / "d.yaml"
    scenario.write_text("name: ck48\ncluster: {kind: docker, nodes: 2, compose: docker-compose.yml}\nworkload: "
                        "{steps: 50}\nfaults:\n  - {kind: process.kill, target: {ranks: [1]}, at: {after: 1s}}\n")
    loaded, preview = _checked(scenario)  # the check: the link resolves inside script_roots
    assert preview.author_files["compose"] == good
    _link(link, evil)  # after it
    with pytest.raises(InfraError) as err:  # the run's lab: brought up from the checked project, whose image is absent
        backend("docker").open(loaded.model.cluster, loaded.path.parent)
    assert "ck48-reviewed-image" in str(err.value) and "ck48-authors" not in str(err.value), err.value


def test_a_slurm_jobs_agents_run_the_checked_copy_of_a_command_script_not_its_path(tmp_path):
    """``launch: command`` under Slurm: the generated agent.sh ran the author's script by its path, so a link
    swapped after validate's check was what each node ran. Now agent.sh names the checked copy in the job's folder
    (its bytes those of the file the check opened), and the script's own path only as the name it runs under."""
    from chaoskit.backends.api import ClusterHandle
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.slurm import SlurmAccess
    from chaoskit.scenario.model import Workload
    from chaoskit.workloads.slurm import SlurmJob

    base = tmp_path / "scenario"
    base.mkdir()
    (base / "train.py").write_text("print('reviewed')\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    inventory = Inventory("site", [Node("n0", "n0", "ssh", {}, 0)])
    handle = ClusterHandle(id="site", kind="inventory", inventory=inventory, job_nodes=["n0"], rdzv_host="n0",
                           scope=lambda node: "", scheduler=SlurmAccess())
    job = SlurmJob(handle, Workload(launch="command", command=["train.py", "--lr", "1"]), run_dir, "r1", base=base)
    text = job.agent_script()
    copy = run_dir / "command-train.py"
    assert copy.read_text() == "print('reviewed')\n" and oct(copy.stat().st_mode & 0o777) == "0o644"
    assert f"-m chaoskit.workloads.checked_script {copy} {base / 'train.py'} --lr 1" in text, text
