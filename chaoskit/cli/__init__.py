"""The ``chaoskit`` command. :func:`main` owns all error handling; see :mod:`.app`."""

from chaoskit.cli.main import main

__all__ = ["main"]
