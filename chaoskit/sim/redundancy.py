"""Checkpoint storage redundancy: the chance that a checkpoint is gone when it is needed.

A checkpoint lives until the next one is written. Each node that holds a copy
(or a block) fails during that lifetime with probability
``q = 1 - exp(-node_rate * lifetime)``, independently. Then:

- ``r`` full replicas are all lost with probability ``q^r`` (the source
  material's availability ``1 - (1 - a)^r``, seen from the loss side);
- a ``k + m`` erasure code (``k`` data blocks, ``m`` parity blocks on
  ``k + m`` nodes) survives any ``m`` lost blocks, so it is lost when more
  than ``m`` of its ``k + m`` nodes fail: a binomial tail.

No numpy needed; exact sums over small binomials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["node_loss_probability", "replica_loss", "erasure_loss", "StorageOption", "compare"]


def node_loss_probability(node_rate_per_s: float, lifetime_s: float) -> float:
    """``q``: one node fails within ``lifetime_s`` at ``node_rate_per_s``."""
    return -math.expm1(-node_rate_per_s * lifetime_s)


def replica_loss(q: float, replicas: int) -> float:
    """All ``replicas`` copies lost: ``q^r``."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    return q**replicas


def erasure_loss(q: float, k: int, m: int) -> float:
    """More than ``m`` of the ``k + m`` blocks lost: ``sum_{j > m} C(n, j) q^j (1 - q)^(n - j)``."""
    if k < 1 or m < 0:
        raise ValueError(f"an erasure code needs k >= 1 data blocks and m >= 0 parity blocks, got {k}+{m}")
    n = k + m
    return sum(math.comb(n, j) * q**j * (1.0 - q) ** (n - j) for j in range(m + 1, n + 1))


@dataclass(frozen=True)
class StorageOption:
    name: str
    loss_probability: float
    """Chance that one checkpoint is lost before the next one replaces it."""
    overhead: float
    """Bytes stored per byte of checkpoint."""
    expected_lost: float
    """Checkpoints expected to be lost over the job."""


def compare(node_rate_per_s: float, lifetime_s: float, checkpoints: float, replicas: int, k: int, m: int) -> dict:
    """Both schemes side by side for ``checkpoints`` checkpoints of ``lifetime_s`` each."""
    q = node_loss_probability(node_rate_per_s, lifetime_s)
    rep = replica_loss(q, replicas)
    ec = erasure_loss(q, k, m)
    return {
        "node_loss_probability": q,
        "lifetime_s": lifetime_s,
        "checkpoints": checkpoints,
        "options": [
            StorageOption(f"{replicas} replica{'s' if replicas > 1 else ''}", rep, float(replicas), rep * checkpoints),
            StorageOption(f"erasure {k}+{m}", ec, (k + m) / k, ec * checkpoints),
        ],
    }
