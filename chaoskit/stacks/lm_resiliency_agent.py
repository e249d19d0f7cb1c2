"""Each node's agent under ``recovery: lm-resiliency``: torchrun, with lm-resiliency's rendezvous backend registered
and a same-node manager in it. Run as ``python -m chaoskit.stacks.lm_resiliency_agent <torchrun's arguments>``, by the
job's Python (where lm-resiliency is installed); nothing of chaoskit's is imported.

Two things lm-resiliency 0.2.0 leaves to its user (examples/frameworks/lm-resiliency/README.md):

- its ``torchrun.handlers`` entry point names ``create_rendezvous_handler``, which torchrun calls with no argument
  (torch/distributed/elastic/rendezvous/registry.py): torchrun then says the backend is not registered. Its
  ``get_rendezvous_handler_creator()`` is registered here instead;
- it ships no manager: after a worker dies, the agent asks the handler for the next rendezvous and the handler
  waits for a successor generation published by a manager (``_simple_runtime.SimpleRendezvousHandler.
  next_rendezvous``), else gives up after ``lm_resiliency_join_timeout_ms``. Here the agent publishes it itself the
  moment it asks again, which torchrun does only for a failed worker group (or a membership change, which needs a
  plan first): the same nodes, GEMINI's newest step that every rank's shard reached the checkpoint folder
  (``CHAOSKIT_CKPT_DIR``, the job's ``InMemoryCkptConfig.disk_folder``, one folder every node reaches) once the
  flushes have stopped, with the GEMINI topology the job wrote to ``topology.json`` there. When several agents ask
  at once, the first publishes and the rest find it done.

It prints ``[lm-resiliency manager] published generation G checkpoint_step S``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from typing import Any

CKPT_ENV = "CHAOSKIT_CKPT_DIR"
RESTART_DEADLINE_S = 120.0
"""How long a published restart plan stays valid for the agents to form its generation."""


def newest_complete_step(folder: Path, world_size: int) -> int:
    """GEMINI's newest step in ``folder`` (``runs/<run>/<topology>/step-N/rank-R.pt``) with every rank's shard, or -1."""
    newest = -1
    for step_dir in folder.glob("runs/*/*/step-*"):
        match = re.fullmatch(r"step-(\d+)", step_dir.name)
        if match and all((step_dir / f"rank-{rank}.pt").exists() for rank in range(world_size)):
            newest = max(newest, int(match.group(1)))
    return newest


def settled_step(folder: Path, world_size: int, quiet_s: float = 1.0, limit_s: float = 30.0) -> int:
    """:func:`newest_complete_step` once the flushes have stopped: no shard written for ``quiet_s`` (the ranks of
    other nodes flush when their own agents stop them, maybe after this agent asked), at most ``limit_s``."""
    deadline, last, quiet_since = time.monotonic() + limit_s, None, time.monotonic()
    while time.monotonic() < deadline:
        files = sorted(str(p) for p in folder.glob("runs/*/*/step-*/rank-*.pt"))
        if files != last:
            last, quiet_since = files, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
        time.sleep(0.1)
    return newest_complete_step(folder, world_size)


def _publish_successor(handler: Any, params: Any) -> None:
    from lm_resiliency.integrations.torchrun import TorchrunRecoveryCoordinator, TorchrunRecoveryRequest

    folder = Path(os.environ.get(CKPT_ENV, "checkpoints"))
    local_world_size = _nproc_per_node()
    coordinator = TorchrunRecoveryCoordinator(handler._store, run_id=params.run_id)  # the handler's own store
    placement = coordinator.initial_placement(active_node_count=params.min_nodes, allocated_node_count=params.max_nodes)
    generation = coordinator.current_generation
    if placement is None or handler._last_generation is None or generation > handler._last_generation:
        return  # not formed yet, or another agent already published the next generation
    step = settled_step(folder, params.min_nodes * local_world_size)
    topology = json.loads((folder / "topology.json").read_text())["topology_id"]
    request = TorchrunRecoveryRequest(
        plan_id=uuid.uuid4().hex, intent_id=uuid.uuid4().hex, reason_code="worker_exit", recovery_mode="latest",
        checkpoint_source="gemini", checkpoint_step=step, checkpoint_manifest_id=f"gemini-step-{step}",
        topology_digest=topology, restart_deadline_unix_ms=time.time_ns() // 1_000_000 + int(RESTART_DEADLINE_S * 1000))
    try:
        successor = coordinator.publish_successor(
            generation=generation, active_node_ids=placement.active_node_ids, quarantined_node_ids=(),
            request=request, local_world_size=local_world_size)
    except RuntimeError as exc:  # another agent's plan won (stale generation, or its create-once key taken)
        print(f"[lm-resiliency manager] generation {generation + 1} published by another agent ({exc})", flush=True)
        return
    print(f"[lm-resiliency manager] published generation {successor.generation} checkpoint_step {step}", flush=True)


def _nproc_per_node() -> int:
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg.startswith("--nproc-per-node=") or arg.startswith("--nproc_per_node="):
            return int(arg.split("=", 1)[1])
        if arg in ("--nproc-per-node", "--nproc_per_node") and i + 1 < len(args):
            return int(args[i + 1])
    return 1


def create_handler(params: Any) -> Any:
    """lm-resiliency's handler, whose every ``next_rendezvous`` after the first publishes the successor first."""
    from lm_resiliency.integrations.torchrun import get_rendezvous_handler_creator

    handler = get_rendezvous_handler_creator()(params)
    first = handler.next_rendezvous

    def next_rendezvous():
        if handler._last_generation is not None:  # a failed worker group: torchrun asks for the next world
            _publish_successor(handler, params)
        return first()

    handler.next_rendezvous = next_rendezvous
    return handler


def run() -> int:
    """torchrun's main with the backend registered (lm-resiliency and torch are imported here: the job's Python has
    them, chaoskit's need not)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main

    rendezvous_handler_registry.register("lm_resiliency", create_handler)
    main()
    return 0


if __name__ == "__main__":
    sys.exit(run())
