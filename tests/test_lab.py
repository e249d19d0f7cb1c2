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
    data = res.json
    assert data["up"] and data["nodes"] == ["n0", "n1"]
    # a process of node n1, as a run would start it
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            env=dict(os.environ, CHAOSKIT_SCOPE=f"{data['id']}.n1"))
    try:
        for _ in range(50):
            if run_cli("lab", "status", "--json").json["processes"]:
                break
        procs = run_cli("lab", "status", "--json").json["processes"]
        assert [(p["node"], p["pid"]) for p in procs] == [("n1", proc.pid)]
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
    assert res.code == 2 and "unknown lab kind" in res.stderr
