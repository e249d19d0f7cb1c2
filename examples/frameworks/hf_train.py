"""A Hugging Face Trainer job as its users write it, small enough for a CPU: a 2-layer GPT-2 built from a
config (nothing downloaded), synthetic tokens, checkpoints every N steps, and restart-safe the usual way:
``get_last_checkpoint(output_dir)`` picks up where the last run stopped.

The one line chaoskit needs is the callback (``callbacks=[ChaoskitCallback()]``); ``--no-callback`` runs the
job unchanged, to be measured by the ``hf`` log preset alone (with ``TRANSFORMERS_VERBOSITY=info``).

    torchrun --nproc-per-node 2 hf_train.py --steps 60 --checkpoint-every 10 --output-dir out
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    """Random token ids, the same on every rank and every restart (seeded)."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """Hold each step to at least ``seconds`` so that a drill has time to act (a real step takes that long)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.t = seconds, time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        rest = self.seconds - (time.monotonic() - self.t)
        if rest > 0:
            time.sleep(rest)
        self.t = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--output-dir", default=os.environ.get("CHAOSKIT_CKPT_DIR", "hf-out"))
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--no-callback", action="store_true", help="run unchanged: the hf log preset measures it")
    args = ap.parse_args(argv)

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, save_steps=args.checkpoint_every,
        per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=args.checkpoint_every,
        report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,  # the progress bar on: the hf preset reads it
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    callbacks: list[TrainerCallback] = [Pace(args.step_time)]
    if not args.no_callback:
        from chaoskit.integrations.hf import ChaoskitCallback

        callbacks.append(ChaoskitCallback())  # the one line chaoskit needs
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(256, 16, 64), callbacks=callbacks)
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
