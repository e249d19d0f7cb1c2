"""Cluster backends: the kinds of cluster a scenario's ``cluster:`` may name.

One module per backend (:mod:`.process`, :mod:`.ray`, :mod:`.netns`, :mod:`.docker`),
the contract in :mod:`.api`, and the registry in :mod:`.registry` (entry-point group
``chaoskit.clusters``). See ``docs/architecture.md``.
"""
