"""Checkpoint storage gray faults: slow (``storage.slow``) and failing (``storage.error``) reads, writes, opens and
fsyncs in the job's checkpoint folder, through a FUSE passthrough mounted over it.

The folder is taken as ``storage.corrupt`` and ``storage.full`` take it (``path`` inside the job's checkpoint folder;
anything outside it, or through a link, refused on the node before anything is armed). On the node
:data:`STORAGE_IO` (:mod:`chaoskit.nodeside.storage_io`) opens the folder without following a link anyone but root
could have made, mounts ``fuse.chaoskit`` on that checked descriptor (``/proc/self/fd/N``), in the mount namespace of
the job's processes on the node, and serves the folder's original contents through a descriptor opened before the
mount hid them, every name walked with ``O_NOFOLLOW``. Only the chosen operations (``ops``) of the files matching
``files`` are harmed; everything else passes through. The mount is ``allow_other,default_permissions``: the job's
user keeps the rights the files give it, and what it makes through the mount is its own.

- ``storage.slow``: each chosen operation waits ``latency`` (plus or minus up to ``jitter``) before it runs, and
  reads and writes together move at most ``rate`` bytes a second (one queue, as one device).
- ``storage.error``: ``percent`` of the chosen operations fail with ``errno`` before they run.

The revert is armed as a lease first: it detaches the mount (``umount -l``) in every mount namespace that shows it,
with no call that waits on the daemon, so a hung or SIGKILLed daemon leaves no hung mount point, and then ends the
daemon. The daemon's own root parent detaches the mount the moment its server ends, however it ends.
``chaoskit audit`` names a leftover mount (``fuse.chaoskit``, source ``chaoskit-io-<token>``), its daemon and its
state file; ``chaoskit rollback`` runs the revert from the trusted journal.

The binding is mfusepy (``pip install 'chaoskit[fuse]'``, beside Debian's ``libfuse3-3``): ctypes over libfuse3's
high-level API, so nothing is compiled on a node, it imports in any CPython 3.8+, and its threads serve the job's
ranks at once. pyfuse3 needs a C compiler and libfuse3's headers on every node (or a wheel for the node's exact
Python) and trio, for an async API this passthrough does not need. The daemon runs on the node, so the node's
Python (this machine's for the process and netns labs, ``ssh.python`` or ``python3`` over SSH) must import it.
"""

from __future__ import annotations

import errno
import json
import re
import secrets
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit import nodeside
from chaoskit.cluster.selectors import NodeTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import Duration, PositiveDuration
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.sizes import ByteSize, format_size
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import (checkpoint_job_problem, checkpoint_root, checkpoint_where, helper_argv, helper_source,
                                       journaled_python, node_python, own_state_path, undo, until_reverted,
                                       wait_node_file)
from chaoskit.nodeside import procstat

__all__ = ["SlowSpec", "SlowFault", "ErrorSpec", "ErrorFault", "STORAGE_IO", "SOURCE_PREFIX", "FSTYPE", "ERRNOS"]

SOURCE_PREFIX = "chaoskit-io-"
"""The mount's source: ``chaoskit-io-<token>`` (``/proc/self/mountinfo``, ``findmnt``)."""
FSTYPE = "fuse.chaoskit"
STATE_PREFIX = "storage-io-"
GRACE_S = 5.0
"""How long a revert lets the files still open through the detached mount be closed before it ends the daemon."""
READY_S = 10.0
COMMAND_TIMEOUT_S = 30.0
STARTED_S = 20.0
OPS = ("open", "read", "write", "fsync")
ERRNOS = ("EIO", "ENOSPC", "EROFS", "EDQUOT", "EACCES", "EPERM", "ENOMEM", "EAGAIN", "EINTR", "ETIMEDOUT", "EBUSY",
          "ENOENT", "ESTALE", "ENOTCONN")
"""The errnos a storage fault may return: what a failing disk or network file system gives a job."""

STORAGE_IO = helper_source(nodeside.source("storage_io"), procstat, SOURCE_PREFIX=SOURCE_PREFIX, FSTYPE=FSTYPE,
                           GRACE_S=GRACE_S, READY_S=READY_S)
"""``python3 -I -c STORAGE_IO OP ...`` on the node (:mod:`chaoskit.nodeside.storage_io`)."""

_TOKEN = re.compile(r"^[0-9a-f]{16}$")
_FILES = r"^[A-Za-z0-9_.*?\[\]/-]+$"


class _IoSpec(FaultSpec):
    path: str = Field(
        ".", min_length=1, max_length=4096,
        description="The folder to mount over, inside the job's checkpoint folder: relative to it ('.', the default, is "
                    "the folder itself), or absolute inside workload.checkpoint_dir. Anything outside it, or a path "
                    "through a symbolic link, is refused on the node.")
    files: str = Field(
        "*", min_length=1, max_length=255, pattern=_FILES,
        description="Which files are harmed: a shell glob matched against each file's path under 'path' and against "
                    "its name (e.g. 'ckpt-*.pt'); the others pass through untouched.")
    ops: list[Literal["open", "read", "write", "fsync"]] = Field(
        default_factory=lambda: list(OPS), min_length=1, max_length=4,
        description="Which operations are harmed: open (creating a file included), read, write, fsync.")
    duration: PositiveDuration = Field(..., description="How long the fault lasts; the node reverts it by itself after that.")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if any(ord(c) < 32 or c == "\x7f" for c in v):
            raise ValueError("path must not contain control characters")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each operation once")
        return v


class SlowSpec(_IoSpec):
    """Slow checkpoint storage: add latency to, or cap the bandwidth of, the chosen operations in the checkpoint folder."""

    kind: Literal["storage.slow"]
    latency: Duration | None = Field(None, description="Added to each chosen operation before it runs (e.g. 200ms).")
    jitter: Duration = Field(0, description="Each delay is latency plus or minus up to this much (never below zero).")
    rate: ByteSize | None = Field(
        None, description="The most bytes a second reads and writes move together (e.g. 20MiB: 20 MiB a second), "
                          "one queue, as one device.")

    @model_validator(mode="after")
    def _something(self) -> "SlowSpec":
        if self.latency is None and self.rate is None:
            raise ValueError("give latency, rate or both")
        if self.jitter and (self.latency is None or self.jitter > self.latency):
            raise ValueError("jitter must not be larger than latency")
        if self.rate is not None and not {"read", "write"} & set(self.ops):
            raise ValueError("rate caps reads and writes: ops names neither")
        return self


class ErrorSpec(_IoSpec):
    """Failing checkpoint storage: a share of the chosen operations in the checkpoint folder fail with an errno."""

    kind: Literal["storage.error"]
    errno: Literal[ERRNOS] = Field("EIO", description="What the operations fail with (EIO, ENOSPC, EROFS, ...).")  # type: ignore[valid-type]
    percent: float = Field(100, gt=0, le=100, description="The share of the chosen operations that fail, in percent.")


class _IoFault(Fault):
    target_type = "node"
    lasting: ClassVar[bool] = True
    measures_checkpoint_io: ClassVar[bool] = True
    state_prefixes = (STATE_PREFIX,)

    def harm(self) -> dict[str, Any]:
        """What the daemon does (its CONFIG): ``ops``, ``files`` and the kind's own."""
        raise NotImplementedError

    def what(self) -> str:
        """The harm in words, for the plan."""
        raise NotImplementedError

    def needs(self) -> tuple[str, ...]:
        return ("python3",)

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        return checkpoint_job_problem(self.kind, self.spec.path, workload)

    def _root(self, ctx: FaultContext) -> str:
        return checkpoint_root(self.kind, ctx)

    def _where(self) -> str:
        return checkpoint_where(self.spec.path)

    def _probe(self, ctx: FaultContext, transport: Transport, root: str) -> dict[str, Any]:
        res = transport.run(helper_argv(node_python(ctx, transport, transport.node), STORAGE_IO, "probe", root,
                                        self.spec.path), COMMAND_TIMEOUT_S)
        if res.returncode == 2:
            i = self.fault_id.lstrip("f").split(".")[0]
            raise ScenarioError(f"faults.{i}.path: {_last(res)} on node {transport.node}; nothing was injected")
        if res.returncode != 0:
            raise InfraError(f"{self.kind} on node {transport.node}: {_last(res)}; nothing was injected")
        found = json.loads(res.stdout)
        if not found["fuse"]:
            raise InfraError(f"{self.kind}: node {transport.node} has no /dev/fuse", hint="load the fuse kernel module")
        if found["binding"] is None:
            raise InfraError(f"{self.kind}: the FUSE binding does not load on node {transport.node}: "
                             f"{found.get('binding_error')}",
                             hint="on the node: apt-get install fuse3 libfuse3-3, and pip install 'chaoskit[fuse]' "
                                  "(mfusepy) for the Python chaoskit runs there")
        if found["mounted_here"]:
            raise InfraError(f"{self.kind}: a chaoskit FUSE mount is on {found['folder']} on node {transport.node} "
                             "already (one storage.slow or storage.error per folder at a time); nothing was injected")
        return found

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        root = getattr(ctx, "checkpoint_dir", None)
        if not root:
            return  # a job chaoskit starts: its folder exists once it runs; inject probes again
        for t in targets:
            transport = ctx.transport(t.node)
            if transport.run(["test", "-d", root], COMMAND_TIMEOUT_S).returncode == 0:
                self._probe(ctx, transport, self._root(ctx))

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, where = self.spec.duration, self._where()
        out = []
        for t in targets:
            out.append(Action(t.node, f"open {where} from / (refused if it leaves the checkpoint folder or goes through a "
                                      "link); check /dev/fuse and the FUSE binding (mfusepy, libfuse3)", t.node))
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <storage io tool> unmount <token>' "
                                      f"(umount -l of {SOURCE_PREFIX}<token> in every mount namespace, then the daemon "
                                      f"ended) after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"start detached: the FUSE daemon mounts {FSTYPE} ({SOURCE_PREFIX}<token>; "
                                      f"allow_other,default_permissions,nosuid,nodev) over {where} in the mount "
                                      "namespace of the job's processes there, serving the original folder through a "
                                      f"descriptor opened before the mount, as the folder's owner: {self.what()}",
                              t.node))
            out.append(Action(t.node, f"after {d:g}s: umount -l the mount, end the daemon", t.node))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        root = self._root(ctx)
        return [self._inject_on(ctx, root, f"{self.fault_id}.{i}", t) for i, t in enumerate(targets)]

    def _inject_on(self, ctx: FaultContext, root: str, fid: str, t: NodeTarget) -> Injection:
        transport = ctx.transport(t.node)
        found = self._probe(ctx, transport, root)
        python = node_python(ctx, transport, t.node)
        token = secrets.token_hex(8)
        state = f"{transport.state_dir}/{STATE_PREFIX}{token}.json"
        revert = helper_argv(python, STORAGE_IO, "unmount", token, state)
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.node}:{found['folder']}")
        # the job's processes on the node may have a mount namespace of their own (ip netns exec): mount in theirs
        procs = [p for p in transport.processes() if p.start_time is not None]
        ns = (str(procs[0].pid), str(procs[0].start_time)) if procs else ("-", "-")
        config = json.dumps({**self.harm(), "ops": list(self.spec.ops), "files": self.spec.files})
        try:
            transport.spawn_detached(helper_argv(python, STORAGE_IO, "serve", root, found["root_id"], found["rel"],
                                                 found["folder_id"], token, state, *ns, config))
            text = wait_node_file(transport, state, STARTED_S)
            started = json.loads(text) if text else {"failed": f"the FUSE daemon did not start within {STARTED_S:g}s"}
        except (InfraError, ValueError) as exc:
            started = {"failed": str(exc)}
        if "failed" in started:
            undo(ctx, transport, fid, revert)
            if started.get("code") == 2:
                i = self.fault_id.lstrip("f").split(".")[0]
                raise ScenarioError(f"faults.{i}.path: {started['failed']} on node {t.node}; nothing was injected")
            raise InfraError(f"{self.kind} on node {t.node}: {started['failed']}; nothing was injected")
        detail = {"mechanism": "fuse", "fidelity": "real", "folder": found["folder"], "mount": f"{SOURCE_PREFIX}{token}",
                  "daemon_pid": started.get("pid"), **self.harm(), "ops": list(self.spec.ops), "files": self.spec.files,
                  "revert": revert}
        return Injection(fid, self.kind, t.node, [f"{t.node}:{found['folder']}"], float(started["t"]), detail)

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        revert = injection.detail["revert"]
        _parse_revert(revert)
        res = ctx.transport(injection.node).run(revert, COMMAND_TIMEOUT_S + GRACE_S)
        if res.returncode != 0:
            raise InfraError(f"{self.kind}: revert on node {injection.node} failed: {_last(res)}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        return until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"]))

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The storage io tool's ``unmount TOKEN STATE`` (a state file of this node's state folder)."""
        python, token, state = _parse_revert(revert)
        return helper_argv(journaled_python(python, node), STORAGE_IO, "unmount", token,
                           own_state_path(node.conn, state, STATE_PREFIX, ".json"))

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        python, token, state = _parse_revert(revert)
        res = transport.run(helper_argv(python, STORAGE_IO, "check", token, state), COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot check the FUSE mount {SOURCE_PREFIX}{token}: {_last(res)}"
        return res.stdout.strip() or None

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """A ``fuse.chaoskit`` mount in any of the node's mount namespaces, a FUSE daemon still running, a state file."""
        text = view.run(["sh", "-c", "cat /proc/[0-9]*/mountinfo 2>/dev/null; true"]) or ""
        points = sorted({(words[4], rest[1]) for line in text.splitlines()
                         for words, _, rest in [(line.partition(" - ")[0].split(" "), 0, line.partition(" - ")[2].split(" "))]
                         if len(words) > 4 and len(rest) > 1 and rest[0] == FSTYPE and rest[1].startswith(SOURCE_PREFIX)})
        out = [f"FUSE mount {source} on {point} (storage.slow/storage.error)" for point, source in points]
        out += [f"FUSE daemon running: pid {pid} (storage.slow/storage.error)" for pid, _, cmdline in view.ps()
                if " serve " in cmdline and f"/{STATE_PREFIX}" in cmdline and "-I -c" in cmdline]
        return out + [f"state {name} (storage.slow/storage.error)" for name in view.state_entries()
                      if name.startswith(STATE_PREFIX) and "/" not in name]


class SlowFault(_IoFault):
    kind = "storage.slow"
    covers = ("storage.degraded",)
    Spec = SlowSpec
    primes: ClassVar[bool] = True  # slow storage restarts nothing by itself: a later fault's recovery is measured

    def harm(self) -> dict[str, Any]:
        return {"latency": self.spec.latency, "jitter": self.spec.jitter, "rate": self.spec.rate}

    def what(self) -> str:
        parts = []
        if self.spec.latency is not None:
            parts.append(f"{self.spec.latency * 1000:g} ms" + (f" ± {self.spec.jitter * 1000:g} ms" if self.spec.jitter else "")
                         + f" before each {'/'.join(self.spec.ops)}")
        if self.spec.rate is not None:
            parts.append(f"reads and writes at most {format_size(self.spec.rate)}/s together")
        return "; ".join(parts) + f" of the files matching '{self.spec.files}'"


class ErrorFault(_IoFault):
    kind = "storage.error"
    covers = ("storage.degraded", "storage.disk")
    Spec = ErrorSpec

    def harm(self) -> dict[str, Any]:
        return {"errno": getattr(errno, self.spec.errno), "errno_name": self.spec.errno, "share": self.spec.percent}

    def what(self) -> str:
        return (f"{self.spec.percent:g}% of each {'/'.join(self.spec.ops)} of the files matching '{self.spec.files}' "
                f"fail with {self.spec.errno}")


def _parse_revert(revert: list[str]) -> tuple[str, str, str]:
    """``(python, token, state)`` of a revert this module made; ``ValueError`` for any other argv."""
    if len(revert) != 7 or revert[1:5] != ["-I", "-c", STORAGE_IO, "unmount"] or not _TOKEN.match(revert[5]):
        raise ValueError("not a storage.slow/storage.error revert chaoskit makes")
    python, token, state = revert[0], revert[5], revert[6]
    name = state.rsplit("/", 1)[-1]
    if name != f"{STATE_PREFIX}{token}.json" or not state.startswith("/") or any(ord(c) < 32 for c in python + state):
        raise ValueError("not a storage.slow/storage.error revert chaoskit makes: its state file is not the token's")
    return python, token, state


def _last(res: Any) -> str:
    """The last line the node's tool wrote on stderr (its one clear line), or its exit status."""
    return (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
