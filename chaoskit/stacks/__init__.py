"""Recovery stacks: how a training job recovers from a failure, and so how a drill starts and measures it.

One module per stack (:mod:`chaoskit.stacks.api` says what a stack owns), found by :mod:`chaoskit.stacks.registry`
the way fault kinds and cluster backends are found: ``workload.recovery`` names one.
"""
