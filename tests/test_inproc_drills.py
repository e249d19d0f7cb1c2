"""In-process drills end to end: the shipped scenarios against the reference job under torchrun on the process lab.

The job is unchanged: its orders come through chaoskit's bootstrap. Each drill is the issue's "done when".
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from chaoskit.core.accounts import lab_account, python_paths, unreachable_by
from tests.conftest import IN_CI, ROOT, SCENARIOS, need, need_torch, run_cli, short_form

pytestmark = pytest.mark.slow


def drill(path: Path, out: Path):
    need_torch()
    res = run_cli("run", path, "--out", out, "--json")
    assert res.stdout, res.stderr
    return res, res.json


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def passable():
    """A folder of root's that anyone may pass through (pytest's own may be root's 0700): a run folder in it lets
    the job run as the lab's account, whose folder goes beside the run's."""
    base = Path(tempfile.mkdtemp(prefix="ck-inproc-drill-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_live_hang_keeps_the_rank_heartbeating_and_peers_detect_it_at_the_collective_timeout(passable):
    """Also the in-process drill of a job that runs as the lab's account (issue 48, item 0; it was a drill of its
    own in tests/test_inproc_account.py, issue 52): as root, with the run folder where the account can pass, the
    job is chaoskit-lab's, the order reached it and its end came in its own channel, RUN.job/inproc."""
    tmp_path = passable / "run"
    # the shipped drill in a short form (issue 52): 100 steps, not 160; the hang at step 50, its peer's timeout and
    # torchrun's restart are the shipped ones
    res, r = drill(short_form(SCENARIOS / "inproc-hang.yaml", passable, ("steps: 160", "steps: 100")), tmp_path)
    assert res.code == 0, res.stderr
    timeout = r["workload"]["collective_timeout"]
    assert abs(r["phases"]["detection_s"] - timeout) <= 0.25 * timeout, (r["phases"]["detected_by"], r["phases"]["detections"])
    assert r["phases"]["recovery_s"] is not None and r["checks"]["faults_reverted"]["pass"]
    timeline = events(tmp_path)
    t_fault = r["faults"][0]["t_fault"]
    beats = [e["ts"] - t_fault for e in timeline if e["kind"] == "heartbeat" and e.get("rank") == 1 and e.get("node") == "n1"]
    steps = [e["ts"] - t_fault for e in timeline if e["kind"] == "step" and e.get("rank") == 1]
    # the training thread is held (no step of rank 1 for the collective timeout) while its heartbeat thread beats on
    assert not [s for s in steps if 0.5 < s < timeout]
    assert len([b for b in beats if 0 < b < timeout]) >= timeout / 2
    account = lab_account()  # None unless root
    cannot = unreachable_by(account, python_paths()) if account is not None else "not root"
    if cannot is None or (account is not None and IN_CI):  # the job ran as the account, its hang ended in its channel
        assert cannot is None, f"a venv {account.name} can run (make builds one from /usr/bin/python3): {cannot}"
        assert r["cluster"]["job_user"].startswith(account.name) and "job_user_why" not in r["cluster"], r["cluster"]
        journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
        lease = [e for e in journal if e.get("action") == "armed" and e.get("kind") == "inproc.hang"]
        assert lease and lease[0]["revert"][5] == str(passable / "run.job" / "inproc")
        assert not [e for e in journal if e.get("action") == "lease.kill"]  # the job reported its hang's end there


def test_nan_in_one_ranks_gradients_is_caught_by_the_loss_watch(tmp_path):
    res, r = drill(SCENARIOS / "inproc-nan.yaml", tmp_path)
    assert res.code == 0, res.stderr
    assert r["phases"]["detection_s"] is not None and r["phases"]["detection_s"] < 5
    assert "loss watch" in r["phases"]["detected_by"]
    assert r["silent"]["detected"] and r["silent"]["corrupt_steps"] is not None


def test_sdc_bitflip_is_found_by_the_checksum_probe_within_its_interval(tmp_path, tmp_path_factory):
    # the shipped drill in a short form (issue 52): the flip at step 30 of 80, not 60 of 120; the checksums every 10
    # steps and the checkpoints every 4 find it alike at any step, with clean checkpoints before it and 50 steps after
    # its trigger (a fault has landed 22 steps after its trigger at load 24, 7918827)
    scenario = short_form(SCENARIOS / "sdc-bitflip.yaml", tmp_path_factory.mktemp("scenario"),
                          ("steps: 120", "steps: 80"), ("at: {step: 60}", "at: {step: 30}"))
    res, r = drill(scenario, tmp_path)
    assert res.code == 0, res.stderr
    s = r["silent"]
    assert s["detected"] and "checksum probe" in s["detected_by"]
    assert 0 <= s["corrupt_steps"] <= 10
    corrupt = [c["step"] for c in s["checkpoints"] if c["corrupt"]]
    clean = [c["step"] for c in s["checkpoints"] if not c["corrupt"]]
    assert corrupt and min(corrupt) >= s["fault_step"] and max(clean) < s["fault_step"]
    assert s["last_clean_checkpoint"] == max(clean) and s["lost_steps"] == s["detect_step"] - max(clean)
    assert not [e for e in events(tmp_path) if e["kind"] == "loss.anomaly"]  # silent: the loss never told
    page = (tmp_path / "report.html").read_text()
    assert "Silent fault" in page and 'class="m-save-corrupt"' in page  # the corrupt checkpoints on the timeline


def test_sdc_without_the_probe_fails_and_says_what_was_flipped(tmp_path):
    res, r = drill(ROOT / "examples" / "sdc-unprobed.yaml", tmp_path)
    assert res.code == 1 and r["verdict"] == "fail"
    reason = r["checks"]["silent_fault_detected"]["reason"]
    assert reason.startswith("bit 10 of 2.weight[0] flipped on rank 1 at step ")
    assert "replicas still disagree at the end; no probe or job line noticed" in reason
    assert reason in r["notes"] and r["silent"]["disagree_at_end"] is True


def test_cuda_error_in_the_step_is_a_crash_torchrun_restarts(tmp_path, tmp_path_factory):
    # the shipped drill in a short form (issue 52): the error at step 30 (after the checkpoint of step 25) of 80, not
    # at 60 of 160; the crash, torchrun's restart and the restore from the last checkpoint are the same at any step
    scenario = short_form(SCENARIOS / "inproc-cuda-error.yaml", tmp_path_factory.mktemp("scenario"),
                          ("steps: 160", "steps: 80"), ("at: {step: 60}", "at: {step: 30}"))
    res, r = drill(scenario, tmp_path)
    assert res.code == 0, res.stderr
    assert r["phases"]["recovery_s"] is not None and r["phases"]["restored_step"] is not None
    [fault] = r["faults"]
    assert fault["fidelity"] == "emulated"
    injected = [e for e in events(tmp_path) if e["kind"] == "fault.injected"]
    assert injected[0]["error"] == "CUDA error: an illegal memory access was encountered"
    assert "an illegal memory access was encountered" in "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))


def test_sdc_bitflip_in_a_hugging_face_trainer_job_is_found_through_its_callback_job(tmp_path, monkeypatch):
    """The same silent fault in a small Trainer job (launch: command, chaoskit's callback): the bootstrap's checksum
    probe, counting the Trainer's steps from the callback, finds the replicas disagreeing."""
    import importlib.util

    need(importlib.util.find_spec("transformers") is not None, "transformers (pip install 'chaoskit[frameworks]')")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res, r = drill(ROOT / "examples" / "frameworks" / "hf-sdc-bitflip.yaml", tmp_path)
    assert res.code == 0, res.stderr[-3000:]
    s = r["silent"]
    assert s["detected"] and "checksum probe" in s["detected_by"] and 0 <= s["corrupt_steps"] <= 5
    assert r["faults"][0]["targets"] == ["n1/rank1"]
    assert any(c["corrupt"] for c in s["checkpoints"]) and any(not c["corrupt"] for c in s["checkpoints"])
