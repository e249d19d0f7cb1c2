"""Lightning reporting to chaoskit: ``lightning.pytorch.Trainer(..., callbacks=[ChaoskitCallback()])``.

Per rank: ``worker.start`` at ``setup``; ``ckpt.load.start`` in ``on_load_checkpoint`` (``fit(ckpt_path=...)``,
with the checkpoint's global step) and ``ckpt.load.end`` at ``on_train_start`` (the restored step); ``step``
after every training batch; ``ckpt.save.start`` when a checkpoint is built and ``ckpt.save.end`` at the next
hook, once it is written; ``detect`` from ``on_exception``. A no-op when ``CHAOSKIT_EVENTS`` is unset.
For the ``pytorch_lightning`` package use :mod:`chaoskit.integrations.pytorch_lightning`.
"""

from __future__ import annotations

from lightning.pytorch import Callback

from chaoskit.integrations._lightning_hooks import Hooks

__all__ = ["ChaoskitCallback"]


class ChaoskitCallback(Hooks, Callback):
    """Report a Lightning job's setup, restore, steps, saves and failures as chaoskit SDK events."""

    def __init__(self) -> None:
        Callback.__init__(self)
        Hooks.__init__(self)
