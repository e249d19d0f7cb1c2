"""chaoskit: chaos engineering for GPU training clusters.

Importing this package is cheap: it pulls in nothing heavy. Training code uses
``from chaoskit import probe`` (stdlib only).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
