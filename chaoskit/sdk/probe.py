"""The chaoskit SDK: what training code imports (``from chaoskit import probe``).

Standard library only, importable without torch. Every call appends one JSON
event line to the file named by ``$CHAOSKIT_EVENTS`` with a single ``write`` on
an ``O_APPEND`` descriptor, so concurrent ranks never interleave. Without that
variable every call is a cheap no-op, so instrumented code runs anywhere.

    from chaoskit import probe
    probe.worker_start()
    with probe.checkpoint_load(step=s):
        state = torch.load(path)
    for step in ...:
        ...
        probe.step(step)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any, Iterator

from chaoskit.sdk import inproc

__all__ = [
    "emit",
    "worker_start",
    "step",
    "heartbeat",
    "detect",
    "rendezvous_done",
    "checkpoint_save",
    "checkpoint_load",
    "start_heartbeat",
    "enabled",
    "straggler",
]

_lock = threading.Lock()
_fd: int | None = None
_fd_path: str | None = None
last_step: int | None = None
"""The last step this process reported (what :mod:`chaoskit.sdk.inproc` counts steps by)."""


def enabled() -> bool:
    return bool(os.environ.get("CHAOSKIT_EVENTS"))


def _identity() -> dict[str, Any]:
    ident: dict[str, Any] = {"node": os.environ.get("CHAOSKIT_NODE") or socket.gethostname()}
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit():
        ident["rank"] = int(rank)
    return ident


def _descriptor(path: str) -> int:
    global _fd, _fd_path
    if _fd is None or _fd_path != path:
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_path = path
    return _fd


def emit(kind: str, **fields: Any) -> dict[str, Any] | None:
    """Append one event ``{"ts", "node", "rank", "kind", ...}``; return it (``None`` when disabled). A ``ts`` among
    ``fields`` is kept in place of the clock's reading now (for a caller that read the clock at the instant itself)."""
    path = os.environ.get("CHAOSKIT_EVENTS")
    if not path:
        return None
    event: dict[str, Any] = {"ts": time.time(), **_identity(), "kind": kind, "pid": os.getpid()}
    event.update(fields)
    line = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
    with _lock:
        os.write(_descriptor(path), line)
    return event


def worker_start(**fields: Any) -> dict[str, Any] | None:
    """Call first thing in a worker: records restart count and world size from torchrun's env."""
    env = os.environ
    info: dict[str, Any] = {"restart_count": int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)}
    for key, name in (("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"), ("GROUP_RANK", "group_rank")):
        if env.get(key, "").isdigit():
            info[name] = int(env[key])
    info.update(fields)
    _start_inproc()
    return emit("worker.start", **info)


def step(step: int, **fields: Any) -> dict[str, Any] | None:
    """One training step finished."""
    global last_step
    last_step = int(step)
    return emit("step", step=int(step), **fields)


def heartbeat(**fields: Any) -> dict[str, Any] | None:
    return emit("heartbeat", **fields)


def detect(why: str, **fields: Any) -> dict[str, Any] | None:
    """This process noticed a failure (e.g. a collective raised)."""
    return emit("detect", why=why, **fields)


def straggler(rank: int, step_time_s: float | None = None, **fields: Any) -> dict[str, Any] | None:
    """This process noticed that ``rank`` is slow (e.g. its step time is far above the others')."""
    extra = {"step_time_s": float(step_time_s)} if step_time_s is not None else {}
    return emit("straggler", slow_rank=int(rank), **extra, **fields)


def rendezvous_done(world_size: int, **fields: Any) -> dict[str, Any] | None:
    return emit("rendezvous.done", world_size=int(world_size), **fields)


@contextlib.contextmanager
def checkpoint_save(step: int, **fields: Any) -> Iterator[dict[str, Any]]:
    """Wrap a checkpoint save; put ``bytes`` into the yielded dict if known."""
    extra: dict[str, Any] = {}
    emit("ckpt.save.start", step=int(step), **fields)
    yield extra
    emit("ckpt.save.end", step=int(step), **fields, **extra)


@contextlib.contextmanager
def checkpoint_load(step: int | None = None, **fields: Any) -> Iterator[dict[str, Any]]:
    """Wrap a checkpoint restore; set ``extra["step"]`` inside if it is only known after loading."""
    extra: dict[str, Any] = {}
    emit("ckpt.load.start", **({"step": int(step)} if step is not None else {}), **fields)
    yield extra
    if step is not None:
        extra.setdefault("step", int(step))
    emit("ckpt.load.end", **fields, **extra)


def _start_inproc() -> None:
    """Take chaoskit's in-process fault orders (:mod:`chaoskit.sdk.inproc`) in a job chaoskit did not start
    (an attached job); a job it starts has them from its bootstrap already. Only in a torchrun worker (``RANK``)
    or where chaoskit's variables are set; the watcher costs one failing ``lstat`` every 0.05 s."""
    if enabled() or os.environ.get("CHAOSKIT_INPROC_DIR") or os.environ.get("RANK", "").isdigit():
        inproc.start()


def start_heartbeat(interval: float = 1.0) -> threading.Event:
    """Emit ``heartbeat`` every ``interval`` seconds from a daemon thread; set the returned event to stop."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            heartbeat()

    if enabled():
        threading.Thread(target=beat, name="chaoskit-heartbeat", daemon=True).start()
    return stop
