"""A fault never outlives its welcome: the journal (:mod:`.journal`), on-node leases
(:mod:`.lease`, :mod:`.watchdog`), the cluster lock (:mod:`.lock`) and rollback from a
journal (:mod:`.rollback`). See ``docs/architecture.md``.
"""
