"""Cluster-scale simulator and checkpoint-interval planner (``chaoskit simulate``).

- :mod:`.model`: the model and its closed forms (failures, MTBF, availability,
  lost work, goodput, Young's and Daly's intervals);
- :mod:`.montecarlo`: the same model, simulated for many trials at once;
- :mod:`.redundancy`: the chance a checkpoint is lost with replicas or an erasure code;
- :mod:`.measured`: recovery phases read back from drills (result.json, gameday.json);
- :mod:`.demo`: the source material's step-by-step example, kept exactly;
- :mod:`.plot`: goodput against checkpoint interval as SVG;
- :mod:`.summary`: what the command prints.

These modules import numpy, which only the ``sim`` extra (and ``workload``, for campaigns) installs; the CLI
imports them inside the command only, after :func:`require_numpy`.
"""

from __future__ import annotations

import importlib.util

from chaoskit.core.errors import InfraError

__all__ = ["require_numpy", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'chaoskit[sim]'"


def require_numpy(what: str) -> None:
    """:class:`InfraError` naming ``what`` and the install line when numpy is not installed (checked before any
    work, so a campaign never fails at its end for it)."""
    if importlib.util.find_spec("numpy") is None:
        raise InfraError(f"{what} needs numpy, which this install lacks", hint=INSTALL_HINT)
