"""How chaoskit runs commands on a node. See :mod:`.api`."""
