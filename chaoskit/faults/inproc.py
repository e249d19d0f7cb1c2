"""In-process faults (``inproc.*``): harm done from inside a training process, the way GPUs and drivers fail.

The order reaches the process through the node's state folder: chaoskit's helper (stdlib, nodefs in front,
``python3 -I``) writes ``<state folder>/inproc/order-<pid>.json`` atomically (for a job that runs as an account of
its own, ``RUN.job/inproc``: the account's folder, which only it and root may write, where the helper follows no
link and takes only the account's regular files as answers), and the process's watcher
(:mod:`chaoskit.sdk.inproc`: the bootstrap of a job chaoskit starts, or the SDK / a framework callback of an
attached one) checks the folder and the file, takes only the listed kinds with bounded fields, and answers in
``status-<pid>.json`` (``armed`` / ``refused``, ``fired``, ``ended``). The helper waits on the node for that
answer within :data:`CHECKIN_S`: a process that never answers (no channel: an attached job with neither the SDK
nor a callback) fails the fault there, exit 3, nothing injected.

Every lasting kind has its end armed in the process *and* a lease on the node whose revert is the helper's
``end``: it takes the order back, gives the process :data:`END_GRACE_S` to report its end, and kills it
(its start time checked, through a pidfd) when it did not; the journal records that kill.

The answer is the job's word, not chaoskit's: what it reports of the fault (a bit flip's tensor and bit, an
exception's text) is kept in the injection's detail, but never over what chaoskit chose itself
(:data:`CHOSEN_KEYS`: the pid, its start time, the rank, the folder, the order), which the fault's end acts on;
the fault's time it reports counts only when it falls between the order's writing and the answer's reading
(on the controller's clock, the node's measured offset applied), else the answer's reading is the fault's time
and the detail's ``note`` says why.

Kinds: ``inproc.hang`` (the training thread held before the step or in the data loader; every other thread
runs on), ``inproc.gil`` (the GIL held: nothing runs), ``inproc.raise`` (an exception with a CUDA error's real
text, or a given one), ``inproc.nan`` (NaN/Inf into one rank's loss or gradients), ``inproc.bitflip`` (one bit
of one element of a parameter or gradient: silent), ``inproc.slow`` (a share of each step slept or spent).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit import nodeside
from chaoskit.cluster.clock import ClockOffset
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.launches import LAUNCHES
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import journaled_python, node_python
from chaoskit.nodeside.nodefs import bundle
from chaoskit.sdk.inproc import CUDA_ERRORS, ID_RE, NAME_RE

__all__ = ["InprocHangFault", "InprocGilFault", "InprocRaiseFault", "InprocNanFault", "InprocBitflipFault",
           "InprocSlowFault", "CHECKIN_S", "FIRE_S", "END_GRACE_S", "HELPER", "CHOSEN_KEYS", "describe_flip", "job_channel"]

CHECKIN_S = 10.0
"""How long a process has to answer an order (its watcher polls every 0.05 s): past it, the fault fails, exit 3."""
FIRE_S = 30.0
"""How long an armed order may wait for its point in the step (the next step, or the next batch) to come."""
END_GRACE_S = 3.0
"""How long past a lasting fault's end the process has to report it ended before the lease kills it."""

HELPER = bundle(nodeside.source("inproc_tool"))
"""The node side of the channel: ``order``/``wait``/``clear``/``end FOLDER PID ...``, in the node's state folder only."""

TIMEOUT_S = 60.0

CHOSEN_KEYS = frozenset({"pid", "start_time", "rank", "order", "folder", "mechanism", "fidelity", "scope", "killed",
                         "reported", "note"})
"""An injection's detail that chaoskit sets itself (the fault's end signals ``pid`` at ``start_time`` in ``folder``;
the report reads ``mechanism``, ``fidelity``, ``scope``): a process's answer never sets one. Those it claimed anyway
are kept apart, under ``reported``."""


class InprocSpec(FaultSpec):
    """Fields every in-process fault shares: the ranks it acts in (``target``), when (``at``)."""

    def order_params(self) -> dict[str, Any]:
        raise NotImplementedError


class InprocHangSpec(InprocSpec):
    """Hold the training thread (before the step's collective, or in the data loader) while every other thread runs on."""

    kind: Literal["inproc.hang"]
    where: Literal["step", "data"] = Field("step", description=(
        "step: before the step's forward (so before its gradient all-reduce); data: in the data loader's next batch "
        "(a job that uses torch's DataLoader)."))
    duration: PositiveDuration | None = Field(None, le=86400, description="How long it is held; for good when not given.")

    def order_params(self) -> dict[str, Any]:
        return {"where": self.where, "duration": self.duration}


class InprocGilSpec(InprocSpec):
    """Hold the GIL: no Python thread of the process runs (heartbeats and watchdogs included), as NVRx's LOCK_GIL."""

    kind: Literal["inproc.gil"]
    duration: PositiveDuration = Field(..., le=3600, description="How long the GIL is held.")

    def order_params(self) -> dict[str, Any]:
        return {"duration": self.duration}


class InprocRaiseSpec(InprocSpec):
    """Raise an exception in the step: a CUDA error's own text (emulated: no GPU is harmed), or a given one."""

    kind: Literal["inproc.raise"]
    cuda: Literal[tuple(CUDA_ERRORS)] | None = Field(None, description=(
        "A CUDA runtime error, raised with the runtime's own message as PyTorch wraps it ('CUDA error: an illegal "
        "memory access was encountered', ...)."))
    message: str | None = Field(None, min_length=1, max_length=500, description="The exception's text, instead of a CUDA error.")

    @field_validator("message")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        if v is not None and not v.isprintable():
            raise ValueError("message must be one line of printable text")
        return v

    @model_validator(mode="after")
    def _one(self) -> "InprocRaiseSpec":
        if (self.cuda is None) == (self.message is None):
            raise ValueError("give exactly one of 'cuda' or 'message'")
        return self

    def order_params(self) -> dict[str, Any]:
        return {"cuda": self.cuda, "message": self.message}

    def catalog_tag(self) -> str:
        return f"{self.kind}:{self.cuda}" if self.cuda else self.kind


class InprocNanSpec(InprocSpec):
    """Write NaN (or Inf) into one rank's loss or gradients at one step."""

    kind: Literal["inproc.nan"]
    into: Literal["loss", "grads"] = Field("grads", description="The loss (what the job logs) or the gradients (after their all-reduce).")
    value: Literal["nan", "inf"] = "nan"

    def order_params(self) -> dict[str, Any]:
        return {"target": self.into, "value": self.value}


class InprocBitflipSpec(InprocSpec):
    """Flip one bit of one element of a parameter or gradient on one rank: silent data corruption (no error, no log)."""

    kind: Literal["inproc.bitflip"]
    tensor: Literal["param", "grad"] = Field("param", description="A parameter (after the optimizer step) or its gradient (before it).")
    name: str | None = Field(None, max_length=200, description="The parameter's name in the model (e.g. 2.weight); picked from the seed when not given.")
    index: int | None = Field(None, ge=0, lt=1 << 40, description="The element (flat index); picked from the seed when not given.")
    bit: int | None = Field(None, ge=0, le=63, description="The bit (30: float32's top exponent bit); picked from the seed when not given.")
    seed: int = Field(0, ge=0, lt=1 << 63, description="What picks the name, element and bit not given.")
    steps: int = Field(1, ge=1, le=1_000_000, description="1: once; N: the same flip every step for N steps.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError("name must be a parameter's dotted name such as 2.weight or net.2.weight")
        return v

    def order_params(self) -> dict[str, Any]:
        return {"target": self.tensor, "name": self.name, "index": self.index, "bit": self.bit, "seed": self.seed,
                "steps": self.steps}


class InprocSlowSpec(InprocSpec):
    """Make one rank's steps slower from inside: a share of each step slept or spent computing (no root, no cgroup)."""

    kind: Literal["inproc.slow"]
    share: float = Field(..., gt=0, le=0.95, description="The share of each (slowed) step the slowdown takes: 0.5 doubles it.")
    mode: Literal["sleep", "busy"] = "sleep"
    duration: PositiveDuration | None = Field(None, le=86400, description="How long; for good when not given.")

    def order_params(self) -> dict[str, Any]:
        return {"share": self.share, "mode": self.mode, "duration": self.duration}


class _InprocFault(Fault):
    """What every ``inproc.*`` kind does the same way; a kind names its spec and whether it lasts."""

    target_type: ClassVar[Literal["process"]] = "process"
    uses_inproc_channel = True
    state_prefixes = ("inproc/",)  # the channel folder itself (a file inproc-x.json is nobody's)

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """An order or an answer still in the node's channel folder (``inproc/order-PID.json``, ``status-PID.json``):
        a fault's end takes both back, so one left is a fault whose controller died before its end."""
        return [f"state {name} (an in-process fault's {'order' if '/order-' in name else 'answer'})"
                for name in view.state_entries() if re.fullmatch(r"inproc/(order|status)-[0-9]+\.json", name)]

    def check_job(self, workload: Any) -> tuple[str, str] | None:
        launch = getattr(workload, "launch", None)
        reach = LAUNCHES[launch].inproc if launch in LAUNCHES else "bootstrap"
        if reach == "none":
            return "kind", f"{self.kind} needs a job chaoskit starts under torchrun (launch: reference or command) or an SDK job"
        if reach == "sdk" and getattr(workload, "inproc", None) is None:
            raise InfraError(
                f"{self.kind}: the attached job cannot take in-process faults: chaoskit reaches inside a process only "
                "through its own bootstrap (a job it starts) or the SDK / a framework callback in the job; nothing was injected",
                hint="if the job calls chaoskit.sdk.probe.worker_start() or uses ChaoskitCallback, say so with workload.inproc: sdk")
        return None

    def order(self, target: ProcessTarget, index: int) -> dict[str, Any]:
        return {"v": 1, "id": f"{self.fault_id}.{index}", "kind": self.kind, "pid": int(target.pid),
                "params": self.spec.order_params()}

    def plan(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Action]:
        out = []
        for i, t in enumerate(targets):
            folder = "<the channel folder>"  # the job's own RUN.job/inproc where it runs as an account, else the state folder's
            if self.lasting:
                out.append(Action(t.node, f"arm lease: after {self._ends()} the node takes the order back and kills pid "
                                          f"{t.pid} (its start time checked) unless it reported the fault's end", t.label()))
            params = json.dumps({k: v for k, v in self.spec.order_params().items() if v is not None})
            out.append(Action(t.node, f"write {folder}/order-{t.pid}.json: {self.kind} {params} "
                                      f"(chaoskit's helper, atomically); pid {t.pid} answers in status-{t.pid}.json "
                                      f"within {CHECKIN_S:g}s or the fault fails",
                              t.label()))
        return out

    def mechanism(self) -> dict[str, str]:
        """How it acts, for the timeline and the report: from inside the process, real (its harm is the real
        thing, done to a real process) unless said otherwise."""
        return {"mechanism": "in-process", "fidelity": "real"}

    def _ends(self) -> str:
        return f"{self.duration:g}s" if self.duration is not None else "the run (it lasts for good)"

    def _helper(self, ctx: FaultContext, transport: Transport, node: str, *args: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        python = node_python(ctx, transport, node)
        res = transport.run([python, "-I", "-c", HELPER, *args], timeout)
        if res.returncode != 0:
            last = res.stderr.strip().splitlines()[-1:] or [f"exit {res.returncode}"]
            raise InfraError(f"{self.kind} on node {node}: the channel's helper ({args[0]}) failed: {last[0]}")
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise InfraError(f"{self.kind} on node {node}: the channel's helper answered something that is not JSON") from None

    def revert_argv(self, python: str, folder: str, pid: int, start_time: int | None, oid: str) -> list[str]:
        return [python, "-I", "-c", HELPER, "end", folder, str(int(pid)), str(start_time if start_time is not None else ""),
                oid, f"{END_GRACE_S:g}"]

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The helper's ``end`` of one pid (start time checked) in the node's own channel folder."""
        if (len(revert) == 10 and revert[1:5] == ["-I", "-c", HELPER, "end"] and revert[5].endswith("/inproc")
                and revert[6].isascii() and revert[6].isdigit() and revert[7].isascii() and revert[7].isdigit()
                and re_id(revert[8]) and revert[9] == f"{END_GRACE_S:g}"):
            state = getattr(getattr(node, "conn", None), "state_dir", None)
            if state is not None and revert[5] != f"{state}/inproc" and not job_channel(revert[5]):
                raise ValueError(f"not this node's in-process channel folder: {revert[5]!r}")
            return [journaled_python(revert[0], node), "-I", "-c", HELPER, "end", revert[5], str(int(revert[6])),
                    str(int(revert[7])), revert[8], f"{END_GRACE_S:g}"]
        raise ValueError(f"not a revert chaoskit arms for {cls.kind} (its channel helper's end of one pid)")

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out = []
        for i, t in enumerate(targets):
            transport = ctx.transport(t.node)
            folder = ctx.inproc_folder(transport.node)
            order = self.order(t, i)
            fid = order["id"]
            python = node_python(ctx, transport, t.node)
            start = getattr(t, "start_time", None)
            if self.lasting:
                ctx.arm(transport, fid, self.kind, self.revert_argv(python, folder, t.pid, start, fid), self.duration,
                        target=t.label())
            t_order = time.time()
            answer = self._helper(ctx, transport, t.node, "order", folder, str(t.pid), json.dumps(order, separators=(",", ":")),
                                  fid, f"{CHECKIN_S:g}", f"{FIRE_S:g}", timeout=CHECKIN_S + FIRE_S + TIMEOUT_S)
            t_answer = time.time()
            status = answer.get("status")
            if status in ("timeout", "refused", "gone", "unfired"):
                self._take_back(ctx, transport, t, fid)
            if status in ("timeout", "refused", "gone"):
                why = {"timeout": f"it did not answer within {CHECKIN_S:g}s: it has no chaoskit channel (a job chaoskit "
                                  "starts has it from its bootstrap; an attached one needs the SDK or a framework callback)",
                       "gone": "the process ended before it answered",
                       "refused": f"it refused the order: {str(answer.get('reason'))[:200]}"}[status]
                raise InfraError(f"{self.kind}: {t.label()} (pid {t.pid}) did not take the order: {why}; nothing was injected")
            if status not in ("fired", "ended"):
                raise InfraError(f"{self.kind}: {t.label()} took the order but its point (the next "
                                 f"{'batch from a DataLoader' if getattr(self.spec, 'where', 'step') == 'data' else 'step'}) "
                                 f"did not come within {FIRE_S:g}s; the order was taken back")
            reported = answer.get("detail") if isinstance(answer.get("detail"), dict) else {}
            step = answer.get("step")
            detail = {**{k: v for k, v in reported.items() if k not in CHOSEN_KEYS},
                      "pid": t.pid, "start_time": start, "rank": t.rank, "order": fid, "folder": folder,
                      "step": step if isinstance(step, int) and not isinstance(step, bool) else None, **self.mechanism()}
            claimed = {k: v for k, v in reported.items() if k in CHOSEN_KEYS}
            if claimed:
                detail["reported"] = claimed
            t_fault, note = self._fault_time(transport, t, answer.get("ts"), t_order, t_answer)
            if note is not None:
                detail["note"] = note
            if not self.lasting:
                self._helper(ctx, transport, t.node, "clear", folder, str(t.pid))
            out.append(Injection(fid, self.kind, t.node, [t.label()], t_fault, detail))
        return out

    def _fault_time(self, transport: Transport, t: ProcessTarget, ts: Any, t_order: float, t_answer: float
                    ) -> tuple[float, str | None]:
        """The fault's time on the controller's clock, and a note when it is not the one the process reported: that
        one counts only inside the injection's window, from ``t_order`` (before the order was written) to
        ``t_answer`` (once the answer was read), widened by how well the node's clock offset is known."""
        clock = getattr(transport, "clock", None)
        clock = clock if isinstance(clock, ClockOffset) else ClockOffset()
        if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts):
            at = clock.to_controller(float(ts))
            if t_order - clock.error_s <= at <= t_answer + clock.error_s:
                return at, None
            why = f"{at - t_order:+.3f}s from the order, outside its window of {t_answer - t_order:.3f}s"
        else:
            why = "no time"
        return t_answer, (f"{self.kind}: {t.label()} (pid {t.pid}) reported {why}; the fault's time is chaoskit's own "
                          "(when its answer was read)")

    def _take_back(self, ctx: FaultContext, transport: Transport, t: ProcessTarget, fid: str) -> None:
        try:
            self._helper(ctx, transport, t.node, "clear", ctx.inproc_folder(transport.node), str(t.pid))
        finally:
            if self.lasting and ctx.leases is not None:
                ctx.leases.release(fid)

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        if not self.lasting:
            return
        transport = ctx.transport(injection.node)
        d = injection.detail
        start = d.get("start_time")
        answer = self._helper(ctx, transport, injection.node, "end", d["folder"], str(d["pid"]),
                              str(start if start is not None else ""), injection.fault_id, f"{END_GRACE_S:g}")
        d["killed"] = bool(answer.get("killed"))
        if d["killed"]:
            journal = getattr(ctx, "journal", None)
            if journal is not None:
                journal.record("lease.kill", fault_id=injection.fault_id, kind=self.kind, node=injection.node, pid=d["pid"],
                               why=f"pid {d['pid']} missed the end of {self.kind} ({END_GRACE_S:g}s past it): killed")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        if not self.lasting:
            return None
        d = injection.detail
        if d.get("killed") and ctx.transport(injection.node).state(d["pid"], d.get("start_time")) not in (None, "Z"):
            return f"pid {d['pid']} missed the end of {self.kind} and is still alive after the lease's kill"
        return None


def re_id(text: str) -> bool:
    return bool(ID_RE.fullmatch(text))


def job_channel(folder: str) -> bool:
    """Whether ``folder`` has the shape of a job's own channel folder (``/.../RUN.job/inproc``); the helper checks
    the folder itself (no link on the way, nobody else may write) before it acts there."""
    return (folder.startswith("/") and folder.endswith(".job/inproc") and posixpath.normpath(folder) == folder
            and folder.isprintable())


def describe_flip(detail: dict[str, Any]) -> str:
    """``bit 30 of 2.weight[17] flipped on rank 1 at step 60`` from a bit flip's injection detail."""
    where = f"{detail.get('name')}[{detail.get('index')}]" + (" (its gradient)" if detail.get("tensor") == "grad" else "")
    return f"bit {detail.get('bit')} of {where} flipped on rank {detail.get('rank')} at step {detail.get('step')}"


class InprocHangFault(_InprocFault):
    kind = "inproc.hang"
    covers = ("software.hang",)
    Spec = InprocHangSpec
    lasting = True


class InprocGilFault(_InprocFault):
    kind = "inproc.gil"
    covers = ("software.hang",)
    Spec = InprocGilSpec
    lasting = True


class InprocRaiseFault(_InprocFault):
    kind = "inproc.raise"
    covers = ("hardware.gpu_memory", "software.crash", "software.driver")
    Spec = InprocRaiseSpec

    def mechanism(self) -> dict[str, str]:
        # a CUDA error's own text and the process's exit, without a GPU that failed
        return {"mechanism": "in-process exception", "fidelity": "emulated" if self.spec.cuda else "real"}


class InprocNanFault(_InprocFault):
    kind = "inproc.nan"
    covers = ("hardware.sdc",)
    Spec = InprocNanSpec
    silent = True

    def describe(self, injection: Injection) -> str:
        d = injection.detail
        return (f"{self.spec.value.upper() if self.spec.value == 'nan' else 'Inf'} written into rank {d.get('rank')}'s "
                f"{'loss' if self.spec.into == 'loss' else 'gradients'} at step {d.get('step')}")


class InprocBitflipFault(_InprocFault):
    kind = "inproc.bitflip"
    covers = ("hardware.sdc",)
    Spec = InprocBitflipSpec
    silent = True
    needs_final_checksum = True  # a flipped bit in one replica's parameters: the replicas differ at the end

    def describe(self, injection: Injection) -> str:
        return describe_flip(injection.detail)

class InprocSlowFault(_InprocFault):
    kind = "inproc.slow"
    covers = ("hardware.slow",)
    Spec = InprocSlowSpec
    lasting = True
    measures_slowdown = True

