"""A plain DDP training script as PyTorch's tutorial writes one ("Fault-tolerant Distributed Training with torchrun",
multigpu_torchrun.py), counted in steps instead of epochs: it knows nothing of chaoskit and reports only through its
prints. Runs on CPU (gloo) when there is no GPU. torchrun --nproc-per-node 2 ddp_tutorial.py --steps 200

chaoskit init reads what it prints (tests/test_init_script_scan.py drills it with the scenario init writes).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, save_every, snapshot_path, step_time):
        self.rank = int(os.environ["RANK"])
        self.device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.step_time = step_time
        self.steps_run = 0
        print(f"[RANK{self.rank}] starting worker pid {os.getpid()}", flush=True)
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]
        print(f"[RANK{self.rank}] Resuming training from snapshot at Step {self.steps_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _save_snapshot(self, step):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "STEPS_RUN": step}
        tmp = f"{self.snapshot_path}.tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Step {step} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_steps):
        gen = torch.Generator().manual_seed(self.rank)
        for step in range(self.steps_run + 1, max_steps + 1):
            t0 = time.monotonic()
            source = torch.randn(16, 32, generator=gen).to(self.device)
            loss = self._run_batch(source, source.sum(dim=1, keepdim=True))
            time.sleep(max(0.0, self.step_time - (time.monotonic() - t0)))
            print(f"[RANK{self.rank}] Step {step} loss {loss.item():.4f}", flush=True)
            if self.rank == 0 and step % self.save_every == 0:
                self._save_snapshot(step)


def main():
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--steps", type=int, default=200, help="total steps to train the model")
    parser.add_argument("--save-every", type=int, default=20, help="how often to save a snapshot")
    parser.add_argument("--step-time", type=float, default=0.05, help="seconds per step at least")
    parser.add_argument("--snapshot-path", default="snapshot.pt")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), args.save_every, args.snapshot_path,
                      args.step_time)
    trainer.train(args.steps)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
