"""The process lab's lifecycle: up, status, down; down leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import run_cli


def test_lab_up_status_down():
    res = run_cli("lab", "status")
    assert "no lab is up" in res.stdout
    res = run_cli("lab", "up", "--nodes", "2")
    assert res.code == 0 and "2 process nodes" in res.stdout
    res = run_cli("lab", "status", "--json")
    [lab] = [lab for lab in res.json["labs"] if lab["kind"] == "process"]
    assert res.json["up"] and [n["name"] for n in lab["nodes"]] == ["n0", "n1"]
    # a process of node n1, as a run would start it
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            env=dict(os.environ, CHAOSKIT_SCOPE=f"{lab['id']}.n1"))

    def processes() -> list[tuple[str, int]]:
        [lab] = [lab for lab in run_cli("lab", "status", "--json").json["labs"] if lab["kind"] == "process"]
        return [(n["name"], p["pid"]) for n in lab["nodes"] for p in n["processes"]]

    try:
        for _ in range(50):
            if processes():
                break
        assert processes() == [("n1", proc.pid)]
        assert "n1: 1 process(es)" in run_cli("lab", "status").stdout
        res = run_cli("lab", "down")
        assert res.code == 0 and "1 process(es) stopped" in res.stdout
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "no lab is up" in run_cli("lab", "status").stdout
    assert "no lab is up" in run_cli("lab", "down").stdout  # twice is fine


def test_a_second_lab_up_is_refused_politely():
    run_cli("lab", "up")
    res = run_cli("lab", "up")
    assert "already up" in res.stdout
    run_cli("lab", "down")


def test_unknown_lab_kind_is_bad_input():
    res = run_cli("lab", "up", "--kind", "moon")
    assert res.code == 2 and "unknown cluster kind 'moon'" in res.stderr
    assert "known kinds: docker, inventory, netns, process, ray, slurm" in res.stderr
    typo = run_cli("lab", "up", "--kind", "proces")
    assert typo.code == 2 and "unknown cluster kind 'proces' (did you mean 'process'?)" in typo.stderr


def test_a_flag_that_does_not_apply_to_the_kind_is_bad_input():
    res = run_cli("lab", "up", "--kind", "process", "--spare", "1")
    assert res.code == 2 and "--spare does not apply to --kind process" in res.stderr
    res = run_cli("lab", "up", "--nodes", "0")
    assert res.code == 2 and "--nodes: Input should be greater than or equal to 1" in res.stderr
    assert "no lab is up" in run_cli("lab", "status").stdout


def test_lab_kinds_lists_every_backend():
    res = run_cli("lab", "kinds")
    assert res.code == 0
    assert [line.split()[0] for line in res.stdout.splitlines()] == ["docker", "inventory", "netns", "process", "ray", "slurm"]
