"""A DDP job under lm-resiliency, small enough for a CPU: two ranks (gloo) train a residual MLP whose blocks are
``model.layers`` (SCOUT's replay looks for repeated layers), with GEMINI's in-memory checkpoint taken every step
and replicated to the peer rank. It prints ``step N`` each step, and on a successor generation the step the
manager chose and GEMINI restored.

Why it calls ``enable_resiliency`` itself instead of letting the rendezvous backend attach it (the
``lm_resiliency_worker_config`` policy): the automatic attachment forms SCOUT's peer groups with
``dist.new_group(backend="nccl")`` (lm_resiliency/detection/peer_group.py, form_detection_groups), which a
CPU build of torch refuses ("Distributed package doesn't have NCCL built in") even with detection off, since
GEMINI alone asks for the groups too (lm_resiliency/_feature_wiring.py). Given two gloo groups, GEMINI runs on
CPU. SCOUT (``--detect``) runs too but on CPU flags every step (``SCOUT fault at step N: sdc=[0, 0],
straggler=[0, 0]``, no rank named) and so skips every checkpoint capture: leave it off here.

    python torchrun_lmr.py --nnodes=1:1 --nproc-per-node=2 --max-restarts=3 --monitor-interval=0.1 \
        --rdzv-backend=lm_resiliency --rdzv-endpoint=127.0.0.1:29440 --rdzv-id=lmr-demo \
        --rdzv-conf=store_type=tcp,read_timeout=60,lm_resiliency_restart_context_path=$PWD/ctx/context.json \
        train.py --steps 80
    python manager.py --endpoint 127.0.0.1:29440 --run-id lmr-demo --agent-pid <torchrun_lmr.py's pid>
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from lm_resiliency import InMemoryCkptConfig
from lm_resiliency.integrations.pytorch import enable_resiliency
from lm_resiliency.integrations.torchrun import get_torchrun_worker_context
from torch.nn.parallel import DistributedDataParallel


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


class Net(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--collective-timeout", type=float, default=30.0, help="gloo's timeout of one collective (s)")
    # under chaoskit (recovery: lm-resiliency) its checkpoint folder, where the agent looks for GEMINI's flushes
    ap.add_argument("--checkpoints", default=os.environ.get("CHAOSKIT_CKPT_DIR", "checkpoints"),
                    help="GEMINI's node-local folder (its flushes)")
    ap.add_argument("--detect", action="store_true", help="SCOUT's replay detection too (see the docstring)")
    args = ap.parse_args(argv)
    # lm-resiliency's own INFO/WARNING lines (restore, flush, SCOUT) are what a reader of this job's log needs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    timeout = timedelta(seconds=args.collective_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    # the decision the manager published for this generation (generation 0: none)
    context = get_torchrun_worker_context()
    print(f"rank {rank} generation {context.generation} checkpoint_step {context.checkpoint_step}", flush=True)
    # GEMINI's group and SCOUT's "nccl" group, both gloo (see the docstring); made collectively, in this order
    group, replay_group = (dist.new_group(backend="gloo", timeout=timeout), dist.new_group(backend="gloo", timeout=timeout))
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(args.width, depth=4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recovery = {}
    if context.checkpoint_step is not None:
        recovery = {"recovery_mode": context.recovery_mode, "_recovery_step": context.checkpoint_step,
                    "_expected_topology_id": context.topology_digest}
    Path(args.checkpoints).mkdir(parents=True, exist_ok=True)
    # every step in memory (and to the peer); to disk only when a worker is told to stop (SIGTERM, exit): GEMINI's
    # flush of its own shard and of the peer's replica, which a successor generation reloads
    checkpoint = InMemoryCkptConfig(enable=True, interval=1, disk_flush_interval=0, disk_folder=args.checkpoints)
    handle = enable_resiliency(model, optimizer, interval=1, enable_detection=args.detect, checkpoint=checkpoint,
                               group=group, nccl_group=replay_group, device=torch.device("cpu"), **recovery)
    if rank == 0 and context.generation == 0:
        # the manager's restart plan must carry GEMINI's topology digest, which only the job knows
        Path(args.checkpoints, "topology.json").write_text(json.dumps({"topology_id": handle.ckpt_manager.topology_id}))
    print(f"rank {rank} starting at step {handle.step_count}", flush=True)
    data = torch.Generator().manual_seed(rank)
    for step in range(handle.step_count, args.steps):
        x = torch.randn(8, args.width, generator=data)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()  # GEMINI's hook: the in-memory checkpoint of this step, replicated to the peer
        print(f"step {step} rank {rank} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_time)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # SCOUT's daemon is started with multiprocessing's spawn, which imports this file
    raise SystemExit(main())
