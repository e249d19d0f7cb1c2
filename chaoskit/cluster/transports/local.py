"""The local transport: the node is a set of processes on this machine.

A process-lab node is the torchrun agent the lab started plus every process it
starts. torchrun puts each worker in a session of its own, so the lab marks the
node through the environment every descendant inherits: ``CHAOSKIT_SCOPE``.
:meth:`LocalTransport.processes` returns only processes carrying the node's
token, so a selector can never reach anything else on the machine. Faults keep the
node's files in :attr:`LocalTransport.state_dir`, this user's state folder
(:mod:`chaoskit.nodeside.nodefs`: ``/run/chaoskit`` as root, else in its home).
"""

from __future__ import annotations

import os
import subprocess
import time

from chaoskit.cluster.transports.api import CommandResult, JobScope, ProcInfo, proc_env
from chaoskit.core import procs
from chaoskit.core.errors import InfraError, TargetGone
from chaoskit.core.jobenv import SCOPE_VAR
from chaoskit.nodeside import nodefs

__all__ = ["LocalTransport", "read_proc"]


class LocalTransport:
    """A node of local processes (a process-lab node), or the controller itself (``LocalTransport(node)``)."""

    name = "local"

    SCOPE_ENV = SCOPE_VAR
    has_own_network = False
    has_own_clock = False
    processes_here = True
    container = None

    def __init__(self, node: str, scope: str | None = None, state_dir: str | None = None, *,
                 uids: frozenset[int] | None = None, since: int | None = None) -> None:
        self.node = node
        self.scope = scope
        """Processes whose environment has ``CHAOSKIT_SCOPE=<scope>`` belong to the node (and, with ``uids`` and
        ``since``, are of those users and started after that moment)."""
        self.uids = uids
        """The users a node's process may be (a lab's: chaoskit's and its job account's); ``None``: any. Another
        user can copy the token into a process of theirs; it is not the node's for that."""
        self.since = since
        """The earliest start (clock ticks since boot, as ``/proc/PID/stat``) of a node's process: the lab's birth."""
        self._wanted_state_dir = state_dir
        self._state_dir: str | None = None
        self.job: JobScope | None = None
        """The drilled job within the node's scope (``None``: the whole scope is the job's)."""

    @property
    def state_dir(self) -> str:
        """chaoskit's state folder for this node (made and checked on first use)."""
        if self._state_dir is None:
            try:
                self._state_dir = nodefs.state_dir(self._wanted_state_dir)
            except nodefs.StateDirError as exc:
                raise InfraError(f"node {self.node}: {exc}") from None
        return self._state_dir

    def connect(self) -> "LocalTransport":
        return self

    def ping(self, timeout: float = 5.0) -> float:
        return time.time()

    def close(self) -> None:
        pass

    def processes(self, workers_only: bool = False, *, node_wide: bool = False) -> list[ProcInfo]:
        if not self.scope:
            return []
        procs = [p for p in read_proc() if p.env.get(self.SCOPE_ENV) == self.scope and self._admits(p)]
        if self.job is not None and not node_wide:
            procs = self.job.select(procs)
        return [p for p in procs if p.is_worker or not workers_only]

    def _ours(self, info: ProcInfo | None) -> bool:
        """``info`` is of the node's scope and of the drilled job."""
        if not self.scope or info is None or info.env.get(self.SCOPE_ENV) != self.scope or not self._admits(info):
            return False
        if self.job is None or self.job.carries(info):
            return True
        return any(p.pid == info.pid for p in self.job.select(self.processes(node_wide=True)))

    def _admits(self, info: ProcInfo) -> bool:
        """``info``'s user and start are the node's (see :attr:`uids`, :attr:`since`)."""
        if self.uids is not None and info.uid not in self.uids:
            return False
        return self.since is None or info.start_time is None or info.start_time >= self.since

    def scope_wire(self) -> dict[str, object]:
        """The node's scope as a node-side program judges it (the crash loop): token, users, earliest start."""
        return {"env": self.scope, "netns": False,
                **({"uids": sorted(self.uids)} if self.uids is not None else {}),
                **({"since": self.since} if self.since is not None else {})}

    def in_scope(self, pid: int) -> bool:
        info = proc_info(pid)
        return info is not None and info.state != "Z" and self._ours(info)

    def state(self, pid: int, start_time: int | None = None) -> str | None:
        """One-letter process state (R, S, T when stopped, Z) or ``None`` when gone, out of scope, or (with
        ``start_time``) another process now."""
        info = proc_info(pid)
        if info is None or (start_time is not None and info.start_time != start_time):
            return None
        return info.state if self._ours(info) else None

    def signal(self, pid: int, signum: int, start_time: int | None = None) -> float:
        info = proc_info(pid)
        if info is not None and start_time is not None and info.start_time != start_time:
            raise TargetGone(f"refusing to signal pid {pid}: it is not the process that was selected (its start time "
                             "changed: the pid was reused)")
        if info is None or info.state == "Z":
            raise TargetGone(f"pid {pid} on node {self.node} exited before it was signalled; not signalled")
        if not self._ours(info):
            what = f"the drilled job ({self.job.describe()})" if self.job is not None else f"node {self.node}"
            raise InfraError(f"refusing to signal pid {pid}: it is not a process of {what}")
        os.kill(pid, signum)
        return time.time()

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise InfraError(f"{argv[0]}: command not found on node {self.node}") from None
        except subprocess.TimeoutExpired:
            raise InfraError(f"{argv[0]}: no answer within {timeout:g}s on node {self.node}") from None
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def spawn_detached(self, argv: list[str]) -> int:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        return proc.pid

    def touch(self, path: str) -> None:
        nodefs.touch_file(path)


def read_proc() -> list[ProcInfo]:
    """Every readable process on this machine, with the environment keys chaoskit reads (:func:`~.api.proc_env`)."""
    out = []
    for pid in procs.pids():
        info = proc_info(pid)
        if info is not None:
            out.append(info)
    return out


_ENV_CACHE: dict[tuple[int, str, str], dict[str, str]] = {}


def proc_info(pid: int) -> ProcInfo | None:
    """One process from /proc, or ``None`` when it is gone or unreadable.

    The environment is the costly part and cannot change without an exec, so it
    is cached per (pid, start time, command line): an exec changes the command line.
    """
    rest = procs.stat_fields(pid)
    raw_cmdline = procs.cmdline(pid)
    if rest is None or len(rest) < 20 or raw_cmdline is None:
        return None
    cmdline = raw_cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    key = (pid, rest[19], cmdline)
    env = _ENV_CACHE.get(key)
    if env is None:
        raw = procs.environ(pid) or b""  # unreadable (another user's): no environment
        env = {}
        for item in raw.split(b"\0"):
            k, sep, value = item.partition(b"=")
            if sep:
                env[k.decode(errors="replace")] = value.decode(errors="replace")
        env = proc_env(env)
        # a process between fork and exec has no stable identity yet, and right after exec its environ can
        # read empty for a moment: neither is cached
        if cmdline and raw:
            if len(_ENV_CACHE) > 4096:
                _ENV_CACHE.clear()
            _ENV_CACHE[key] = env
    uid = procs.owner(pid)
    if uid is None:
        return None
    return ProcInfo(pid=pid, ppid=int(rest[1]), cmdline=cmdline, env=env, state=rest[0].decode(errors="replace"), uid=uid,
                    start_time=int(rest[19]))
