"""Cluster backends: the kinds of cluster a scenario's ``cluster:`` may name.

One module per backend (:mod:`.process`, :mod:`.ray`, :mod:`.netns`, :mod:`.docker`,
:mod:`.inventory`, :mod:`.slurm`), the contract in :mod:`.api`, and the registry in
:mod:`.registry`, which finds each built-in in its module (plugins: entry-point group
``chaoskit.clusters``). See ``docs/architecture.md``.
"""
