"""Log presets: the lines frameworks print themselves, mapped to timeline events (``probes.presets``).

For a job that cannot be touched: name its framework and chaoskit reads the framework's own lines, no regex
to write. Each pattern below names the framework source file whose line it follows; the lines are matched
after ANSI colour codes are stripped (:meth:`LogRegexProbe.feed`). A preset sees only what its framework
prints, and several print their resume lines on rank 0 only: such a line says "the first rank finished
loading", not the last. Each :class:`Preset` documents what it sees, what it cannot see and the verbosity the job
needs; docs/frameworks.md ("Drill your framework's job") has the same table for people.

The frameworks' presets are here (:data:`FRAMEWORK_PRESETS`); a recovery stack's own (torchft's manager and
lighthouse, NVRx's rank monitors, ...) are in its module of ``chaoskit/stacks/``, and
:func:`chaoskit.stacks.registry.log_presets` is every preset by name, as ``probes.presets`` names them.

Presets and the scenario's own ``probes.log`` rules combine: every rule runs on every line.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaoskit.observe.rules import TORCHRUN_RULES, LogRule

__all__ = ["Preset", "TORCHRUN", "FRAMEWORK_PRESETS", "rules_of_presets", "NO_STEP_SEEN"]


@dataclass(frozen=True)
class Preset:
    name: str
    rules: tuple[LogRule, ...]
    sees: tuple[str, ...]
    """Event kinds its lines give."""
    cannot_see: str
    """What a drill measured with this preset alone misses, and why."""
    verbosity: str
    """What the job must set for the lines to be printed at all."""
    tee_prefixes: bool = False
    """torchrun's ``--tee`` / ``--role`` prefixes (``[rank3]:``, ``[default0]:``) give the line's rank."""


# The step a checkpoint path names: transformers' checkpoint-N, Lightning's ...step=N..., torchtitan's step-N,
# DeepSpeed's global_stepN.
_CKPT_STEP = r"(?:checkpoint-|step=|step-|global_step)(?P<step>\d+)"

TORCHRUN = Preset(
    "torchrun",
    # torch/distributed/elastic/multiprocessing/api.py (the dead worker the agent reports)
    TORCHRUN_RULES,
    sees=("worker.exit",),
    cannot_see="steps, checkpoints and worker starts: torchrun prints none (combine with the framework's preset)",
    verbosity="none: the agent prints its failure lines at its default level; --tee 3 (or --role NAME) prefixes "
              "every worker line with [defaultN]: / [rankN]:, which then gives each event its rank",
    tee_prefixes=True,
)

HF = Preset("hf", (
    # transformers/trainer.py _load_from_checkpoint: logger.info(f"Loading model from {resume_from_checkpoint}.")
    LogRule.of(rf"Loading model from (?P<path>\S*?{_CKPT_STEP})\b", "ckpt.load.start", {"source": "hf"}),
    # transformers/trainer.py _inner_training_loop (5.x): "  Resuming training from checkpoint with epoch E and
    # global step N"; (4.x): "  Continuing training from global step N"
    LogRule.of(r"Resuming training from checkpoint with epoch \d+ and global step (?P<step>\d+)", "ckpt.load.end",
               {"source": "hf"}),
    LogRule.of(r"Continuing training from global step (?P<step>\d+)", "ckpt.load.end", {"source": "hf"}),
    # transformers/trainer.py _save: logger.info(f"Saving model checkpoint to {output_dir}")
    LogRule.of(rf"Saving model checkpoint to (?P<path>\S*?{_CKPT_STEP})\b", "ckpt.save.start", {"source": "hf"}),
    # transformers/trainer_callback.py ProgressCallback (on by default: disable_tqdm=False): on rank 0, a tqdm bar of
    # max_steps that on_step_end moves to state.global_step; each redraw ("\r 25%|██▌   | 10/40 [00:01<00:03,
    # 9.50it/s]") is a line to chaoskit (workloads/launch.py reads \r as a line end). Its n is the global step,
    # also right after a resume (the bar jumps to the restored step); 0/N, drawn as training begins, is no step.
    LogRule.of(r"^\s*\d{1,3}%\|[^|]*\|\s*(?P<step>[1-9]\d*)/\d+ \[", "step", {"source": "hf"}),
), sees=("step", "ckpt.load.start", "ckpt.load.end", "ckpt.save.start"),
    cannot_see="worker starts (so reallocation and checkpoint load, which begin at the new world's start, are not "
               "measured), every step (the progress bar is rank 0's, redrawn at most every 0.1 s: tqdm's "
               "mininterval; Trainer.log's loss dicts carry no step), and the last rank's load: the resume lines "
               "are rank 0's only (first rank loaded); use chaoskit.integrations.hf.ChaoskitCallback for those",
    verbosity="TRANSFORMERS_VERBOSITY=info (the resume and save lines are logger.info; replicas log at warning), "
              "and the progress bar left on (disable_tqdm=False, the default) for the steps")

LIGHTNING = Preset("lightning", (
    # lightning/pytorch/trainer/connectors/checkpoint_connector.py resume_start:
    # rank_zero_info(f"Restoring states from the checkpoint path at {checkpoint_path}")
    LogRule.of(rf"Restoring states from the checkpoint path at (?P<path>(?:\S*?{_CKPT_STEP})?\S*)",
               "ckpt.load.start", {"source": "lightning"}),
    # the same file, resume_end: rank_zero_info(f"Restored all states from the checkpoint at {self._ckpt_path}")
    LogRule.of(rf"Restored all states from the checkpoint at (?P<path>(?:\S*?{_CKPT_STEP})?\S*)",
               "ckpt.load.end", {"source": "lightning"}),
    # lightning/pytorch/callbacks/model_checkpoint.py _update_best_and_save (verbose=True):
    # f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} reached ... saving model to ..."
    LogRule.of(r"Epoch \d+, global step (?P<step>\d+): .* saving model to", "ckpt.save.start", {"source": "lightning"}),
), sees=("ckpt.load.start", "ckpt.load.end", "ckpt.save.start"),
    cannot_see="steps (a progress bar, no per-step line), worker starts, the last rank's load (rank 0's lines "
               "only), and saves unless ModelCheckpoint(verbose=True, monitor=...); a checkpoint named last.ckpt "
               "gives no step; use chaoskit.integrations.lightning.ChaoskitCallback for those",
    verbosity="the default (rank_zero_info is printed at Lightning's default INFO level)")

TORCHTITAN = Preset("torchtitan", (
    # torchtitan/components/metrics.py MetricsProcessor.log (train.py calls it every metrics.log_freq steps):
    # f"{color.red}step: {step:2}  {color.green}loss: ..." — ANSI colours between the label and the number
    LogRule.of(r"step:\s*(?P<step>\d+)\s+loss:", "step", {"source": "torchtitan"}),
    # torchtitan/components/checkpoint.py CheckpointManager.load: f"Loading the checkpoint from {checkpoint_id}."
    LogRule.of(rf"Loading the checkpoint from (?P<path>\S*?{_CKPT_STEP})", "ckpt.load.start", {"source": "torchtitan"}),
    # the same file: f"Finished loading the checkpoint in {...:.2f} seconds."
    LogRule.of(r"Finished loading the checkpoint in", "ckpt.load.end", {"source": "torchtitan"}),
    # the same file, save: "Saving the checkpoint (or staging if async is enabled)." / "Finished saving the checkpoint"
    LogRule.of(r"Saving the checkpoint \(or staging", "ckpt.save.start", {"source": "torchtitan"}),
    LogRule.of(r"Finished saving the checkpoint", "ckpt.save.end", {"source": "torchtitan"}),
), sees=("step", "ckpt.load.start", "ckpt.load.end", "ckpt.save.start", "ckpt.save.end"),
    cannot_see="steps between metrics.log_freq lines, and worker starts; its lines come from rank 0 (first rank "
               "loaded) unless every rank's output is kept",
    verbosity="the default (logger.info); torchrun --tee 3 --local-ranks-filter 0 as torchtitan's run script does")

MEGATRON = Preset("megatron", (
    # megatron/training/training.py training_log (print_rank_last, every --log-interval):
    # " [2026-01-01 00:00:00] iteration      100/    1000 | consumed samples: ..."
    LogRule.of(r"\biteration\s+(?P<step>\d+)/\s*\d+ \|", "step", {"source": "megatron"}),
    # megatron/training/checkpointing.py load_checkpoint (print_rank_0, after a barrier of every rank):
    # "  successfully loaded checkpoint from {load_dir} [ t 1/1, p 1/1 ] at iteration {iteration}"
    LogRule.of(r"successfully loaded checkpoint from (?P<path>\S+) \[[^\]]*\] at iteration (?P<step>\d+)",
               "ckpt.load.end", {"source": "megatron"}),
    # the same file, save_checkpoint: "saving checkpoint at iteration {:7d} to {} in {} format",
    # then "  successfully saved checkpoint from iteration {:7d} to {}"
    LogRule.of(r"saving checkpoint at iteration\s+(?P<step>\d+) to", "ckpt.save.start", {"source": "megatron"}),
    LogRule.of(r"successfully saved checkpoint from iteration\s+(?P<step>\d+) to", "ckpt.save.end",
               {"source": "megatron"}),
), sees=("step", "ckpt.load.end", "ckpt.save.start", "ckpt.save.end"),
    cannot_see="steps between --log-interval lines (printed by the last rank), and worker starts; the load line "
               "follows a barrier of every rank, so it does say the last rank loaded",
    verbosity="the default (print_rank_0 / print_rank_last)")

DEEPSPEED = Preset("deepspeed", (
    # deepspeed/runtime/engine.py _report_progress (every steps_per_print, through log_dist on rank 0):
    # "[Rank 0] step=10, skipped=0, lr=[...], mom=[...]"
    LogRule.of(r"\[Rank (?P<rank>\d+)\] step=(?P<step>\d+), skipped=", "step", {"source": "deepspeed"}),
    # deepspeed/runtime/engine.py _load_checkpoint: f"rank: {self.global_rank} loading checkpoint: {load_path}"
    LogRule.of(rf"rank: (?P<rank>\d+) loading checkpoint: (?P<path>\S*?{_CKPT_STEP}\S*)", "ckpt.load.start",
               {"source": "deepspeed"}),
    # deepspeed/runtime/engine.py _save_checkpoint: f"Saving model checkpoint: {save_path}"; the checkpoint engine
    # (deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py commit): f"[Torch] Checkpoint {tag} is ready now!"
    LogRule.of(rf"Saving model checkpoint: (?P<path>\S*?{_CKPT_STEP}\S*)", "ckpt.save.start", {"source": "deepspeed"}),
    LogRule.of(r"Checkpoint (?:global_step)(?P<step>\d+) is ready now", "ckpt.save.end", {"source": "deepspeed"}),
), sees=("step", "ckpt.load.start", "ckpt.save.start", "ckpt.save.end"),
    cannot_see="the end of a load (DeepSpeed prints its start per rank, not its end: checkpoint load is then "
               "measured to the first step), steps between steps_per_print lines, and worker starts",
    verbosity="DeepSpeed's INFO lines are hidden by default since 0.17.6: raise the `DeepSpeed` logger to INFO "
              "(deepspeed.utils.logger.setLevel(logging.INFO)) and set steps_per_print")

ACCELERATE = Preset("accelerate", (
    # accelerate/accelerator.py load_state: logger.info(f"Loading states from {input_dir}")
    LogRule.of(r"Loading states from (?P<path>\S+)", "ckpt.load.start", {"source": "accelerate"}),
    # accelerate/checkpointing.py load_accelerator_state, its last line: "All random states loaded successfully"
    LogRule.of(r"All random states loaded successfully", "ckpt.load.end", {"source": "accelerate"}),
    # accelerate/accelerator.py save_state: logger.info(f"Saving current state to {output_dir}"); then
    # accelerate/checkpointing.py save_accelerator_state: f"Random states saved in {output_states_file}"
    LogRule.of(r"Saving current state to (?P<path>\S+)", "ckpt.save.start", {"source": "accelerate"}),
    LogRule.of(r"Random states saved in", "ckpt.save.end", {"source": "accelerate"}),
), sees=("ckpt.load.start", "ckpt.load.end", "ckpt.save.start", "ckpt.save.end"),
    cannot_see="steps (Accelerate prints none), the step a checkpoint holds (its folders are numbered by save, not "
               "by step), and worker starts; the lines are the main process's only (first rank loaded)",
    verbosity="accelerate's logger at INFO (logging.basicConfig(level=logging.INFO), or ACCELERATE_LOG_LEVEL=info)")

FRAMEWORK_PRESETS: dict[str, Preset] = {p.name: p for p in (TORCHRUN, HF, LIGHTNING, TORCHTITAN, MEGATRON,
                                                            DEEPSPEED, ACCELERATE)}
"""The frameworks' presets; a recovery stack's own are its module's (:attr:`chaoskit.stacks.api.Stack.log_presets`),
and :func:`chaoskit.stacks.registry.log_presets` gives them all by name."""


def rules_of_presets(presets: list[Preset] | tuple[Preset, ...], torchrun: bool = True) -> tuple[list[LogRule], bool]:
    """The rules of ``presets`` (``torchrun``: the built-in torchrun rule even when its preset is not among them),
    and whether torchrun's ``--tee`` prefixes give each line's rank."""
    tee = any(p is TORCHRUN for p in presets)
    rules: list[LogRule] = list(TORCHRUN_RULES) if torchrun or tee else []
    for preset in {p.name: p for p in presets}.values():
        if preset is not TORCHRUN:
            rules.extend(preset.rules)
    return rules, tee


NO_STEP_SEEN = ("no step event was seen: the job reported none (no SDK, no callback) and no probes.log rule or "
                "preset read one from its lines (torchrun's carry none); add a step rule, e.g. {event: step, match: "
                "'Step (?P<step>\\d+)'}, or chaoskit.probe.step(n) in the script")
"""What a job that ended before steady state without one step event seen is told (issue 51, item 5)."""
