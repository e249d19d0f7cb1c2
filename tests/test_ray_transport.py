"""Faults through ChaosAgent actors on a real 3-node Ray cluster (the process lab joined into Ray)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.cluster.selectors import TargetSpec, resolve_processes
from chaoskit.cluster.transports.local import proc_info
from chaoskit.core.errors import InfraError
from chaoskit.faults.process import HangFault, HangSpec, KillFault, KillSpec
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal
from chaoskit.safety.lease import LeaseManager
from tests.conftest import need, proc_state, wait_exec, wait_state, lab_fixture

WORKER = "import time; time.sleep(600)  # ray-worker"




@lab_fixture(scope="module")
def ray_lab(tmp_path_factory):
    need(importlib.util.find_spec("ray") is not None, "ray (pip install 'chaoskit[ray]')")
    from chaoskit.lab.process import ProcessLab
    from chaoskit.lab.ray import RayLab

    state = pytest.MonkeyPatch()  # the lab's record in a state folder of this module's, not the machine's
    state.setenv("CHAOSKIT_STATE_DIR", str(tmp_path_factory.mktemp("ray-state")))
    lab = ProcessLab.create(3)
    ray_lab = RayLab.start(lab)
    temp = Path(ray_lab.temp_dir).parent  # Ray's files in a 0700 folder of the lab's own, not the shared /tmp/ray
    assert temp.name.startswith("chaoskit-ray-") and lab.lab_id not in temp.name  # a name nobody can guess
    assert (temp.stat().st_mode & 0o777) == 0o700
    assert temp.stat().st_uid == (ray_lab.account.uid if ray_lab.account else os.geteuid())
    assert any(p.name.startswith("session_") for p in Path(ray_lab.temp_dir).iterdir())
    try:
        yield ray_lab
    finally:
        import ray

        from chaoskit.lab.ray import HEAD_NODE, scope_pids

        ray.shutdown()
        tree = scope_pids({lab.scope(n) for n in [HEAD_NODE, *lab.node_names()]})
        ray_lab.down()
        left = [pid for pid in tree if (info := proc_info(pid)) is not None and info.state != "Z"]
        state.undo()
        assert left == [], f"Ray processes left behind: {left}"
        assert not temp.exists()


@pytest.fixture
def workers(ray_lab):
    """One fake training worker (torchrun's env, the node's scope) per lab node, and one outsider."""
    lab = ray_lab.lab
    ids = ray_lab.account.popen_ids() if ray_lab.account else {}  # a job of the lab's, as its nodes' account
    procs = []
    for i, node in enumerate(lab.node_names()):
        env = dict(os.environ, CHAOSKIT_SCOPE=lab.scope(node), RANK=str(i), TORCHELASTIC_RUN_ID="t")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd="/", **ids))
    outsider = subprocess.Popen([sys.executable, "-c", WORKER], env=dict(os.environ, RANK="1", TORCHELASTIC_RUN_ID="t"))
    for p in procs + [outsider]:
        wait_exec(p)
    yield procs, outsider
    for p in procs + [outsider]:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()


def connected(ray_lab):
    """The lab's inventory with every node's ChaosAgent started, each within its start timeout, as a run starts them
    before it resolves a target (ClusterHandle.connect): resolving asks every node within 5 s
    (selectors.RESOLVE_DEADLINE_S) and leaves out a node that has not answered, and an agent's first start (a Ray
    worker process) takes longer than that on a loaded machine: the fan-out test missed a node so at load 18."""
    inv = ray_lab.inventory()
    for node in inv.nodes:
        node.conn.connect()
    return inv


def test_each_agent_runs_on_its_own_node_inside_its_scope(ray_lab):
    inv = ray_lab.inventory()
    seen = {}
    for node in inv.nodes:
        where = node.conn.connect()
        assert where["node_id"] == node.conn.node_id
        assert where["scope_env"] == ray_lab.lab.scope(node.name)  # the actor is a process of its node
        seen[node.name] = where["node_id"]
    assert len(set(seen.values())) == 3


def test_kill_through_the_agent_stays_inside_the_node(ray_lab, workers):
    procs, outsider = workers
    inv = connected(ray_lab)
    ctx = RunContext(inv)
    with pytest.raises(InfraError, match="not a process of node n0"):
        inv["n0"].conn.signal(outsider.pid, signal.SIGKILL)
    with pytest.raises(InfraError):
        inv["n0"].conn.signal(procs[1].pid, signal.SIGKILL)  # a process of n1
    fault = KillFault(KillSpec(kind="process.kill", target=TargetSpec(ranks=[1])), "f0")
    targets = resolve_processes(inv, fault.spec.target)
    assert [t.pid for t in targets] == [procs[1].pid]
    before = time.time()
    [inj] = fault.inject(ctx, targets)
    assert before <= inj.t_fault <= time.time()
    assert procs[1].wait(timeout=5) == -signal.SIGKILL
    assert fault.verify(ctx, inj) is None
    assert outsider.poll() is None and procs[0].poll() is None and procs[2].poll() is None


def test_a_fault_fanned_out_reaches_every_selected_node(ray_lab, workers, tmp_path):
    procs, outsider = workers
    inv = connected(ray_lab)
    leases = LeaseManager(tmp_path / "leases", "fan", ttl=5)
    ctx = RunContext(inv, Journal(tmp_path / "j.jsonl"), leases)
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(process=r"ray-worker"), duration=30), "f0")
    targets = resolve_processes(inv, fault.spec.target)
    assert sorted(t.node for t in targets) == ["n0", "n1", "n2"]
    injections = fault.inject(ctx, targets)
    assert sorted(i.node for i in injections) == ["n0", "n1", "n2"]
    for p in procs:
        assert wait_state(p.pid, lambda s: s == "T")
    assert proc_state(outsider.pid) != "T"
    for inj in injections:
        fault.revert(ctx, inj)
        leases.release(inj.fault_id)
        assert fault.verify(ctx, inj) is None
    for p in procs:
        assert wait_state(p.pid, lambda s: s in ("S", "R"))
    leases.close()


def test_run_has_a_hard_deadline(ray_lab):
    conn = ray_lab.inventory()["n2"].conn
    res = conn.run(["sh", "-c", "echo $CHAOSKIT_SCOPE"], timeout=10)
    assert res.returncode == 0 and res.stdout.strip() == ray_lab.lab.scope("n2")
    start = time.time()
    with pytest.raises(InfraError, match="no answer within 0.5s"):
        conn.run(["sleep", "5"], timeout=0.5)
    assert time.time() - start < 3


def test_a_killed_agent_leaves_the_lease_to_revert_the_hang(ray_lab, workers, tmp_path):
    """SIGKILL the ChaosAgent mid-hang and stop renewing: the node's watchdog SIGCONTs the process."""
    import ray

    procs, _ = workers
    inv = connected(ray_lab)
    leases = LeaseManager(tmp_path / "leases", "agentkill", ttl=1.0)
    ctx = RunContext(inv, Journal(tmp_path / "j.jsonl"), leases)
    fault = HangFault(HangSpec(kind="process.hang", target=TargetSpec(ranks=[2]), duration=300), "f0")
    [inj] = fault.inject(ctx, resolve_processes(inv, fault.spec.target))
    assert wait_state(procs[2].pid, lambda s: s == "T")
    lease = leases.leases[inj.fault_id]
    agent_pid = inv["n2"].conn.connect()["pid"]
    time.sleep(1.5)
    assert proc_state(procs[2].pid) == "T"  # renewed through the agent while it lives
    assert proc_state(lease.watchdog_pid) not in (None, "Z")
    ray.kill(inv["n2"].conn.agent)
    leases.abandon(inj.fault_id)  # the controller is gone too: nobody renews
    assert wait_state(agent_pid, lambda s: s in (None, "Z"), timeout=5)
    # the watchdog is no child of the agent: it outlives it and continues the process once the lease (1 s) expires.
    # Not asserted alive after the agent's death: on a loaded machine that wait outlasts the lease and the watchdog
    # has already fired and ended (two busy loops beside the suite: it was a zombie by then); the process running
    # again and the watchdog's own word below are what prove it acted
    assert wait_state(procs[2].pid, lambda s: s in ("S", "R"), timeout=10)
    fired = None
    end = time.time() + 3
    while fired is None and time.time() < end:
        try:
            fired = inv["n2"].conn.lease_fired(lease.directory)  # a new agent, started lazily
        except InfraError:
            pass
        time.sleep(0.1)
    assert fired is not None and "lease expired" in fired
    leases.close()


def test_power_off_kills_the_node_and_ray_declares_it_dead(ray_lab, workers, tmp_path):
    """node.poweroff with the lab's power commands: every process of n1 dies, Ray's probe sees it, power on returns it."""
    from chaoskit.cluster.selectors import resolve_nodes
    from chaoskit.faults.power import PowerOffFault, PowerOffSpec
    from chaoskit.observe.events import EventBus
    from chaoskit.observe.ray_nodes import RayNodeProbe

    procs, _ = workers
    inv = ray_lab.inventory()
    old_id = inv["n1"].conn.connect()["node_id"]
    bus = EventBus()
    probe = RayNodeProbe(bus, ray_lab.address, inv.names())
    probe.poll()
    assert sorted(probe.alive.values()) == ["n0", "n1", "n2"]
    probe.start()
    leases = LeaseManager(tmp_path / "leases", "power", ttl=30)
    ctx = RunContext(inv, Journal(tmp_path / "j.jsonl"), leases)
    fault = PowerOffFault(PowerOffSpec(kind="node.poweroff", target=TargetSpec(nodes=["n1"]), duration=60), "f0")
    try:
        [inj] = fault.inject(ctx, resolve_nodes(inv, fault.spec.target))
        assert procs[1].wait(timeout=5) == -signal.SIGKILL  # the node's job process died with it
        assert not ray_lab._raylet_running("n1")
        assert procs[0].poll() is None and procs[2].poll() is None
        end = time.time() + 30
        while not [e for e in bus.snapshot() if e["kind"] == "detect"] and time.time() < end:
            time.sleep(0.1)
        [detect] = [e for e in bus.snapshot() if e["kind"] == "detect"]
        assert detect["node"] == "n1" and detect["who"] == "ray" and detect["why"] == "node DEAD"
        assert 0 < detect["ts"] - inj.t_fault < 15
        with pytest.raises(InfraError):
            inv["n1"].conn.ping(timeout=5)
        fault.revert(ctx, inj)
        assert fault.verify(ctx, inj) is None
        leases.release(inj.fault_id)
        where = inv["n1"].conn.connect()
        assert where["node_id"] != old_id and where["scope_env"] == ray_lab.lab.scope("n1")  # re-resolved
    finally:
        probe.stop()
        leases.close()
        ray_lab.wait_alive(["n1"], 60)


def test_an_inventory_discovers_its_nodes_from_ray(ray_lab, tmp_path, monkeypatch):
    from chaoskit.cluster.inventory_file import load_inventory
    from chaoskit.cluster.transports.ray import ray_auth_env

    for name, value in ray_auth_env(ray_lab.token_file).items():  # the cluster's token, as a Ray user names it
        monkeypatch.setenv(name, value)
    path = tmp_path / "inventory.yaml"
    path.write_text(
        "name: raycluster\n"
        f"ray: {ray_lab.address}\n"
        "nodes:\n"
        "  - {name: n1, address: 127.0.0.1, transport: ray, labels: {role: trainer}}\n"
    )
    inv = load_inventory(path)
    assert sorted(inv.names()) == ["n0", "n1", "n2"]  # n1 listed, n0 and n2 discovered; the empty head left out
    assert inv["n1"].labels["role"] == "trainer" and inv["n0"].labels["ray"] == "yes"
    assert all(n.transport == "ray" for n in inv.nodes)
    where = inv["n2"].conn.connect()
    assert where["scope_env"] == ray_lab.lab.scope("n2")  # the agent acts in the scope its raylet carries
    monkeypatch.setenv("RAY_ADDRESS", ray_lab.address)
    path.write_text("name: raycluster\nray: auto\n")
    assert sorted(load_inventory(path).names()) == ["n0", "n1", "n2"]
    path.write_text("name: raycluster\nray: auto\nnodes:\n  - {name: n7, address: 127.0.0.1, transport: ray}\n")
    with pytest.raises(Exception, match=r"inventory.yaml:4:\d+: nodes.0.name: no live Ray node is named 'n7'"):
        load_inventory(path)


def test_a_node_ray_does_not_know_fails_fast(ray_lab):
    from chaoskit.cluster.transports.ray import RayTransport

    conn = RayTransport("n9", None, address=ray_lab.address, resource="chaoskit_node_n9", start_timeout=5)
    start = time.time()
    with pytest.raises(InfraError, match="no live Ray node carries the resource chaoskit_node_n9"):
        conn.processes()
    assert time.time() - start < 5


def test_leaving_the_cluster_waits_for_the_calls_in_flight(ray_lab):
    """A run's teardown leaves Ray (``disconnect_ray``) only once the calls in flight have answered: a get still
    waiting when its driver shuts down can spin in Ray's core worker for good (CI's pytest never exited, a process
    watch's poll spinning). A call made afterwards is an InfraError, not a get on a driver that is gone."""
    import threading

    import ray

    from chaoskit.cluster.transports import ray as ray_transport

    conn = ray_lab.inventory()["n1"].conn
    conn.connect()
    answer = {}
    call = threading.Thread(target=lambda: answer.setdefault("run", conn.run(["sleep", "2"], 10)))
    call.start()
    deadline = time.monotonic() + 10
    while ray_transport._IN_FLIGHT == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ray_transport._IN_FLIGHT == 1
    ray_transport.disconnect_ray()
    assert "run" in answer and not ray.is_initialized()  # the sleep answered first, then the driver left
    call.join(timeout=5)
    with pytest.raises(InfraError, match="has left the Ray cluster"):
        conn.processes()
