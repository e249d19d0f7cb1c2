"""A small PyTorch DDP training job with no chaoskit import at all.

Run under torchrun. It says what it does only through its own prints, the way
most real jobs do, so chaoskit can measure it through log-regex probes alone
(``scenarios/kill-uninstrumented.yaml``). :mod:`chaoskit.workloads.ddp_train`
is the same job with SDK hooks.

Checkpoints are written atomically (temp file + rename) into a shared folder by
rank 0 and every rank resumes from the newest one on (re)start.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import sys
import time


class Hooks:
    """Where the job reports progress. The default prints; the SDK version emits events."""

    def worker_start(self, rank: int, world: int, restart: int) -> None:
        print(f"[rank {rank}] worker started pid={os.getpid()} restart={restart} world_size={world}", flush=True)

    def rendezvous_done(self, rank: int, world: int) -> None:
        print(f"[rank {rank}] process group ready world_size={world}", flush=True)

    def load(self, rank: int, path: str):  # returns a context manager
        return _PrintLoad(rank, path)

    def save(self, rank: int, step: int):
        return _PrintSave(rank, step)

    def step(self, rank: int, step: int, loss: float) -> None:
        print(f"[rank {rank}] step {step} loss {loss:.4f}", flush=True)

    def collective_error(self, rank: int, exc: BaseException) -> None:
        print(f"[rank {rank}] collective failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)


class _PrintLoad:
    def __init__(self, rank: int, path: str) -> None:
        self.rank, self.path, self.info = rank, path, {}

    def __enter__(self):
        return self.info

    def __exit__(self, *exc):
        if exc[0] is None:
            print(f"[rank {self.rank}] Resuming training from snapshot at step {self.info.get('step')}", flush=True)


class _PrintSave:
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step, self.info = rank, step, {}

    def __enter__(self):
        return self.info

    def __exit__(self, *exc):
        if exc[0] is None:
            print(f"[rank {self.rank}] saved snapshot at step {self.step}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-time", type=float, default=0.05, help="minimum seconds per step")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHAOSKIT_CKPT_DIR", "checkpoints"))
    p.add_argument("--collective-timeout", type=float, default=30.0, help="seconds (torch's default is 30 min)")
    p.add_argument("--hidden", type=int, default=64)
    return p.parse_args(argv)


def newest_checkpoint(folder: str) -> str | None:
    paths = sorted(glob.glob(os.path.join(folder, "ckpt-*.pt")))
    return paths[-1] if paths else None


def train(args: argparse.Namespace, hooks: Hooks) -> int:
    env = os.environ
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    hooks.worker_start(rank, world, int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{int(env.get('LOCAL_RANK', '0'))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    hooks.rendezvous_done(rank, world)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = newest_checkpoint(args.checkpoint_dir)
    if path:
        with hooks.load(rank, path) as info:
            state = torch.load(path, map_location=device, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = int(state["step"])
            info["step"] = start
            info["bytes"] = os.path.getsize(path)
    ddp = DDP(model)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, args.steps + 1):
        t0 = time.monotonic()
        x = torch.randn(16, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # the gradient all-reduce: where a dead or hung peer is noticed
        except Exception as exc:  # noqa: BLE001 - any collective failure ends this worker
            hooks.collective_error(rank, exc)
            return 1
        opt.step()
        rest = args.step_time - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        hooks.step(rank, step, loss.item())
        if rank == 0 and step % args.checkpoint_every == 0:
            _save(args.checkpoint_dir, step, model, opt, hooks, rank)
    dist.destroy_process_group()
    if rank == 0:
        print(f"[rank {rank}] training finished at step {args.steps}", flush=True)
    return 0


def _save(folder, step, model, opt, hooks, rank) -> None:
    import torch

    final = os.path.join(folder, f"ckpt-{step:08d}.pt")
    tmp = f"{final}.tmp.{os.getpid()}"
    with hooks.save(rank, step) as info:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)  # atomic: a reader sees the whole file or none
        info["bytes"] = os.path.getsize(final)
    for old in sorted(glob.glob(os.path.join(folder, "ckpt-*.pt")))[:-3]:
        os.unlink(old)


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(argv), Hooks())


if __name__ == "__main__":
    sys.exit(main())
