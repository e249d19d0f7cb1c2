"""A node's NVIDIA GPUs as faults see them: which device a worker uses, and whether ``nvidia-smi`` lists it.

Shared by the fault kinds that act on a GPU (``gpu.fail``, ``node.slow``), which may not import each other.
"""

from __future__ import annotations

from chaoskit.cluster.transports.api import Transport
from chaoskit.core.errors import InfraError

__all__ = ["device_of", "listed_devices", "lists_devices"]


def device_of(env: dict[str, str]) -> int:
    """The GPU index a worker uses: ``LOCAL_RANK`` (0 if unset), mapped through ``CUDA_VISIBLE_DEVICES``."""
    local = env.get("LOCAL_RANK", "0")
    local_rank = int(local) if local.isdigit() else 0
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and local_rank < len(visible) and visible[local_rank].isdigit():
        return int(visible[local_rank])
    return local_rank


def listed_devices(transport: Transport, timeout: float) -> list[int]:
    """The GPU indexes ``nvidia-smi -L`` on the node lists (``GPU 0: ...``); empty when it does not answer."""
    try:
        res = transport.run(["nvidia-smi", "-L"], timeout)
    except InfraError:  # not installed
        return []
    if res.returncode != 0:
        return []
    heads = (line.split(":", 1)[0].strip() for line in res.stdout.splitlines())
    return sorted({int(h[4:]) for h in heads if h.startswith("GPU ") and h[4:].isdigit()})


def lists_devices(transport: Transport, devices: list[int], timeout: float) -> bool:
    """True when ``nvidia-smi -L`` on the node answers and lists every one of ``devices``."""
    listed = set(listed_devices(transport, timeout))
    return bool(listed) and all(d in listed for d in devices)
