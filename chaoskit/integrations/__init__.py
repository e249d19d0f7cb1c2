"""Callbacks that make a framework's training job report to chaoskit with one line added.

- :mod:`chaoskit.integrations.hf`: ``ChaoskitCallback`` for the Hugging Face ``transformers.Trainer``;
- :mod:`chaoskit.integrations.lightning`: ``ChaoskitCallback`` for ``lightning.pytorch.Trainer``
  (:mod:`chaoskit.integrations.pytorch_lightning` for the older ``pytorch_lightning`` package).

Each writes the SDK's events (:mod:`chaoskit.sdk.probe`) and is a no-op when ``CHAOSKIT_EVENTS`` is unset.
Importing ``chaoskit`` imports none of these modules; each imports its framework when it is imported.
"""
