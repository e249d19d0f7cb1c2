"""GPU faults: a device that stays failed (``gpu.fail``) from the fault time until revert, and the first sign of
one, an NVIDIA Xid line in the node's kernel log (``gpu.xid``, at the end of this module).

What makes a failed GPU different from a crashed process is that it *stays*
failed: torchrun restarting the workers in place fails again, and only moving
the job off the node recovers. Two mechanisms, chosen per node (``auto``) or
named in the scenario, and both named in the dry-run plan and the report:

- ``nvidia`` (real): the device's compute mode is set to ``PROHIBITED``, so no new
  CUDA context can be created on it, and the processes holding a context on it
  (``nvidia-smi --query-compute-apps``) are killed, the node's own only. Revert
  restores the compute mode read before the fault. Needs root on the node.
- ``crashloop`` (emulated, runs anywhere): a small stdlib-only loop started
  detached on the node (it outlives chaoskit) kills every job worker that appears
  there and matches the fault's selector, within one poll (:data:`POLL_S`), until
  a stop file appears or its own deadline (the fault's duration) passes. The
  recovery path the job takes is the same: restarts in place die again.

``scope`` says what fails: ``device`` (the default) fails the selected workers' GPU, so
torchrun restarts them in place on the same node until its restarts run out; ``node``
takes the whole node out of the job, as a health check that finds a failed GPU does:
every device of the node is failed and every process of the job there, its torchrun
agent included, is killed (the crash loop keeps killing any that appears). With the
agent gone the rendezvous loses the node, and a spare (or the scheduler) takes its place.
A job's process is one whose environment carries the job's marks (``CHAOSKIT_NODE``, set
for every process chaoskit starts, or torchrun's ``TORCHELASTIC_RUN_ID``), or the torchrun
agent that is the parent of such a worker (a job chaoskit attached to).

Either way the revert is armed as a lease first, so a controller that is
SIGKILLed still ends with the compute mode restored or the loop stopped.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from chaoskit import nodeside
from chaoskit.cluster.inventory import Node
from chaoskit.cluster.nvidia import device_of, listed_devices, lists_devices
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.cluster.transports.api import ProcInfo, Transport
from chaoskit.cluster.xid import MARKER, XID_MESSAGES, format_xid, normalize_pci
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.limits import MAX_COUNT
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import (
    COMMAND_TIMEOUT_S,
    helper_argv,
    helper_source,
    node_python,
    own_state_path,
    parse_started,
    read_node_file,
    run_helper,
    slurm_drain,
    state_path,
    undo,
    until_reverted,
    wait_node_file,
)
from chaoskit.nodeside import jobscope

__all__ = ["GpuFailFault", "GpuFailSpec", "GpuXidFault", "GpuXidSpec", "XID_WRITER", "CRASHLOOP", "COMPUTE_MODES", "POLL_S", "job_processes"]

POLL_S = 0.05
"""How often the crash loop scans the node's processes: a new worker dies within one poll."""
STARTED_S = 10.0
"""How long inject waits for the crash loop to say it watches."""
LOOP_DIR = "crashloop-"
"""The crash loop's folder is ``<state folder>/crashloop-<token>``, made by the loop itself (0700)."""

COMPUTE_MODES = {
    "default": "DEFAULT",
    "exclusive_thread": "EXCLUSIVE_THREAD",
    "prohibited": "PROHIBITED",
    "exclusive_process": "EXCLUSIVE_PROCESS",
}
"""``nvidia-smi --query-gpu=compute_mode`` answers (lower-cased) -> the value ``nvidia-smi -c`` takes."""

LOOP_GRACE_S = 5.0
"""How long a crash loop that ended waits for its controller to read and remove its folder before removing it itself."""
CRASHLOOP = helper_source(nodeside.source("crashloop"), jobscope, LOOP_GRACE_S=LOOP_GRACE_S)
"""The crash loop (:mod:`chaoskit.nodeside.crashloop`), with the job-scope rule the node's agent applies."""


class GpuFailSpec(FaultSpec):
    """Fail the GPU of the selected ranks (``scope: device``), or take their whole node out of the job
    (``scope: node``), until ``duration`` ends."""

    kind: Literal["gpu.fail"]
    duration: PositiveDuration = Field(..., description="How long the device stays failed; the node reverts it by itself after that.")
    mechanism: Literal["auto", "nvidia", "crashloop"] = Field(
        "auto",
        description=(
            "nvidia: compute mode PROHIBITED and the processes holding a context killed (real; needs nvidia-smi "
            "and root on the node). crashloop: every matching job worker on the node is killed as soon as it "
            "appears (emulated; runs anywhere). auto: nvidia when nvidia-smi -L on the node lists the device, "
            "else crashloop."
        ),
    )
    scope: Literal["device", "node"] = Field(
        "device",
        description=(
            "device: only the selected workers' GPU fails; torchrun restarts them in place on the same node. "
            "node: the whole node is out of the job, as when a health check takes a node with a failed GPU away: "
            "nvidia sets every GPU of the node PROHIBITED, and both mechanisms kill every process of the job on "
            "the node, its torchrun agent included (crashloop: any that appears, until revert), so a spare or "
            "the scheduler must take its place. The selector picks the node(s)."
        ),
    )
    device: int | None = Field(
        None, ge=0, le=MAX_COUNT,
        description="GPU index on the node (nvidia); default: the device each selected worker uses (LOCAL_RANK, "
                    "through CUDA_VISIBLE_DEVICES).",
    )

    @field_validator("device")
    @classmethod
    def _device_or_node(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("scope") == "node":
            raise ValueError("scope node fails every GPU of the node: give device or scope node, not both")
        return v


class GpuFailFault(Fault):
    kind = "gpu.fail"
    covers = ("hardware.gpu", "hardware.gpu_memory")
    Spec = GpuFailSpec
    lasting: ClassVar[bool] = True

    # -- plan ---------------------------------------------------------------------------

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d = self.spec.duration
        mech = self.spec.mechanism
        whole_node = self.spec.scope == "node"
        out = []
        for node, group in _by_node(targets).items():
            label = ",".join(t.label() for t in group)
            if whole_node:
                out.append(Action(node, "scope node: the whole node is out of the job (a health check that takes a "
                                        "node with a failed GPU away): every process of the job there, its torchrun "
                                        "agent included, is killed, so a spare or the scheduler must take its place",
                                  label))
            if mech == "auto":
                out.append(Action(node, "mechanism auto: nvidia if 'nvidia-smi -L' on the node lists the device, "
                                        "else crashloop (emulated)", label))
            if mech in ("auto", "nvidia"):
                prefix = "if nvidia: " if mech == "auto" else ""
                for device in self._plan_devices(group):
                    for command in self._nvidia_plan(device, d):
                        out.append(Action(node, prefix + command, label))
                if whole_node:
                    out.append(Action(node, prefix + "kill -s KILL every process of the job on the node, agents "
                                                     "first (CHAOSKIT_NODE or TORCHELASTIC_RUN_ID in its environment, "
                                                     "or the torchrun parent of a worker)", label))
            if mech in ("auto", "crashloop"):
                prefix = "else crashloop: " if mech == "auto" else "crashloop (emulated): "
                out.append(Action(node, prefix + f"arm lease: watchdog runs 'touch <state folder>/{LOOP_DIR}<token>/stop' after {d:g}s "
                                                 "or a stale lease", label))
                victims = ("every process of the job on the node, its torchrun agent included," if whole_node
                           else f"every job worker matching {self.spec.target.describe()}")
                out.append(Action(node, prefix + f"start detached on the node: python3 -I -c <crash loop> <state folder>/{LOOP_DIR}<token> "
                                                 f"{d:g} {POLL_S:g} (kills {victims} within {POLL_S * 1000:g} ms of "
                                                 f"appearing, ends by itself after {d:g}s)", label))
                out.append(Action(node, prefix + f"after {d:g}s: touch <state folder>/{LOOP_DIR}<token>/stop", label))
        return out

    def _plan_devices(self, group: list[Any]) -> list[str]:
        if self.spec.scope == "node":
            return ["<each GPU nvidia-smi -L lists>"]
        if self.spec.device is not None:
            return [str(self.spec.device)]
        return sorted({f"<GPU of {t.label()}>" for t in group})

    @staticmethod
    def _nvidia_plan(device: str, d: float) -> list[str]:
        return [
            f"nvidia-smi -i {device} --query-gpu=compute_mode --format=csv,noheader (remember it)",
            f"arm lease: watchdog runs 'nvidia-smi -i {device} -c <remembered mode>' after {d:g}s or a stale lease",
            f"nvidia-smi -i {device} -c PROHIBITED",
            f"nvidia-smi --query-compute-apps=pid --format=csv,noheader -i {device}; kill -s KILL each pid of the node",
            f"after {d:g}s: nvidia-smi -i {device} -c <remembered mode>",
        ]

    # -- inject -------------------------------------------------------------------------

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out: list[Injection] = []
        for i, (node, group) in enumerate(_by_node(targets).items()):
            transport = ctx.transport(node)
            devices = self._devices(transport, group)
            mechanism = self.spec.mechanism
            if mechanism == "auto":
                mechanism = "nvidia" if lists_devices(transport, devices, COMMAND_TIMEOUT_S) else "crashloop"
            elif mechanism == "nvidia" and not lists_devices(transport, devices, COMMAND_TIMEOUT_S):
                raise InfraError(
                    f"gpu.fail with mechanism nvidia: 'nvidia-smi -L' on node {node} does not list GPU "
                    f"{', '.join(map(str, devices))}",
                    hint="use mechanism: crashloop (or auto) on nodes without NVIDIA GPUs",
                )
            labels = [t.label() for t in group]
            if mechanism == "nvidia":
                for j, device in enumerate(devices):
                    out.append(self._inject_nvidia(ctx, transport, f"{self.fault_id}.{i}.{j}", node, device, labels))
                if self.spec.scope == "node":
                    _kill_job(transport, out[-1].detail)
            else:
                out.append(self._inject_crashloop(ctx, transport, f"{self.fault_id}.{i}", node, labels))
        return out

    def _devices(self, transport: Transport, group: list[ProcessTarget]) -> list[int]:
        if self.spec.scope == "node":
            return listed_devices(transport, COMMAND_TIMEOUT_S) or [device_of({})]
        if self.spec.device is not None:
            return [self.spec.device]
        envs = {p.pid: p.env for p in transport.processes()}
        return sorted({device_of(envs.get(t.pid, {})) for t in group})

    def _inject_nvidia(self, ctx: FaultContext, transport: Transport, fid: str, node: str, device: int,
                       labels: list[str]) -> Injection:
        dev = str(int(device))
        mode = _compute_mode(transport, dev)
        revert = ["nvidia-smi", "-i", dev, "-c", mode]
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{node}:gpu{dev}")
        res = transport.run(["nvidia-smi", "-i", dev, "-c", "PROHIBITED"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            undo(ctx, transport, fid, revert)
            raise InfraError(f"gpu.fail: nvidia-smi -i {dev} -c PROHIBITED failed on node {node}: "
                             f"{res.stderr.strip() or res.stdout.strip()}", hint="setting the compute mode needs root on the node")
        ts = res.finished_at or time.time()
        apps = transport.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader", "-i", dev], COMMAND_TIMEOUT_S)
        killed, skipped = [], []
        pids = [int(w) for w in (apps.stdout.split() if apps.returncode == 0 else []) if w.isdigit()]
        # the job's processes on the node, with their start times: a context of another job on a shared node is
        # not ours to end, and a pid that names another process by the time of the signal is refused
        ours = {p.pid: p for p in transport.processes()} if pids else {}
        for pid in pids:
            proc = ours.get(pid)
            if proc is None or proc.state == "Z":
                skipped.append(pid)
                continue
            try:
                transport.signal(pid, signal.SIGKILL, proc.start_time)
                killed.append(pid)
            except InfraError:
                skipped.append(pid)
        detail = {"mechanism": "nvidia", "fidelity": "real", "scope": self.spec.scope, "device": int(dev), "restore_mode": mode,
                  "revert": revert, "killed": killed, "not_ours": skipped}
        return Injection(fid, self.kind, node, [f"{label}:gpu{dev}" for label in labels], ts, detail)

    def _inject_crashloop(self, ctx: FaultContext, transport: Transport, fid: str, node: str, labels: list[str]) -> Injection:
        directory = state_path(transport, LOOP_DIR)
        revert = ["touch", f"{directory}/stop"]
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=",".join(labels))
        sel = self.spec.target
        selector = ({"node": True} if self.spec.scope == "node"
                    else {"ranks": sel.ranks, "pid": sel.pid, "process": sel.process})
        argv = helper_argv(node_python(ctx, transport, node), CRASHLOOP, directory, f"{self.spec.duration:g}", f"{POLL_S:g}",
                           json.dumps(_scope(transport)), json.dumps(selector))
        try:
            transport.spawn_detached(argv)
            started = wait_node_file(transport, f"{directory}/started", STARTED_S)
        except InfraError:
            undo(ctx, transport, fid, revert)
            raise
        if started is None:
            undo(ctx, transport, fid, revert)
            raise InfraError(f"gpu.fail: the crash loop did not start on node {node} within {STARTED_S:g}s")
        try:
            ts, pid = parse_started(started, "gpu.fail: the crash loop's started file", node)
        except InfraError:
            undo(ctx, transport, fid, revert)
            raise
        detail = {"mechanism": "crashloop", "fidelity": "emulated", "scope": self.spec.scope, "directory": directory,
                  "loop_pid": pid, "revert": revert}
        return Injection(fid, self.kind, node, labels, ts, detail)

    # -- revert, verify -----------------------------------------------------------------

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        res = ctx.transport(injection.node).run(injection.detail["revert"], COMMAND_TIMEOUT_S)
        if res.returncode != 0 and injection.detail["mechanism"] == "nvidia":
            raise InfraError(f"restoring the compute mode of GPU {injection.detail['device']} on node {injection.node} "
                             f"failed: {res.stderr.strip() or res.stdout.strip()}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        problem = until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"]))
        if problem is None and injection.detail["mechanism"] == "crashloop":
            injection.detail["kills"] = read_node_file(transport, f"{injection.detail['directory']}/kills").count("\n")
            transport.run(["rm", "-rf", injection.detail["directory"]], COMMAND_TIMEOUT_S)
        return problem

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """``nvidia-smi -i DEV -c MODE`` (the mode the device had), or ``touch <state folder>/crashloop-<token>/stop``."""
        if (len(revert) == 5 and revert[:2] == ["nvidia-smi", "-i"] and revert[2].isascii() and revert[2].isdigit()
                and revert[3] == "-c" and revert[4] in COMPUTE_MODES.values()):
            return ["nvidia-smi", "-i", str(int(revert[2])), "-c", revert[4]]
        if len(revert) == 2 and revert[0] == "touch" and revert[1].endswith("/stop"):
            return ["touch", own_state_path(node.conn, revert[1][: -len("/stop")], LOOP_DIR) + "/stop"]
        raise ValueError("not a gpu.fail revert chaoskit arms (the device's compute mode back, or its crash loop's stop file)")

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None) -> str | None:
        if revert[0] == "nvidia-smi":
            dev, want = revert[2], revert[4]
            now = _compute_mode(transport, dev)
            return None if now == want else f"GPU {dev} is in compute mode {now}, not {want}"
        if len(revert) != 2 or revert[0] != "touch" or not revert[1].endswith("/stop"):
            raise ValueError(f"not a chaoskit crash loop's revert: {revert[:2]!r}")
        directory = own_state_path(transport, revert[1][: -len("/stop")], LOOP_DIR)
        res = transport.run(["cat", f"{directory}/exited"], COMMAND_TIMEOUT_S)
        if res.returncode == 0:
            return None
        gone = transport.run(["cat", f"{directory}/started"], COMMAND_TIMEOUT_S).returncode != 0
        return None if gone else f"the crash loop in {directory} is still running"

    state_prefixes = (LOOP_DIR,)

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """A crash loop still running (its process, by its folder on the command line) and its folders
        (``crashloop-*``, which ``verify`` removes once the loop exited)."""
        if view.state_dir is None:
            return []
        folder = f"{view.state_dir}/{LOOP_DIR}"
        out = [f"crash loop running: pid {pid}" for pid, _, cmdline in view.ps() if folder in cmdline]
        return out + [f"state {name} (gpu.fail's crash loop)" for name in view.state_entries()
                      if name.startswith(LOOP_DIR) and name.count("/") == 1 and name.endswith("/")]


# -- helpers ----------------------------------------------------------------------------


def _by_node(targets: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for t in targets:
        out.setdefault(t.node, []).append(t)
    return out


def job_processes(procs: list[ProcInfo]) -> list[ProcInfo]:
    """The job's processes among a node's ``procs`` (already in its scope), agents first.

    A process is the job's when its environment carries ``CHAOSKIT_NODE`` (every process chaoskit
    starts for the job) or ``TORCHELASTIC_RUN_ID`` (a torchrun worker), or when it is the torchrun
    agent a worker was started by: the same rule the crash loop applies with ``scope: node``."""
    marked = [p for p in procs if "CHAOSKIT_NODE" in p.env or "TORCHELASTIC_RUN_ID" in p.env]
    parents = {p.ppid for p in marked if p.is_worker}
    ours = {p.pid for p in marked}
    agents = [p for p in procs if p.pid in parents and p.pid not in ours and _AGENT.search(p.cmdline)]
    return sorted(agents + marked, key=lambda p: p.is_worker)


_AGENT = re.compile(r"torchrun|torch[./]distributed[./]run")


def _kill_job(transport: Transport, detail: dict[str, Any]) -> None:
    """``scope: node`` with nvidia: every process of the job on the node, agents first, killed once."""
    for proc in job_processes(transport.processes()):
        try:
            transport.signal(proc.pid, signal.SIGKILL, proc.start_time)
        except InfraError:  # gone in the meantime
            continue
        if proc.pid not in detail["killed"]:
            detail["killed"].append(proc.pid)


def _compute_mode(transport: Transport, dev: str) -> str:
    res = transport.run(["nvidia-smi", "-i", dev, "--query-gpu=compute_mode", "--format=csv,noheader"], COMMAND_TIMEOUT_S)
    answer = res.stdout.strip().lower().replace(" ", "_")
    if res.returncode != 0 or answer not in COMPUTE_MODES:
        raise InfraError(f"cannot read the compute mode of GPU {dev} on node {transport.node}: "
                         f"{res.stderr.strip() or res.stdout.strip() or 'no answer'}")
    return COMPUTE_MODES[answer]


def _scope(transport: Transport) -> dict[str, Any]:
    """The node's scope as the crash loop judges it: the ``CHAOSKIT_SCOPE`` token and/or its network namespace,
    and the drilled job within it (:attr:`Transport.job`)."""
    scope = getattr(transport, "scope", None)
    job = getattr(transport, "job", None)
    wire = job.wire() if job is not None else None
    if isinstance(scope, dict):
        return {"env": scope.get("env"), "netns": bool(scope.get("netns")), "job": wire}
    if not scope:
        raise InfraError(f"gpu.fail: node {transport.node} has no process scope, so a crash loop could not tell its "
                         "workers from other processes")
    wire_scope = getattr(transport, "scope_wire", None)
    return {**(wire_scope() if wire_scope is not None else {"env": str(scope), "netns": False}), "job": wire}


# -- gpu.xid ----------------------------------------------------------------------------------
#
# The line the driver writes (chaoskit.cluster.xid), into /dev/kmsg on the node as root, for one of the node's
# GPUs: what the site's health check, log monitors and chaoskit's kernel-log probe read. A line cannot be taken
# back, so nothing of it is lasting; what it makes happen can be: with_failure applies gpu.fail to the device
# (and reverts it as gpu.fail does), and on a Slurm node a drain the site's health check makes for the line
# (its reason quoting the line's marker) is resumed after ``duration`` by a lease on the controller, only while
# the node's reason still names this drill's line: an administrator's drain is left alone.

XID_WRITER = helper_source(nodeside.source("xid_writer"))
"""``python3 -I -c XID_WRITER LINE`` (:mod:`chaoskit.nodeside.xid_writer`)."""

RESUME_NOTE = "a node the site's health check drained for this line"


class GpuXidSpec(FaultSpec):
    """Write an NVIDIA Xid line for a GPU of the selected ranks' node into that node's kernel log, as the driver
    does; the site's health check, log monitors and chaoskit's own kernel-log probe see it."""

    kind: Literal["gpu.xid"]
    code: int = Field(..., description=(
        "The Xid: 79 fallen off the bus, 48 double-bit ECC, 94/95 contained/uncontained ECC, 63/64 row remapping "
        "recorded/failed, 74 NVLink, 13/31/43 an application's CUDA error (graphics exception, memory page "
        "fault, GPU stopped processing)."))
    device: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "GPU index on the node; default: the device each selected worker uses (LOCAL_RANK through "
        "CUDA_VISIBLE_DEVICES). Its PCI id comes from nvidia-smi on the node, else the inventory's gpu_pci."))
    pci: str | None = Field(None, description="The GPU by PCI bus id instead of an index (0000:3b:00.0).")
    with_failure: bool = Field(False, description=(
        "Also fail the device as gpu.fail does (a real Xid 79 is followed by a dead device; 13/31/43 kill the "
        "rank as a CUDA error would): with mechanism and scope as gpu.fail takes them, for duration."))
    mechanism: Literal["auto", "nvidia", "crashloop"] = Field("auto", description="with_failure: gpu.fail's mechanism.")
    scope: Literal["device", "node"] = Field("device", description="with_failure: gpu.fail's scope.")
    duration: PositiveDuration = Field(60.0, description=(
        "How long the consequences are left in place: with_failure, the device stays failed; on a Slurm node, "
        "a drain the site's health check made for this line (its reason naming the line's marker) is resumed "
        "after it. The line itself stays in the log (a log line cannot be taken back)."))

    def catalog_tag(self) -> str:
        return f"{self.kind}:{self.code}"  # the code decides the class: 79 a GPU, 48 its memory, 13 the software

    @field_validator("code")
    @classmethod
    def _code(cls, v: int) -> int:
        if v not in XID_MESSAGES:
            raise ValueError(f"Xid {v} is not one gpu.xid writes (it writes {', '.join(map(str, sorted(XID_MESSAGES)))})")
        return v

    @field_validator("pci")
    @classmethod
    def _pci(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if info.data.get("device") is not None:
            raise ValueError("give the GPU by device index or by pci, not both")
        return normalize_pci(v)


class GpuXidFault(Fault):
    kind = "gpu.xid"
    covers = ("hardware.gpu", "hardware.gpu_memory", "software.driver")
    Spec = GpuXidSpec
    lasting: ClassVar[bool] = True

    def __init__(self, spec: FaultSpec, fault_id: str) -> None:
        super().__init__(spec, fault_id)
        self.token = secrets.token_hex(4)
        """The marker's token: the lines of this fault, and a health check's drain reason that quotes one."""
        self.failure = None
        if self.spec.with_failure:
            self.failure = GpuFailFault(GpuFailSpec(
                kind="gpu.fail", target=self.spec.target, at=self.spec.at, duration=self.spec.duration,
                mechanism=self.spec.mechanism, scope=self.spec.scope,
                device=None if self.spec.scope == "node" else self.spec.device), f"{fault_id}.fail")

    def unfit(self, node: Node) -> str | None:
        known = [normalize_pci(p) for p in node.gpu_pci]
        if self.spec.pci is not None and known and self.spec.pci not in known:
            return f"node {node.name} has no GPU {self.spec.pci} (its gpu_pci: {', '.join(known)})"
        if self.spec.device is not None and known and not node.gpus and self.spec.device >= len(known):
            return f"node {node.name} has no GPU {self.spec.device} (its gpu_pci lists {len(known)})"
        return None

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        out = []
        message = XID_MESSAGES[self.spec.code]
        for node, group in _by_node(targets).items():
            label = ",".join(t.label() for t in group)
            gpu = self.spec.pci or (f"GPU {self.spec.device}" if self.spec.device is not None else "<GPU of each target>")
            out.append(Action(node, f"PCI id of {gpu}: nvidia-smi --query-gpu=index,pci.bus_id on the node, else the "
                                    "inventory's gpu_pci", label))
            out.append(Action(node, f"write to /dev/kmsg (root): 'NVRM: Xid (PCI:<id>): {self.spec.code}, pid=<pid>, "
                                    f"name=<process>, {message} {MARKER.format(token='<token>')}' (not lasting: the line "
                                    "stays in the log)", label))
            info = ctx.inventory[node]
            if info.scheduler is not None:
                d = self.spec.duration
                out.append(Action(node, f"arm lease on the controller: after {d:g}s or a stale lease, resume {node} if it "
                                        f"is drained with a reason naming the line's marker ({RESUME_NOTE})", label))
        if self.failure is not None:
            out += [Action(a.node, "with_failure (gpu.fail): " + a.command, a.target) for a in self.failure.plan(ctx, targets)]
        return out

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out: list[Injection] = []
        lines: list[tuple[str, Transport, str, dict[str, Any]]] = []
        for node, group in _by_node(targets).items():  # every input checked before anything is written
            transport = ctx.transport(node)
            for pci, target in self._devices(ctx, transport, node, group):
                line = format_xid(pci, self.spec.code, self.token, pid=getattr(target, "pid", None),
                                  name=_comm_of(transport, getattr(target, "pid", None)))
                lines.append((node, transport, line, {"pci": normalize_pci(pci), "target": target.label()}))
        resumes: list[Injection] = []
        for node in dict.fromkeys(n for n, *_ in lines):
            resumes += self._arm_resume(ctx, node, len(resumes))
        for i, (node, transport, line, info) in enumerate(lines):
            res = run_helper(transport, node_python(ctx, transport, node), XID_WRITER, [line], "gpu.xid",
                             "writing /dev/kmsg needs root on the node")
            inj = Injection(f"{self.fault_id}.{i}", self.kind, node, [info["target"]], float(res.get("t") or time.time()),
                            {"mechanism": "kmsg", "fidelity": "real line, emulated GPU error", "code": self.spec.code,
                             "pci": info["pci"], "token": self.token, "line": line, "revert": None})
            transport_t = getattr(transport, "clock", None)
            if transport_t is not None and res.get("t") is not None:
                inj.t_fault = transport_t.to_controller(float(res["t"]))
            inj.reverted = True  # a log line cannot be taken back; nothing of it is left to revert
            out.append(inj)
        for r in resumes:  # after the lines: the run's fault time is the first line's
            r.t_fault = out[0].t_fault
        out += resumes
        if self.failure is not None:
            out += self.failure.inject(ctx, targets)
        return out

    def _devices(self, ctx: FaultContext, transport: Transport, node: str, group: list[Any]) -> list[tuple[str, Any]]:
        """(PCI id, the target it is for) per device of the node the line is for."""
        listed = _pci_by_index(transport)
        inventory = [normalize_pci(p) for p in ctx.inventory[node].gpu_pci]
        if self.spec.pci is not None:
            known = set(listed.values()) or set(inventory)
            if known and self.spec.pci not in known:
                raise InfraError(f"gpu.xid: node {node} has no GPU {self.spec.pci} (it has {', '.join(sorted(known))})")
            return [(self.spec.pci, group[0])]
        if self.spec.device is not None:
            wanted = {self.spec.device: group[0]}
        else:
            envs = {p.pid: p.env for p in transport.processes()}
            wanted = {}
            for t in group:
                wanted.setdefault(device_of(envs.get(t.pid, {})), t)
        out = []
        for index, target in sorted(wanted.items()):
            if index in listed:
                out.append((listed[index], target))
            elif not listed and index < len(inventory):
                out.append((inventory[index], target))
            else:
                where = "nvidia-smi lists" if listed else "the inventory's gpu_pci lists"
                count = len(listed) if listed else len(inventory)
                raise InfraError(f"gpu.xid: node {node} has no GPU {index} ({where} {count})",
                                 hint="give the node's gpu_pci in the inventory, or pci: in the fault")
        return out

    def _arm_resume(self, ctx: FaultContext, node: str, n: int) -> list[Injection]:
        """On a Slurm node: the node must be in service now, and a drain made for this line is resumed after
        ``duration`` (a lease on the controller), only while the node's reason still names this line's marker."""
        info = ctx.inventory[node]
        if info.scheduler is None:
            return []
        state, reason, _ = info.scheduler.node_state(node)
        if set(state.split("+")) & {"DRAIN", "DOWN", "FAIL"}:
            raise InfraError(f"gpu.xid: node {node} is already {state} ({reason or 'no reason'}): a drain the line "
                             "causes could not be told from it; nothing was written",
                             hint="drill a node in service")
        marker = f"chaoskit drill {self.token}"
        resume = info.scheduler.resume_argv(node, marker, marked=True)
        fid = f"{self.fault_id}.resume{n}"
        ctx.arm(ctx.controller(node), fid, self.kind, resume, self.spec.duration, target=node, on="controller")
        return [Injection(fid, self.kind, node, [node], time.time(), {
            "mechanism": "slurm resume", "fidelity": "real", "revert": resume, "marker": marker, "before": state})]

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        if injection.kind == "gpu.fail" and self.failure is not None:
            self.failure.revert(ctx, injection)
            return
        if injection.detail.get("mechanism") == "slurm resume":
            info = ctx.inventory[injection.node]
            injection.detail["resumed"] = info.scheduler.resume_if_drained_by(injection.node, injection.detail["marker"],
                                                                              marked=True)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        if injection.kind == "gpu.fail" and self.failure is not None:
            return self.failure.verify(ctx, injection)
        if injection.detail.get("mechanism") == "slurm resume":
            info = ctx.inventory[injection.node]
            state, reason, _ = info.scheduler.node_state(injection.node)
            if "DRAIN" in state.split("+") and injection.detail["marker"] in reason:
                return f"node {injection.node} is still {state} ({reason})"
        return None

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The conditional resume of this node: only while its reason names a ``gpu.xid`` line's marker."""
        if node is None or node.scheduler is None or len(revert) < 4 or revert[-4:-2] != ["--marked", "--"]:
            raise ValueError("not a gpu.xid revert chaoskit arms (a resume conditional on its line's marker)")
        if revert[-2] != node.name or not re.fullmatch(r"chaoskit drill [0-9a-f]{8}", revert[-1]):
            raise ValueError(f"the journal's gpu.xid revert is not for node {node.name}")
        return node.scheduler.resume_argv(node.name, revert[-1], marked=True)

    @classmethod
    def check_reverted(cls, transport: Any, revert: list[str], node: Any = None) -> str | None:
        if node is None or node.scheduler is None or not revert:
            return None
        state, reason, _ = node.scheduler.node_state(node.name)
        return f"node {node.name} is still {state} ({reason})" if "DRAIN" in state.split("+") and revert[-1] in reason else None

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """A Slurm drain a health check made for one of its lines (the reason names a drill's marker)."""
        drain = slurm_drain(view.node)
        if drain is not None and re.search(r"chaoskit drill [0-9a-f]{8}", drain[1] or ""):
            return ["Slurm drain for a gpu.xid line: %s (%s)" % drain]
        return []


def _pci_by_index(transport: Transport) -> dict[int, str]:
    """``nvidia-smi --query-gpu=index,pci.bus_id`` on the node: index -> PCI id; empty when it does not answer."""
    try:
        res = transport.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], COMMAND_TIMEOUT_S)
    except InfraError:  # not installed
        return {}
    if res.returncode != 0:
        return {}
    out = {}
    for line in res.stdout.splitlines():
        index, _, pci = line.partition(",")
        try:
            out[int(index.strip())] = normalize_pci(pci.strip())
        except ValueError:
            continue
    return out


def _comm_of(transport: Transport, pid: int | None) -> str | None:
    """The process name the driver would name (its command's base name), when the target is a process."""
    if pid is None:
        return None
    for p in transport.processes():
        if p.pid == pid and p.cmdline:
            return p.cmdline.split()[0].rsplit("/", 1)[-1]
    return None
