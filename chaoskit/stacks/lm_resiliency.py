"""``recovery: lm-resiliency``: torchrun with lm-resiliency's rendezvous backend (``lm_resiliency``, 0.2.0). The job
is the user's: it calls lm-resiliency's ``enable_resiliency`` (GEMINI's in-memory checkpoint every step,
replicated to a peer rank; examples/frameworks/lm-resiliency/train.py). A dead worker stops its world; the
survivors flush their GEMINI shards and the replicas they hold; the agent (:mod:`chaoskit.stacks.lm_resiliency_agent`,
the manager lm-resiliency does not ship) publishes the next generation on the same nodes at GEMINI's newest complete
step, which every rank loads (``Loaded exact checkpoint at manager-selected step S``). Measured as a restart.

What it is not (docs/recovery-stacks.md, "lm-resiliency"): a standby replacement (the nodes are ``N:N``; spares
take no part), nor SCOUT's localization on this machine's CPU build (it needs NCCL for its zero-code attachment,
and on gloo it flags every step with no rank).
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
from pathlib import Path
from typing import Any

from chaoskit.core.durations import parse_duration
from chaoskit.observe.presets import Preset
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import CannotRun, Stack, StackRun, row_kind

__all__ = ["LM_RESILIENCY_PRESET", "LmResiliency", "LmResiliencyRun"]

MACHINE_ID_ENV = "LM_RESILIENCY_MACHINE_ID_PATH"
"""Where lm-resiliency reads a node's identity (default /etc/machine-id, which a lab's nodes share)."""
SCRIPT = Path("..") / "frameworks" / "lm-resiliency" / "train.py"
"""The scorecard column's job, relative to the rows' folder (examples/frameworks/lm-resiliency/train.py beside
examples/scorecard/); a folder without it gets "cannot run here" in that column."""
JOIN_TIMEOUT_MS = 120_000
"""How long an agent waits for a world of its generation (lm-resiliency's default: 300 s)."""


# lm-resiliency 0.2.0 logs through the logging module (its loggers are lm_resiliency.*): a job with a handler at INFO
# prints "... INFO lm_resiliency.checkpointing.manager: Loaded exact checkpoint at ...". examples/frameworks/
# lm-resiliency/README.md holds the lines of a real kill.
LM_RESILIENCY_PRESET = Preset("lm-resiliency", (
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


class LmResiliencyRun(StackRun):
    def __init__(self, stack: Stack, job: Any) -> None:
        super().__init__(stack, job)
        self.port = _free_port()

    def _folder(self, node: str) -> Path:
        """The node's restart-context folder: made by its agent (lm-resiliency wants it its own, 0700)."""
        return Path(self.job.job_dir) / "lm-resiliency" / node

    def _identity(self, node: str) -> Path:
        """The node's identity file: chaoskit's, which the agent (the job's account, maybe) reads."""
        return Path(self.job.job_dir) / "lm-resiliency-nodes" / node

    def world(self, node: str) -> list[str]:
        cluster = self.job.cluster
        n = len(cluster.job_nodes)
        conf = [f"is_host={'true' if node == cluster.agent_nodes[0] else 'false'}", "store_type=tcp",
                "read_timeout=60", f"lm_resiliency_restart_context_path={self._folder(node) / 'context.json'}",
                f"lm_resiliency_join_timeout_ms={JOIN_TIMEOUT_MS}"]
        return ["--nnodes", f"{n}:{n}", "--rdzv-backend", "lm_resiliency",
                "--rdzv-endpoint", f"{cluster.rdzv_host}:{self.port}", "--rdzv-id", self.job.run_id,
                "--rdzv-conf", ",".join(conf)]

    def launcher(self, plan: bool = False) -> list[str]:
        return ["-m", "chaoskit.stacks.lm_resiliency_agent"]

    def env_owned(self, node: str, plan: bool = False) -> dict[str, str]:
        return {MACHINE_ID_ENV: str(self._identity(node))}

    def start(self) -> list[subprocess.Popen[bytes]]:
        # a node's identity of its own (32 hex digits, as /etc/machine-id): lm-resiliency places nodes by it
        for node in self.job.cluster.agent_nodes:
            path = self._identity(node)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(hashlib.sha256(f"{self.job.run_id}/{node}".encode()).hexdigest()[:32] + "\n")
            path.chmod(0o644)
        return []


def _scout(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
           pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    # lm_resiliency/_feature_wiring.py (0.2.0): f"SCOUT fault at step {step}: sdc={sdc_bitmap}, straggler=
    # {straggler_bitmap}"; the bitmaps follow the replay group's peer ranks, the world's under DDP
    def ones(bits: Any) -> list[int]:
        return [i for i, b in enumerate(str(bits or "").replace(" ", "").split(",")) if b == "1"]

    ranks = sorted(set(ones(e.get("sdc")) + ones(e.get("straggler"))))
    words = f"SCOUT fault at step {e.get('at_step')}: sdc=[{e.get('sdc')}], straggler=[{e.get('straggler')}]"
    return {"by": e.get("who") or "lm-resiliency SCOUT", "words": words,
            "parties": [{"rank": r, "node": where.get(r)} for r in ranks]}


class LmResiliency(Stack):
    name = "lm-resiliency"
    log_presets = (LM_RESILIENCY_PRESET,)
    blame_readers = {("detect", "lm-resiliency"): _scout}
    describe = "torchrun with lm-resiliency's rendezvous: the world restarts from GEMINI's in-memory checkpoint"
    launches = ("command",)
    refusal = ("recovery: lm-resiliency is only used with launch: {launches} (the job calls lm-resiliency's "
               "enable_resiliency itself), not launch: {launch}")
    agent = "torchrun (lm_resiliency rendezvous)"
    owned_env = (MACHINE_ID_ENV,)
    presets = ("lm-resiliency",)
    reallocation_label = "next generation formed"
    extra = "lm-resiliency"
    requires = "lm_resiliency"
    install = "pip install 'chaoskit[lm-resiliency]' (lm-resiliency==0.2.0)"
    scorecard_column = "lm-resiliency"
    scorecard_note = "GEMINI in-memory checkpoints; chaoskit's agent publishes each restart (0.2.0 ships no manager)"
    run_class = LmResiliencyRun

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        script = (folder / SCRIPT).resolve()
        if not script.is_file():
            raise CannotRun(f"no lm-resiliency training job: {script} is missing")
        w = doc["workload"]
        if w.get("launch", "reference") != "reference":
            raise CannotRun(f"the column runs its own job (lm-resiliency/train.py), not launch: {w['launch']}")
        # the row's job, as lm-resiliency's example writes it: its pace, its collective timeout, its length
        step_time = parse_duration(w.get("step_time", 0.1))
        command = [str(script), "--steps", str(w.get("steps", 100)), "--step-time", f"{step_time:g}",
                   "--collective-timeout", f"{parse_duration(w.get('collective_timeout', 30)):g}"]
        doc["cluster"] = {**doc["cluster"], "kind": row_kind(doc)} if isinstance(doc.get("cluster"), dict) else doc["cluster"]
        if isinstance(doc["cluster"], dict) and doc["cluster"].get("nodes", 2) * w.get("nproc_per_node", 1) % 2:
            # GEMINI pairs each rank with a peer: its ChunkedGlooBackend refuses an odd world ("world_size (3) must
            # be divisible by 2 * replication_jump (2)", lm_resiliency/checkpointing/replication.py), so one node more
            doc["cluster"] = {**doc["cluster"], "nodes": doc["cluster"].get("nodes", 2) + 1}
        doc["workload"] = {"launch": "command", "recovery": self.name, "command": command,
                           **{k: w[k] for k in ("steps", "nproc_per_node", "max_restarts", "collective_timeout")
                              if k in w}}  # the row's collective timeout, as the job runs it (its timeouts say so)
        doc["probes"] = {"presets": ["torchrun", "lm-resiliency"],
                         "log": [{"match": r"step (?P<step>\d+) rank 0 ", "event": "step"}]}
        return doc

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        return {"lm-resiliency join timeout": f"{JOIN_TIMEOUT_MS // 1000}s (an agent's wait for its generation)"}, []


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
