"""A small PyTorch DDP training job with no chaoskit import at all.

Run under torchrun. It says what it does only through its own prints, the way
most real jobs do, so chaoskit can measure it through log-regex probes alone
(``scenarios/kill-uninstrumented.yaml``). :mod:`chaoskit.workloads.ddp_train`
is the same job with SDK hooks.

Checkpoints are written atomically (temp file + rename) into a shared folder by
rank 0, which keeps the newest :data:`KEEP` of them. On (re)start every rank
resumes from the newest one it can load: one that is truncated, corrupt or gone
is reported and the next older one is tried (the "fallback"); with none left the
job starts from step 0, and says so. A save that fails (a full disk) is reported
and training goes on: the previous checkpoints are still there.

Under NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext; it sets ``FT_RANK_MONITOR_IPC_SOCKET``) every rank sends its
rank monitor a heartbeat each step, and, where the launcher was given section timeouts, opens the sections it
names: ``setup`` (process group and checkpoint load), ``step``, ``checkpointing`` (:class:`NvrxMonitor`).

With ``--nvrx-inprocess`` the training loop runs under NVRx's in-process restart
(``nvidia_resiliency_ext.inprocess.Wrapper``, :func:`train_inprocess`): an exception in any rank, a rank whose
steps stop (its ``ping`` each step goes stale past the soft timeout) or a rank that dies makes every surviving
rank abandon its process group and run the loop again, in the same process, from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import glob
import os
import sys
import threading
import time
from typing import Any, Callable, NoReturn

KEEP = 3
"""Checkpoints kept: the newest, and two to fall back to when it cannot be loaded."""


class Hooks:
    """Where the job reports progress. The default prints; the SDK version emits events."""

    def worker_start(self, rank: int, world: int, restart: int, iteration: int | None = None) -> None:
        """``restart``: torchrun's restart count; ``iteration``: the in-process restart's (``None`` without one)."""
        again = "" if iteration is None else f" iteration={iteration}"
        print(f"[rank {rank}] worker started pid={os.getpid()} restart={restart} world_size={world}{again}", flush=True)

    def rendezvous_done(self, rank: int, world: int) -> None:
        print(f"[rank {rank}] process group ready world_size={world}", flush=True)

    def load(self, rank: int, path: str):  # returns a context manager
        return _PrintOnSuccess(lambda info: f"[rank {rank}] Resuming training from snapshot at step {info.get('step')}")

    def save(self, rank: int, step: int):
        return _PrintOnSuccess(lambda info: f"[rank {rank}] saved snapshot at step {step}")

    def load_failed(self, rank: int, path: str, exc: BaseException, fallback: str | None) -> None:
        then = f"falling back to {os.path.basename(fallback)}" if fallback else "no older checkpoint: starting from step 0"
        print(f"[rank {rank}] cannot load checkpoint {os.path.basename(path)}: {error_line(exc)}; {then}", flush=True)

    def save_failed(self, rank: int, step: int, exc: BaseException) -> None:
        print(f"[rank {rank}] checkpoint save at step {step} failed: {error_line(exc)}; training goes on", flush=True)

    def step(self, rank: int, step: int, loss: float) -> None:
        print(f"[rank {rank}] step {step} loss {loss:.4f}", flush=True)

    def finished(self, rank: int) -> None:
        """Every rank made its last step (after the closing barrier, before the process group goes)."""

    def collective_error(self, rank: int, exc: BaseException) -> None:
        print(f"[rank {rank}] collective failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)


class _PrintOnSuccess:
    """A load's or a save's context: the job fills the info dict it gives; ``line(info)`` is printed when the
    block ends without an exception (a failed one is reported by ``load_failed`` / ``save_failed``)."""

    def __init__(self, line: Callable[[dict[str, Any]], str]) -> None:
        self.line, self.info = line, {}

    def __enter__(self):
        return self.info

    def __exit__(self, *exc):
        if exc[0] is None:
            print(self.line(self.info), flush=True)


class NvrxMonitor:
    """The rank's link to its NVRx rank monitor: heartbeats, and the sections the launcher has timeouts for.
    Does nothing outside ``ft_launcher``; ``nvidia_resiliency_ext`` is imported only under it."""

    SECTIONS = ("setup", "step", "checkpointing")

    def __init__(self) -> None:
        self.client = None
        self.sections: set[str] = set()
        if not os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        self.client = RankMonitorClient()
        self.client.init_workload_monitoring()
        self.sections = set(self.client.cfg.rank_section_timeouts) & set(self.SECTIONS)
        # No heartbeat yet: the first one switches the monitor from the initial timeout (start-up: the process
        # group, the checkpoint load) to the rank heartbeat timeout, which a slow start-up would then overrun
        # (seen here: a restarted world killed again and again 5 s into its checkpoint load).

    def beat(self) -> None:
        if self.client is not None:
            self.client.send_heartbeat()

    def open(self, section: str) -> None:
        if section in self.sections:
            self.client.start_section(section)

    def close(self, section: str) -> None:
        if section in self.sections:
            self.client.end_section(section)

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.shutdown_workload_monitoring()


class Session:
    """How one run of the training loop meets what launched it. Under torchrun: no in-process iteration, a process
    group from its environment (``env://``), and a collective that fails ends the worker."""

    in_process = False

    def iteration(self) -> int | None:
        return None

    def init_group(self, backend: str, timeout: datetime.timedelta) -> None:
        import torch.distributed as dist

        dist.init_process_group(backend, timeout=timeout)

    def ping(self) -> None:
        """A step was made (the in-process restart's progress watchdog)."""


class InprocessSession(Session):
    """One iteration of NVRx's in-process restart (:func:`train_inprocess`): the Wrapper's iteration, each iteration's process group lives under a prefix of its own in the job's store (the previous one's keys
    would collide), every step pings the progress watchdog, and a failed collective is raised to the Wrapper."""

    in_process = True

    def __init__(self, call_wrapper, store) -> None:
        self.call_wrapper, self.store = call_wrapper, store

    def iteration(self) -> int:
        return int(self.call_wrapper.iteration)

    def init_group(self, backend: str, timeout: datetime.timedelta) -> None:
        import torch.distributed as dist

        env = os.environ  # the Wrapper sets RANK and WORLD_SIZE for each iteration
        dist.init_process_group(backend, store=dist.PrefixStore(f"chaoskit-iteration-{self.iteration()}", self.store),
                                rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), timeout=timeout)

    def ping(self) -> None:
        self.call_wrapper.ping()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-time", type=float, default=0.05, help="minimum seconds per step")
    p.add_argument("--step-compute", type=float, default=0.0,
                   help="CPU seconds of busy work per step (counted in this thread's CPU time), before sleeping the rest")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHAOSKIT_CKPT_DIR", "checkpoints"))
    p.add_argument("--collective-timeout", type=float, default=30.0, help="seconds (torch's default is 30 min)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--nvrx-inprocess", action="store_true",
                   help="run the loop under NVRx's in-process restart (nvidia_resiliency_ext.inprocess.Wrapper)")
    p.add_argument("--nvrx-soft-timeout", type=float, default=5.0,
                   help="in-process: seconds without a step (the ping) before the ranks restart")
    p.add_argument("--nvrx-hard-timeout", type=float, default=15.0,
                   help="in-process: seconds without a step before the rank's monitor process kills it")
    p.add_argument("--nvrx-heartbeat-timeout", type=float, default=5.0,
                   help="in-process: seconds without a peer's heartbeat (a dead rank) before the others restart")
    return p.parse_args(argv)


def checkpoints(folder: str) -> list[str]:
    """The job's checkpoints in ``folder``, newest first."""
    return sorted(glob.glob(os.path.join(folder, "ckpt-*.pt")), reverse=True)


def newest_checkpoint(folder: str) -> str | None:
    paths = checkpoints(folder)
    return paths[0] if paths else None


def error_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def compute(cpu_s: float) -> None:
    """Busy work until this thread has used ``cpu_s`` seconds of CPU.

    Counted in CPU time, not wall time: a throttled or starved worker takes longer in wall time for
    the same work, the way a real step's compute does, while a sleeping step would not notice a
    CPU throttle at all on an idle machine."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i


def _collective_failed(hooks: Hooks, session: Session, rank: int, exc: Exception) -> int:
    """A collective raised: reported, then the worker exits 1, or, under the in-process restart, the iteration
    ends by raising it to the Wrapper."""
    hooks.collective_error(rank, exc)
    if session.in_process:
        raise exc
    return 1


def train(args: argparse.Namespace, hooks: Hooks, session: Session | None = None) -> int:
    env = os.environ
    session = session or Session()
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    hooks.worker_start(rank, world, int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0), session.iteration())
    nvrx = NvrxMonitor()
    nvrx.open("setup")

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{int(env.get('LOCAL_RANK', '0'))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    session.init_group(backend, datetime.timedelta(seconds=args.collective_timeout))
    hooks.rendezvous_done(rank, world)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    candidates = checkpoints(args.checkpoint_dir)
    for n, path in enumerate(candidates):
        try:
            state = None
            with hooks.load(rank, path) as info:
                state = torch.load(path, map_location=device, weights_only=True)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                start = int(state["step"])
                info["step"] = start
                info["bytes"] = os.path.getsize(path)
                if n:
                    info["fallback"] = n
            break
        except Exception as exc:  # noqa: BLE001 - truncated, corrupt or gone: try the next older one
            torch.manual_seed(0)  # a half-loaded state must not leak into the next try
            model = torch.nn.Sequential(
                torch.nn.Linear(32, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)
            ).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            start = 0
            hooks.load_failed(rank, path, exc, candidates[n + 1] if n + 1 < len(candidates) else None)
    ddp = DDP(model)
    nvrx.close("setup")
    nvrx.beat()
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, args.steps + 1):
        nvrx.open("step")
        t0 = time.monotonic()
        x = torch.randn(16, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # the gradient all-reduce: where a dead or hung peer is noticed
        except Exception as exc:  # noqa: BLE001 - any collective failure ends this worker (or its iteration)
            return _collective_failed(hooks, session, rank, exc)
        opt.step()
        if args.step_compute > 0:
            compute(args.step_compute)
        rest = args.step_time - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        hooks.step(rank, step, loss.item())
        session.ping()
        nvrx.close("step")
        nvrx.beat()
        if rank == 0 and step % args.checkpoint_every == 0:
            nvrx.open("checkpointing")
            _save(args.checkpoint_dir, step, model, opt, hooks, rank)
            nvrx.close("checkpointing")
    nvrx.shutdown()
    # every rank leaves its last all-reduce before any rank closes its connections: a rank that tears its group
    # down while a peer still reads from it can take that peer down at exit (SIGABRT), after the job finished
    try:
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - a peer that died after its last step
        return _collective_failed(hooks, session, rank, exc)
    hooks.finished(rank)
    dist.destroy_process_group()
    if rank == 0:
        print(f"[rank {rank}] training finished at step {args.steps}", flush=True)
    return 0


def _save(folder, step, model, opt, hooks, rank) -> None:
    """Write one checkpoint atomically; a failed save (a full disk) is reported, its partial file removed,
    and training goes on with the checkpoints already there."""
    import torch

    final = os.path.join(folder, f"ckpt-{step:08d}.pt")
    tmp = f"{final}.tmp.{os.getpid()}"
    try:
        with hooks.save(rank, step) as info:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)  # atomic: a reader sees the whole file or none
            info["bytes"] = os.path.getsize(final)
    except (OSError, RuntimeError) as exc:  # torch.save reports ENOSPC as a RuntimeError from its zip writer
        try:
            os.unlink(tmp)
        except OSError:
            pass
        hooks.save_failed(rank, step, exc)
        return
    for old in checkpoints(folder)[KEEP:]:
        try:
            os.unlink(old)
        except OSError:
            pass


def train_inprocess(args: argparse.Namespace, hooks: Hooks) -> int:
    """:func:`train` under NVRx's in-process restart. The Wrapper's own store is at ``MASTER_PORT`` (rank 0 hosts
    it); the job's process groups use a store of their own at ``$CHAOSKIT_NVRX_STORE_PORT`` (chaoskit picks a free
    one; else ``MASTER_PORT + 1``). The Wrapper's log lines (its ``nvidia_resiliency_ext`` loggers, at INFO) go to
    stderr prefixed ``[nvrx-inprocess]``: what the ``nvrx-inprocess`` preset reads."""
    import logging

    import torch.distributed as dist
    from nvidia_resiliency_ext import inprocess

    env = os.environ
    # The Wrapper logs only where the root logger has a StreamHandler (inprocess.utils.Logging): one here, for its
    # lines alone (the job logs nothing else through logging)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[nvrx-inprocess] %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("nvidia_resiliency_ext").setLevel(logging.INFO)
    store = dist.TCPStore(env["MASTER_ADDR"], int(env.get("CHAOSKIT_NVRX_STORE_PORT") or int(env["MASTER_PORT"]) + 1),
                          int(env["WORLD_SIZE"]), is_master=int(env["RANK"]) == 0, multi_tenant=True,
                          wait_for_workers=True, timeout=datetime.timedelta(seconds=300))
    s = datetime.timedelta(seconds=1)

    def loop(call_wrapper=None) -> int:
        return train(args, hooks, InprocessSession(call_wrapper, store))

    # the Wrapper passes its CallWrapper to the argument annotated so, and reads the annotation as a class (this
    # module's annotations are strings)
    loop.__annotations__["call_wrapper"] = inprocess.CallWrapper

    wrapped = inprocess.Wrapper(
        soft_timeout=args.nvrx_soft_timeout * s, hard_timeout=args.nvrx_hard_timeout * s,
        heartbeat_timeout=args.nvrx_heartbeat_timeout * s, heartbeat_interval=min(1.0, args.nvrx_heartbeat_timeout / 4) * s,
        # the monitor process checks its timeouts only when no message came within its interval, and the watchdog
        # sends one each of its own: a watchdog as frequent as the check would starve it (no soft timeout, ever)
        monitor_thread_interval=0.5 * s, monitor_process_interval=0.25 * s, progress_watchdog_interval=1 * s,
        barrier_timeout=max(60.0, 4 * args.nvrx_hard_timeout) * s, completion_timeout=max(60.0, 4 * args.nvrx_hard_timeout) * s,
        health_check=None)(loop)
    return wrapped()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return (train_inprocess if args.nvrx_inprocess else train)(args, Hooks())


def leave(code: int) -> NoReturn:
    """End a worker whose training returned, as the interpreter would, less torch's own teardown: threads that are
    not daemons are waited for, the exit handlers run (the SDK's last checksum, logging, multiprocessing's
    children), the streams are flushed, then the process exits with ``code``. The teardown skipped frees torch's
    modules one by one: 0.4 s of CPU a worker here, seconds on a loaded node, at the end of every job."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter runs at exit, in the same order (CPython's own function)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    leave(main())
