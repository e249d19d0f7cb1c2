"""A Lightning job as its users write it, small enough for a CPU: a small MLP on synthetic data, a checkpoint
every N steps (``ModelCheckpoint(every_n_train_steps=N, save_last=True)``), and restart-safe the usual way:
``trainer.fit(model, ckpt_path="last")`` resumes from ``last.ckpt`` when there is one.

The one line chaoskit needs is the callback (``callbacks=[ChaoskitCallback()]``); ``--no-callback`` runs the
job unchanged, to be measured by the ``lightning`` log preset alone.

    torchrun --nproc-per-node 2 lightning_train.py --steps 60 --checkpoint-every 10 --checkpoint-dir ckpt
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Net(pl.LightningModule):
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.step_time, self.t = step_time, time.monotonic()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        rest = self.step_time - (time.monotonic() - self.t)  # a real step takes this long
        if rest > 0:
            time.sleep(rest)
        self.t = time.monotonic()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--checkpoint-dir", default=os.environ.get("CHAOSKIT_CKPT_DIR", "lightning-ckpt"))
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--no-callback", action="store_true", help="run unchanged: the lightning log preset measures it")
    args = ap.parse_args(argv)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    callbacks: list[pl.Callback] = [ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.checkpoint_every,
                                                    save_top_k=-1, save_last=True)]
    if not args.no_callback:
        from chaoskit.integrations.lightning import ChaoskitCallback

        callbacks.append(ChaoskitCallback())  # the one line chaoskit needs
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
        strategy="ddp" if world > 1 else "auto", callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, max_epochs=-1,
    )
    last = os.path.join(args.checkpoint_dir, "last.ckpt")
    trainer.fit(Net(args.step_time), torch.utils.data.DataLoader(data, batch_size=8),
                ckpt_path="last" if os.path.exists(last) else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
