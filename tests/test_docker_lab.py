"""The Docker lab on a real docker engine: the repository's docker-compose.yml brought up
through the SDK, the docker transport, and every process and network fault acting
inside the containers (reverted by the controller, by the deadline or by a stale lease).

The compose-file tests at the top need no engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.core.errors import InfraError, ScenarioError
from tests.conftest import need_root_tool, run_cli

pytest_plugins = ["tests.docker_fixtures"]


def fx():
    from tests import docker_fixtures

    return docker_fixtures


# -- the compose file (no engine) ---------------------------------------------------------------


def test_the_compose_file_users_run_is_the_lab():
    from chaoskit.lab.docker import load_compose

    project = load_compose(fx().COMPOSE, environ={})
    assert project.name == "chaoskit"
    assert [s.name for s in project.services] == ["n0", "n1", "n2"]
    for s in project.services:
        assert s.image == "chaoskit-node:latest" and s.init and s.cap_add == ["NET_ADMIN", "SYS_PTRACE"] and s.networks == ["data"]
        assert (project.directory / s.build["context"] / s.build["dockerfile"]).is_file()
    assert [s.labels["io.chaoskit.role"] for s in project.services] == ["worker", "worker", "spare"]
    assert project.shared_dir() == Path("/tmp/chaoskit-docker")  # the same path on both sides


def test_a_compose_file_without_sys_ptrace_keeps_the_job_root_and_says_why(tmp_path):
    """The job runs in the containers as a lab account only where chaoskit's agent (root there) can see its processes,
    which takes SYS_PTRACE (issue 48): a compose file of the user's without it keeps the job root, with the reason (the
    runner's job_user_why); chaoskit's own compose file adds it. No engine needed: the compose file as read."""
    from types import SimpleNamespace

    from chaoskit.backends.docker import _no_ptrace
    from chaoskit.lab.docker import find_compose, load_compose

    f = tmp_path / "docker-compose.yml"
    f.write_text("name: mine\nservices:\n  n0:\n    image: chaoskit-node:latest\n    cap_add: [NET_ADMIN]\n"
                 "    labels: [io.chaoskit.role=worker]\n"
                 "  n1:\n    image: chaoskit-node:latest\n    cap_add: [NET_ADMIN, SYS_PTRACE]\n"
                 "    labels: [io.chaoskit.role=worker]\n")
    why = _no_ptrace(SimpleNamespace(project=load_compose(f, environ={})), ["n0", "n1"])
    assert why is not None and "services n0 do not add SYS_PTRACE" in why, why
    assert _no_ptrace(SimpleNamespace(project=load_compose(find_compose(), environ={})), ["n0", "n1"]) is None


def test_compose_variables_and_project_name_follow_compose(tmp_path):
    from chaoskit.lab.docker import load_compose

    f = tmp_path / "docker-compose.yml"
    f.write_text(
        "name: mylab\n"
        "services:\n"
        "  a:\n"
        "    image: ${IMG:-chaoskit-node:latest}\n"
        "    labels: [io.chaoskit.role=worker]\n"
        "    environment:\n      PRICE: $$5\n      WHO: ${WHO-nobody}\n      EMPTY: ${UNSET}\n"
        "    volumes: ['${SHARED:-/tmp/x}:${SHARED:-/tmp/x}', './data:/data:ro']\n"
    )
    p = load_compose(f, environ={"WHO": ""})
    [svc] = p.services
    assert p.name == "mylab" and svc.image == "chaoskit-node:latest"
    assert svc.environment == {"PRICE": "$5", "WHO": "", "EMPTY": ""}
    assert svc.binds == [("/tmp/x", "/tmp/x", "rw"), (str(tmp_path / "data"), "/data", "ro")]
    assert svc.networks == ["default"] and "default" in p.networks
    p = load_compose(f, environ={"COMPOSE_PROJECT_NAME": "other", "IMG": "img:1", "SHARED": "/srv/s"})
    assert p.name == "other" and p.services[0].image == "img:1" and p.shared_dir() == Path("/srv/s")


@pytest.mark.parametrize("body, message", [
    ("services:\n  n0:\n    image: x\n    ports: ['80:80']\n", "services.n0.ports: chaoskit's docker lab does not read 'ports'"),
    ("services:\n  n0:\n    image: x\n    networks: [fast]\n", "network 'fast' is not declared under networks:"),
    ("services:\n  n0:\n    build: .\n", "services.n0: image: the node image"),
    ("services:\n  n0:\n    image: x\n    volumes: [cache:/cache]\n", "named volume 'cache' is not declared"),
    ("services: {}\n", "services: at least one service"),
    ("secrets: {}\nservices:\n  n0: {image: x}\n", "does not read 'secrets'"),
    ("services:\n  db: {image: postgres}\n  n0: {image: x, labels: {io.chaoskit.role: worker}}\n",
     "db: no io.chaoskit.role label, so this is not a chaoskit lab"),
])
def test_what_the_lab_cannot_honour_is_an_error_not_ignored(tmp_path, body, message):
    from chaoskit.lab.docker import load_compose

    f = tmp_path / "docker-compose.yml"
    f.write_text(body)
    with pytest.raises(ScenarioError) as err:
        load_compose(f, environ={})
    assert message in str(err.value)
    assert err.value.pos.file == str(f)


def test_a_scenario_asking_for_more_nodes_than_services_is_refused(tmp_path):
    sc = tmp_path / "big.yaml"
    sc.write_text(f"name: big\ncluster: {{kind: docker, nodes: 3, spare: 1, compose: {fx().COMPOSE}}}\n"
                  "faults:\n  - kind: process.kill\n    target: {ranks: [0]}\n")
    res = run_cli("validate", sc)
    assert res.code == 2
    assert "3 nodes + 1 spare, but" in res.stdout + res.stderr and "has 3 services" in res.stdout + res.stderr


def test_disconnect_partitions_take_no_peers(tmp_path):
    sc = tmp_path / "p.yaml"
    sc.write_text("name: p\ncluster: {kind: docker, nodes: 2, compose: " + str(fx().COMPOSE) + "}\n"
                  "faults:\n  - kind: network.partition\n    method: disconnect\n    target: {nodes: [n1]}\n"
                  "    peers: {nodes: [n0]}\n    duration: 5s\n")
    res = run_cli("validate", sc)
    assert res.code == 2 and "peers: needs method: nft" in res.stdout + res.stderr


def test_dry_run_shows_the_docker_commands_without_an_engine(monkeypatch):
    from tests.conftest import SCENARIOS

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # nothing may be contacted
    res = run_cli("run", "--dry-run", "--json", SCENARIOS / "docker-node-poweroff.yaml")
    assert res.code == 0, res.stderr
    job = res.json["job"]
    assert sorted(job) == ["n0", "n1", "n2"]
    assert job["n1"].startswith("docker exec -i -w /tmp/chaoskit-docker/") and " chaoskit-n1-1 /opt/chaoskit/bin/python -m torch" in job["n1"]
    [fault] = res.json["plan"]
    assert "power off chaoskit-n1-1" in fault["actions"][1]["command"]


def test_runs_need_an_engine_and_say_how_to_get_one(monkeypatch):
    from tests.conftest import SCENARIOS

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = run_cli("run", SCENARIOS / "docker-nic-drop.yaml")
    assert res.code == 3
    assert "no docker engine answers" in res.stderr and "apt-get install docker.io" in res.stderr


# -- on the engine ----------------------------------------------------------------------------------


def test_lab_up_makes_what_compose_would(docker_lab):
    project = docker_lab.project.name
    containers = docker_lab.containers()
    assert sorted(containers) == ["n0", "n1", "n2"]
    for service, c in containers.items():
        c.reload()
        assert c.name == f"{project}-{service}-1" and c.status == "running"
        assert c.labels["com.docker.compose.project"] == project
        assert c.labels["com.docker.compose.service"] == service
        assert c.labels["com.docker.compose.container-number"] == "1"
        host = c.attrs["HostConfig"]
        assert host["CapAdd"] == ["NET_ADMIN", "SYS_PTRACE"] and host["Init"] is True
        shared = str(docker_lab.project.shared_dir())
        assert {"Type": "bind", "Source": shared, "Destination": shared} in [
            {k: m[k] for k in ("Type", "Source", "Destination")} for m in c.attrs["Mounts"]]
        assert list(c.attrs["NetworkSettings"]["Networks"]) == [f"{project}_data"]
        assert c.attrs["Config"]["Hostname"] == service
    inventory = docker_lab.inventory()
    assert inventory.names() == ["n0", "n1", "n2"]
    assert inventory["n2"].labels["role"] == "spare" and inventory["n0"].interfaces["data"].name == "eth0"


def test_another_user_of_this_machine_reaches_no_lab_node(docker_lab):
    """The job's rendezvous store listens on a node's address, which this machine reaches through docker's bridge
    (issue 48's suspected docker form of finding 1): root (chaoskit) connects, another user is refused."""
    need_root_tool("setpriv")
    c = docker_lab.containers()["n1"]
    address = docker_lab.address("n1")
    server = c.exec_run(["python3", "-c", "import socket,time\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                         "socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 29411)); s.listen(8); time.sleep(20)"], detach=True)
    reach = ("import socket,sys,time\nfor _ in range(50):\n s=socket.socket(); s.settimeout(3)\n try:\n"
             "  s.connect((sys.argv[1], 29411)); print('connected'); break\n except ConnectionRefusedError:\n"
             "  time.sleep(0.1)\n except OSError as e:\n  print('refused', e); break\n")
    as_root = subprocess.run([sys.executable, "-c", reach, address], capture_output=True, text=True, timeout=60)
    assert as_root.stdout.startswith("connected"), as_root.stdout + as_root.stderr
    once = ("import socket,sys\ns=socket.socket(); s.settimeout(3)\ntry:\n s.connect((sys.argv[1], 29411)); print('connected')\n"
            "except OSError as e:\n print('refused', e)\n")
    other = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                            once, address], capture_output=True, text=True, timeout=60)
    assert other.stdout.startswith("refused"), other.stdout + other.stderr


def test_the_transport_runs_commands_in_the_container(docker_inventory):
    t = docker_inventory["n1"].conn
    assert t.mode == "agent"
    assert abs(t.ping() - time.time()) < 5
    res = t.run(["sh", "-c", "hostname; echo oops >&2; exit 3"], 10)
    assert (res.returncode, res.stdout, res.stderr) == (3, "n1\n", "oops\n")
    with pytest.raises(InfraError, match="no answer within 1s"):
        t.run(["sleep", "30"], 1)
    t.mode = "exec"  # the fallback: one docker exec per command
    try:
        res = t.run(["sh", "-c", "hostname; exit 4"], 10)
        assert (res.returncode, res.stdout) == (4, "n1\n")
        assert t.read_file("/etc/hostname").strip() == "n1"
    finally:
        t.mode = "agent"


def _start(lab, node: str, scoped: bool) -> tuple[int, str]:
    """Start a ``sleep`` with a unique command line in a node's container (in the node's scope or not):
    (its pid there, its command line)."""
    c = lab.containers()[node]
    cmdline = f"sleep 300.{time.time_ns() % 10**9}"
    env = {"CHAOSKIT_SCOPE": lab.scope(node)} if scoped else {}
    c.exec_run(cmdline.split(), environment=env, detach=True)
    assert fx().wait_until(lambda: c.exec_run(["pgrep", "-fx", cmdline]).exit_code == 0, 10)
    return int(c.exec_run(["pgrep", "-fx", cmdline]).output.split()[0]), cmdline


def test_processes_are_scoped_and_signals_refused_outside_the_scope(docker_lab, docker_inventory):
    t = docker_inventory["n0"].conn
    mine, _ = _start(docker_lab, "n0", True)
    other, _ = _start(docker_lab, "n0", False)
    pids = {p.pid for p in t.processes()}
    assert mine in pids and other not in pids
    with pytest.raises(InfraError, match="refusing to signal"):
        t.signal(other, 9)
    t.signal(mine, 9)
    assert fx().wait_until(lambda: t.state(mine) is None, 5)
    docker_lab.containers()["n0"].exec_run(["kill", "-9", str(other)])


def make(kind: str, **fields):
    from chaoskit.faults.registry import get_fault

    cls = get_fault(kind)
    spec = cls.Spec.model_validate({"kind": kind, **fields})
    return cls(spec, f"f{time.time_ns() % 10**6}")


def test_process_kill_and_hang_act_inside_the_container(docker_lab, docker_ctx):
    from chaoskit.cluster.selectors import resolve_processes

    t = docker_ctx.transport("n1")
    pid, cmdline = _start(docker_lab, "n1", True)
    hang = make("process.hang", target={"nodes": ["n1"], "process": cmdline}, duration="30s")
    [inj] = hang.inject(docker_ctx, resolve_processes(docker_ctx.inventory, hang.spec.target))
    assert t.state(pid) == "T"
    hang.revert(docker_ctx, inj)
    docker_ctx.leases.release(inj.fault_id)
    assert hang.verify(docker_ctx, inj) is None and t.state(pid) in ("S", "R")
    kill = make("process.kill", target={"nodes": ["n1"], "process": cmdline})
    kill.inject(docker_ctx, resolve_processes(docker_ctx.inventory, kill.spec.target))
    assert fx().wait_until(lambda: t.state(pid) is None, 5)


_ADDRESSES: dict[tuple[str, str], str] = {}


def tcp(lab, src: str, dst: str, port: int = 22) -> bool:
    """Can ``src`` open a TCP connection to ``dst``'s sshd (checked from inside ``src``'s container)?
    ``dst``'s address is looked up once: a disconnected container has none while it is cut off."""
    key = (lab.project.name, dst)
    address = _ADDRESSES.get(key) or _ADDRESSES.setdefault(key, lab.address(dst))
    code = f"import socket; socket.create_connection(({address!r}, {port}), 1).close()"
    return lab.containers()[src].exec_run(["python3", "-c", code]).exit_code == 0


def inject_and_finish(ctx, fault, check_in_effect):
    from chaoskit.cluster.selectors import resolve_nodes

    targets = resolve_nodes(ctx.inventory, fault.spec.target)
    fault.preflight(ctx, targets)
    [inj] = fault.inject(ctx, targets)
    check_in_effect(inj)
    fault.revert(ctx, inj)
    ctx.leases.release(inj.fault_id)
    assert fault.verify(ctx, inj) is None
    fault.revert(ctx, inj)  # idempotent
    assert fault.verify(ctx, inj) is None
    return inj


@pytest.mark.parametrize("kind, fields", [
    ("network.link_down", {}),
    ("network.blackhole", {}),
    ("network.partition", {"peers": {"nodes": ["n0"]}}),
    ("network.partition", {"method": "disconnect"}),
])
def test_network_faults_cut_the_node_inside_its_container_and_are_reverted(docker_lab, docker_ctx, clean_docker_lab, kind, fields):
    lab = docker_lab
    address = lab.address("n1")
    assert tcp(lab, "n0", "n1") and tcp(lab, "n2", "n1")
    fault = make(kind, target={"nodes": ["n1"]}, duration="30s", **fields)

    def in_effect(inj):
        assert not tcp(lab, "n0", "n1"), f"{kind} did not cut n0 -> n1"
        if fields.get("peers"):  # a partition between groups: n2 is not on the other side
            assert tcp(lab, "n2", "n1")
        assert docker_ctx.transport("n1").ping() > 0  # chaoskit reaches the node through the engine, not its NIC

    inj = inject_and_finish(docker_ctx, fault, in_effect)
    assert tcp(lab, "n0", "n1") and tcp(lab, "n2", "n1")
    assert lab.address("n1") == address  # a reconnected container keeps its address (and its names)
    if fields.get("method") == "disconnect":
        assert inj.detail["on"] == "controller"
        assert '"on": "controller"' in docker_ctx.journal.path.read_text()
        # The engine named the NIC anew; the lab's inventory finds it by address, and a second
        # disconnect cuts the node again (a NIC renamed behind the engine's back would stay).
        device = lab.inventory()["n1"].interfaces["data"].name
        assert lab.device("n1", address) == device
        inject_and_finish(docker_ctx, make(kind, target={"nodes": ["n1"]}, duration="30s", **fields), in_effect)


def test_degrade_shapes_the_rate_with_tbf(docker_lab, docker_ctx, clean_docker_lab):
    fault = make("network.degrade", target={"nodes": ["n2"]}, rate="1mbit", duration="30s")
    c = docker_lab.containers()["n2"]
    inject_and_finish(docker_ctx, fault, lambda inj: (
        None if "tbf" in c.exec_run(["tc", "qdisc", "show", "dev", "eth0"]).output.decode() else pytest.fail("no tbf qdisc")))


def test_a_stale_lease_restores_the_link_from_inside_the_container(docker_lab, docker_ctx, clean_docker_lab):
    """The controller stops renewing (as if it died): the watchdog in the container brings eth0 back."""
    from chaoskit.cluster.selectors import resolve_nodes

    fault = make("network.link_down", target={"nodes": ["n2"]}, duration="10m")
    [inj] = fault.inject(docker_ctx, resolve_nodes(docker_ctx.inventory, fault.spec.target))
    assert not tcp(docker_lab, "n0", "n2")
    t0 = time.time()
    docker_ctx.leases.abandon(inj.fault_id)
    assert fx().wait_until(lambda: tcp(docker_lab, "n0", "n2"), 2.0 + 10)
    assert time.time() - t0 < 2.0 + 10


def test_poweroff_kills_the_container_and_power_on_starts_it(docker_lab, docker_ctx, clean_docker_lab):
    fault = make("node.poweroff", target={"nodes": ["n2"]}, duration="30s")
    c = docker_lab.containers()["n2"]

    def off(inj):
        c.reload()
        assert c.status == "exited" and c.attrs["State"]["ExitCode"] == 137  # SIGKILL: a power cut, not a shutdown
        with pytest.raises(InfraError, match="not running"):
            docker_ctx.transport("n2").ping(timeout=2)

    inject_and_finish(docker_ctx, fault, off)
    c.reload()
    assert c.status == "running" and docker_ctx.transport("n2").ping() > 0


def test_poweroff_is_undone_by_the_controllers_watchdog_when_the_lease_goes_stale(docker_lab, docker_ctx, clean_docker_lab):
    from chaoskit.cluster.selectors import resolve_nodes

    fault = make("node.poweroff", target={"nodes": ["n2"]}, duration="10m")
    [inj] = fault.inject(docker_ctx, resolve_nodes(docker_ctx.inventory, fault.spec.target))
    c = docker_lab.containers()["n2"]
    docker_ctx.leases.abandon(inj.fault_id)

    def running():
        c.reload()
        return c.status == "running"

    assert fx().wait_until(running, 2.0 + 15)
    assert fault.verify(docker_ctx, inj) is None


@pytest.mark.slow
def test_lab_up_status_and_down_through_the_cli_leave_nothing(tmp_path, monkeypatch):
    fx().require_docker()
    env = fx().project_env(tmp_path / "shared", "c")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    project = env["COMPOSE_PROJECT_NAME"]
    res = run_cli("lab", "up", "--kind", "docker", "--compose", fx().COMPOSE)
    try:
        assert res.code == 0, res.stderr
        assert f"docker lab {project} up" in res.stdout
        st = run_cli("lab", "status", "--json")
        [lab] = [d for d in st.json["labs"] if d["kind"] == "docker" and d["id"] == f"docker-{project}"]
        assert [(n["name"], n["state"]) for n in lab["nodes"]] == [("n0", "running"), ("n1", "running"), ("n2", "running")]
        again = run_cli("lab", "up", "--kind", "docker", "--compose", fx().COMPOSE)
        assert again.code == 0 and "already up" in again.stdout
    finally:
        down = run_cli("lab", "down", "--compose", fx().COMPOSE)
    assert down.code == 0 and f"docker lab {project} down: removed 3 containers" in down.stdout
    assert fx().leftovers(project) == {"containers": [], "networks": [], "volumes": []}
    assert run_cli("lab", "down", "--compose", fx().COMPOSE).code == 0  # twice is fine


def test_power_commands_refuse_unknown_containers():
    fx().require_docker()
    res = subprocess.run([sys.executable, "-m", "chaoskit.cluster.transports.docker", "power", "status", "no-such-ck-node"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = subprocess.run([sys.executable, "-m", "chaoskit.cluster.transports.docker", "power", "reboot"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage:" in res.stderr
    assert os.environ.get("CHAOSKIT_STATE_DIR")  # private state dir: nothing of the user's is touched


CONTROLLER = r"""
import sys, time
from pathlib import Path
from chaoskit.cluster.selectors import resolve_nodes
from chaoskit.faults.registry import get_fault
from chaoskit.runner import RunContext
from chaoskit.crash import rollback_inventory
from chaoskit.safety.journal import Journal
from chaoskit.safety.lease import LeaseManager, default_lease_root
from chaoskit.safety.rollback import CrashedRun

compose, project, run_dir = sys.argv[1:4]
run_dir = Path(run_dir)
run = CrashedRun("r", 0, run_dir, run_dir / "marker", {"kind": "docker", "compose": compose, "project": project})
inventory = rollback_inventory(run)
ctx = RunContext(inventory, Journal(run_dir / "journal.jsonl"), LeaseManager(default_lease_root(), run_dir.name, 60.0))
for kind, node, extra in (("network.link_down", "n2", {}), ("network.partition", "n1", {"method": "disconnect"})):
    cls = get_fault(kind)
    spec = cls.Spec.model_validate({"kind": kind, "target": {"nodes": [node]}, "duration": "10m", **extra})
    cls(spec, "f" + node).inject(ctx, resolve_nodes(inventory, spec.target))
print("injected", flush=True)
time.sleep(600)
"""


def test_rollback_undoes_what_a_sigkilled_controller_left_in_the_containers(docker_lab, tmp_path, clean_docker_lab):
    """A controller arms and injects a NIC fault (node-side lease) and a disconnect (controller-side
    lease), then dies by SIGKILL. Its leases would only fire after 60 s: rollback, from the journal
    alone, reverts both now, and a second rollback finds nothing to do."""
    import signal

    from chaoskit.crash import rollback_inventory
    from chaoskit.safety.rollback import CrashedRun, rollback_journal

    run_dir = tmp_path / "crashed"
    run_dir.mkdir()
    info = {"kind": "docker", "compose": str(fx().COMPOSE), "project": docker_lab.project.name}
    assert tcp(docker_lab, "n0", "n1") and tcp(docker_lab, "n0", "n2")
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, info["compose"], info["project"], str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "injected", proc.stderr.read() if proc.poll() is not None else ""
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert not tcp(docker_lab, "n0", "n2") and not tcp(docker_lab, "n0", "n1")
    inventory = rollback_inventory(CrashedRun("crashed", proc.pid, run_dir, run_dir / "m", info))
    try:
        outcomes = rollback_journal(run_dir / "journal.jsonl", inventory, run_id="crashed")
        assert [(o.kind, o.node, o.ok, o.problem) for o in outcomes] == [
            ("network.link_down", "n2", True, None), ("network.partition", "n1", True, None)]
        assert tcp(docker_lab, "n0", "n2") and tcp(docker_lab, "n0", "n1")
        assert rollback_journal(run_dir / "journal.jsonl", inventory, run_id="crashed") == []
        # Both watchdogs stood down: the controller's (disconnect) and the one in n2's container (NIC).
        assert fx().wait_until(lambda: subprocess.run(["pgrep", "-f", "leases/crashed/fn1"]).returncode != 0, 10)
        assert fx().wait_until(lambda: docker_lab.containers()["n2"].exec_run(["pgrep", "-f", "watchdog"]).exit_code != 0, 10)
    finally:
        for n in inventory.nodes:
            n.conn.close()


def test_lab_down_leaves_other_compose_projects_alone(tmp_path, monkeypatch):
    """`chaoskit lab down` run in another project's folder: that project's docker-compose.yml is not
    a chaoskit lab (no io.chaoskit.role labels), so its running container is not touched."""
    fx().require_docker()
    from chaoskit.cluster.transports.docker import docker_client

    project = f"foreignck{os.getpid() % 100000}"
    (tmp_path / "docker-compose.yml").write_text(f"name: {project}\nservices:\n  web:\n    image: {fx().IMAGE}\n")
    client = docker_client()
    c = client.containers.run(fx().IMAGE, name=f"{project}-web-1", detach=True, init=True,
                              labels={"com.docker.compose.project": project, "com.docker.compose.service": "web"})
    try:
        monkeypatch.chdir(tmp_path)
        res = run_cli("lab", "down")
        assert res.code == 0 and "no lab is up" in res.stdout
        assert "no lab is up" in run_cli("lab", "status").stdout
        c.reload()
        assert c.status == "running"
        res = run_cli("lab", "down", "--compose", tmp_path / "docker-compose.yml")
        assert res.code == 2 and "not a chaoskit lab" in res.stderr
        c.reload()
        assert c.status == "running"
    finally:
        c.remove(force=True)
