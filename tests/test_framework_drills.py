"""End-to-end drills of the frameworks' example jobs on the process lab, one each (examples/frameworks): the
Hugging Face Trainer job with chaoskit's callback (the same job unchanged, measured by the torchrun + hf presets
alone, from its recorded drill: tests/data/hf-kill-rank-preset), the
Lightning job with its callback (lost work against its own .ckpt files), and the torchft job, a replica group
killed, measured with the torchft recovery model. Lightning measured by its preset alone: tests/test_preset_only.py
(its real output, recorded)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil

import pytest

from tests.conftest import ROOT, need, need_torch, run_cli, short_form

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def _checkpoint_steps(folder, pattern):
    """The steps of the job's checkpoints in the run's ``folder`` (``RUN/checkpoints``: a job of root's). A job of
    the lab's account (issue 48) kept them in its own folder beside the run's, removed with it at the run's end:
    then the steps its saves were made at, from the run's events (the framework's ``ckpt.save.*`` lines)."""
    if folder.is_dir():
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(pattern, p.name)))
    events = [json.loads(line) for line in (folder.parent / "events.jsonl").read_text().splitlines()]
    return sorted({int(e["step"]) for e in events
                   if e.get("kind") in ("ckpt.save.start", "ckpt.save.end") and e.get("step") is not None})


@pytest.mark.slow
def test_hf_trainer_job_recovers_from_a_killed_rank_measured_with_the_callback(tmp_path, monkeypatch):
    """The Trainer job with chaoskit's callback: every phase measured, the lost work the one its checkpoint folder
    says. The same job unchanged, measured by the presets alone, is read from its recording below."""
    need_torch()
    need(importlib.util.find_spec("transformers") is not None, "transformers (pip install 'chaoskit[frameworks]')")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = run_cli("run", ROOT / "examples" / "frameworks" / "hf-kill-rank.yaml", "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr[-3000:] + res.stdout[-3000:]
    result = res.json
    assert result["verdict"] == "pass", result["notes"]
    phases = result["phases"]
    for phase in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert phases[phase] is not None and phases[phase] > 0, (phase, phases.get("reasons"))
    # the job's own checkpoint folder: the newest checkpoint-N at or before the last step before the fault is
    # the one the Trainer resumed from (get_last_checkpoint), and the lost work is the steps since it
    saved = _checkpoint_steps(tmp_path / "run" / "checkpoints", r"checkpoint-(\d+)")
    before = phases["last_step_before"]
    newest = max(n for n in saved if n <= before)
    assert phases["restored_step"] == newest
    assert phases["lost_steps"] == before - newest > 0
    assert "unseen" not in phases  # the callback gave every signal
    page = (tmp_path / "run" / "report.html").read_text()
    assert "log preset hf sees step, ckpt.load.start" in page and "TRANSFORMERS_VERBOSITY=info" in page


def test_a_recorded_hf_trainer_job_measured_by_the_presets_alone(tmp_path):
    """examples/frameworks/hf-kill-rank-preset.yaml's drill, recorded (tests/data/hf-kill-rank-preset/README.md): the
    same Trainer job unchanged (--no-callback), at the verbosity the hf preset documents, rank 1 SIGKILLed. Measured
    again here from its timeline by this checkout: the presets see the dead worker (torchrun's line), rank 0's
    progress bar (steps) and its resume lines, not the new workers' start, so neither reallocation nor checkpoint
    load, and the phases and the report say which signal was missing. It was drilled live beside the callback's
    drill until issue 52: the drilling (a kill, torchrun's restart, the Trainer's resume) is the same in both."""
    from chaoskit.measure import measure_fault, unseen_signals
    from chaoskit.observe.events import EventBus, read_events
    from chaoskit.observe.probes import LogRegexProbe
    from chaoskit.stacks.registry import log_presets, preset_rules

    data = ROOT / "tests" / "data" / "hf-kill-rank-preset"
    recorded = json.loads((data / "result.json").read_text())
    assert recorded["verdict"] == "pass" and recorded["faults"][0]["kind"] == "process.kill", recorded["notes"]
    events = read_events(data / "events.jsonl")
    assert not [e for e in events if e.get("source") == "sdk"]  # the job reported nothing itself
    t_fault = recorded["faults"][0]["t_fault"]
    phases = measure_fault(events, t_fault)
    # seen: the dead worker (torchrun's line), rank 0's progress bar (steps) and its resume lines
    assert phases["detection_s"] > 0 and phases["recovery_s"] > 0 and phases["detected_by"].startswith("torchrun agent")
    saved = _checkpoint_steps(data / "checkpoints", r"checkpoint-(\d+)")  # no folder: the saves' own lines
    newest = max(n for n in saved if n <= phases["last_step_before"])
    assert phases["restored_step"] == newest and phases["lost_steps"] == phases["last_step_before"] - newest > 0
    # not seen: the new workers' start, so neither reallocation nor checkpoint load, and the phases say why
    assert phases["reallocation_s"] is None and phases["checkpoint_load_s"] is None
    presets = ("torchrun", "hf")
    unseen = unseen_signals(phases, events, {p: log_presets()[p].sees for p in presets})
    assert set(unseen) == {"reallocation", "checkpoint_load"}
    assert "worker.start" in unseen["reallocation"] and "torchrun, hf cannot see" in unseen["reallocation"]
    assert "worker starts" in log_presets()["hf"].cannot_see
    # rank 0's own output, read again through the presets: the steps of its bar, its save and its resume lines
    bus = EventBus()
    rules, tee = preset_rules(list(presets))
    probe = LogRegexProbe(bus, rules, tee_prefixes=tee)
    for line in (data / "n0.log").read_text().splitlines():
        probe.feed("n0", line)
    kinds = {e["kind"] for e in bus.snapshot()}
    assert {"step", "ckpt.save.start", "ckpt.load.start", "ckpt.load.end"} <= kinds and "worker.start" not in kinds
    for name in ("result.json", "events.jsonl", "journal.jsonl"):
        shutil.copy(data / name, tmp_path / name)
    assert run_cli("report", tmp_path).code == 0
    assert "presets torchrun, hf cannot see it" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_lightning_job_recovers_from_a_killed_rank_with_the_lost_work_its_checkpoints_say(tmp_path):
    need_torch()
    need(importlib.util.find_spec("lightning") is not None, "lightning (pip install 'chaoskit[frameworks]')")
    # the kill at step 15 (after the checkpoint of step 10), not 25 (issue 52): 10 steps of 0.2 s fewer before it, and
    # the restore and the lost work the same (the short form is written in tmp_path: the job's script by its path)
    frameworks = ROOT / "examples" / "frameworks"
    scenario = short_form(frameworks / "lightning-kill-rank.yaml", tmp_path, ("at: {step: 25}", "at: {step: 15}"),
                          ("command: [lightning_train.py,", f"command: [{frameworks / 'lightning_train.py'},"))
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr[-3000:] + res.stdout[-3000:]
    result = res.json
    assert result["verdict"] == "pass", result["notes"]
    phases = result["phases"]
    for phase in ("detection_s", "reallocation_s", "checkpoint_load_s", "recovery_s"):
        assert phases[phase] is not None and phases[phase] > 0, (phase, phases.get("reasons"))
    # ModelCheckpoint(every_n_train_steps=N, save_top_k=-1) keeps every save as epoch=E-step=S.ckpt; the newest
    # one at or before the last step before the fault is what last.ckpt held when fit(ckpt_path="last") resumed
    saved = _checkpoint_steps(tmp_path / "run" / "checkpoints", r"epoch=\d+-step=(\d+)\.ckpt")
    before = phases["last_step_before"]
    newest = max(n for n in saved if n <= before)
    assert phases["restored_step"] == newest
    assert phases["lost_steps"] == before - newest > 0
    assert result["presets"]["lightning"]["verbosity"].startswith("the default")


@pytest.mark.slow
def test_torchft_job_carries_on_without_a_killed_replica_group_measured_with_the_torchft_model(tmp_path):
    need_torch()
    need(importlib.util.find_spec("torchft") is not None, "torchft (pip install 'chaoskit[frameworks]')")
    res = run_cli("run", ROOT / "examples" / "frameworks" / "torchft-kill-group.yaml", "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stderr[-3000:] + res.stdout[-3000:]
    result = res.json
    assert result["verdict"] == "pass", result["notes"]
    assert result["recovery_model"] == "torchft" and result["phases"]["model"] == "torchft"
    phases = result["phases"]
    for phase in ("detection_s", "checkpoint_load_s", "recovery_s"):
        assert phases[phase] is not None and phases[phase] > 0, (phase, phases.get("reasons"))
    assert phases["reallocation_s"] is not None and phases["reallocation_s"] >= 0, phases.get("reasons")
    # torchft noticed, not (only) the dead group's torchrun: a survivor's collective or the lighthouse's quorum
    assert phases["detected_by"].split(" on ")[0] in ("torchft manager", "torchft lighthouse"), phases["detected_by"]
    # the survivor never restarted: one torchft replica (one uuid) on n0 from start to end
    survivor = (tmp_path / "run" / "logs" / "n0.log").read_text()
    assert len(set(re.findall(r"\[train_ddp_0:([0-9a-f-]{36})/0 - step", survivor))) == 1
    # the killed group's torchrun started it again and it healed to the step the survivor had reached
    healed = (tmp_path / "run" / "logs" / "n1.log").read_text()
    heals = re.findall(r"healing required, .*max_step=(\d+)", healed)
    assert int(heals[-1]) == phases["restored_step"] > phases["last_step_before"] - 1
    assert phases["lost_steps"] == len(phases["discarded_steps"]) + phases["catch_up_steps"]
    assert "torchft recovery model" in (tmp_path / "run" / "report.html").read_text()
