"""``recovery: restart``: plain torchrun (torchelastic). The world stops, restarts and loads a checkpoint; its agent
sees a dead worker at once and a hang only at the collective timeout. Every launch runs under it."""

from __future__ import annotations

from typing import Any

from chaoskit.stacks.api import Stack

__all__ = ["Restart"]


def _torchrun_exit(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
                   pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    # torch/distributed/elastic/multiprocessing/api.py: "failed (exitcode: -9) local_rank: 0 (pid: 2368) of binary"
    node, pid, local = e.get("node"), e.get("pid"), e.get("local_rank")
    words = f"failed (exitcode: {e.get('exitcode')}) local_rank: {local} (pid: {pid})"
    rank, via = e.get("rank"), None
    if rank is None and node is not None and isinstance(pid, int) and (node, pid) in pids:
        rank, via = pids[(node, pid)], f"pid {pid} was rank {pids[(node, pid)]}"
    party = {"rank": rank, "node": node}
    if rank is None and local is not None:
        party["local_rank"] = local
    return {"by": e.get("who") or "torchrun agent", "words": words, "parties": [party], **({"via": via} if via else {})}


class Restart(Stack):
    name = "restart"
    blame_readers = {("worker.exit", "torchrun"): _torchrun_exit}
    scorecard_column = "torchrun"
    describe = "torchelastic: the agent sees a dead worker, a hang only at the collective timeout"
