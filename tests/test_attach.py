"""``cluster: {inventory: FILE}`` with ``launch: attach``: a netns lab treated as somebody else's cluster.

The ``site`` fixture makes the lab look like a real site: chaoskit logs in as a non-root user
with password-less sudo (``become: sudo``), and only through a bastion node, since nftables
refuses SSH from this machine to the nodes themselves. The test plays the user: it starts a
torchrun job on the nodes itself (its own launcher command line, its own log files), and only
then points chaoskit at the site's inventory. chaoskit must find the job's workers over SSH,
measure every phase from the log files the nodes' agents follow, leave the job running, let the
node's lease revert a NIC fault when chaoskit is SIGKILLed, and exit 3 (touching nothing) when
it cannot see the job. (The job runs as root: this machine's Python lives under /root, which
the site's user cannot read; chaoskit's own access is the site user's, through sudo.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.core.files import torch_cache_env
from tests.conftest import need_torch, run_cli, wait_until

pytest_plugins = ["tests.netns_fixtures"]

TTL_S = 2.0

PLAIN_TRAIN = Path(__file__).resolve().parents[1] / "chaoskit" / "workloads" / "plain_train.py"

LOG_RULES = """\
  log:
    - match: '\\[rank (?P<rank>\\d+)\\] worker started pid=(?P<pid>\\d+) restart=(?P<restart_count>\\d+) world_size=(?P<world_size>\\d+)'
      event: worker.start
    - match: '\\[rank (?P<rank>\\d+)\\] process group ready'
      event: rendezvous.done
    - match: '\\[rank (?P<rank>\\d+)\\] Resuming training from snapshot at step (?P<step>\\d+)'
      event: ckpt.load.end
    - match: '\\[rank (?P<rank>\\d+)\\] step (?P<step>\\d+) loss'
      event: step
"""


class UserJob:
    """A 2-node torchrun job started the way a user's launcher would: one agent per node, output to a log file."""

    def __init__(self, lab, folder: Path, nodes=("n0", "n1"), max_restarts: int = 3) -> None:
        self.lab, self.folder, self.nodes, self.max_restarts = lab, folder, list(nodes), max_restarts
        self.procs: list[subprocess.Popen] = []
        self.logs = {node: folder / f"{node}.log" for node in self.nodes}

    def start(self) -> "UserJob":
        port = 29000 + os.getpid() % 1000
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **torch_cache_env(self.folder)}  # torch's cache with the test's
        for i, node in enumerate(self.nodes):
            argv = self.lab.exec_argv(node, [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.lab.mgmt_address(self.nodes[0])}:{port}",
                "--rdzv-id", "users-own-job", "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}",
                "--max-restarts", str(self.max_restarts), "--monitor-interval", "0.1", "--local-addr", self.lab.data_address(node),
                "--log-dir", str(self.folder / "torchelastic" / node),  # torchrun's files with the test's, not in /tmp
                str(PLAIN_TRAIN), "--steps", "100000", "--step-time", "0.05", "--checkpoint-every", "25",
                "--checkpoint-dir", str(self.folder / "ckpt"),
            ])
            log = open(self.logs[node], "ab")
            self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))
        return self

    def steps(self) -> int:
        text = "".join(p.read_text(errors="replace") for p in self.logs.values() if p.exists())
        found = [int(line.split(" step ")[1].split()[0]) for line in text.splitlines() if "] step " in line]
        return max(found, default=0)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """Every process of the job on its nodes (torchrun puts its workers in sessions of their own)."""
        for node in self.nodes:
            for pid in self.lab.pids(node):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        mine = str(PLAIN_TRAIN).encode() in fh.read()
                    if mine:
                        os.kill(pid, signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        for p in self.procs:
            p.wait(timeout=10)


def scenario(tmp_path: Path, inventory: Path, job: UserJob, faults: str, extra: str = "", process: str = "plain_train\\.py",
             safety: str = "safety: {max_nodes: 1, abort_after: 3m}\n") -> Path:
    files = "".join(f"    - {{node: {n}, path: {p}}}\n" for n, p in job.logs.items())
    path = tmp_path / "attach.yaml"
    path.write_text(
        "name: attach-drill\n"
        f"cluster: {{inventory: {inventory}}}\n"
        f"workload: {{launch: attach, process: '{process}'}}\n"
        "probes:\n  sdk: false\n" + LOG_RULES + "  log_files:\n" + files +
        "steady_state: {steps: 3, timeout: 90s}\n"
        + safety +
        f"faults:\n{faults}{extra}"
    )
    return path


@pytest.fixture
def user_job(site, tmp_path):
    need_torch()
    job = UserJob(site.lab, tmp_path).start()
    try:
        assert wait_until(lambda: job.steps() >= 5, 120, interval=0.5), "the user's job never trained"
        yield job
    finally:
        job.stop()


@pytest.mark.slow
def test_kill_one_rank_of_a_job_chaoskit_did_not_start(site, user_job, tmp_path, monkeypatch):
    """Also with the nodes' clocks seconds apart: the lab's nodes share this machine's clock, so the
    test shifts what their agents report (n1 7.5 s ahead, n0 4 s behind). The fault's time and the
    detection come from n1, the restarted workers from both: uncorrected, reallocation would be off
    by 11.5 s."""
    from chaoskit.cluster.transports.agent_transport import TEST_SKEW_ENV

    monkeypatch.setenv(TEST_SKEW_ENV, "n1=7.5,n0=-4")
    sc = scenario(tmp_path, site.inventory_path, user_job,
                  "  - {kind: process.kill, target: {process: 'plain_train\\.py', ranks: [1]}, at: {after: 1s}}\n",
                  "slo: {detection: 5s, reallocation: 60s, checkpoint_load: 30s, recovery: 90s}\n")
    out = tmp_path / "run"
    res = run_cli("run", sc, "--out", out)
    result = json.loads((out / "result.json").read_text())
    assert res.code == 0, res.stdout + res.stderr + json.dumps(result["notes"])
    phases = result["phases"]
    for phase in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert phases[phase] is not None and phases[phase] >= 0, (phase, phases)
    # the first to notice is a torchrun agent: n1's (its worker SIGKILLed) or n0's, whose worker gloo may abort
    # (exit -6) the moment its peer's socket closes; which comes first is a race of the two nodes, not a defect
    assert phases["detected_by"].startswith(("torchrun agent on n1", "torchrun agent on n0")), phases["detected_by"]
    assert result["cluster"]["kind"] == "inventory"
    assert sorted(w["rank"] for w in result["attached"]["workers"]) == [0, 1]
    clocks = result["clocks"]
    assert clocks["n1"]["offset_s"] == pytest.approx(7.5, abs=0.05) and clocks["n0"]["offset_s"] == pytest.approx(-4, abs=0.05)
    assert phases["detection_s"] < 5 and phases["reallocation_s"] < 60
    assert all(0 <= u < 0.1 for u in phases["uncertainty_s"].values()), phases["uncertainty_s"]
    # every line came from the nodes' own log files, through their agents
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "step" and e["node"] == "n1" for e in events)
    # the job is still the user's, and still training
    assert user_job.alive()
    before = user_job.steps()
    assert wait_until(lambda: user_job.steps() > before + 3, 30, interval=0.5)


def test_a_job_that_is_not_there_is_exit_3_and_nothing_is_injected(site, tmp_path):
    job = UserJob(site.lab, tmp_path)          # never started
    sc = scenario(tmp_path, site.inventory_path, job,
                  "  - {kind: network.link_down, target: {nodes: [n1]}, interface: data, duration: 5s}\n")
    sc.write_text(sc.read_text().replace("timeout: 90s", "timeout: 3s"))
    out = tmp_path / "run"
    res = run_cli("run", sc, "--out", out)
    assert res.code == 3, res.stdout + res.stderr
    assert "no process matching 'plain_train\\.py'" in res.stderr and "n0, n1" in res.stderr
    assert not (out / "journal.jsonl").exists() or "inject" not in (out / "journal.jsonl").read_text()


def test_a_pattern_that_looks_like_markup_is_printed_as_written_on_one_line(site, tmp_path):
    """The run's progress lines are Rich markup: a scenario's pattern holding '[/.]' (a closing tag to Rich) is
    printed as written, not taken for markup (it was an internal error, exit 70), and a long line is not wrapped."""
    job = UserJob(site.lab, tmp_path)          # never started
    sc = scenario(tmp_path, site.inventory_path, job,
                  "  - {kind: network.link_down, target: {nodes: [n1]}, interface: data, duration: 5s}\n",
                  process="plain_train[/.]py --some-rather-long-argument-that-takes-the-line-past-its-width")
    sc.write_text(sc.read_text().replace("timeout: 90s", "timeout: 2s"))
    res = run_cli("run", sc, "--out", tmp_path / "run")
    assert res.code == 3, res.stdout + res.stderr
    [line] = [line for line in res.stdout.splitlines() if "attaching to" in line]
    assert line.endswith("(processes matching 'plain_train[/.]py --some-rather-long-argument-that-takes-the-line-past-its-width')"), line


@pytest.mark.slow
def test_a_selector_that_matches_nothing_is_exit_3_before_any_fault(site, user_job, tmp_path):
    sc = scenario(tmp_path, site.inventory_path, user_job,
                  "  - {kind: process.kill, target: {process: 'no-such-trainer', nodes: [n1]}, at: {after: 1s}}\n")
    out = tmp_path / "run"
    res = run_cli("run", sc, "--out", out)
    assert res.code == 3, res.stdout + res.stderr
    assert "faults.0.target: no process matches" in res.stderr and "nothing was injected" in res.stderr
    assert user_job.alive()


@pytest.mark.slow
def test_a_nic_drop_is_reverted_by_the_nodes_lease_when_chaoskit_is_sigkilled(site, user_job, tmp_path):
    """chaoskit dies (SIGKILL: no revert of its own) while n1's data NIC is down; the watchdog armed
    on n1 before the drop brings the link back once the lease goes stale."""
    from tests.netns_fixtures import node_clean

    sc = scenario(tmp_path, site.inventory_path, user_job,
                  "  - {kind: network.link_down, target: {nodes: [n1]}, interface: data, duration: 5m, at: {after: 0s}}\n",
                  safety=f"safety: {{max_nodes: 1, abort_after: 10m, lease_ttl: {TTL_S:g}s}}\n")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(sc), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    journal = out / "journal.jsonl"
    try:
        injected = wait_until(lambda: journal.exists() and '"injected"' in journal.read_text(), 120, interval=0.2)
        assert injected, proc.stderr.read() if proc.poll() is not None else "no injection within 120s"
        assert node_clean(site.lab, "n1") == "n1:eth0 is down"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.time()
        assert wait_until(lambda: node_clean(site.lab, "n1") is None, TTL_S + 5), node_clean(site.lab, "n1")
        assert time.time() - killed <= TTL_S + 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert user_job.alive()
