"""EDIT: replace this with your training script (workload.command runs it under torchrun on every node).

Until then it runs chaoskit's reference DDP job, so that the drill works end to end. Your script reads
CHAOSKIT_CKPT_DIR for its checkpoint folder (or its own flag), resumes from its newest checkpoint when
restarted, and reports to chaoskit through its framework's callback, the SDK (from chaoskit import probe)
or its own log lines (probes.presets / probes.log in the scenario).
"""
import sys

from chaoskit.workloads.ddp_train import main

raise SystemExit(main(sys.argv[1:] or ["--steps", "400"]))
