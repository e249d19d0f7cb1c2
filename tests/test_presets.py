"""Log presets against lines in the frameworks' own formats (ANSI colours included, as torchtitan prints them).

No framework runs here: each line below is what the named source file prints (see chaoskit/observe/presets.py, and
a recovery stack's module for its own preset), so a preset is tested for the frameworks that cannot run on this machine's CPU (torchtitan, Megatron) too."""

from __future__ import annotations

import pytest

from chaoskit.observe.events import EventBus
from chaoskit.observe.probes import LogRegexProbe
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.registry import log_presets, preset_rules
from tests.conftest import run_cli

RED, GREEN, ORANGE, RESET = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[39m"


def _events(presets, lines, extra=()):
    bus = EventBus()
    rules, tee = preset_rules(presets, torchrun=False)
    probe = LogRegexProbe(bus, [*rules, *extra], tee_prefixes=tee)
    for i, line in enumerate(lines):
        probe.feed("n0", line, ts=1000.0 + i)
    return [{k: v for k, v in e.items() if k not in ("ts", "node")} for e in bus.snapshot()]


def _kinds(events):
    return [(e["kind"], e.get("step")) for e in events]


def test_torchtitan_step_line_with_its_colours_and_checkpoint():
    lines = [
        "[rank0]:[titan] 2026-12-01 12:00:00,000 - root - INFO - Loading the checkpoint from ./outputs/checkpoint/step-20.",
        "[rank0]:[titan] 2026-12-01 12:00:01,000 - root - INFO - Finished loading the checkpoint in 0.41 seconds.",
        f"[rank0]:[titan] 2026-12-01 12:00:02,000 - root - INFO - {RED}step: 21  {GREEN}loss:  7.1234  {ORANGE}grad_norm:"
        f"  1.2000  \x1b[96mmemory:  1.20GiB(1.50%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 0.12  \x1b[35mmfu: 0.01%{RESET}",
        "[rank0]:[titan] 2026-12-01 12:00:03,000 - root - INFO - Saving the checkpoint (or staging if async is enabled).",
        "[rank0]:[titan] 2026-12-01 12:00:03,500 - root - INFO - Finished saving the checkpoint (or staging if async is "
        "enabled)in 0.50 seconds.",
    ]
    events = _events(["torchrun", "torchtitan"], lines)
    assert _kinds(events) == [("ckpt.load.start", 20), ("ckpt.load.end", 20), ("step", 21), ("ckpt.save.start", None),
                              ("ckpt.save.end", None)]
    assert all(e["rank"] == 0 and e["source"] == "torchtitan" for e in events)  # [rank0]: gave the rank


def test_a_coloured_step_line_is_missed_without_stripping_only_by_a_naive_regex():
    line = f"{RED}step: 21  {GREEN}loss:  7.1234{RESET}"
    import re

    assert not re.search(r"step:\s*\d+\s+loss:", line)  # the colour codes sit between label and number
    assert _kinds(_events(["torchtitan"], [line])) == [("step", 21)]


def test_megatron_iteration_load_and_save_lines():
    lines = [
        "  successfully loaded checkpoint from /ckpt/gpt [ t 1/2, p 1/1 ] at iteration 200",
        " [2026-12-01 12:00:00] iteration      210/    1000 | consumed samples:        26880 | elapsed time per "
        "iteration (ms): 812.3 | learning rate: 2.999E-04 | global batch size:   128 | lm loss: 6.543210E+00 |",
        "saving checkpoint at iteration     250 to /ckpt/gpt in torch_dist format",
        "  successfully saved checkpoint from iteration     250 to /ckpt/gpt [ t 1/2, p 1/1 ]",
    ]
    assert _kinds(_events(["megatron"], lines)) == [("ckpt.load.end", 200), ("step", 210), ("ckpt.save.start", 250),
                                                    ("ckpt.save.end", 250)]


def test_hf_trainer_resume_and_save_lines_from_both_major_versions():
    lines = [
        "Loading model from out/checkpoint-40.",
        "  Resuming training from checkpoint with epoch 0 and global step 40",
        "  Continuing training from global step 40",  # transformers 4.x
        "{'loss': '0.6931', 'grad_norm': '1.2', 'learning_rate': '4.5e-05', 'epoch': '0.4'}",  # no step: no event
        "Saving model checkpoint to out/checkpoint-60",
        # the progress bar's redraws (each a line: workloads/launch.py ends a line at \r); 0/N is no step, another
        # tqdm bar (the datasets' "Map: ...") none either
        "  0%|          | 0/80 [00:00<?, ?it/s]",
        " 51%|█████▏    | 41/80 [00:01<00:01, 22.39it/s]",
        "Map: 100%|██████████| 256/256 [00:00<00:00, 9000.00 examples/s]",
    ]
    assert _kinds(_events(["hf"], lines)) == [("ckpt.load.start", 40), ("ckpt.load.end", 40), ("ckpt.load.end", 40),
                                              ("ckpt.save.start", 60), ("step", 41)]


def test_lightning_restore_lines_with_and_without_a_step_in_the_path():
    lines = [
        "Restoring states from the checkpoint path at /job/ckpt/epoch=0-step=40.ckpt",
        "Restored all states from the checkpoint at /job/ckpt/epoch=0-step=40.ckpt",
        "Restoring states from the checkpoint path at /job/ckpt/last.ckpt",
        "Epoch 1, global step 80: 'train_loss' reached 0.51000 (best 0.51000), saving model to '/job/ckpt/x.ckpt' as top 1",
    ]
    events = _events(["lightning"], lines)
    assert _kinds(events) == [("ckpt.load.start", 40), ("ckpt.load.end", 40), ("ckpt.load.start", None),
                              ("ckpt.save.start", 80)]
    assert events[2]["path"] == "/job/ckpt/last.ckpt"


def test_deepspeed_accelerate_and_torchft_lines():
    ds = [
        "[2026-12-01 12:00:00,000] [INFO] [engine.py:3000:_load_checkpoint] rank: 1 loading checkpoint: "
        "/ckpt/global_step30/mp_rank_00_model_states.pt",
        "[2026-12-01 12:00:01,000] [INFO] [logging.py:128:log_dist] [Rank 0] step=40, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]",
        "[2026-12-01 12:00:02,000] [INFO] [logging.py:128:log_dist] [Rank 0] Saving model checkpoint: "
        "/ckpt/global_step50/mp_rank_00_model_states.pt",
        "[2026-12-01 12:00:03,000] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] Checkpoint global_step50 is ready now!",
    ]
    events = _events(["deepspeed"], ds)
    assert _kinds(events) == [("ckpt.load.start", 30), ("step", 40), ("ckpt.save.start", 50), ("ckpt.save.end", 50)]
    assert events[0]["rank"] == 1 and events[1]["rank"] == 0
    acc = ["INFO:accelerate.accelerator:Loading states from out/checkpoints/checkpoint_2",
           "INFO:accelerate.checkpointing:All random states loaded successfully",
           "INFO:accelerate.accelerator:Saving current state to out/checkpoints/checkpoint_3",
           "INFO:accelerate.checkpointing:Random states saved in out/checkpoints/checkpoint_3/random_states_0.pkl"]
    assert [k for k, _ in _kinds(_events(["accelerate"], acc))] == ["ckpt.load.start", "ckpt.load.end",
                                                                   "ckpt.save.start", "ckpt.save.end"]
    ft = ["INFO:torchft.manager:[train_ddp_0:9f5b/0 - step 17] got exception in all reduce -- skipping remaining: timeout",
          "INFO:torchft.manager:[train_ddp_1:77aa/0 - step 0] reconfiguring for quorum_id=3 store_prefixed_addr='x'",
          "INFO:torchft.manager:[train_ddp_1:77aa/0 - step 0] healing required, fetching checkpoint metadata from "
          "recover_src_manager_address='http://n0:4281' max_step=17",
          "INFO:torchft.manager:[train_ddp_1:77aa/0 - step 17] applying pending state dict",
          "INFO:torchft.manager:[train_ddp_1:77aa/0 - step 17] Loaded state dict.",
          "INFO:torchft.manager:[train_ddp_1:77aa/0 - step 17] should_commit=True enough_replicas=True, errored=None"]
    assert _kinds(_events(["torchft"], ft)) == [("detect", None), ("rendezvous.done", None), ("ckpt.load.start", 17),
                                                ("ckpt.load.end", 17), ("step", 17)]


def test_torchrun_preset_gives_ranks_from_tee_prefixes_to_the_scenarios_own_rules():
    own = LogRule.of(r"my step (?P<step>\d+)", "step")
    events = _events(["torchrun"], ["[default1]:my step 5", "[rank3]:my step 6", "my step 7",
                                    "[default0]:[W1201 12:00:00] failed (exitcode: -9) local_rank: 0 (pid: 42) of binary: x"],
                     extra=[own])
    assert [(e["kind"], e.get("step"), e.get("rank"), e.get("local_rank")) for e in events] == [
        ("step", 5, None, 1), ("step", 6, 3, None), ("step", 7, None, None), ("worker.exit", None, None, 0)]
    # without the torchrun preset the prefix stays part of the line and gives no rank
    plain = _events(["hf"], ["[rank3]:my step 6"], extra=[own])
    assert plain[0].get("rank") is None and plain[0]["step"] == 6


def test_every_preset_documents_what_it_sees_cannot_see_and_its_verbosity():
    for name, preset in log_presets().items():
        assert preset.cannot_see and preset.verbosity, name
        assert set(preset.sees) == {r.event for r in preset.rules}, name


@pytest.mark.parametrize("presets", [["hf"], ["torchrun", "lightning", "torchtitan"], ["megatron", "deepspeed"]])
def test_presets_in_a_scenario_validate_and_an_unknown_one_is_refused_at_its_line(tmp_path, presets):
    good = tmp_path / "good.yaml"
    good.write_text(f"""\
name: presets
workload: {{launch: uninstrumented, steps: 100}}
probes:
  sdk: false
  presets: [{', '.join(presets)}]
faults:
  - kind: process.kill
    target: {{ranks: [1]}}
    at: {{step: 50}}
""")
    res = run_cli("validate", good)
    assert res.code == 0, res.stdout + res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace(f"presets: [{', '.join(presets)}]", "presets: [hf, keras]"))
    res = run_cli("validate", bad)
    assert res.code == 2
    line = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(line) == 1 and line[0].startswith(f"{bad}:5:17: probes.presets.1: ") and "'megatron'" in line[0], res.stderr


def test_the_ray_train_preset_reads_the_raylets_dead_worker_line():
    """The line a Ray Train drill's driver printed as the raylet found a Train worker SIGKILLed (the scorecard's
    cascade row on the ray column), colours included."""
    line = ("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error. "
            "To troubleshoot the problem, check the logs for the dead worker. Lease ID: 0a00000000709e37 Worker ID: "
            "a72f828e07ee380c")
    [event] = _events(["ray-train"], [line])
    assert (event["kind"], event["source"], event["who"]) == ("detect", "raylet", "Ray raylet")
