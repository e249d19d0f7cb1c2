"""``recovery: torchft``: every node is one torchft replica group with a torchrun world of its own; chaoskit starts
torchft's lighthouse beside the first node's agent and gives each group ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``
and ``TORCHFT_LIGHTHOUSE``. Survivors drop a dead group from the quorum and carry on; the restarted group heals
from a peer (:func:`measure_torchft`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

from chaoskit.measure import (DETECT_KINDS, detection_sources, phase_uncertainty, span, steps_before, time_error,
                              who_noticed)
from chaoskit.observe.presets import Preset
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import CannotRun, Stack, StackRun, ranks_to_nodes, row_kind

__all__ = ["measure_torchft", "TORCHFT_SOURCE", "TORCHFT_DETECT_SOURCES", "TORCHFT_PRESET", "Torchft", "TorchftRun",
           "TORCHFT_SCRIPT"]

TORCHFT_SCRIPT = Path("..") / "frameworks" / "torchft_train.py"
"""The scorecard's torchft column's job, relative to the rows' folder (examples/frameworks/torchft_train.py beside
examples/scorecard/); a folder without it gets "cannot run here" in that column."""


# torchft/manager.py _ManagerLogger.prefix: f"[{replica_id}/{group_rank} - step {current_step}] {msg}", where
# replica_id is the job's id plus a uuid ("train_ddp_1:6de461db-...") and the step the manager's current one
_TORCHFT = r"\[[^\]/]*/(?P<group_rank>\d+) - step (?P<at_step>\d+)\] "

TORCHFT_PRESET = Preset("torchft", (
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


class TorchftRun(StackRun):
    def __init__(self, stack: Stack, job: Any) -> None:
        super().__init__(stack, job)
        self.lighthouse_port = _free_port()
        self.lighthouse: subprocess.Popen[bytes] | None = None

    def world(self, node: str) -> list[str]:
        # a replica group: a world of its own, its rendezvous on the node's own loopback
        return ["--nnodes", "1:1", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", f"{self.job.run_id}-{node}",
                "--rdzv-conf", "is_host=true"]

    def env_owned(self, node: str, plan: bool = False) -> dict[str, str]:
        # what torchft's Manager reads (torchft/manager.py) to join the lighthouse's quorum
        cluster = self.job.cluster
        group = cluster.job_nodes.index(node) if node in cluster.job_nodes else cluster.agent_nodes.index(node)
        return {"REPLICA_GROUP_ID": str(group), "NUM_REPLICA_GROUPS": str(len(cluster.job_nodes)),
                "TORCHFT_LIGHTHOUSE": f"http://{cluster.rdzv_host}:{self.lighthouse_port}"}

    def lighthouse_argv(self) -> list[str]:
        """torchft's lighthouse (the ``torchft_lighthouse`` console script beside the job's Python): a quorum as
        soon as one group is there, stragglers awaited 1 s, a group silent 5 s is dead (torchft's default)."""
        cluster = self.job.cluster
        script = Path(cluster.python or sys.executable).with_name("torchft_lighthouse")
        return [str(script), "--min_replicas", "1", "--join_timeout_ms", "1000", "--quorum_tick_ms", "100",
                "--bind", f"{cluster.rdzv_host}:{self.lighthouse_port}"]

    def side_commands(self) -> dict[str, list[str]]:
        return {f"{self.job.cluster.agent_nodes[0]} (torchft lighthouse)": self.lighthouse_argv()}

    def start(self) -> list[subprocess.Popen[bytes]]:
        if self.lighthouse is not None:
            return []
        # its log has a few lines a step per group; only its quorum changes go to the probes (the torchft preset)
        self.lighthouse = self.job.start_beside(self.job.cluster.agent_nodes[0], self.lighthouse_argv(), "lighthouse",
                                                only="Detected quorum change")
        return [self.lighthouse]


_SOURCE = "torchft"
"""The ``source`` of the ``torchft`` preset's events from torchft's manager."""


def _lighthouse(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
                pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    # torchft's src/lighthouse.rs: "Detected quorum change, bumping quorum_id to N"; it names no member: the group
    # that left is one that trained before and whose manager did not log "reconfiguring for quorum_id=N"
    quorum = e.get("quorum_id")
    groups = {x.get("node") for x in timeline[:i] if x.get("source") == _SOURCE and x.get("node") is not None
              and x.get("kind") in ("step", "rendezvous.done", "step.discarded")}
    stayed = {x.get("node") for x in timeline if x.get("kind") == "rendezvous.done" and x.get("source") == _SOURCE
              and x.get("quorum_id") == quorum}
    if quorum is None or not stayed:
        return None  # nobody reconfigured for it yet: which group left is not known
    left = sorted(g for g in groups - stayed if g is not None)
    via = (f"quorum {quorum}: {', '.join(sorted(n for n in stayed if n))} reconfigured for it, "
           f"{', '.join(left) or 'no group'} did not")
    return {"by": e.get("who") or "torchft lighthouse", "words": f"Detected quorum change, bumping quorum_id to {quorum}",
            "parties": [{"rank": None, "node": n} for n in left], "via": via}


TORCHFT_SOURCE = "torchft"
"""The ``source`` of the ``torchft`` preset's events from torchft's manager (the lighthouse's is its own)."""
TORCHFT_DETECT_SOURCES = frozenset({TORCHFT_SOURCE, "torchft lighthouse"})
"""Who notices a dead replica group in the torchft model: a survivor's failed collective (torchft's manager)
or the lighthouse dropping the group from the quorum once it stopped heartbeating."""


def measure_torchft(events: Iterable[dict[str, Any]], t_fault: float, t_fault_uncertainty: float = 0.0,
                    node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """Measure a torchft job's recovery from a fault to the replica group on ``node`` (docs/architecture.md,
    "Recovery models"): no restart of the world, so the phases are torchft's own.

    - detection: ``t_fault`` to the first sign torchft noticed: a survivor's collective error (``detect`` from
      torchft's manager: "got exception in all reduce") or the lighthouse changing the quorum (the group's
      heartbeat stopped), whichever came first;
    - reallocation: to the first survivor reconfigured for a new quorum after the fault (``rendezvous.done``:
      "reconfiguring for quorum_id=N"); 0 when the lighthouse's new quorum was the detection and the survivor took
      it at once (torchft has no reallocation apart from the quorum);
    - checkpoint load: the restarted group's heal from a peer, ``healing required`` (``ckpt.load.start``) to
      ``Loaded state dict.`` (``ckpt.load.end``), both on ``node``;
    - recovery: ``t_fault`` to the healed group's first committed step (the job at full strength again);
    - lost work: the steps the survivors discarded (``step.discarded``: ``should_commit=False``) plus the healed
      group's catch-up: the steps it did not take part in, from the one after its last committed step before the
      fault to the one before the step it healed to (``max_step``, the peers' next step to run, which the group
      runs itself): ``restored_step - 1 - last committed``.

    The keys are :func:`measure_fault`'s, plus ``discarded_steps``, ``catch_up_steps`` and ``healed_group``.
    """
    timeline = sorted(events, key=lambda e: e["ts"])
    after = [e for e in timeline if e["ts"] > t_fault]
    reasons: dict[str, str] = {}

    def survivor(e: dict[str, Any]) -> bool:
        return node is None or e.get("node") != node or e.get("source") == "torchft lighthouse"

    steps_before_fault = [e for e in steps_before(timeline, t_fault, fault_step)
                          if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    last_step_before = max((e["step"] for e in steps_before_fault), default=None)
    group_before = max((e["step"] for e in steps_before_fault if node is None or e.get("node") == node), default=None)

    detect = next((e for e in after if e.get("kind") in DETECT_KINDS and e.get("source") in TORCHFT_DETECT_SOURCES
                   and survivor(e)), None)
    if detect is None:
        reasons["detection"] = ("not observed: no survivor's collective error and no quorum change after the fault "
                                "(the torchft preset and the torchft.manager logger at INFO are needed)")
    t_detect = detect["ts"] if detect else None
    realloc = None
    if t_detect is not None:
        # the first survivor reconfigured after the fault; it may be read a moment before the lighthouse's line that
        # caused it (two pipes, two readers): then the two are one instant, and reallocation is 0
        realloc = next((e for e in after if e.get("kind") == "rendezvous.done" and e.get("source") == TORCHFT_SOURCE
                        and survivor(e)), None)
        if realloc is None:
            reasons["reallocation"] = "not observed: no survivor reconfigured for a new quorum after the detection"
    else:
        reasons["reallocation"] = "not measurable: detection was not observed"

    mine = [e for e in after if node is None or e.get("node") == node]
    heal = next((e for e in mine if e.get("kind") == "ckpt.load.start" and e.get("source") == TORCHFT_SOURCE), None)
    healed = next((e for e in mine if heal is not None and e.get("kind") == "ckpt.load.end"
                   and e.get("source") == TORCHFT_SOURCE and e["ts"] >= heal["ts"]), None)
    if heal is None:
        reasons["checkpoint_load"] = (f"not observed: the group on {node or '?'} never healed from a peer after the "
                                      "fault (no 'healing required' line: did its torchrun restart it?)")
    elif healed is None:
        reasons["checkpoint_load"] = f"not observed: the group on {node or '?'} began healing but never loaded the state dict"
    resumed = next((e for e in mine if healed is not None and e.get("kind") == "step" and e["ts"] >= healed["ts"]), None)
    if resumed is None:
        reasons["recovery"] = f"not observed: the group on {node or '?'} did not commit a step after healing"

    restored_step = healed.get("step") if healed is not None and isinstance(healed.get("step"), int) else None
    if restored_step is None and heal is not None and isinstance(heal.get("step"), int):
        restored_step = heal["step"]  # "healing required ... max_step=N": the step it fetches
    end = resumed["ts"] if resumed is not None else float("inf")
    discarded = sorted({e.get("step") for e in after if e.get("kind") == "step.discarded" and survivor(e)
                        and e["ts"] <= end and isinstance(e.get("step"), int)})
    # restored_step is the next step to run (torchft's max_step), group_before the last one the group committed
    catch_up = (max(0, restored_step - 1 - group_before) if restored_step is not None and group_before is not None
                else None)
    lost = len(discarded) + catch_up if catch_up is not None and resumed is not None else None
    if lost is None:
        reasons["lost_steps"] = ("not observed: " + ("the healed group did not commit a step" if resumed is None else
                                 f"no step of the group on {node or '?'} before the fault" if group_before is None else
                                 "no step the group healed to"))

    detection, reallocation = span(t_fault, detect), span(detect, realloc)
    if reallocation is not None and reallocation < 0:
        reallocation = 0.0
    checkpoint_load, recovery = span(heal, healed), span(t_fault, resumed)
    return {
        "model": "torchft",
        "detection_s": detection,
        "reallocation_s": reallocation,
        "checkpoint_load_s": checkpoint_load,
        "startup_s": None,
        "recovery_s": recovery,
        "lost_steps": lost,
        "discarded_steps": discarded,
        "catch_up_steps": catch_up,
        "healed_group": node,
        "last_step_before": last_step_before,
        "restored_step": restored_step,
        "detected_by": who_noticed(detect),
        "detections": detection_sources(timeline, t_fault),
        "t_fault": t_fault,
        "t_detect": t_detect,
        "t_realloc": realloc["ts"] if realloc else None,
        "t_loaded": healed["ts"] if healed else None,
        "t_resumed": resumed["ts"] if resumed else None,
        "reasons": reasons,
        "uncertainty_s": {
            "detection": phase_uncertainty(detection, t_fault_uncertainty, time_error(detect)),
            "reallocation": phase_uncertainty(reallocation, time_error(detect), time_error(realloc)),
            "checkpoint_load": phase_uncertainty(checkpoint_load, time_error(heal), time_error(healed)),
            "recovery": phase_uncertainty(recovery, t_fault_uncertainty, time_error(resumed)),
        },
    }


class Torchft(Stack):
    name = "torchft"
    log_presets = (TORCHFT_PRESET,)
    blame_readers = {("detect", "torchft lighthouse"): _lighthouse}
    describe = "every node one replica group: survivors drop a dead group from the quorum; it heals from a peer"
    launches = ("command",)
    refusal = ("recovery: torchft is only used with launch: {launches} (chaoskit starts each replica group and the "
               "lighthouse), not launch: {launch}")
    owned_env = ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE")
    every_group_steady = True
    phase_meanings = {"detection": "fault -> a survivor's collective failed or the lighthouse changed the quorum",
                      "reallocation": "noticed -> a survivor reconfigured for the quorum without the dead group",
                      "checkpoint_load": "the restarted group's heal from a peer ('healing required' -> 'Loaded state dict.')",
                      "recovery": "fault -> the healed group's first committed step",
                      "lost_steps": "steps the survivors discarded (should_commit=False) + the healed group's catch-up"}
    result_keys = ("discarded_steps", "catch_up_steps", "healed_group")
    extra = "frameworks"
    requires = "torchft"
    install = "pip install 'chaoskit[frameworks]' (torchft==0.2.0)"
    scorecard_column = "torchft"
    framework = "torchft"
    init_lines = ("  recovery: torchft                    # one replica group per node, torchft's lighthouse, the group's "
                  "torchrun store shared (torchft's Manager finds it at MASTER_ADDR:MASTER_PORT); measured without a "
                  "restart",)
    run_class = TorchftRun

    def measure(self, events: Any, t_fault: float, t_fault_uncertainty: float = 0.0, *, node: str | None = None,
                fault_step: int | None = None) -> dict[str, Any]:
        return measure_torchft(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)

    def lost_work(self, phases: dict[str, Any]) -> str | None:
        discarded, catch_up, restored = (phases.get("discarded_steps"), phases.get("catch_up_steps"),
                                         phases.get("restored_step"))
        return (f"{len(discarded or [])} step(s) discarded by the survivors {discarded or ''}, catch-up of the healed "
                f"group {'?' if catch_up is None else catch_up} (healed to step {'?' if restored is None else restored})")

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        script = (folder / TORCHFT_SCRIPT).resolve()
        if not script.is_file():
            raise CannotRun(f"no torchft training job: {script} is missing")
        row_nodes = doc["cluster"].get("nodes", 3) if isinstance(doc.get("cluster"), dict) else 3
        # one replica group per node, as many as the row's nodes (at least two); a spare has no place in torchft
        doc["cluster"] = {"kind": row_kind(doc), "nodes": max(2, int(row_nodes))}
        w = doc["workload"]
        doc["workload"] = {"launch": "command", "recovery": self.name, "command": [str(script), "--steps", "100000",
                           "--step-time", "0.2"], "steps": 100000, "max_restarts": w.get("max_restarts", 3)}
        doc["probes"] = {"presets": ["torchrun", "torchft"]}
        doc["steady_state"] = {"steps": 10, "timeout": "4m"}
        ranks_to_nodes(doc)
        for fault in doc.get("faults", []):
            if isinstance(fault.get("at"), dict) and "step" in fault["at"]:
                fault["at"] = {"step": 20}  # torchft's steps are 0.2 s: the row's step would be minutes in
        slo = doc.get("slo") or {}
        slo.pop("lost_steps", None)  # the healed group's catch-up is counted in steps of the survivors' pace
        doc["slo"] = slo
        return doc

    def unfit(self, handle: Any) -> str | None:
        if handle.rdzv_host == "127.0.0.1":
            return None
        return ("torchft_train.py's replica groups reach each other's stores at 127.0.0.1 (TORCHFT_STORE_HOST), and "
                f"this cluster's nodes share no loopback (their rendezvous is at {handle.rdzv_host})")

    def share_store(self) -> tuple[bool, str]:
        # each replica group is a torchrun world of one agent: no other agent's rounds to mix, and torchft's
        # Manager looks for a store at MASTER_ADDR:MASTER_PORT (torchft/manager.py), which only a shared one hosts
        return True, ("shared (torchrun's default): torchft's Manager connects to the store at MASTER_ADDR:MASTER_PORT, "
                      "and each replica group is a world of one agent, so no rounds of other agents mix in it")

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        return {"torchft timeout": "10s (torchft_train.py --timeout: a collective, a heal)",
                "torchft lighthouse heartbeat timeout": "5s (torchft's default)",
                "torchft quorum timeout": "60s (torchft's Manager default)"}, []


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
