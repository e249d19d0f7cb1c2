"""Log presets: the lines frameworks print themselves, mapped to timeline events (``probes.presets``).

For a job that cannot be touched: name its framework and chaoskit reads the framework's own lines, no regex
to write. Each pattern below names the framework source file whose line it follows; the lines are matched
after ANSI colour codes are stripped (:meth:`LogRegexProbe.feed`). A preset sees only what its framework
prints, and several print their resume lines on rank 0 only: such a line says "the first rank finished
loading", not the last. :data:`PRESETS` documents, per preset, what it sees, what it cannot see and the
verbosity the job needs; docs/frameworks.md ("Drill your framework's job") has the same table for people.

Presets and the scenario's own ``probes.log`` rules combine: every rule runs on every line.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaoskit.observe.rules import TORCHRUN_RULES, LogRule

__all__ = ["Preset", "PRESETS", "PRESET_NAMES", "preset_rules", "NO_STEP_SEEN"]


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

# torchft/manager.py _ManagerLogger.prefix: f"[{replica_id}/{group_rank} - step {current_step}] {msg}", where
# replica_id is the job's id plus a uuid ("train_ddp_1:6de461db-...") and the step the manager's current one
_TORCHFT = r"\[[^\]/]*/(?P<group_rank>\d+) - step (?P<at_step>\d+)\] "

TORCHFT = Preset("torchft", (
    # torchft/manager.py Manager.allreduce: f"got exception in all reduce -- skipping remaining: {e}"; the same file,
    # wrap_future: "got exception in future -- skipping remaining"; _ManagedWork.wait: "got exception waiting for
    # work": a survivor's collective failed (its step will not commit)
    LogRule.of(_TORCHFT + r"got exception (?:in all reduce|in future|waiting for work)", "detect",
               {"source": "torchft", "who": "torchft manager", "why": "a collective with a dead replica group failed"}),
    # torchft's src/lighthouse.rs (compiled into torchft/_torchft*.so; log target torchft::lighthouse), the
    # lighthouse's own output: "Detected quorum change, bumping quorum_id to N": the quorum's members changed (after a fault: a group stopped heartbeating for heartbeat_timeout_ms)
    LogRule.of(r"\[torchft::lighthouse\] - Detected quorum change, bumping quorum_id to (?P<quorum_id>\d+)", "detect",
               {"source": "torchft lighthouse", "who": "torchft lighthouse", "why": "the quorum's members changed"}),
    # torchft/manager.py Manager._async_quorum: f"reconfiguring for {quorum_id=} {store_prefixed_addr=}"
    LogRule.of(_TORCHFT + r"reconfiguring for quorum_id=(?P<quorum_id>\d+)", "rendezvous.done", {"source": "torchft"}),
    # the same function: f"healing required, fetching checkpoint metadata from {recover_src_manager_address=}
    # {max_step=}": a (re)started group fetches the current state from a peer
    LogRule.of(_TORCHFT + r"healing required, .*max_step=(?P<step>\d+)", "ckpt.load.start", {"source": "torchft"}),
    # torchft/manager.py Manager._apply_pending_state_dict: "Loaded state dict." (the prefix's step is the healed one)
    LogRule.of(r"\[[^\]/]*/(?P<group_rank>\d+) - step (?P<step>\d+)\] Loaded state dict\.", "ckpt.load.end",
               {"source": "torchft"}),
    # torchft/manager.py Manager.should_commit: f"should_commit={should_commit} enough_replicas=..., errored=..."
    # (the prefix's step is the one being committed, or thrown away)
    LogRule.of(r"\[[^\]/]*/(?P<group_rank>\d+) - step (?P<step>\d+)\] should_commit=True", "step", {"source": "torchft"}),
    LogRule.of(r"\[[^\]/]*/(?P<group_rank>\d+) - step (?P<step>\d+)\] should_commit=False", "step.discarded",
               {"source": "torchft"}),
), sees=("detect", "rendezvous.done", "ckpt.load.start", "ckpt.load.end", "step", "step.discarded"),
    cannot_see="worker starts (a restarted group is seen when it heals), the members of a quorum (a reconfiguration "
               "is taken as the one without the dead group: the first after the fault), and the lighthouse's quorum "
               "changes unless its output is read (workload.recovery: torchft starts it and reads it); measure it "
               "with workload.recovery: torchft, the torchft recovery model (no restart of the survivors)",
    verbosity="the torchft.manager logger at INFO (logging.basicConfig(level=logging.INFO)); the lighthouse's "
              "RUST_LOG default (info)")

# nvidia_resiliency_ext/fault_tolerance/rank_monitor_server.py (0.4.1): each rank's monitor logs through
# RankMonitorLogger, "[%(asctime)s] [%(levelname)s] [RankMonServer{pid}@{hostname}:{rank}] %(message)s", on stderr
# (which ft_launcher passes through); tests/data/nvrx/ holds a real recording.
_RANK_MONITOR = r"\[RankMonServer\d+@[^\]\s]*:(?P<rank>\d+)\] "
NVRX = Preset("nvrx", (
    # _is_hb_timeout_elapsed: f"Did not get subsequent heartbeat. Waited {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Did not get subsequent heartbeat\. Waited (?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "no heartbeat within the rank heartbeat timeout"}),
    # the same, before any: f"Did not get initial heartbeat. Waited {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Did not get initial heartbeat\. Waited (?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "no first heartbeat within the initial timeout"}),
    # _is_section_timeout_elapsed: f"Section '{section}' has been open for {elapsed:.2f} seconds. Timeout is ..."
    LogRule.of(_RANK_MONITOR + r"Section '(?P<section>[^']{1,64})' has been open for [\d.]+ seconds\. Timeout is "
               r"(?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "a section stayed open past its timeout"}),
    # the same: f"Was out of section for {elapsed:.2f} seconds. Timeout is {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Was out of section for [\d.]+ seconds\. Timeout is (?P<timeout_s>[\d.]+) seconds",
               "detect", {"source": "nvrx", "who": "NVRx rank monitor", "why": "out of every section past its timeout"}),
), sees=("detect",),
    cannot_see="steps, checkpoints and worker starts (ft_launcher prints none; combine with the job's own events "
               "or its framework's preset); a rank that exits is reported by ft_launcher's torchrun lines "
               "(the torchrun preset), not by its rank monitor",
    verbosity="ft_launcher's default (--ft-log-level INFO: the monitors' timeout lines are warnings)",
    tee_prefixes=False)

# nvidia_resiliency_ext/inprocess/wrap.py (0.4.1): CallWrapper.__call__ logs through utils.log_exc,
# f"{rank=} {name}: {format_exc(exc)}", where the root logger has a StreamHandler; the reference job's
# train_inprocess prefixes them "[nvrx-inprocess] LEVEL LOGGER: ". tests/data/nvrx-inprocess/ holds a real recording.
_WRAPPER = r"\[nvrx-inprocess\] [A-Z]+ nvidia_resiliency_ext\.inprocess\.wrap: rank=(?P<rank>\d+) "
NVRX_INPROCESS = Preset("nvrx-inprocess", (
    # fn_ex: the wrapped loop raised in this rank (log.error): the first to know of an exception
    LogRule.of(_WRAPPER + r"fn_ex: (?P<error>.{1,300})", "detect",
               {"source": "nvrx-inprocess", "who": "NVRx in-process Wrapper",
                "why": "the wrapped training loop raised"}),
    # term_ex: the iteration is over, for every rank, and why (log.warning): RankShouldRestart('Interruption.X on
    # ranks={...}'); an exception, a soft timeout (no ping), a dead or silent peer
    # (several at once: "Interruption.EXCEPTION on ranks={0}, Interruption.SOFT_TIMEOUT on ranks={0}")
    LogRule.of(_WRAPPER + r"term_ex: RankShouldRestart\('(?P<interruptions>Interruption\.(?P<interruption>[A-Z_]{1,40}) "
               r"on ranks=\{(?P<ranks>[\d, ]{0,200})\}[^']{0,400})'\)", "detect",
               {"source": "nvrx-inprocess", "who": "NVRx in-process Wrapper",
                "why": "the Wrapper interrupted the iteration"}),
    # restart_ex: the rank passed its health check and restarts its loop (log.info)
    LogRule.of(_WRAPPER + r"restart_ex: ", "inprocess.restart", {"source": "nvrx-inprocess"}),
), sees=("detect", "inprocess.restart"),
    cannot_see="steps, checkpoints and the loop's restarts (the Wrapper prints none; the reference job's own "
               "events give them, restart_count being the Wrapper's iteration); a rank its monitor process killed "
               "(hard timeout) is torchrun's to report",
    verbosity="the nvidia_resiliency_ext logger at INFO and a StreamHandler on the root logger (without one the "
              "Wrapper warns 'logging not initialized, logs are disabled' and prints nothing)")

# lm-resiliency 0.2.0 logs through the logging module (its loggers are lm_resiliency.*): a job with a handler at INFO
# prints "... INFO lm_resiliency.checkpointing.manager: Loaded exact checkpoint at ...". examples/frameworks/
# lm-resiliency/README.md holds the lines of a real kill.
LM_RESILIENCY = Preset("lm-resiliency", (
    # lm_resiliency/checkpointing/replication.py ChunkedGlooBackend.__init__: logger.info(f"ChunkedGlooBackend: rank
    # {rank} paired with rank {peer}, chunk_size=...") when a worker's GEMINI starts (after init_process_group, before
    # its checkpoint is loaded): each rank of a new world
    LogRule.of(r"lm_resiliency\.checkpointing\.replication: ChunkedGlooBackend: rank (?P<rank>\d+) paired with rank",
               "worker.start", {"source": "lm-resiliency"}),
    # lm_resiliency/checkpointing/manager.py load(): logger.info("Loaded exact checkpoint at manager-selected step
    # %s", agreed_step), after every rank agreed on the step the manager chose: the last rank loaded
    LogRule.of(r"lm_resiliency\.checkpointing\.manager: Loaded exact checkpoint at manager-selected step (?P<step>\d+)",
               "ckpt.load.end", {"source": "lm-resiliency"}),
    # the same function, with no manager's step: f"Loaded checkpoint from memory at step {step}" / f"Loaded checkpoint
    # from {folder} at step {latest}"
    LogRule.of(r"lm_resiliency\.checkpointing\.manager: Loaded checkpoint from \S+ at step (?P<step>\d+)",
               "ckpt.load.end", {"source": "lm-resiliency"}),
    # lm_resiliency/_feature_wiring.py: logger.warning(f"SCOUT fault at step {step}: sdc={sdc_bitmap},
    # straggler={straggler_bitmap}"), one place per peer rank of the replay group (the world for DDP), 1 = blamed.
    # Only a line that blames someone: on CPU it comes every step with all zeros (docs/recovery-stacks.md)
    LogRule.of(r"lm_resiliency\._feature_wiring: SCOUT fault at step (?P<at_step>\d+): (?=.*\b1\b)sdc=\[(?P<sdc>[01, ]{0,400})\], "
               r"straggler=\[(?P<straggler>[01, ]{0,400})\]", "detect",
               {"source": "lm-resiliency", "who": "lm-resiliency SCOUT", "why": "SCOUT localized a fault"}),
), sees=("worker.start", "ckpt.load.end", "detect"),
    cannot_see="steps and saves (GEMINI's capture every step logs nothing; the job's own step lines give steps), "
               "and a worker's start unless GEMINI replicates (its pairing line); a killed worker is torchrun's to "
               "report (the torchrun preset): SCOUT names no rank for it",
    verbosity="the lm_resiliency loggers at INFO (logging.basicConfig(level=logging.INFO))")

PRESETS: dict[str, Preset] = {p.name: p for p in (TORCHRUN, HF, LIGHTNING, TORCHTITAN, MEGATRON, DEEPSPEED,
                                                  ACCELERATE, TORCHFT, NVRX, NVRX_INPROCESS,
                                                  LM_RESILIENCY)}
PRESET_NAMES = tuple(PRESETS)


def preset_rules(names: list[str] | tuple[str, ...], torchrun: bool = True) -> tuple[list[LogRule], bool]:
    """The rules of the named presets (``torchrun``: the built-in torchrun rule even when not named), and whether
    torchrun's ``--tee`` prefixes give each line's rank."""
    rules: list[LogRule] = list(TORCHRUN_RULES) if torchrun or "torchrun" in names else []
    for name in dict.fromkeys(names):
        if name != "torchrun":
            rules.extend(PRESETS[name].rules)
    return rules, "torchrun" in names


NO_STEP_SEEN = ("no step event was seen: the job reported none (no SDK, no callback) and no probes.log rule or "
                "preset read one from its lines (torchrun's carry none); add a step rule, e.g. {event: step, match: "
                "'Step (?P<step>\\d+)'}, or chaoskit.probe.step(n) in the script")
"""What a job that ended before steady state without one step event seen is told (issue 51, item 5)."""
