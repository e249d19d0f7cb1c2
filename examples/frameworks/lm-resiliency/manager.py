"""The manager lm-resiliency's torchrun backend waits for, at its smallest: one node, same-node restarts.

lm-resiliency 0.2.0 ships the pieces of a manager (TorchrunRecoveryCoordinator, TorchrunRecoveryRequest) but no
manager: its rendezvous handler never restarts a worker group by itself. After a worker dies, torchrun's agent
asks the handler for the next rendezvous, and the handler waits for a successor generation that a manager
publishes (lm_resiliency/integrations/torchrun/_simple_runtime.py, next_rendezvous); with none it gives up after
lm_resiliency_join_timeout_ms (300 s by default) with "RendezvousTimeoutError: timed out waiting for a
manager-owned successor generation" and torchrun exits 1. lm-resiliency's own examples run a campaign controller
that plays this part (examples/torchrun/resiliency_cycle in its repository, GPUs only).

This one watches the agent's worker processes. When the whole group is gone and the agent has not entered
torchrun's exit barrier within ``--grace`` seconds (it does so only for a group that succeeded: its
``torchelastic/agent/terminal_state`` key in the generation's store), it publishes the next generation on the
same node: GEMINI's newest step that every rank's shard reached the node's disk (the survivors flush their
own shard and the replica they hold of the dead rank's when torchrun stops them), and the GEMINI topology the
job wrote. Its lines: ``manager: published generation G checkpoint_step S``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

from lm_resiliency.integrations.torchrun import TorchrunRecoveryCoordinator, TorchrunRecoveryRequest
from torch.distributed import DistNetworkError, TCPStore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="the rendezvous endpoint (host:port) the agent serves")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--agent-pid", type=int, required=True, help="the torchrun agent whose workers to watch")
    ap.add_argument("--nproc-per-node", type=int, default=2)
    ap.add_argument("--checkpoints", default="checkpoints", help="the job's GEMINI folder (train.py --checkpoints)")
    ap.add_argument("--grace", type=float, default=1.0)
    args = ap.parse_args(argv)
    host, port = args.endpoint.rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    coordinator = TorchrunRecoveryCoordinator(store, run_id=args.run_id)
    try:
        _manage(coordinator, store, args)
    except (DistNetworkError, RuntimeError):
        if _alive(args.agent_pid):
            raise
        # the agent hosted the store: it is gone, and the plan's lease renewal failed with it
    finally:
        try:
            coordinator.close()  # stops renewing the last plan's lease
        except (DistNetworkError, RuntimeError):
            pass
    print("manager: the agent has ended", flush=True)
    return 0


def _manage(coordinator: TorchrunRecoveryCoordinator, store: TCPStore, args: argparse.Namespace) -> None:
    while (placement := coordinator.initial_placement(active_node_count=1, allocated_node_count=1)) is None:
        time.sleep(0.2)
    active, generation = placement.active_node_ids, 0
    print(f"manager: generation 0 on {len(active)} node(s)", flush=True)
    watched: set[int] = set()
    while _alive(args.agent_pid):
        workers = _children(args.agent_pid)
        if workers:
            watched = workers
        elif watched and _failed(store, args.run_id, generation, args.agent_pid, args.grace):
            step = _newest_complete_step(Path(args.checkpoints), args.nproc_per_node)
            topology = json.loads(Path(args.checkpoints, "topology.json").read_text())["topology_id"]
            request = TorchrunRecoveryRequest(
                plan_id=uuid.uuid4().hex, intent_id=uuid.uuid4().hex, reason_code="worker_exit",
                recovery_mode="latest", checkpoint_source="gemini", checkpoint_step=step,
                checkpoint_manifest_id=f"gemini-step-{step}", topology_digest=topology,
                restart_deadline_unix_ms=time.time_ns() // 1_000_000 + 120_000)
            successor = coordinator.publish_successor(
                generation=generation, active_node_ids=active, quarantined_node_ids=(), request=request,
                local_world_size=args.nproc_per_node)
            generation, active = successor.generation, successor.active_node_ids
            print(f"manager: published generation {generation} checkpoint_step {step}", flush=True)
            watched = set()
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:  # a zombie (exited, not yet reaped by whoever started it) is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


def _failed(store: TCPStore, run_id: str, generation: int, pid: int, grace: float) -> bool:
    """The worker group of ``generation`` is gone and its agent is waiting for a successor, not finishing."""
    # lm-resiliency 0.2.0's store layout (_simple_runtime.SimpleRecoveryPlanStore, next_rendezvous): the agent's
    # store of a generation is PrefixStore("<prefix>/bootstrap/<generation>/"), where torchrun's exit barrier
    # counts its members (PrefixStore joins with one more "/")
    prefix = f"lm_resiliency/simple/v1/runs/{hashlib.sha256(run_id.encode()).hexdigest()}"
    finished = f"{prefix}/bootstrap/{generation}//torchelastic/agent/terminal_state/num_members"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if not _alive(pid) or _children(pid) or store.check([finished]):
                return False
        except DistNetworkError:
            return False  # the agent, which serves the store, is exiting
        time.sleep(0.1)
    return True


def _newest_complete_step(folder: Path, world_size: int) -> int:
    newest = -1
    for step_dir in folder.glob("runs/*/*/step-*"):
        match = re.fullmatch(r"step-(\d+)", step_dir.name)
        if match and all((step_dir / f"rank-{rank}.pt").exists() for rank in range(world_size)):
            newest = max(newest, int(match.group(1)))
    return newest


if __name__ == "__main__":
    raise SystemExit(main())
