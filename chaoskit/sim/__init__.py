"""Cluster-scale simulator and checkpoint-interval planner (``chaoskit simulate``).

- :mod:`.model`: the model and its closed forms (failures, MTBF, availability,
  lost work, goodput, Young's and Daly's intervals);
- :mod:`.montecarlo`: the same model, simulated for many trials at once;
- :mod:`.redundancy`: the chance a checkpoint is lost with replicas or an erasure code;
- :mod:`.measured`: recovery phases read back from drills (result.json, gameday.json);
- :mod:`.demo`: the source material's step-by-step example, kept exactly;
- :mod:`.plot`: goodput against checkpoint interval as SVG;
- :mod:`.summary`: what the command prints.

These modules import numpy; the CLI imports them inside the command only.
"""
