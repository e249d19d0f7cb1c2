"""Fault kinds: the contract (:mod:`.api`), one module per family (:mod:`.process`,
:mod:`.network`, :mod:`.power`) and the registry (:mod:`.registry`, entry-point group
``chaoskit.faults``). See ``docs/architecture.md``.
"""
