"""End-to-end drills on the Docker lab: the shipped docker scenarios against a real
torchrun job in the containers of docker-compose.yml, brought up by the run itself
and removed after it (under a project name of the test's own)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SCENARIOS, need_torch, run_cli

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.docker_fixtures"]


def _drill(name: str, tmp_path, monkeypatch) -> dict:
    from tests import docker_fixtures as fx

    need_torch()
    fx.require_docker()
    env = fx.project_env(tmp_path / "shared", name[-4:].replace("-", ""))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = run_cli("run", SCENARIOS / f"{name}.yaml", "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr + res.stdout[-3000:]
    result = res.json
    project = env["COMPOSE_PROJECT_NAME"]
    assert result["cluster"]["kind"] == "docker" and result["cluster"]["project"] == project
    assert fx.leftovers(project) == {"containers": [], "networks": [], "volumes": []}
    assert (tmp_path / "run" / "sdk-events.jsonl").stat().st_size > 0  # collected from the shared folder
    assert list((tmp_path / "shared").iterdir()) == []  # the job's checkpoints went with the run
    return result


def test_docker_node_poweroff_spare_takes_over(tmp_path, monkeypatch):
    r = _drill("docker-node-poweroff", tmp_path, monkeypatch)
    assert r["verdict"] == "pass"
    p = r["phases"]
    for phase in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert p[phase] is not None and p[phase] > 0, (phase, p)
    assert p["detection_s"] < 12.5 and p["lost_steps"] <= 25
    assert r["checks"]["faults_reverted"]["pass"] and r["checks"]["training_finished"]["pass"]
    t_fault = r["faults"][0]["t_fault"]
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    before = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] < t_fault}
    after = {e["node"] for e in events if e["kind"] == "worker.start" and e["ts"] > t_fault}
    assert before == {"n0", "n1"} and after == {"n0", "n2"}  # n1 is off; the spare n2 joined the new world


def test_docker_nic_drop_recovers_after_the_link_returns(tmp_path, monkeypatch):
    r = _drill("docker-nic-drop", tmp_path, monkeypatch)
    assert r["verdict"] == "pass"
    p = r["phases"]
    assert 7.0 < p["detection_s"] < 10.0, p  # the 8 s collective timeout
    assert p["reallocation_s"] is not None and p["checkpoint_load_s"] is not None
    assert r["checks"]["faults_reverted"]["pass"]


def test_docker_partition_by_network_disconnect(tmp_path, monkeypatch):
    r = _drill("docker-partition", tmp_path, monkeypatch)
    assert r["verdict"] == "pass"
    assert 7.0 < r["phases"]["detection_s"] < 10.0, r["phases"]
    assert r["phases"]["recovery_s"] is not None
    journal = (tmp_path / "run" / "journal.jsonl").read_text()
    assert '"on": "controller"' in journal and '"verified": true' in journal
