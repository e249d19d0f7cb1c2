"""A straggler (``node.slow``): a rank's processes throttled to a share of one CPU through the node's cgroups.

A cgroup of chaoskit's own is made for each fault (``chaoskit-<token>``): on a
cgroup v2 hierarchy with the cpu controller, ``cpu.max``; else on the v1 ``cpu``
hierarchy, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. The rank's processes
(the worker and its descendants; ``cgroup.procs`` moves every thread) go in,
their original cgroups are written down on the node first, and the revert moves
them (and anything they started meanwhile) back and removes the cgroup. The
revert is armed as a lease before, so a dead controller still ends with the
node restored. Everything on the node is done by :data:`CGROUP_TOOL`, a small
stdlib-only script run as ``python3 -I -c`` through the node's transport
(:mod:`chaoskit.faults.node_tool`); its state file (``slow-<token>.json``) lies in the
node's state folder, made with ``O_EXCL|O_NOFOLLOW``, the folder checked by every
command that uses it.
"""

from __future__ import annotations

import re
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit import nodeside
from chaoskit.cluster.nvidia import device_of, lists_devices
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.limits import MAX_COUNT
from chaoskit.faults.api import Action, FaultContext, FaultSpec, Injection
from chaoskit.faults.node_tool import COMMAND_TIMEOUT_S, CgroupTool, helper_source, undo
from chaoskit.nodeside import cgroups

__all__ = ["SlowFault", "SlowSpec", "CGROUP_TOOL", "PERIOD_US"]

PERIOD_US = 100_000
STATE = "slow-"
"""The state file is ``<state folder>/slow-<token>.json``."""

CGROUP_TOOL = helper_source(nodeside.source("cpu_tool"), cgroups, CONTROLLER="cpu")
"""``python3 -I -c CGROUP_TOOL probe | throttle ... | restore | check`` (:mod:`chaoskit.nodeside.cpu_tool`)."""


class SlowSpec(FaultSpec):
    """Make the selected ranks slow for ``duration``: their processes throttled to ``cpu_share`` percent of one CPU
    (cgroup), or their GPU's graphics clock locked at ``gpu_clock_mhz`` (nvidia)."""

    kind: Literal["node.slow"]
    cpu_share: int | None = Field(None, gt=0, lt=100, description="cgroup: percent of one CPU the rank's processes may use, 1 to 99.")
    gpu_clock_mhz: int | None = Field(
        None, ge=1, le=100_000,
        description="nvidia: lock the graphics clock of the rank's GPU at this many MHz (nvidia-smi -lgc MHZ,MHZ; "
                    "revert nvidia-smi -rgc). Needs nvidia-smi and root on the node.",
    )
    mechanism: Literal["auto", "cgroup", "nvidia"] = Field(
        "auto",
        description="cgroup: a CPU share (emulated; needs cpu_share). nvidia: the GPU's clocks locked low (real; needs "
                    "gpu_clock_mhz). auto: nvidia when gpu_clock_mhz is set and 'nvidia-smi -L' on the node lists the "
                    "device, else cgroup.",
    )
    device: int | None = Field(None, ge=0, le=MAX_COUNT, description="nvidia: GPU index on the node; default: the device "
                               "each selected worker uses (LOCAL_RANK, through CUDA_VISIBLE_DEVICES).")
    duration: PositiveDuration = Field(..., description="How long the rank stays slow; the node reverts it by itself after that.")

    @model_validator(mode="after")
    def _what_slows(self) -> "SlowSpec":
        if self.mechanism in ("cgroup", "auto") and self.cpu_share is None:
            raise ValueError(f"mechanism {self.mechanism} needs 'cpu_share' (percent of one CPU, 1 to 99)"
                             + (" as the fallback where there is no GPU" if self.mechanism == "auto" else ""))
        if self.mechanism == "nvidia" and self.gpu_clock_mhz is None:
            raise ValueError("mechanism nvidia needs 'gpu_clock_mhz' (the graphics clock to lock the GPU at)")
        return self


class SlowFault(CgroupTool):
    kind = "node.slow"
    covers = ("hardware.slow",)
    Spec = SlowSpec
    tool_source, state_prefix, controller, cgroup_what = CGROUP_TOOL, STATE, "cpu", "CPU quota"
    measures_slowdown: ClassVar[bool] = True
    """The runner reports step time before, during and after this fault, and the throughput it cost."""

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, share, mech, mhz = self.spec.duration, self.spec.cpu_share, self.spec.mechanism, self.spec.gpu_clock_mhz
        out = []
        for t in targets:
            label = t.label()
            if mech == "auto" and mhz is not None:
                out.append(Action(t.node, "mechanism auto: nvidia if 'nvidia-smi -L' on the node lists the device, "
                                          "else cgroup (emulated)", label))
            if mech == "nvidia" or (mech == "auto" and mhz is not None):
                dev = str(self.spec.device) if self.spec.device is not None else f"<GPU of {label}>"
                prefix = "if nvidia: " if mech == "auto" else ""
                out.append(Action(t.node, prefix + f"arm lease: watchdog runs 'nvidia-smi -i {dev} -rgc' after {d:g}s "
                                                   "or a stale lease", label))
                out.append(Action(t.node, prefix + f"nvidia-smi -i {dev} -lgc {mhz},{mhz}", label))
                out.append(Action(t.node, prefix + f"after {d:g}s: nvidia-smi -i {dev} -rgc", label))
            if mech == "nvidia":
                continue
            quota = (share or 0) * PERIOD_US // 100
            prefix = "else cgroup (emulated): " if mech == "auto" and mhz is not None else ""
            out.append(Action(t.node, prefix + f"arm lease: watchdog runs 'python3 -I -c <cgroup tool> restore "
                                               f"<state folder>/{STATE}<token>.json' after {d:g}s or a stale lease", label))
            out.append(Action(t.node, prefix + f"mkdir <cgroup mount>/chaoskit-<token>; cgroup v2: cpu.max '{quota} "
                                               f"{PERIOD_US}' (v1: cpu.cfs_quota_us {quota}, cpu.cfs_period_us {PERIOD_US}); "
                                               f"move {t.pid} and its descendants in (cgroup.procs), their cgroups written down",
                              label))
            out.append(Action(t.node, prefix + f"after {d:g}s: move them back to their own cgroups; rmdir the chaoskit cgroup",
                              label))
        return out

    def inject_otherwise(self, ctx: FaultContext, transport: Transport, fid: str, t: ProcessTarget) -> Injection | None:
        """The GPU's clocks locked, where the mechanism allows it and ``nvidia-smi -L`` lists the rank's device."""
        if self.spec.mechanism == "cgroup" or self.spec.gpu_clock_mhz is None:
            return None
        envs = {p.pid: p.env for p in transport.processes()}
        device = self.spec.device if self.spec.device is not None else device_of(envs.get(t.pid, {}))
        if lists_devices(transport, [device], COMMAND_TIMEOUT_S):
            return self._inject_nvidia(ctx, transport, fid, t, device)
        if self.spec.mechanism == "nvidia":
            raise InfraError(f"node.slow with mechanism nvidia: 'nvidia-smi -L' on node {t.node} does not list GPU {device}",
                             hint="use mechanism: cgroup (or auto, with cpu_share) on nodes without NVIDIA GPUs")
        return None

    def move_in(self, transport: Transport, python: str, t: ProcessTarget, pids: list[int], state: str,
                token: str) -> dict[str, Any]:
        return self.run_tool(transport, python, ["throttle", f"chaoskit-{token}", str(self.spec.cpu_share or 0),
                                                 str(PERIOD_US), state, *map(str, pids)])

    def after_move(self, ctx: FaultContext, transport: Transport, python: str, t: ProcessTarget, state: str,
                   done: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return time.time(), {"pids": done["moved"], "cpu_share": self.spec.cpu_share}

    def _inject_nvidia(self, ctx: FaultContext, transport: Transport, fid: str, t: ProcessTarget, device: int) -> Injection:
        dev, mhz = str(int(device)), int(self.spec.gpu_clock_mhz or 0)
        revert = ["nvidia-smi", "-i", dev, "-rgc"]
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=f"{t.label()}:gpu{dev}")
        res = transport.run(["nvidia-smi", "-i", dev, "-lgc", f"{mhz},{mhz}"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            undo(ctx, transport, fid, revert)
            raise InfraError(f"node.slow: nvidia-smi -i {dev} -lgc {mhz},{mhz} failed on node {t.node}: "
                             f"{res.stderr.strip() or res.stdout.strip()}", hint="locking the clocks needs root on the node")
        ts = res.finished_at or time.time()
        detail = {"mechanism": "nvidia", "fidelity": "real", "device": int(dev), "gpu_clock_mhz": mhz, "revert": revert}
        return Injection(fid, self.kind, t.node, [f"{t.label()}:gpu{dev}"], ts, detail)

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        res = ctx.transport(injection.node).run(injection.detail["revert"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            what = "the GPU clocks" if injection.detail["mechanism"] == "nvidia" else "the cgroups"
            raise InfraError(f"node.slow: restoring {what} on node {injection.node} failed: "
                             f"{res.stderr.strip() or res.stdout.strip()}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        if injection.detail["mechanism"] == "nvidia":
            return None  # nvidia-smi -rgc answered 0 (revert raises otherwise); nvidia-smi shows no lock to read back
        return super().verify(ctx, injection)

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """``nvidia-smi -i DEV -rgc``, or the cgroup tool's ``restore`` of a state file in the node's state folder."""
        if len(revert) == 4 and revert[:2] == ["nvidia-smi", "-i"] and revert[2].isascii() and revert[2].isdigit() \
                and revert[3] == "-rgc":
            return ["nvidia-smi", "-i", str(int(revert[2])), "-rgc"]
        return super().journaled_revert(revert, node)

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None, cgroup: str | None = None) -> str | None:
        if revert[0] == "nvidia-smi":
            return None  # the reset is idempotent and ran; the driver shows no clock lock to compare with
        return super().check_reverted(transport, revert, node, cgroup)

    state_prefixes = (STATE,)

    @classmethod
    def own_cgroup(cls, name: str) -> bool:
        return re.fullmatch(r"chaoskit-[0-9a-f]{12,32}", name) is not None
