"""End-to-end drills on the Ray lab: a Ray Train TorchTrainer, faults through ChaosAgent actors."""

from __future__ import annotations

import importlib.util
import json

import pytest

from chaoskit.cluster.transports.local import read_proc
from tests.conftest import SCENARIOS, need, need_torch, run_cli

pytestmark = pytest.mark.slow


def ray_drill(name: str, out):
    need_torch()
    need(importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.train") is not None,
         "ray[train] (pip install 'chaoskit[ray]')")
    res = run_cli("run", SCENARIOS / f"{name}.yaml", "--out", out, "--json")
    assert res.stdout, res.stderr
    return res


def lab_processes(result: dict) -> list:
    prefix = result["cluster"]["id"] + "."
    return [p for p in read_proc() if p.env.get("CHAOSKIT_SCOPE", "").startswith(prefix) and p.state != "Z"]


def assert_every_phase_measured(r: dict) -> None:
    assert r["verdict"] == "pass", r["notes"]
    p = r["phases"]
    for key in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert p[key] is not None and p[key] >= 0, (key, p["reasons"])
    assert p["detection_s"] + p["reallocation_s"] + p["checkpoint_load_s"] <= p["recovery_s"] + 1e-6
    assert r["final_step"] == r["workload"]["steps"]
    assert r["cluster"]["kind"] == "ray" and r["cluster"]["ray_address"]


def _staged_in_tmp() -> set:
    """Folders of the system's temporary folder holding a Ray Train checkpoint being staged (state.pt)."""
    import tempfile
    from pathlib import Path

    return {p.parent for p in Path(tempfile.gettempdir()).glob("tmp*/state.pt")}


def test_ray_kill_worker(tmp_path):
    before = _staged_in_tmp()
    res = ray_drill("ray-kill-worker", tmp_path)
    assert res.code == 0, res.stderr
    r = res.json
    assert_every_phase_measured(r)
    assert r["faults"][0]["kind"] == "process.kill" and r["faults"][0]["targets"][0].startswith("n1/pid")
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    t_fault = r["faults"][0]["t_fault"]
    restarted = {e["rank"] for e in events if e["kind"] == "worker.start" and e["ts"] > t_fault}
    assert restarted == {0, 1, 2}  # Ray Train restarted the whole worker group
    assert (tmp_path / "logs" / "driver.log").exists()
    assert lab_processes(r) == []
    # checkpoints are staged in the run's own storage: a worker killed mid-save leaves nothing in /tmp
    assert (tmp_path / "checkpoints" / ".staging").is_dir() and _staged_in_tmp() <= before


def test_ray_node_poweroff(tmp_path):
    res = ray_drill("ray-node-poweroff", tmp_path)
    assert res.code == 0, res.stderr
    r = res.json
    assert_every_phase_measured(r)
    assert r["checks"]["faults_reverted"]["pass"]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    t_fault = r["faults"][0]["t_fault"]
    [dead] = [e for e in events if e["kind"] == "detect" and e.get("who") == "ray"]
    assert dead["node"] == "n1" and dead["why"] == "node DEAD" and 0 < dead["ts"] - t_fault < 15
    # the new group formed on the surviving nodes
    new_nodes = {e["node"] for e in events if e["kind"] == "worker.start" and t_fault < e["ts"] <= r["per_fault"][0]["t_realloc"]}
    assert "n1" not in new_nodes
    journal = [json.loads(x)["action"] for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert journal.index("armed") < journal.index("injected") < journal.index("reverted")
    assert lab_processes(r) == []
