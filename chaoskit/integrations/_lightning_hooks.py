"""The hooks of the Lightning callbacks, shared by ``lightning.pytorch`` and ``pytorch_lightning`` (stdlib only)."""

from __future__ import annotations

from typing import Any

from chaoskit.integrations._common import failure_text, report_failures
from chaoskit.sdk import probe

__all__ = ["Hooks"]


class Hooks:
    """Mixed in before the framework's ``Callback``; every method is a Lightning hook."""

    def __init__(self) -> None:
        self._started = False
        self._loading: int | None = None
        self._saving: int | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self._started:
            self._started = True
            probe.worker_start(source="lightning")
            report_failures("lightning")

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # fit(ckpt_path=...): the checkpoint is read and being restored; training starts once it is
        step = checkpoint.get("global_step")
        self._loading = int(step) if isinstance(step, int) else -1
        probe.emit("ckpt.load.start", **({"step": self._loading} if self._loading >= 0 else {}), source="lightning")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._loading is not None:
            probe.emit("ckpt.load.end", step=int(trainer.global_step), source="lightning")
            self._loading = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._saved()
        probe.step(int(trainer.global_step), source="lightning")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # the checkpoint dict is being built; the file is written when Lightning calls back next (a step's
        # checkpoint and last.ckpt are two calls: one save)
        if self._saving == int(trainer.global_step):
            return
        self._saving = int(trainer.global_step)
        probe.emit("ckpt.save.start", step=self._saving, source="lightning")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._saved()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._saved()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._saved()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._saved()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt):
            probe.detect(failure_text(exception), source="lightning", who="lightning rank")

    def _saved(self) -> None:
        if self._saving is not None:
            probe.emit("ckpt.save.end", step=self._saving, source="lightning")
            self._saving = None
