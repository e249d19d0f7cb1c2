"""Fault kinds: the contract (:mod:`.api`), one module per family (:mod:`.process`,
:mod:`.network`, :mod:`.power`, ...), what the kinds that run a program on a node share
(:mod:`.node_tool`) and the registry (:mod:`.registry`: the built-ins found in this package's
source, plugins from the ``chaoskit.faults`` entry-point group). See ``docs/architecture.md``.
"""
