"""``from chaoskit import probe``: the SDK for training code (stdlib only).

This module re-exports :mod:`chaoskit.sdk.probe`; see there for the contract.
"""

from chaoskit.sdk.probe import *  # noqa: F401,F403
from chaoskit.sdk.probe import __all__  # noqa: F401
