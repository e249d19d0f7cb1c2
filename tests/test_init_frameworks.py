"""``chaoskit init --framework nvrx|nvrx-inprocess|torchft`` writes a scenario that runs the job under what the
framework needs (NVRx's ft_launcher, torchft's groups and lighthouse), and the root cause of a job that dies is
its worker's exception, not what the agents raise after it."""

from __future__ import annotations

import pytest

from chaoskit.workloads.root_cause import RootCause
from tests.conftest import run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def _init(tmp_path, framework: str) -> dict:
    out = tmp_path / framework / "drill.yaml"
    res = run_cli("init", "--framework", framework, "--cluster", "lab", "--launch", "command", "-o", out)
    assert res.code == 0, res.stderr
    assert run_cli("validate", out).code == 0
    plan = run_cli("run", out, "--dry-run", "--json")
    assert plan.code == 0, plan.stderr
    return plan.json


def test_init_nvrx_starts_ft_launcher_with_its_timeouts(tmp_path):
    plan = _init(tmp_path, "nvrx")
    agent = plan["job"]["n0"]
    assert "nvidia_resiliency_ext.fault_tolerance.launcher" in agent and "torch.distributed.run" not in agent
    assert "--ft-rank-heartbeat-timeout 5" in agent and "--ft-initial-rank-heartbeat-timeout 60" in agent
    assert "TMPDIR" in plan["env"]["nodes"]["n0"]  # the rank monitors' sockets, in a private folder


def test_init_torchft_and_nvrx_inprocess(tmp_path):
    ft = _init(tmp_path, "torchft")
    assert any("torchft_lighthouse" in cmd for cmd in ft["job"].values())
    assert ft["env"]["rdzv_store"].startswith("shared")
    assert "NUM_REPLICA_GROUPS" in ft["env"]["nodes"]["n0"]
    inprocess = _init(tmp_path, "nvrx-inprocess")  # the user's job wraps itself: torchrun, and the Wrapper's preset
    assert "torch.distributed.run" in inprocess["job"]["n0"]
    text = (tmp_path / "nvrx-inprocess" / "drill.yaml").read_text()
    assert "recovery: restart" in text and "nvrx-inprocess]" in text


# What a job initialised for NVRx but started under plain torchrun printed (two agents, the RankMonitorClient's
# error in rank 1, then the agents failing to reach the store of the one that exited): the lines that matter, in
# order; the worker's exception is the earliest failure.
RECORDED = [
    ("n1", "[default0]:Traceback (most recent call last):"),
    ("n1", '[default0]:  File "/work/train.py", line 31, in <module>'),
    ("n1", "[default0]:    client.init_workload_monitoring()"),
    ("n1", "[default0]:nvidia_resiliency_ext.fault_tolerance.rank_monitor_client.RankMonitorClientError: "
           "FT_RANK_MONITOR_IPC_SOCKET env variable should be set"),
    ("n1", "E1206 14:02:11.532000 4242 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)"),
    ("n0", "Traceback (most recent call last):"),
    ("n0", '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", '
           "line 117, in _call_store"),
    ("n0", "torch.distributed.DistNetworkError: failed to recv, got 0 bytes"),
    ("n0", ""),
    ("n0", "The above exception was the direct cause of the following exception:"),
    ("n0", "Traceback (most recent call last):"),
    ("n0", '  File "/venv/bin/torchrun", line 8, in <module>'),
    ("n0", "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
           "failed. See inner exception for details."),
]


def test_the_root_cause_is_the_workers_exception_not_the_agents_later_error():
    rc = RootCause()
    for node, line in RECORDED:
        rc.feed(node, line)
    summary = rc.summary()
    assert "RankMonitorClientError: FT_RANK_MONITOR_IPC_SOCKET env variable should be set (in n1's output)" in summary
    assert "RendezvousConnectionError" not in summary and "DistNetworkError" not in summary
