"""``chaoskit lab up --kind ray``: a Ray head plus one Ray node per lab node; ``lab down`` stops every Ray process."""

from __future__ import annotations

import importlib.util

import pytest

from chaoskit.cluster.transports.local import proc_info, read_proc
from tests.conftest import need, run_cli


def _marked(lab_id: str) -> list:
    prefix = lab_id + "."
    return [p for p in read_proc() if p.env.get("CHAOSKIT_SCOPE", "").startswith(prefix) and p.state != "Z"]


def _live(pid: int) -> bool:
    info = proc_info(pid)
    return info is not None and info.state != "Z"


@pytest.mark.slow
def test_lab_up_ray_status_down():
    need(importlib.util.find_spec("ray") is not None, "ray (pip install 'chaoskit[ray]')")
    from chaoskit.cluster.transports.ray import node_resource, node_table
    from chaoskit.lab.ray import HEAD_NODE, RayLab, scope_pids

    res = run_cli("lab", "up", "--nodes", "3", "--kind", "ray")
    ray_lab = RayLab.load()
    tree: list[int] = []
    try:
        assert res.code == 0, res.stderr
        assert "joined into Ray at 127.0.0.1:" in res.stdout
        assert ray_lab is not None
        lab = ray_lab.lab
        [status] = [lab for lab in run_cli("lab", "status", "--json").json["labs"] if lab["kind"] == "ray"]
        assert status["extra"]["ray_address"] == ray_lab.address
        table = [e for e in node_table(ray_lab.address) if e["Alive"]]
        assert len(table) == 4  # the head and n0, n1, n2
        for name in ("n0", "n1", "n2"):
            [entry] = [e for e in table if e["Resources"].get(node_resource(name))]
            assert entry["Resources"].get("CPU") == 2
        procs = _marked(lab.lab_id)
        scopes = {p.env["CHAOSKIT_SCOPE"].split(".", 1)[1] for p in procs if "raylet" in p.cmdline.split(" ")[0]}
        assert scopes == {HEAD_NODE, "n0", "n1", "n2"}  # one raylet per node, each inside its node's scope
        assert any("gcs_server" in p.cmdline for p in procs)
        tree = scope_pids({lab.scope(n) for n in [HEAD_NODE, *lab.node_names()]})
        assert len(tree) >= len(procs)
    finally:
        down = run_cli("lab", "down")
    assert down.code == 0 and "down" in down.stdout
    assert _marked(ray_lab.lab.lab_id) == []
    assert [pid for pid in tree if _live(pid)] == []  # the raylets' agents (renamed, environment blanked) too
    assert RayLab.load() is None


@pytest.mark.slow
def test_a_crashed_runs_ray_lab_is_stopped_by_rollback_cleanup():
    """What ``chaoskit rollback`` calls for a crashed run's own Ray lab: every process goes, renamed ones too."""
    need(importlib.util.find_spec("ray") is not None, "ray (pip install 'chaoskit[ray]')")
    from chaoskit.lab.process import ProcessLab
    from chaoskit.lab.ray import RayLab, scope_pids, stop_lab_processes

    lab = ProcessLab.create(1)
    RayLab.start(lab)
    tree = scope_pids(prefix=lab.lab_id + ".")
    assert any("raylet" in (proc_info(pid).cmdline if proc_info(pid) else "") for pid in tree)
    assert stop_lab_processes(lab.lab_id) == len(tree)
    assert [pid for pid in tree if _live(pid)] == []
