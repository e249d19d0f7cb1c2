"""The site policy: a scenario outside what the cluster's owners allow is refused at its line, before anything connects.

The inventory's nodes are a TCP socket this test listens on (loopback): a connection attempt, had one
been made, would be waiting in its backlog. A scenario inside the policy is the control: ``run``
does try to connect there.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import anyone_connected, run_cli

pytest_plugins = ["tests.netns_fixtures"]

POLICY = """\
  faults: [process.kill, process.freeze, network.*, storage.*, slurm.*]
  slurm: false
  log_roots: [/var/log/train]
  checkpoint_roots: [/scratch/ckpt]
  python: [/usr/bin/python3]
  max_nodes: 2
"""

GOOD = """\
name: inside-policy
cluster: {inventory: inventory.yaml}
workload: {launch: attach, process: 'train\\.py', nproc_per_node: 1, checkpoint_dir: /scratch/ckpt/job1}
probes:
  log: [{match: 'step (?P<step>\\d+)', event: step}]
  log_files:
    - {node: n1, path: /var/log/train/n1.log}
faults:
  - kind: process.kill
    target: {nodes: [n1], process: 'train\\.py'}
    at: {after: 1s}
safety: {max_nodes: 2}
"""

# (what is outside the policy, text replaced in GOOD, its replacement, the line:col of the refusal, the message)
OUTSIDE = [
    ("fault-kind", "kind: process.kill", "kind: gpu.fail\n    duration: 5s", "9:11", "does not allow gpu.fail"),
    ("slurm-fault", "kind: process.kill\n    target: {nodes: [n1], process: 'train\\.py'}",
     "kind: slurm.drain\n    target: {nodes: [n1]}", "9:11", "no slurm.* fault"),
    ("log-file", "path: /var/log/train/n1.log", "path: /etc/shadow", "7:24", "outside the site policy's log_roots"),
    ("log-file-dotdot", "path: /var/log/train/n1.log", "path: /var/log/train/../../../etc/shadow", "7:24", "log_roots"),
    ("checkpoint-dir", "checkpoint_dir: /scratch/ckpt/job1", "checkpoint_dir: /etc", "3:85", "checkpoint_roots"),
    ("safety-max-nodes", "safety: {max_nodes: 2}", "safety: {max_nodes: 3}", "12:21", "more than the site policy's max_nodes"),
    ("too-many-nodes", "target: {nodes: [n1], process: 'train\\.py'}", "target: {labels: {role: worker}}",
     "10:13", "may touch 3 nodes"),
]





def _inventory(folder: Path, port: int, policy: str = "policy:\n" + POLICY) -> Path:
    text = textwrap.dedent(f"""\
        name: policed
        ssh: {{user: root, port: {port}, python: /usr/bin/python3, known_hosts: ./known_hosts, connect_timeout: 2s}}
        """) + policy + textwrap.dedent("""\
        nodes:
          - {name: n1, address: 127.0.0.1, labels: {role: worker}}
          - {name: n2, address: 127.0.0.1, labels: {role: worker}}
          - {name: n3, address: 127.0.0.1, labels: {role: worker}}
        """)
    (folder / "known_hosts").write_text("")
    path = folder / "inventory.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", OUTSIDE, ids=[c[0] for c in OUTSIDE])
def test_a_scenario_outside_the_policy_is_refused_at_its_line(case, tmp_path: Path, listener):
    _, old, new, where, message = case
    _inventory(tmp_path, listener.getsockname()[1])
    assert old in GOOD
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD.replace(old, new))
    res = run_cli("validate", scenario)
    assert res.code == 2, res.stderr
    assert any(line.startswith(f"{scenario}:{where}: ") and message in line for line in res.stderr.splitlines()), res.stderr
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 2, res.stderr
    assert res.stderr.startswith(f"error: {scenario}:{where}: "), res.stderr
    assert not (tmp_path / "run").exists()
    assert not anyone_connected(listener), "a refused scenario must not connect to any node"


def test_a_scenario_inside_the_policy_validates_and_run_connects(tmp_path: Path, listener):
    """The control: the same inventory and a scenario inside the policy; run reaches for the node."""
    _inventory(tmp_path, listener.getsockname()[1])
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD)
    res = run_cli("validate", scenario)
    assert res.code == 0, res.stderr
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 3, res.stderr  # nobody speaks SSH on the port
    assert anyone_connected(listener)


def test_inventory_python_outside_the_policy_is_refused_at_its_line(tmp_path: Path, listener):
    path = _inventory(tmp_path, listener.getsockname()[1])
    text = path.read_text().replace("- {name: n2, address: 127.0.0.1,", "- {name: n2, address: 127.0.0.1, ssh: {python: /tmp/py},")
    path.write_text(text)
    res = run_cli("validate", path)
    assert res.code == 2
    assert f"{path}:12:50: nodes.1.ssh.python: the site policy lets the agent run only /usr/bin/python3" in res.stderr, res.stderr


def _policy_file(tmp_path: Path, port: int) -> tuple[Path, Path]:
    folder = tmp_path / "site"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    policy = folder / "policy.yaml"
    policy.write_text(textwrap.dedent(POLICY))
    os.chmod(policy, 0o644)
    _inventory(tmp_path, port, policy="policy: site/policy.yaml\n")
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD.replace("kind: process.kill", "kind: gpu.fail\n    duration: 5s"))
    return policy, scenario


def test_a_policy_file_is_read_and_applied(tmp_path: Path, listener):
    _, scenario = _policy_file(tmp_path, listener.getsockname()[1])
    res = run_cli("validate", scenario)
    assert res.code == 2
    assert f"{scenario}:9:11: faults.0.kind: the site policy does not allow gpu.fail" in res.stderr, res.stderr


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "folder-writable", "symlink"])
def test_a_policy_file_others_can_write_is_refused(how: str, tmp_path: Path, listener):
    policy, scenario = _policy_file(tmp_path, listener.getsockname()[1])
    if how == "world-writable":
        os.chmod(policy, 0o646)
    elif how == "group-writable":
        os.chmod(policy, 0o664)
    elif how == "folder-writable":
        os.chmod(policy.parent, 0o777)
    else:
        real = tmp_path / "elsewhere.yaml"
        policy.rename(real)
        policy.symlink_to(real)
    inventory = tmp_path / "inventory.yaml"
    for target in (inventory, scenario):
        res = run_cli("validate", target)
        assert res.code == 2, res.stderr
        line = next(x for x in res.stderr.splitlines() if "policy file" in x)
        assert f"{inventory}:3:9: " in line, res.stderr  # the inventory's policy: line
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 2 and "policy file" in res.stderr, res.stderr
    assert not anyone_connected(listener)


# -- the agent's Python, checked on the node (the netns lab's sshd) -------------------------------------------


def _policed_lab_inventory(netns_lab, python: str, allowed: list[str]) -> Path:
    import yaml

    doc = netns_lab.inventory_document()
    doc["ssh"]["python"] = python
    doc["policy"] = {"python": allowed}
    path = netns_lab.directory / f"policed-{abs(hash(python)) % 10**6}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_agent_runs_the_policys_root_owned_python(netns_lab):
    from chaoskit.cluster.inventory_file import load_inventory

    python = os.path.realpath("/usr/bin/python3")
    inventory = load_inventory(_policed_lab_inventory(netns_lab, python, [python]))
    try:
        assert inventory["n0"].conn.ping() >= 0
    finally:
        inventory.close()


@pytest.mark.parametrize("how", ["writable", "not-root"])
def test_a_python_that_is_not_root_owned_or_is_writable_never_runs(netns_lab, tmp_path, how):
    import pwd
    import shutil

    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.core.errors import InfraError

    folder = tmp_path / "bin"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    python = folder / "python3"
    shutil.copy(os.path.realpath("/usr/bin/python3"), python)
    if how == "writable":
        os.chmod(python, 0o777)
    else:
        os.chown(python, pwd.getpwnam("nobody").pw_uid, -1)
    inventory = load_inventory(_policed_lab_inventory(netns_lab, str(python), [str(python)]))
    try:
        with pytest.raises(InfraError) as info:
            inventory["n0"].conn.ping()
        assert "is not a root-owned file only root can write" in str(info.value)
    finally:
        inventory.close()


def test_the_agent_follows_only_files_really_inside_the_log_roots(tmp_path):
    """A link planted inside a log root (by the job's user, say) that points at /etc/shadow is refused by
    the node's agent, which resolves where the open file really is; a file inside is followed."""
    from tests.conftest import wait_until
    from tests.test_bounded_input import _LocalAgent

    root = tmp_path / "logs"
    root.mkdir()
    (root / "n1.log").write_text("step 1\n")
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash:19000::::::\n")
    (root / "planted.log").symlink_to(secret)
    agent = _LocalAgent()
    try:
        agent.send({"id": 1, "op": "follow", "path": str(root / "planted.log"), "roots": [str(root)]})
        agent.send({"id": 2, "op": "follow", "path": str(root / "n1.log"), "roots": [str(root)]})
        assert wait_until(lambda: any(r.get("id") == 1 and not r.get("ok") for r in agent.replies), 10), agent.replies
        [refused] = [r for r in agent.replies if r.get("id") == 1]
        assert "outside the site policy's log roots" in refused["error"]
        assert wait_until(lambda: agent.lines() == ["step 1"], 10), agent.lines()  # no line of the secret
    finally:
        agent.close()


# -- this machine's policy: for every inventory, even one the scenario's author wrote -------------------


@pytest.fixture()
def machine_policy(tmp_path: Path, monkeypatch):
    """A machine-wide policy file (root's, 0644, in a root-owned 0755 folder), named by CHAOSKIT_SITE_POLICY (which
    narrows /etc/chaoskit/policy.yaml's, absent here: the test leaves the real system path alone)."""
    folder = tmp_path / "etc-chaoskit"
    folder.mkdir()
    os.chmod(folder, 0o755)
    path = folder / "policy.yaml"
    path.write_text("faults: [process.*, network.*]\nmax_nodes: 2\nlog_roots: [/var/log]\n")
    os.chmod(path, 0o644)
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(path))
    return path


def test_this_machines_policy_binds_an_inventory_with_none_of_its_own(machine_policy, tmp_path: Path, listener):
    """The author of a scenario writes an inventory with no policy: this machine's still refuses gpu.fail, at its
    line, and nothing connects; a policy of the inventory's own that allows gpu.fail cannot widen it."""
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD.replace("kind: process.kill", "kind: gpu.fail\n    duration: 5s"))
    for policy in ("", "policy: {faults: ['*']}\n"):
        _inventory(tmp_path, listener.getsockname()[1], policy=policy)
        res = run_cli("run", scenario, "--out", tmp_path / "run")
        assert res.code == 2 and f"{scenario}:9:11: faults.0.kind: the site policy does not allow gpu.fail" in res.stderr, res.stderr
        assert not (tmp_path / "run").exists() and not anyone_connected(listener)
    # the control: inside both, validate passes
    _inventory(tmp_path, listener.getsockname()[1], policy="policy: {faults: [process.kill], log_roots: [/var/log/train]}\n")
    scenario.write_text(GOOD.replace("checkpoint_dir: /scratch/ckpt/job1", "checkpoint_dir: /scratch/job1"))
    assert run_cli("validate", scenario).code == 0


def test_this_machines_policy_owned_by_someone_else_refuses_every_inventory(machine_policy, tmp_path: Path, listener):
    os.chown(machine_policy, 65534, 65534)
    _inventory(tmp_path, listener.getsockname()[1], policy="")
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD)
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"this machine's site policy {machine_policy} is owned by uid 65534, not root" in res.stderr, res.stderr
    assert not anyone_connected(listener)


def test_the_narrowest_of_two_policies_allows_what_both_allow():
    from chaoskit.cluster.policy import SitePolicy, narrowest

    site = SitePolicy(faults=["process.*", "network.link_down"], log_roots=["/var/log"], python=["/usr/bin/python3"],
                      max_nodes=8)
    own = SitePolicy(faults=["network.*", "process.kill", "gpu.fail"], log_roots=["/var/log/train", "/home"],
                     python=["/usr/bin/python3", "/opt/py"], slurm=False, max_nodes=16)
    both = narrowest(site, own)
    assert both.allows_kind("process.kill") is None and both.allows_kind("network.link_down") is None
    for kind in ("process.hang", "network.partition", "gpu.fail", "slurm.drain"):
        assert both.allows_kind(kind) is not None, kind
    assert both.log_roots == ["/var/log/train"] and both.python == ["/usr/bin/python3"] and both.max_nodes == 8
    assert narrowest(site, None) is site and narrowest(site, SitePolicy()).faults == site.faults
    site = SitePolicy(launches=["reference", "attach", "command"], script_roots=["/srv/gameday"])
    own = SitePolicy(launches=["command", "sbatch"], script_roots=["/srv/gameday/team-a", "/home"])
    both = narrowest(site, own)
    assert both.launches == ["command"] and both.script_roots == ["/srv/gameday/team-a"]


# -- the attack as a second, unprivileged author (issue 31) ------------------------------------------------

AUTHOR = "ckauthor31"


def _sh(*argv: str, check: bool = True, stdin: str | None = None):
    import subprocess

    res = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()}")
    return res


@pytest.fixture(scope="module")
def author():
    """A second local user (made with useradd, removed at the end) who writes the scenario and inventory."""
    import shutil

    from tests.conftest import need, need_root_tool

    need_root_tool("useradd")
    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    _sh("userdel", "--remove", "--force", AUTHOR, check=False)
    _sh("useradd", "--create-home", "--shell", "/bin/sh", AUTHOR)
    try:
        _sh("runuser", "-u", AUTHOR, "--", "mkdir", "-p", f"/home/{AUTHOR}/drill")
        yield Path(f"/home/{AUTHOR}/drill")
    finally:
        _sh("userdel", "--remove", "--force", AUTHOR, check=False)


def _as_author(path: Path, text: str) -> Path:
    """``text`` written to ``path`` by the author themself."""
    _sh("runuser", "-u", AUTHOR, "--", "tee", str(path), stdin=text)
    assert os.stat(path).st_uid != 0
    return path


def test_an_authors_own_permissive_inventory_is_bound_by_the_machines_policy(author, machine_policy, listener):
    """The author writes a scenario asking gpu.fail and names their own inventory, whose policy allows every fault:
    the machine's policy refuses it at the scenario's line, and nothing connects; a scenario inside both validates
    and says which policy applied, and from where."""
    port = listener.getsockname()[1]
    inv = _inventory(Path("/tmp"), port, policy="policy: {faults: ['*'], max_nodes: 64}\n").read_text()
    os.unlink("/tmp/inventory.yaml")
    os.unlink("/tmp/known_hosts")
    _as_author(author / "known_hosts", "")
    _as_author(author / "inventory.yaml", inv)
    scenario = _as_author(author / "drill.yaml", GOOD.replace("kind: process.kill", "kind: gpu.fail\n    duration: 5s")
                          .replace("/var/log/train/n1.log", "/var/log/n1.log"))
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"{scenario}:9:11: faults.0.kind: the site policy does not allow gpu.fail" in res.stderr, res.stderr
    res = run_cli("run", scenario, "--out", author / "run")
    assert res.code == 2 and not (author / "run").exists() and not anyone_connected(listener), res.stderr
    fine = _as_author(author / "fine.yaml", GOOD.replace("/var/log/train/n1.log", "/var/log/n1.log"))
    res = run_cli("validate", fine)
    assert res.code == 0, res.stderr
    said = " ".join(res.stdout.split())
    assert (f"site policy {machine_policy} (this machine's, named by CHAOSKIT_SITE_POLICY), narrowed by inventory "
            f"{author / 'inventory.yaml'} (its policy:)") in said, said


def test_a_policy_the_author_owns_named_by_the_environment_refuses_every_run(author, tmp_path, monkeypatch, listener):
    """Whoever sets a run's environment cannot swap in a policy of their own: one not root's refuses the run."""
    mine = _as_author(author / "policy.yaml", "faults: ['*']\n")
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(mine))
    _inventory(tmp_path, listener.getsockname()[1], policy="")
    scenario = tmp_path / "drill.yaml"
    scenario.write_text(GOOD)
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"this machine's site policy {mine} is owned by uid" in res.stderr, res.stderr
    assert not anyone_connected(listener)


def test_a_policy_named_by_the_environment_only_narrows_the_system_ones(tmp_path, monkeypatch):
    """A root-owned permissive file named by CHAOSKIT_SITE_POLICY cannot widen the system path's policy. (The system
    path itself is pointed at a file of the test's: the one global patched here, to leave /etc alone.)"""
    from chaoskit.cluster import policy

    folder = tmp_path / "etc"
    folder.mkdir(mode=0o755)
    system, loose = folder / "policy.yaml", folder / "loose.yaml"
    system.write_text("faults: [process.kill]\nmax_nodes: 1\n")
    loose.write_text("faults: ['*']\nmax_nodes: 64\n")
    monkeypatch.setattr(policy, "SITE_POLICY_FILE", system)
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", str(loose))
    got = policy.site_policy()
    assert got.allows_kind("process.kill") is None and got.allows_kind("gpu.fail") is not None and got.max_nodes == 1
    assert policy.origin(got) == (f"site policy {system} (this machine's), narrowed by {loose} (this machine's, "
                                  "named by CHAOSKIT_SITE_POLICY)")
    monkeypatch.setenv("CHAOSKIT_SITE_POLICY", "relative.yaml")
    assert "name an absolute path" in str(policy.site_policy()[0])


def test_the_machines_policy_binds_a_lab_scenario_too(machine_policy, tmp_path):
    """A lab is no way around it: a process-lab scenario asking a kind the machine's policy does not allow is refused."""
    scenario = tmp_path / "lab.yaml"
    scenario.write_text("name: lab-drill\ncluster: {kind: process, nodes: 2}\nworkload: {steps: 50}\n"
                        "faults:\n  - {kind: gpu.fail, target: {ranks: [1]}, duration: 5s, at: {after: 1s}}\n")
    res = run_cli("validate", scenario)
    assert res.code == 2 and "the site policy does not allow gpu.fail" in res.stderr, res.stderr
    scenario.write_text(scenario.read_text().replace("{kind: gpu.fail, target: {ranks: [1]}, duration: 5s,",
                                                     "{kind: process.kill, target: {ranks: [1]},"))
    res = run_cli("validate", scenario)
    assert res.code == 0 and f"site policy {machine_policy}" in " ".join(res.stdout.split()), res.stdout + res.stderr


def _lab_policy(machine_policy: Path, text: str) -> None:
    machine_policy.write_text("faults: [process.*, network.*]\n" + text)


def test_the_machines_policy_bounds_an_authors_program_on_a_lab(machine_policy, tmp_path):
    """A lab runs the author's ``workload.command`` as root too: ``launches`` can leave it out, and ``script_roots``
    says where its script may come from (links resolved, so a link inside the roots to a script outside is no way
    round it); each refusal at its line, before anything starts."""
    reviewed, elsewhere = tmp_path / "reviewed", tmp_path / "elsewhere"
    reviewed.mkdir()
    elsewhere.mkdir()
    (reviewed / "train.py").write_text("print('ok')\n")
    (elsewhere / "evil.py").write_text("print('evil')\n")
    (reviewed / "link.py").symlink_to(elsewhere / "evil.py")
    scenario = reviewed / "lab.yaml"

    def lab(workload: str) -> Path:
        scenario.write_text(f"name: lab-drill\ncluster: {{kind: process, nodes: 2}}\nworkload: {workload}\n"
                            "probes: {log: [{match: 'step (?P<step>\\d+)', event: step}]}\nfaults:\n"
                            "  - {kind: process.kill, target: {ranks: [1]}, at: {after: 1s}}\n")
        return scenario

    _lab_policy(machine_policy, "launches: [reference, uninstrumented]\n")
    res = run_cli("validate", lab("{launch: command, command: [train.py]}"))
    assert res.code == 2 and f"{scenario}:3:" in res.stderr and "allows no launch: command" in res.stderr, res.stderr
    assert run_cli("validate", lab("{steps: 50}")).code == 0  # the reference job: chaoskit's own program
    _lab_policy(machine_policy, f"script_roots: [{reviewed}]\n")
    assert run_cli("validate", lab("{launch: command, command: [train.py]}")).code == 0
    for command, says in (([str(elsewhere / "evil.py")], "outside the site policy's script_roots"),
                          (["link.py"], "outside the site policy's script_roots"),
                          (["-m", "evil"], "runs a module, which the site policy's script_roots")):
        res = run_cli("validate", lab(f"{{launch: command, command: [{', '.join(command)}]}}"))
        assert res.code == 2 and f"{scenario}:3:" in res.stderr and says in res.stderr, (command, res.stderr)
    res = run_cli("run", lab(f"{{launch: command, command: [{elsewhere / 'evil.py'}]}}"), "--out", tmp_path / "run")
    assert res.code == 2 and not (tmp_path / "run").exists(), res.stderr


def test_the_machines_policy_bounds_a_docker_labs_compose_file(machine_policy, tmp_path):
    """A compose file says what the engine runs, as root (images, mounts, privileges): it too must lie in the
    policy's script_roots."""
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services:\n  n0:\n    image: chaoskit-node\n    labels: {io.chaoskit.role: worker}\n"
                       "  n1:\n    image: chaoskit-node\n    labels: {io.chaoskit.role: worker}\n")
    scenario = tmp_path / "d.yaml"
    scenario.write_text("name: d\ncluster: {kind: docker, nodes: 2, compose: docker-compose.yml}\nworkload: {steps: 50}\n"
                        "faults:\n  - {kind: process.kill, target: {ranks: [1]}, at: {after: 1s}}\n")
    _lab_policy(machine_policy, "script_roots: [/srv/gameday]\n")
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"{scenario}:2:" in res.stderr and "cluster.compose" in res.stderr \
        and "outside the site policy's script_roots" in res.stderr, res.stderr
    _lab_policy(machine_policy, f"script_roots: [{tmp_path}]\n")
    res = run_cli("validate", scenario)
    assert res.code == 0, res.stderr


def test_the_machines_policy_says_whom_a_batch_script_may_be_submitted_as(machine_policy, tmp_path):
    """``jobs.users`` bounds ``launch: sbatch`` too: a script submitted as a user outside it is refused at
    ``workload.user``; the launch itself can be left out with ``launches``."""
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\ncluster: {kind: slurm, nodes: 2}\nworkload:\n  launch: sbatch\n  user: nobody\n"
                        "  script: train.sbatch\nfaults:\n  - {kind: process.kill, target: {ranks: [1]}, at: {after: 1s}}\n")
    _lab_policy(machine_policy, "jobs: {users: [alice]}\n")
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"{scenario}:5:" in res.stderr and "submitted as nobody" in res.stderr \
        and "jobs.users (alice)" in res.stderr, res.stderr
    _lab_policy(machine_policy, "jobs: {users: [nobody]}\n")
    assert run_cli("validate", scenario).code == 0
    _lab_policy(machine_policy, "launches: [reference, attach]\n")
    res = run_cli("validate", scenario)
    assert res.code == 2 and f"{scenario}:4:" in res.stderr and "allows no launch: sbatch" in res.stderr, res.stderr


# -- prometheus_urls: the Prometheus and Pushgateway servers chaoskit may talk to (issue 48) -----------------

PROMETHEUS_POLICY = "policy:\n" + POLICY + "  prometheus_urls: [http://prom.example:9090/team, https://push.example]\n"
WATCHED = GOOD.replace(
    "    - {node: n1, path: /var/log/train/n1.log}\n",
    "    - {node: n1, path: /var/log/train/n1.log}\n"
    "  prometheus:\n    - {url: 'http://prom.example:9090/team', query: 'max(up)', when: rises}\n",
).replace("safety: {max_nodes: 2}", "safety:\n  max_nodes: 2\n  stop_when:\n"
                                      "    - {prometheus: 'http://prom.example:9090/team/', query: 'max(up)', above: 1}\n")

# (where the URL is, the URL written there, the line:col of the refusal); each is allowed by chaoskit's own URL
# check and is a text prefix, or a near miss, of an allowed one
PROMETHEUS_OUTSIDE = [
    ("probe-other-port", "url: 'http://prom.example:9090/team'", "url: 'http://prom.example:9091/team'", "9:13",
     "probes.prometheus.0.url"),
    ("probe-path-not-on-a-slash", "url: 'http://prom.example:9090/team'", "url: 'http://prom.example:9090/teamx'",
     "9:13", "probes.prometheus.0.url"),
    ("probe-dotdot", "url: 'http://prom.example:9090/team'", "url: 'http://prom.example:9090/team/../admin'",
     "9:13", "probes.prometheus.0.url"),
    ("stop-other-scheme", "prometheus: 'http://prom.example:9090/team/'", "prometheus: 'https://prom.example:9090/team/'",
     "17:20", "safety.stop_when.0.prometheus"),
    ("stop-longer-host", "prometheus: 'http://prom.example:9090/team/'", "prometheus: 'https://push.example.evil.com'",
     "17:20", "safety.stop_when.0.prometheus"),
]


@pytest.mark.parametrize("case", PROMETHEUS_OUTSIDE, ids=[c[0] for c in PROMETHEUS_OUTSIDE])
def test_a_prometheus_url_outside_the_policys_prometheus_urls_is_refused_at_its_line(case, tmp_path: Path, listener):
    _, old, new, where, field = case
    _inventory(tmp_path, listener.getsockname()[1], policy=PROMETHEUS_POLICY)
    scenario = tmp_path / "drill.yaml"
    assert old in WATCHED
    scenario.write_text(WATCHED)
    assert run_cli("validate", scenario).code == 0  # the control: the same drill with the URLs inside the policy
    scenario.write_text(WATCHED.replace(old, new))
    res = run_cli("validate", scenario)
    assert res.code == 2, res.stderr
    assert f"{scenario}:{where}: {field}: " in res.stderr and "not under the site policy's prometheus_urls" in res.stderr, \
        res.stderr
    res = run_cli("run", scenario, "--out", tmp_path / "run")
    assert res.code == 2 and res.stderr.startswith(f"error: {scenario}:{where}: "), res.stderr
    assert not (tmp_path / "run").exists() and not anyone_connected(listener)


def test_prometheus_url_prefixes_compare_scheme_host_port_and_a_path_on_a_slash_boundary():
    from chaoskit.cluster.policy import SitePolicy, under_urls

    allowed = ["http://prom.example:9090"]
    for url in ("http://prom.example:9090", "http://prom.example:9090/", "http://PROM.example:9090/api/v1",
                "http://prom.example:9090/a//b"):
        assert under_urls(url, allowed), url
    for url in ("http://prom.example:9090.evil.com", "http://prom.example:90901", "http://prom.example:9091",
                "https://prom.example:9090", "http://prom.example", "http://prom.example.evil.com:9090",
                "http://evil@prom.example:9090", "http://prom.example:9090/x/%2e%2e/y", "ftp://prom.example:9090"):
        assert not under_urls(url, allowed), url
    assert under_urls("http://prom.example:80/x", ["http://prom.example"])  # an absent port is the scheme's
    assert under_urls("https://push.example:443", ["https://push.example/"])
    team = ["http://prom.example:9090/team"]
    assert under_urls("http://prom.example:9090/team/", team) and under_urls("http://prom.example:9090/team/a", team)
    assert not under_urls("http://prom.example:9090/teamx", team) and not under_urls("http://prom.example:9090/", team)
    assert SitePolicy().allows_url("http://anything:1") is None
    assert "allowed" not in (SitePolicy(prometheus_urls=[]).allows_url("http://prom.example:9090") or "allowed")


def test_the_narrowest_of_two_policies_allows_the_prometheus_urls_both_allow():
    from chaoskit.cluster.policy import SitePolicy, narrowest

    site = SitePolicy(prometheus_urls=["http://prom.example:9090", "https://push.example"])
    own = SitePolicy(prometheus_urls=["http://prom.example:9090/team", "http://other.example", "https://push.example/"])
    assert narrowest(site, own).prometheus_urls == ["http://prom.example:9090/team", "https://push.example/",
                                                    "https://push.example"]
    # a text prefix is no path prefix: neither /api nor /apix lies under the other
    assert narrowest(SitePolicy(prometheus_urls=["http://p:1/api"]),
                     SitePolicy(prometheus_urls=["http://p:1/apix"])).prometheus_urls == []
    assert narrowest(site, SitePolicy()).prometheus_urls == site.prometheus_urls
    assert narrowest(SitePolicy(), own).prometheus_urls == own.prometheus_urls


def test_a_policys_prometheus_urls_must_be_http_url_prefixes(tmp_path: Path, listener):
    path = _inventory(tmp_path, listener.getsockname()[1],
                      policy="policy:\n  prometheus_urls: ['http://prom.example:9090/team', 'https://[::1]']\n")
    assert run_cli("validate", path).code == 0, run_cli("validate", path).stderr
    for bad in ("ftp://prom.example", "http://user:pw@prom.example", "prom.example:9090", "http://prom.example/a/../b"):
        path = _inventory(tmp_path, listener.getsockname()[1], policy=f"policy:\n  prometheus_urls: ['{bad}']\n")
        res = run_cli("validate", path)
        assert res.code == 2 and f"{path}:4:" in res.stderr and "prometheus_urls prefix" in res.stderr, (bad, res.stderr)


def test_a_push_outside_the_machines_policy_is_refused_before_anything_runs(machine_policy, tmp_path: Path):
    """``--push`` names a server too: ``export`` and ``gameday`` refuse one outside this machine's prometheus_urls
    before they read or run anything (exit 2, one line naming the policy file)."""
    machine_policy.write_text(machine_policy.read_text() + "prometheus_urls: [http://push.example:9091]\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for url in ("http://push.example:9092", "http://push.example.evil.com:9091", "https://push.example:9091"):
        res = run_cli("export", empty, "--push", url)
        assert res.code == 2, res.stderr
        assert "error: --push" in res.stderr and str(machine_policy) in res.stderr.splitlines()[0], res.stderr
    res = run_cli("export", empty, "--push", "http://push.example:9091/metrics")  # allowed: then the folder is read
    assert res.code == 2 and "holds no result.json" in res.stderr, res.stderr
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "lab.yaml").write_text("name: lab-drill\ncluster: {kind: process, nodes: 2}\nworkload: {steps: 50}\n"
                                        "faults:\n  - {kind: gpu.fail, target: {ranks: [1]}, duration: 5s, at: {after: 1s}}\n")
    res = run_cli("gameday", scenarios, "--out", tmp_path / "gd", "--push", "http://push.example.evil.com:9091")
    assert res.code == 2 and "prometheus_urls" in res.stderr and str(machine_policy) in res.stderr, res.stderr
    assert not (tmp_path / "gd").exists()
