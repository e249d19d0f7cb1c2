"""In-process faults: the side of the channel that runs inside a training process.

Standard library only at import (torch is imported when an order is armed, and only if the process already
imported it). Loaded three ways, all ending in :func:`start`:

- the bootstrap (``chaoskit/sdk/_boot/sitecustomize.py``) that a job chaoskit launches finds on the
  ``PYTHONPATH`` chaoskit sets; it starts the watcher in every torchrun worker (``RANK`` set) when
  ``$CHAOSKIT_INPROC_DIR`` names the channel's folder;
- the SDK (:func:`chaoskit.sdk.probe.worker_start`) and the framework callbacks, which call :func:`start`,
  so a job chaoskit attaches to takes the same orders;
- a test, calling :func:`start` or :func:`take_order`.

**The channel.** An order is one file, ``<folder>/order-<pid>.json``, written by chaoskit's helper on the node
(through the node's agent, atomically) into ``<state folder>/inproc``, the node's verified state folder
(:mod:`chaoskit.nodeside.nodefs`). The watcher thread looks for its own pid's file every
:data:`POLL_S` (one ``lstat`` that fails while no order is there: 20 failing system calls a second, off the
training thread). Before it
reads anything it checks, as nodefs does: the folder is a real directory (not a link) of this process's uid
(or root's), writable by nobody else, and so is every folder above it (sticky ones aside); the order is a
regular file opened ``O_NOFOLLOW``, of the same owner, writable by nobody else, at most
:data:`MAX_ORDER_BYTES`. It must be JSON with exactly the fields of one listed kind, each bounded
(:func:`parse_order`). Anything else is a *refusal*: one line on stderr (``chaoskit: refused an in-process
fault order: WHY``) and the status file says ``refused``; nothing else happens.

**The status** goes back the same way: ``<folder>/status-<pid>.json`` (made under a random temp name with
``O_EXCL|O_NOFOLLOW``, renamed over): ``armed``, then ``fired`` (with the step, and for a bit flip what was
flipped: chaoskit's record, never the job's log), then ``ended`` when a lasting fault's end, armed here,
came. The node's lease (:mod:`chaoskit.faults.inproc`) kills a process whose fault missed its end.

**Where a fault lands.** Global torch hooks, installed only once an order is armed: a forward pre-hook
(the first module call after an optimizer step is "before the step", ahead of the gradient all-reduce), the
optimizer's step pre-hook (gradients reduced, not yet applied) and post-hook (the step is done); a data
loader's ``__next__`` for ``where: data``.

**SDC probe.** With ``$CHAOSKIT_SDC_EVERY=N`` (``probes.sdc``) every Nth optimizer step emits ``sdc.checksum``:
the sum of every parameter's bits read as integers (a flipped bit ``b`` moves it by ``2**b``), which DDP
replicas must agree on exactly; chaoskit compares them across ranks (:mod:`chaoskit.observe.sdc`).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import re
import stat
import sys
import threading
import time
from typing import Any, Callable

__all__ = [
    "KINDS", "CUDA_ERRORS", "MAX_ORDER_BYTES", "POLL_S", "OrderError", "parse_order", "check_folder",
    "read_order", "start", "take_order", "checksum", "channel_dir", "order_path", "status_path",
]

POLL_S = 0.05
"""How often the watcher looks for this process's order: the channel's latency, and its whole cost unarmed."""
MAX_ORDER_BYTES = 4096
"""An order is a few fields; anything longer is refused unread."""
MAX_DURATION_S = 86400.0
MAX_INDEX = 1 << 40
MAX_WINDOW_STEPS = 1_000_000
NAME_RE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+){0,15}")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")

# What the CUDA runtime says (cudaGetErrorString, CUDA 12) and how PyTorch wraps it (c10/cuda/CUDAException.h's
# C10_CUDA_CHECK: "CUDA error: <text>" and its advice lines), so a job's handlers and logs see the real thing.
CUDA_ERRORS = {
    "illegal_address": "an illegal memory access was encountered",
    "ecc": "uncorrectable ECC error encountered",
    "launch_failure": "unspecified launch failure",
    "illegal_instruction": "an illegal instruction was encountered",
    "misaligned_address": "misaligned address",
    "hardware_stack_error": "hardware stack error",
    "device_assert": "device-side assert triggered",
    "nvlink": "uncorrectable NVLink error detected during the execution",
    "out_of_memory": "out of memory",
    "launch_timeout": "the launch timed out and was terminated",
}
CUDA_ADVICE = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
               "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
               "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")

KINDS: dict[str, dict[str, Any]] = {
    # field: (type, required, check)
    "inproc.hang": {"where": (str, False, lambda v: v in ("step", "data")),
                    "duration": ((int, float, type(None)), False, lambda v: v is None or 0 < v <= MAX_DURATION_S)},
    "inproc.gil": {"duration": ((int, float), True, lambda v: 0 < v <= 3600)},
    "inproc.raise": {"cuda": ((str, type(None)), False, lambda v: v is None or v in CUDA_ERRORS),
                     "message": ((str, type(None)), False, lambda v: v is None or 0 < len(v) <= 500 and v.isprintable())},
    "inproc.nan": {"target": (str, False, lambda v: v in ("loss", "grads")),
                   "value": (str, False, lambda v: v in ("nan", "inf"))},
    "inproc.bitflip": {"target": (str, False, lambda v: v in ("param", "grad")),
                       "name": ((str, type(None)), False, lambda v: v is None or len(v) <= 200 and NAME_RE.fullmatch(v)),
                       "index": ((int, type(None)), False, lambda v: v is None or 0 <= v < MAX_INDEX),
                       "bit": ((int, type(None)), False, lambda v: v is None or 0 <= v <= 63),
                       "seed": ((int, type(None)), False, lambda v: v is None or 0 <= v < (1 << 63)),
                       "steps": (int, False, lambda v: 1 <= v <= MAX_WINDOW_STEPS)},
    "inproc.slow": {"share": ((int, float), True, lambda v: 0 < v <= 0.95),
                    "mode": (str, False, lambda v: v in ("sleep", "busy")),
                    "duration": ((int, float, type(None)), False, lambda v: v is None or 0 < v <= MAX_DURATION_S)},
}
"""Every kind a process accepts, with its fields: (types, required, bound). Nothing else is ever run."""
DEFAULTS = {"where": "step", "target": None, "value": "nan", "steps": 1, "mode": "sleep"}


class OrderError(ValueError):
    """An order this process refuses; the message says why (never the order's text)."""


def parse_order(data: bytes, pid: int) -> dict[str, Any]:
    """The order in ``data`` for process ``pid``, checked field by field; :class:`OrderError` for anything else."""
    if len(data) > MAX_ORDER_BYTES:
        raise OrderError(f"order of {len(data)} bytes (at most {MAX_ORDER_BYTES})")
    try:
        order = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OrderError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(order, dict):
        raise OrderError("not a JSON object")
    if set(order) - {"v", "id", "kind", "pid", "params"} or not {"v", "id", "kind", "pid", "params"} <= set(order):
        raise OrderError("not the fields of an order (v, id, kind, pid, params)")
    if order["v"] != 1 or isinstance(order["v"], bool):
        raise OrderError("unknown order version")
    if not isinstance(order["id"], str) or not ID_RE.fullmatch(order["id"]):
        raise OrderError("bad order id")
    if type(order["pid"]) is not int or order["pid"] != pid:
        raise OrderError("order for another process")
    kind = order["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise OrderError(f"unknown kind {str(kind)[:40]!r}" if isinstance(kind, str) else "kind is not a string")
    params = order["params"]
    if not isinstance(params, dict):
        raise OrderError("params is not an object")
    fields = KINDS[kind]
    extra = set(params) - set(fields)
    if extra:
        raise OrderError(f"{kind} takes no field {sorted(extra)[0][:40]!r}")
    out: dict[str, Any] = {}
    for name, (types, required, ok) in fields.items():
        if name not in params:
            if required:
                raise OrderError(f"{kind} needs {name}")
            out[name] = DEFAULTS.get(name)
            continue
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise OrderError(f"{kind}: {name} has the wrong type")
        if isinstance(value, float) and not math.isfinite(value):
            raise OrderError(f"{kind}: {name} is not finite")
        if not ok(value):
            raise OrderError(f"{kind}: {name} is out of bounds")
        out[name] = value
    if kind == "inproc.raise" and (out["cuda"] is None) == (out["message"] is None):
        raise OrderError("inproc.raise needs one of cuda or message")
    if kind == "inproc.nan" and out["target"] is None:
        out["target"] = "grads"
    if kind == "inproc.bitflip" and out["target"] is None:
        out["target"] = "param"
    return {"id": order["id"], "kind": kind, "params": out}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON")


def check_folder(path: str) -> None:
    """Refuse (:class:`OrderError`) a channel folder someone other than this uid (or root) could change:
    the folder and every one above it, as :func:`chaoskit.nodeside.nodefs.check_dir` checks a state folder."""
    uid = os.geteuid()
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise OrderError("the channel folder is not an absolute path")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise OrderError(f"the channel folder: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OrderError("the channel folder is not a directory (a link?)")
    if st.st_uid not in (uid, 0) or st.st_mode & 0o022:
        raise OrderError("the channel folder is someone else's or writable by others")
    parent = os.path.dirname(os.path.normpath(path))
    while True:
        try:
            pst = os.lstat(parent)
        except OSError as exc:
            raise OrderError(f"a folder above the channel: {exc.strerror}") from None
        if stat.S_ISLNK(pst.st_mode):
            if pst.st_uid not in (uid, 0):
                raise OrderError("a link above the channel folder is someone else's")
        elif pst.st_uid not in (uid, 0) or (pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX) or pst.st_mode & 0o020 and pst.st_uid != 0:
            raise OrderError("a folder above the channel folder is writable by others")
        if parent == "/":
            return
        parent = os.path.dirname(parent)


def read_order(folder: str, pid: int) -> dict[str, Any] | None:
    """This process's order in ``folder``, checked; ``None`` when there is none; :class:`OrderError` when refused."""
    path = order_path(folder, pid)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OrderError(f"the order: {exc.strerror}") from None
    check_folder(folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise OrderError(f"cannot open the order: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OrderError("the order is not a regular file")
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            raise OrderError("the order is someone else's or writable by others")
        if st.st_size > MAX_ORDER_BYTES:
            raise OrderError(f"order of {st.st_size} bytes (at most {MAX_ORDER_BYTES})")
        data = os.read(fd, MAX_ORDER_BYTES + 1)
    finally:
        os.close(fd)
    return parse_order(data, pid)


def channel_dir() -> str | None:
    """The channel's folder: ``$CHAOSKIT_INPROC_DIR`` (a job chaoskit starts), else ``inproc`` in the
    effective user's default state folder (what :mod:`chaoskit.nodeside.nodefs` makes), where an attached
    SDK job is sent its orders."""
    given = os.environ.get("CHAOSKIT_INPROC_DIR")
    if given:
        return given
    if os.geteuid() == 0:
        return "/run/chaoskit/inproc"
    try:
        import pwd

        return os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".local", "state", "chaoskit", "inproc")
    except (ImportError, KeyError):
        return None


def order_path(folder: str, pid: int) -> str:
    return f"{folder}/order-{int(pid)}.json"


def status_path(folder: str, pid: int) -> str:
    return f"{folder}/status-{int(pid)}.json"


def _write_status(folder: str, status: dict[str, Any]) -> None:
    """Replace this process's status file atomically (a random temp name made ``O_EXCL|O_NOFOLLOW``)."""
    try:
        check_folder(folder)
    except OrderError:
        return
    final = status_path(folder, os.getpid())
    tmp = f"{folder}/.status-{os.getpid()}-{os.urandom(8).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return
    try:
        os.write(fd, (json.dumps(status, default=str) + "\n").encode())
    finally:
        os.close(fd)
    try:
        os.replace(tmp, final)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _refuse(folder: str, why: str) -> None:
    print(f"chaoskit: refused an in-process fault order: {why}", file=sys.stderr, flush=True)
    _write_status(folder, {"status": "refused", "reason": why, "ts": time.time()})


# ---------------------------------------------------------------------------------------------------------------
# The process's state: one watcher, the hooks, the armed order.

_lock = threading.Lock()
_started = False
_hooks_installed = False
_armed: dict[str, Any] | None = None
_folder: str | None = None
_opt_steps = 0
_before_step = False  # True between an optimizer step and the next forward (set by _opt_post; see _forward_hook)
_step_times: list[float] = []
_last_boundary: float | None = None
_modules: list[Any] = []
_optimizers: list[Any] = []
_sdc_every = 0


def start(folder: str | None = None) -> bool:
    """Start this process's watcher (once; ``False`` when there is no channel folder to watch)."""
    global _started, _folder, _sdc_every
    with _lock:
        if _started:
            return True
        folder = folder or channel_dir()
        if not folder:
            return False
        _started, _folder = True, folder
    every = os.environ.get("CHAOSKIT_SDC_EVERY", "")
    if every.isascii() and every.isdigit() and 0 < len(every) < 8 and 0 < int(every) <= MAX_WINDOW_STEPS:
        _sdc_every = int(every)
    if _sdc_every or os.environ.get("CHAOSKIT_SDC_FINAL") == "1":
        # the probe, or a drill that flips a bit: the replicas' checksums at exit tell whether it lasted
        _when_torch(_install_hooks)
        atexit.register(final_checksum)
    threading.Thread(target=_watch, args=(folder,), name="chaoskit-inproc", daemon=True).start()
    return True


def _watch(folder: str) -> None:
    pid = os.getpid()
    seen: tuple[int, int, int] | None = None
    while True:
        time.sleep(POLL_S)
        try:
            st = os.lstat(order_path(folder, pid))
        except OSError:
            continue
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == seen:
            continue
        seen = key
        try:
            take_order(folder, pid)
        except Exception as exc:  # noqa: BLE001 - the watcher outlives any order
            _refuse(folder, f"the order failed: {type(exc).__name__}")


def take_order(folder: str, pid: int | None = None) -> dict[str, Any] | None:
    """Read, check and arm this process's order; a refusal is logged and nothing else happens."""
    global _armed
    pid = os.getpid() if pid is None else pid
    try:
        order = read_order(folder, pid)
    except OrderError as exc:
        _refuse(folder, str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - nothing an order holds may stop the job
        _refuse(folder, f"{type(exc).__name__}")
        return None
    if order is None:
        return None
    with _lock:
        if _armed is not None and _armed["id"] == order["id"]:
            return _armed
        _armed = armed = dict(order, state="armed", fired=0, t_fire=None, window_left=order["params"].get("steps", 1))
    _write_status(folder, {"id": order["id"], "status": "armed", "ts": time.time()})
    if order["kind"] == "inproc.gil":  # nothing of this process runs while it holds: fired from this thread
        _fire_gil(armed)
        return armed
    if not _when_torch(_install_hooks):
        _refuse(folder, "this process has not imported torch: no training step to act on")
        with _lock:
            _armed = None
    return order


def _when_torch(then: Callable[[], None]) -> bool:
    """Run ``then`` now if torch is imported, else once it is (polled by a daemon thread); ``False`` if it never
    can be (a process without torch, told at once when torch is not even installed)."""
    if _torch_ready():
        then()
        return True
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False

    def wait() -> None:
        while not _torch_ready():
            time.sleep(0.05)
        then()

    threading.Thread(target=wait, name="chaoskit-inproc-torch", daemon=True).start()
    return True


def _torch_ready() -> bool:
    """torch is imported, and its import has finished (a module being imported has ``__spec__._initializing``)."""
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(torch, "optim") and not getattr(getattr(torch, "__spec__", None), "_initializing", False)


def _install_hooks() -> None:
    """The optimizer's step hooks (cheap: two calls a step), and what the armed order needs beside them: the
    forward pre-hook for a point before the step (hang, slow) or the model's names (a bit flip by name), which
    makes every module call take torch's slow path, so it is removed once no longer needed; ``Tensor.backward``
    for a NaN loss; the DataLoader's iterator for a hang in the data."""
    global _hooks_installed
    with _lock:
        first = not _hooks_installed
        _hooks_installed = True
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    if first:
        register_optimizer_step_pre_hook(_opt_pre)
        register_optimizer_step_post_hook(_opt_post)
    order = _armed
    kind = order["kind"] if order is not None else None
    params = order["params"] if order is not None else {}
    if kind in ("inproc.hang", "inproc.slow") and params.get("where", "step") == "step" or (
            kind == "inproc.bitflip" and params.get("name") is not None and not _modules):
        _forward_hook(True)
    if kind == "inproc.nan" and params.get("target") == "loss" and not _patched.get("backward"):
        orig_backward = torch.Tensor.backward

        def backward(self, *args, **kwargs):  # inproc.nan into the loss: the value the job reads and logs
            order = _armed
            if order is not None and order["kind"] == "inproc.nan" and order["params"]["target"] == "loss" and _due(order):
                with torch.no_grad():
                    self.fill_(_bad_value(order))
                _fired(order, {"target": "loss"})
            return orig_backward(self, *args, **kwargs)

        torch.Tensor.backward = backward
        _patched["backward"] = True
    if kind == "inproc.hang" and params.get("where") == "data" and not _patched.get("data"):
        try:
            from torch.utils.data import dataloader

            orig_next = dataloader._BaseDataLoaderIter.__next__

            def next_batch(self):
                order = _armed
                if order is not None and order["kind"] == "inproc.hang" and order["params"]["where"] == "data" and _due(order):
                    _fired(order, {"where": "data"})
                    _hold(order)
                return orig_next(self)

            dataloader._BaseDataLoaderIter.__next__ = next_batch
            _patched["data"] = True
        except (ImportError, AttributeError):  # a torch without the loader's iterator class: where: data never fires
            pass


_patched: dict[str, bool] = {}
_forward_handle: list[Any] = []
_forward_unneeded = False


def _forward_hook(on: bool) -> None:
    """Install (``on``) or remove the global forward pre-hook; removed only between steps (the optimizer's
    post-hook), never while a module call iterates over the global hooks."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    global _before_step
    if on and not _forward_handle:
        # installed from the watcher's thread, maybe while a forward runs: its next call may be a submodule's (a
        # bit flip by name then finds ``c_fc.weight``, not ``transformer.h.0.mlp.c_fc.weight``); only a call after
        # the optimizer's next step (its post-hook sets this again) is the model's
        _before_step = False
        _forward_handle.append(register_module_forward_pre_hook(_forward_pre))
    elif not on and _forward_handle:
        _forward_handle.pop().remove()


def job_step() -> int:
    """The job's step being trained: the SDK's last reported step + 1 where the job reports steps, else the
    optimizer steps this process took + 1."""
    sdk = sys.modules.get("chaoskit.sdk.probe")
    last = getattr(sdk, "last_step", None) if sdk is not None else None
    return (last + 1) if isinstance(last, int) else _opt_steps + 1


def _due(order: dict[str, Any]) -> bool:
    return order["state"] == "armed" or (order["state"] == "firing" and order["window_left"] > 0)


def _fired(order: dict[str, Any], detail: dict[str, Any]) -> None:
    """Record that the order took effect (the first time only, for a window)."""
    first = order["state"] == "armed"
    order["fired"] += 1
    order["window_left"] -= 1
    order["state"] = "firing" if order["window_left"] > 0 and order["kind"] == "inproc.bitflip" else "done"
    if first:
        order["t_fire"] = time.time()
        if _folder is not None:
            _write_status(_folder, {"id": order["id"], "status": "fired", "ts": order["t_fire"],
                                    "step": detail.get("step", job_step()), "detail": detail})


def _ended(order: dict[str, Any], why: str = "its end came") -> None:
    if _folder is not None:
        _write_status(_folder, {"id": order["id"], "status": "ended", "ts": time.time(), "why": why,
                                "t_fire": order.get("t_fire")})


def _hold(order: dict[str, Any]) -> None:
    """Block this (the training) thread for the order's duration, or for good; every other thread runs on. An
    exception raised into the held thread (NVRx's in-process Wrapper restarting the loop: ``RankShouldRestart``,
    a ``KeyboardInterrupt``) ends the hold: the fault is over, and its status says so and why, so that the node's
    lease does not kill a process that recovered."""
    duration = order["params"].get("duration")
    end = None if duration is None else time.monotonic() + duration
    try:
        while end is None or time.monotonic() < end:
            time.sleep(0.05 if end is None else min(0.05, max(0.0, end - time.monotonic())))
    except BaseException as exc:
        _ended(order, f"interrupted by {type(exc).__name__}")
        raise
    _ended(order)


def _bad_value(order: dict[str, Any]) -> float:
    return float("nan") if order["params"]["value"] == "nan" else float("inf")


def _forward_pre(module, args):
    global _before_step
    if not _before_step:
        return None
    _before_step = False
    if not _modules:
        _modules.append(module)  # the outermost module of the first step: the model (DDP's wrapper)
    global _forward_unneeded
    order = _armed
    if order is None or order["state"] == "done" or order["kind"] not in ("inproc.hang", "inproc.slow"):
        _forward_unneeded = bool(_modules)  # the names are known; nothing before the step to do
        return None
    kind = order["kind"]
    if kind == "inproc.hang" and order["params"]["where"] == "step" and _due(order):
        _fired(order, {"where": "step"})
        _hold(order)
    elif kind == "inproc.slow" and order["state"] != "done":
        _slow(order)
    return None


def _slow(order: dict[str, Any]) -> None:
    params = order["params"]
    if order["state"] == "armed" and len(_step_times) < 5:
        return  # a few steps first, to know how long one takes
    if order["state"] == "armed":
        order["slow_until"] = None if params["duration"] is None else time.monotonic() + params["duration"]
        order["base_step_s"] = sorted(_step_times)[len(_step_times) // 2] if _step_times else 0.05
        _fired(order, {"share": params["share"], "mode": params["mode"], "base_step_s": round(order["base_step_s"], 6)})
        order["state"] = "firing"
    until = order.get("slow_until")
    if until is not None and time.monotonic() >= until:
        order["state"] = "done"
        _ended(order)
        return
    extra = order["base_step_s"] * params["share"] / (1 - params["share"])
    if params["mode"] == "sleep":
        time.sleep(extra)
    else:
        end = time.thread_time() + extra
        x = 0
        while time.thread_time() < end:
            for i in range(1000):
                x += i * i


def _opt_pre(optimizer, args, kwargs):
    order = _armed
    if order is None:
        return None
    kind = order["kind"]
    if kind == "inproc.raise" and _due(order):
        params = order["params"]
        text = f"CUDA error: {CUDA_ERRORS[params['cuda']]}\n{CUDA_ADVICE}" if params["cuda"] else params["message"]
        _fired(order, {"error": text.splitlines()[0]})
        import torch

        raise (getattr(torch, "AcceleratorError", RuntimeError) if params["cuda"] else RuntimeError)(text)
    if kind == "inproc.nan" and order["params"]["target"] == "grads" and _due(order):
        import torch

        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.fill_(_bad_value(order))
        _fired(order, {"target": "grads"})
    if kind == "inproc.bitflip" and order["params"]["target"] == "grad" and _due(order):
        _bitflip(order, optimizer, grad=True)
    return None


def _opt_post(optimizer, args, kwargs):
    global _opt_steps, _before_step, _forward_unneeded, _last_boundary
    _opt_steps += 1
    _before_step = True
    if _forward_unneeded:
        _forward_unneeded = False
        _forward_hook(False)
    now = time.monotonic()
    if _last_boundary is not None:
        _step_times.append(now - _last_boundary)
        del _step_times[:-20]
    _last_boundary = now
    if not _optimizers or _optimizers[-1] is not optimizer:
        _optimizers[:] = [optimizer]
    order = _armed
    if order is not None and order["kind"] == "inproc.bitflip" and order["params"]["target"] == "param" and _due(order):
        _bitflip(order, optimizer, grad=False)
    if _sdc_every and step_done() % _sdc_every == 0:
        _emit_checksum(optimizer, step_done())
    return None


def step_done() -> int:
    """In the optimizer's post-hook: the job's step just taken (the job reports it only after this hook)."""
    return job_step() if _sdk_steps() else _opt_steps


def _sdk_steps() -> bool:
    sdk = sys.modules.get("chaoskit.sdk.probe")
    return isinstance(getattr(sdk, "last_step", None), int)


def _named(optimizer) -> list[tuple[str, Any]]:
    """The optimizer's parameters with the model's names for them (``0.weight``; DDP's ``module.`` dropped),
    in the model's order; unnamed ones as ``param<i>``."""
    names: dict[int, str] = {}
    for module in _modules:
        for name, p in module.named_parameters():
            names.setdefault(id(p), name[7:] if name.startswith("module.") else name)
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            out.append((names.get(id(p), f"param{len(out)}"), p))
    return out


def _bitflip(order: dict[str, Any], optimizer, grad: bool) -> None:
    import torch

    params = order["params"]
    if params["name"] is not None and not _modules:
        return  # armed between this step's forward and its update: the model's names come with the next forward
    named = _named(optimizer)
    rng = random.Random(params["seed"] if params["seed"] is not None else 0)
    if params["name"] is not None:
        match = [(n, p) for n, p in named if n == params["name"]]
        if not match:
            order["state"] = "done"
            _refuse_late(order, f"no parameter named {params['name']!r}")
            return
        name, p = match[0]
    else:
        name, p = named[rng.randrange(len(named))]
    tensor = p.grad if grad else p
    if tensor is None:
        return
    flat = tensor.detach().reshape(-1)
    index = params["index"] if params["index"] is not None else rng.randrange(flat.numel())
    if index >= flat.numel():
        order["state"] = "done"
        _refuse_late(order, f"{name} has {flat.numel()} elements, no element {index}")
        return
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    width = flat.element_size() * 8
    bit = params["bit"] if params["bit"] is not None else rng.randrange(width)
    if bit >= width:
        order["state"] = "done"
        _refuse_late(order, f"{name} has {width}-bit elements, no bit {bit}")
        return
    with torch.no_grad():
        view = flat.view(ints)
        before = float(flat[index])
        mask = (1 << bit) if bit < width - 1 else -(1 << bit)  # the sign bit of a signed view
        view[index] ^= mask
        after = float(flat[index])
    _fired(order, {"tensor": "grad" if grad else "param", "name": name, "index": index, "bit": bit,
                   "before": before, "after": after, "step": job_step() if grad else step_done()})
    if order["state"] == "done" and params["steps"] > 1:
        _ended(order)


def _refuse_late(order: dict[str, Any], why: str) -> None:
    if _folder is not None:
        _refuse(_folder, f"{order['kind']}: {why}")


def _fire_gil(order: dict[str, Any]) -> None:
    """Hold the GIL for the order's duration: a libc ``nanosleep`` called through :class:`ctypes.PyDLL`, which
    keeps the GIL while the C call runs, so no Python thread of this process (heartbeats, watchdogs) runs."""
    import ctypes

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    duration = order["params"]["duration"]
    libc = ctypes.PyDLL(None)
    libc.nanosleep.argtypes = [ctypes.POINTER(Timespec), ctypes.POINTER(Timespec)]
    _fired(order, {"duration": duration})
    libc.nanosleep(ctypes.byref(Timespec(int(duration), int((duration % 1) * 1e9))), None)
    _ended(order)


def checksum(parameters) -> int:
    """The sum of every element's bits read as an integer of its width, wrapping as integers do (exact and
    order-free): replicas that agree bit for bit agree on it, and one flipped bit ``b`` moves one tensor's sum by
    ``2**b`` modulo ``2**32`` (``2**64`` for 8-byte elements), which is never 0."""
    import torch

    total = 0
    with torch.no_grad():
        for p in parameters:
            flat = p.detach().reshape(-1)
            size = flat.element_size()
            if size == 8:
                total += int(flat.view(torch.int64).sum())
            else:  # summed into 32 bits: a plain int32 reduction, several times faster than widening to int64
                ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
                total += int(flat.view(ints).sum(dtype=torch.int32))
    return total


def _emit_checksum(optimizer, step: int, final: bool = False) -> None:
    sdk = sys.modules.get("chaoskit.sdk.probe")  # it imports this module (and the bootstrap imports it)
    if sdk is None:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sdk.emit("sdc.checksum", step=int(step), sum=str(checksum(params)), params=sum(p.numel() for p in params),
             **({"final": True} if final else {}))


def final_checksum() -> None:
    """At exit with ``probes.sdc``: the replicas' last state, so a silent corruption nothing caught is
    known to have lasted (``sdc.checksum`` with ``final``; never a detection)."""
    if _optimizers and os.environ.get("CHAOSKIT_EVENTS"):
        sdk = sys.modules.get("chaoskit.sdk.probe")
        last = getattr(sdk, "last_step", None)
        _emit_checksum(_optimizers[-1], last if isinstance(last, int) else _opt_steps, final=True)
