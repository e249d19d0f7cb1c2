"""``recovery: ray-train``: Ray Train's own restart (``launch: ray-train``, on a cluster of kind ``ray``). Its
controller sees a worker actor die (or, after Ray's health checks, its node), stops the worker group, places new
actors (on a spare node where one is gone) and restarts the group from the last checkpoint reported through
``ray.train.report``, ``FailureConfig(max_failures=max_restarts)`` times at most. It is measured as the restart
model (:func:`chaoskit.measure.measure_fault`): the world stops, starts again and loads a checkpoint.

The stack of every ``launch: ray-train`` scenario that names none; ``recovery: restart`` there says the same and
runs the same (the restart model), as before this stack was one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoskit.observe.presets import Preset
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import CannotRun, Stack, ranks_to_nodes

__all__ = ["RAY_TRAIN_PRESET", "RayTrain", "RAY_HEALTH_CHECK"]

RAY_HEALTH_CHECK = "1s x 3 failures (the Ray lab's RAY_health_check_*; Ray's default 3s x 5)"
"""How soon Ray's GCS marks a silent node dead, as the Ray lab sets it (chaoskit/lab/ray.py)."""


RAY_TRAIN_PRESET = Preset("ray-train", (
    # the raylet (src/ray/raylet/node_manager.cc, in the raylet binary of ray 2.60), streamed to the driver with the
    # "(raylet)" prefix: "A worker died or was killed while executing a task by an unexpected system error. To
    # troubleshoot the problem, check the logs for the dead worker. Lease ID: ... Worker ID: ...": a Train worker's
    # process is gone (before the surviving workers' collectives fail, or when none is in one)
    LogRule.of(r"\(raylet\).*A worker died or was killed while executing a task by an unexpected system error",
               "detect", {"source": "raylet", "who": "Ray raylet", "why": "a worker died or was killed"}),
), sees=("detect",),
    cannot_see="which worker died (its line names a Worker ID, no rank), steps, checkpoints and worker starts "
               "(the Ray Train job's own events give them)",
    verbosity="Ray's default (log_to_driver=True: the raylets' lines reach the driver's output)")


def _ray(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
         pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    words = "node DEAD" + (f": {e['reason']}" if e.get("reason") else "")
    return {"by": "Ray GCS", "words": words, "parties": [{"rank": None, "node": e.get("node")}]}


class RayTrain(Stack):
    name = "ray-train"
    log_presets = (RAY_TRAIN_PRESET,)
    presets = ("ray-train",)  # the raylet says a worker died
    blame_readers = {("detect", "ray"): _ray}
    describe = ("Ray Train's own restart: its controller restarts the worker group (actors placed again) from the "
                "last reported checkpoint, FailureConfig(max_failures=max_restarts) times")
    launches = ("ray-train",)
    refusal = ("recovery: ray-train is Ray Train's own restart, only used with launch: {launches} (a cluster of "
               "kind: ray), not launch: {launch}")
    extra = "ray"
    requires = "ray"
    install = "pip install 'chaoskit[ray]' (ray[train])"
    scorecard_column = "ray"
    scorecard_cluster = "ray"

    def default_under(self, launch: str, scheduled: bool) -> bool:
        return launch in self.launches

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        net = [f["kind"] for f in doc.get("faults", []) if str(f.get("kind", "")).startswith("network.")]
        if net:
            raise CannotRun(f"{', '.join(net)}: the Ray lab's nodes are process groups on this machine's network, "
                            "with no NIC of their own")
        w = doc["workload"]
        doc["cluster"] = {"kind": self.scorecard_cluster, "nodes": 3}
        doc["workload"] = {"launch": "ray-train", "recovery": self.name,
                           **{k: w[k] for k in ("steps", "step_time", "checkpoint_every", "collective_timeout",
                                                "max_restarts") if k in w}}
        ranks_to_nodes(doc, process="RayTrainWorker")
        return doc

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        return {"Ray health check": RAY_HEALTH_CHECK}, []
