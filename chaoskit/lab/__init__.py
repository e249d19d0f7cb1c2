"""Local clusters for demos and tests. See :mod:`.process`."""
