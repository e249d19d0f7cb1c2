"""The Lightning callback for the ``pytorch_lightning`` package (``import pytorch_lightning as pl``):
``pl.Trainer(..., callbacks=[ChaoskitCallback()])``. The same hooks as :mod:`chaoskit.integrations.lightning`;
``pytorch_lightning.Trainer`` accepts only its own package's ``Callback``, hence this second class."""

from __future__ import annotations

from pytorch_lightning import Callback

from chaoskit.integrations._lightning_hooks import Hooks

__all__ = ["ChaoskitCallback"]


class ChaoskitCallback(Hooks, Callback):
    """Report a ``pytorch_lightning`` job's setup, restore, steps, saves and failures as chaoskit SDK events."""

    def __init__(self) -> None:
        Callback.__init__(self)
        Hooks.__init__(self)
