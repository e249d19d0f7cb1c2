"""A torchft job as its users write it, small enough for a CPU: every node is one replica group (its own
torchrun, one worker here) that trains a small MLP with torchft's fault-tolerant DDP over gloo, coordinated by
torchft's lighthouse. When a group dies the survivors drop it from the quorum and carry on; its torchrun starts
it again and it heals (fetches the current weights from a survivor) and rejoins. No restart of the survivors, no
checkpoint on disk: chaoskit measures it with its torchft recovery model and the ``torchft`` log preset (this
job is not touched: torchft's own INFO lines are all chaoskit reads).

What torchft needs from the launcher (chaoskit's ``workload.recovery: torchft`` sets it, as torchft's own
examples do by hand): ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` (the address of
``torchft_lighthouse --min_replicas 1``).

    torchft_lighthouse --min_replicas 1 --join_timeout_ms 1000 &
    REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 torchrun torchft_train.py
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from datetime import timedelta

import torch
from torch.distributed import TCPStore
from torchft import Manager, Optimizer, ProcessGroupGloo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=1024, help="width of the MLP's hidden layers")
    ap.add_argument("--timeout", type=float, default=10.0, help="torchft's timeout of one collective and of a heal")
    args = ap.parse_args(argv)
    # the verbosity the torchft preset needs: torchft.manager's INFO lines (quorum, heal, commit)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "1"))
    torch.manual_seed(0)  # every group starts from the same weights (init_sync=False below)
    # ~2M parameters (8 MB): a heal moves them from a survivor over HTTP, as it moves a real model's
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
                                torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    # one worker per group: the group's own store (torchrun's is not shared with the workers in this lab). The
    # quorum hands its address to the other groups, so 127.0.0.1 serves groups on one host (the process lab);
    # across hosts, give it the node's own address (TORCHFT_STORE_HOST)
    host = os.environ.get("TORCHFT_STORE_HOST", "127.0.0.1")
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=args.timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
        state_dict=state_dict, replica_id=f"train_ddp_{group}", timeout=timeout, rank=0, world_size=1,
        store_addr=host, store_port=store.port, init_sync=False,
    )
    optimizer = Optimizer(manager, inner)
    g = torch.Generator().manual_seed(group)
    print(f"replica group {group} of {groups} starting at step {manager.current_step()}", flush=True)
    t = time.monotonic()
    while manager.current_step() < args.steps:
        x = torch.randn(8, 16, generator=g)
        optimizer.zero_grad()  # starts the quorum for this step
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        # The gradients averaged across the groups of the quorum with torchft's own allreduce. Not through
        # torchft.DistributedDataParallel: in torchft 0.2.0 its comm hook (torchft/ddp.py _comm_hook) asserts
        # the future a failed allreduce leaves unset, so a survivor dies of AssertionError when a peer group dies
        # mid-collective (seen here), where Manager.allreduce reports the error and the step is not committed.
        for p in model.parameters():
            manager.allreduce(p.grad).wait()
        optimizer.step()  # should_commit: the step counts only if every group of the quorum finished it
        rest = args.step_time - (time.monotonic() - t)
        if rest > 0:
            time.sleep(rest)
        t = time.monotonic()
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
