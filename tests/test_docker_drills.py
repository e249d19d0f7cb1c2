"""End-to-end drills on the Docker lab: the shipped docker scenarios against a real
torchrun job in the containers of docker-compose.yml, brought up by the run itself
and removed after it (under a project name of the test's own).

One drill here (issue 52: each story drilled end to end once, on the lab where it means most): the partition by
``docker network disconnect``, the docker lab's own way to cut a node, reverted from the controller. "A node is
powered off and a spare takes over" is drilled on the netns lab (test_network_drills.py::
test_node_poweroff_a_spare_takes_over), on Slurm and on Ray; "a dropped link is detected at the collective timeout"
on the netns lab (test_network_drills.py, nic-drop). What is the docker lab's own in those two faults, the container
killed and started again, the link taken down and up inside the container, and both undone by the lease, is
tests/test_docker_lab.py's (test_poweroff_kills_the_container_and_power_on_starts_it,
test_poweroff_is_undone_by_the_controllers_watchdog_when_the_lease_goes_stale,
test_network_faults_cut_the_node_inside_its_container_and_are_reverted, test_a_stale_lease_restores_the_link_from_inside_the_container)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ROOT, SCENARIOS, need_torch, run_cli, short_form

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.docker_fixtures"]


def _drill(name: str, tmp_path, monkeypatch, *edits: tuple[str, str]) -> dict:
    from tests import docker_fixtures as fx

    need_torch()
    fx.require_docker()
    env = fx.project_env(tmp_path / "shared", name[-4:].replace("-", ""))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # written beside the run, the scenario names the repository's compose file, which it found from scenarios/
    shipped = "cluster: {kind: docker, nodes: 2}"
    compose = (shipped, shipped[:-1] + f", compose: {ROOT / 'docker-compose.yml'}}}")
    scenario = short_form(SCENARIOS / f"{name}.yaml", tmp_path, compose, *edits)
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr + res.stdout[-3000:]
    result = res.json
    project = env["COMPOSE_PROJECT_NAME"]
    assert result["cluster"]["kind"] == "docker" and result["cluster"]["project"] == project
    assert fx.leftovers(project) == {"containers": [], "networks": [], "volumes": []}
    assert (tmp_path / "run" / "sdk-events.jsonl").stat().st_size > 0  # collected from the shared folder
    if os.geteuid() == 0:  # the job ran in the containers as the run's lab account (issue 48), not root
        job_user = result["cluster"]["job_user"]
        assert job_user.startswith("chaoskit-lab") and "job_user_why" not in result["cluster"], result["cluster"]
        assert result["cluster"]["job_process_users"] == [job_user], result["cluster"]
    assert list((tmp_path / "shared").iterdir()) == []  # the job's checkpoints went with the run
    return result


def test_docker_partition_by_network_disconnect(tmp_path, monkeypatch):
    # a short form (issue 52): 110 steps, not 160; the disconnect at step 50 for 12 s, 4 s past the 8 s collective
    # timeout, is the shipped one
    r = _drill("docker-partition", tmp_path, monkeypatch, ("steps: 160", "steps: 110"))
    assert r["verdict"] == "pass"
    assert 7.0 < r["phases"]["detection_s"] < 10.0, r["phases"]
    assert r["phases"]["recovery_s"] is not None
    journal = (tmp_path / "run" / "journal.jsonl").read_text()
    assert '"on": "controller"' in journal and '"verified": true' in journal
