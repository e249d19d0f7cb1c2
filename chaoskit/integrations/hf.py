"""The Hugging Face Trainer reporting to chaoskit: ``Trainer(..., callbacks=[ChaoskitCallback()])``.

Per rank (every process runs its callbacks): ``worker.start`` when the Trainer is built; when training begins
after a resume (``trainer.train(resume_from_checkpoint=...)``: the model, optimizer and trainer state are loaded
by then) ``ckpt.load.end`` with the restored global step; ``step`` after every optimizer step; ``ckpt.save.end``
after every checkpoint (``checkpoint-N``); ``detect`` with the exception that stops the rank. A no-op when
``CHAOSKIT_EVENTS`` is unset. Imports ``transformers`` (this module only; ``import chaoskit`` does not).
"""

from __future__ import annotations

from transformers import TrainerCallback

from chaoskit.integrations._common import report_failures
from chaoskit.sdk import probe

__all__ = ["ChaoskitCallback"]


class ChaoskitCallback(TrainerCallback):
    """Report a ``transformers.Trainer``'s worker start, restore, steps and saves as chaoskit SDK events."""

    def __init__(self) -> None:
        self._started = False
        self._loaded = False

    def on_init_end(self, args, state, control, **kwargs):
        if not self._started:
            self._started = True
            probe.worker_start(source="hf")
            report_failures("hf")

    def on_train_begin(self, args, state, control, **kwargs):
        self.on_init_end(args, state, control)
        if state.global_step > 0 and not self._loaded:
            # train(resume_from_checkpoint=...) restored the model, the optimizer and this state before this call
            self._loaded = True
            probe.emit("ckpt.load.end", step=int(state.global_step), source="hf")

    def on_step_end(self, args, state, control, **kwargs):
        probe.step(int(state.global_step), source="hf")

    def on_save(self, args, state, control, **kwargs):
        # called once the checkpoint-N folder is written
        probe.emit("ckpt.save.end", step=int(state.global_step), source="hf")
