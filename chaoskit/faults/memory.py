"""Out of memory (``mem.oom``): a rank's memory capped through its cgroup, so the kernel's OOM killer ends it.

A memory cgroup of chaoskit's own is made for each fault
(``chaoskit-oom-<node>-<token>``): on a cgroup v2 hierarchy with the memory
controller, ``memory.max`` (and ``memory.swap.max`` 0) at the hierarchy's root, as
``node.slow`` does; else on the v1 ``memory`` hierarchy, ``memory.limit_in_bytes``
(and ``memory.memsw.limit_in_bytes`` where swap accounting exists), nested under
the rank's own memory cgroup so any limit above it still holds. The rank's
processes (the worker and its descendants) go in, their original cgroups written
down on the node first.

Moving a process into a cgroup does not move the memory it already holds (v2
never does; v1 only with ``move_charge_at_immigrate``, left off), so a cap alone
only bites once the rank allocates more than the limit, which a steady training
step may never do. The pressure therefore comes from a *ballast*: a small
process started detached in the same cgroup, with ``oom_score_adj`` -999, that
fills the cgroup up to its limit one MiB at a time. When the limit is reached the
kernel's OOM killer picks the task of that cgroup with the highest badness, which
is the rank (the ballast's adjustment puts it last); the kill is the kernel's own,
logged as ``Memory cgroup out of memory: Killed process PID`` (the ``oom.kill``
event of :mod:`chaoskit.observe.kmsg`). The ballast stops once every rank process
is gone, or when it is the next one killed.

The revert (armed as a lease first, so a SIGKILLed controller still ends with the
node restored) stops the ballast, moves whatever is left in the cgroup back to
where it came from and removes the cgroup. Torchrun's restarted workers start
from the agent, outside the cgroup. Everything on the node is done by
:data:`MEMORY_TOOL` and :data:`BALLAST`, stdlib-only scripts run as ``python3 -I -c``
through the node's transport (:mod:`chaoskit.faults.node_tool`); their state file
(``oom-<token>.json``) and the ballast's folder (``oom-<token>.ballast``) lie in the
node's state folder, made with ``O_EXCL|O_NOFOLLOW``, the folder checked by every
command that uses it.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaoskit.cluster.cgroups import cgroup_helpers
from chaoskit.cluster.selectors import ProcessTarget
from chaoskit.cluster.transports.api import Transport
from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import (
    COMMAND_TIMEOUT_S,
    check_state_gone,
    helper_argv,
    helper_source,
    journaled_helper,
    node_python,
    parse_started,
    process_tree,
    read_node_file,
    run_helper,
    state_path,
    undo,
    until_reverted,
    wait_node_file,
)

__all__ = ["OomFault", "OomSpec", "MEMORY_TOOL", "BALLAST", "BALLAST_NAME", "CGROUP_PREFIX"]

STARTED_S = 10.0
"""How long inject waits for the ballast to say it is in the cgroup."""
STATE = "oom-"
"""The state file is ``<state folder>/oom-<token>.json``, the ballast's folder ``oom-<token>.ballast`` beside it."""
CGROUP_PREFIX = "chaoskit-oom-"
"""Every cgroup this fault makes is named ``chaoskit-oom-<node>-<token>`` (the kmsg probe reads the node from it)."""
MAX_LIMIT_MIB = 1 << 20
BALLAST_NAME = "ck-oom-ballast"
"""The ballast's process name (``comm``), as the kernel's OOM lines show it."""

MEMORY_TOOL = helper_source(r"""
import json, os, signal, sys, time
""" + cgroup_helpers("memory") + r"""
def state_of(path):
    check_dir(os.path.dirname(path))  # chaoskit's own folder, or nothing is done
    return path
def ballast_of(state, ballast):
    return inside(os.path.dirname(state), ballast)
op = sys.argv[1]
if op == "probe":
    version, mount = pick()
    print(json.dumps({"version": version, "mount": mount, "root": os.geteuid() == 0}))
elif op == "cap":
    name, limit, state = sys.argv[2], int(sys.argv[3]), state_of(sys.argv[4])
    ballast = ballast_of(state, sys.argv[5])
    pids = [int(p) for p in sys.argv[6:]]
    version, mount = pick()
    if version is None:
        sys.exit("no cgroup memory controller on this node")
    original = {}
    for pid in pids:
        try:
            original[pid] = own(pid, version)
        except OSError:
            pass
    if not original:
        sys.exit("the rank's processes are gone")
    parent = "/" if version == "v2" else original[pids[0]] if pids[0] in original else "/"
    target = os.path.join(mount, parent.lstrip("/"), name)
    create_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original,
                                   "ballast": ballast}))
    os.mkdir(target)
    if version == "v2":
        with open(os.path.join(mount, "cgroup.subtree_control")) as fh:
            enabled = fh.read().split()
        if "memory" not in enabled:
            write(os.path.join(mount, "cgroup.subtree_control"), "+memory")
        write(os.path.join(target, "memory.max"), str(limit))
        if os.path.exists(os.path.join(target, "memory.swap.max")):
            write(os.path.join(target, "memory.swap.max"), "0")
    else:
        write(os.path.join(target, "memory.limit_in_bytes"), str(limit))
        if os.path.exists(os.path.join(target, "memory.memsw.limit_in_bytes")):
            write(os.path.join(target, "memory.memsw.limit_in_bytes"), str(limit))
    moved = []
    for pid in original:
        try:
            write(os.path.join(target, "cgroup.procs"), str(pid))
            moved.append(pid)
        except OSError:
            pass
    adj = {}
    try:
        write("/proc/self/oom_score_adj", "-999")  # the ballast (same credentials) can put itself last
    except OSError:
        for pid in moved:  # no CAP_SYS_RESOURCE (a container): put the rank first instead, undone at restore
            try:
                with open("/proc/%d/oom_score_adj" % pid) as fh:
                    adj[pid] = fh.read().strip()
                write("/proc/%d/oom_score_adj" % pid, "1000")
            except OSError:
                pass
    write_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original,
                                  "ballast": ballast, "oom_score_adj": adj}))
    print(json.dumps({"version": version, "cgroup": target, "limit_bytes": limit, "moved": moved,
                      "victim_first": sorted(adj)}))
elif op == "restore":
    state = state_of(sys.argv[2])
    text = read_file(state)
    if text is None:
        sys.exit(0)
    info = json.loads(text)
    target, mount, ballast = info["cgroup"], info["mount"], ballast_of(state, info["ballast"])
    make_dirs(os.path.dirname(state), ballast)  # made now, a ballast not started yet never starts
    touch_file(os.path.join(ballast, "stop"))
    try:
        os.kill(int((read_file(os.path.join(ballast, "started")) or "").split()[1]), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
    for pid, value in info.get("oom_score_adj", {}).items():
        try:
            write("/proc/%s/oom_score_adj" % pid, value)
        except OSError:
            pass
    original = {int(k): v for k, v in info["original"].items()}
    fallback = next(iter(original.values()), "/")
    for _ in range(50):
        left = procs(target)
        if not left:
            break
        for pid in left:
            back = os.path.join(mount, original.get(pid, fallback).lstrip("/"))
            try:
                write(os.path.join(back, "cgroup.procs"), str(pid))
            except OSError:
                try:
                    write(os.path.join(mount, "cgroup.procs"), str(pid))
                except OSError:
                    pass
        time.sleep(0.02)
    for _ in range(50):
        try:
            os.rmdir(target)
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.1)  # a killed ballast still exiting
    for leftover in ("started", "stop", "exited"):
        try:
            os.unlink(os.path.join(ballast, leftover))
        except OSError:
            pass
    try:
        os.rmdir(ballast)
    except OSError:
        pass
    os.unlink(state)
elif op == "check":
    state, target = state_of(sys.argv[2]), sys.argv[3]
    left = os.path.exists(target) or os.path.lexists(state)
    print("cgroup %s is still there" % target if left else "")
""")
"""``python3 -I -c MEMORY_TOOL probe | cap NAME LIMIT_BYTES STATE BALLAST_DIR PID... | restore STATE | check STATE CGROUP``."""

BALLAST = helper_source(r"""
import ctypes, os, sys, time
try:
    ctypes.CDLL(None).prctl(15, b"%s", 0, 0, 0)  # PR_SET_NAME: the kmsg probe knows the ballast's kill is not the rank's
except (OSError, AttributeError):
    pass
procs, d, deadline = sys.argv[1], sys.argv[2], time.time() + float(sys.argv[3])
ranks = [int(p) for p in sys.argv[4:]]
check_dir(os.path.dirname(d))
os.mkdir(d, 0o700)
with open(procs, "w") as fh:
    fh.write(str(os.getpid()))
try:
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("-999")
except OSError:
    pass  # no CAP_SYS_RESOURCE: the cap raised the rank's own score instead
def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
create_file(os.path.join(d, "started"), "%f %d\n" % (time.time(), os.getpid()))
held, reason = [], None
while reason is None:
    if os.path.exists(os.path.join(d, "stop")):
        reason = "stopped"
    elif time.time() >= deadline:
        reason = "deadline"
    elif not any(alive(p) for p in ranks):
        reason = "rank gone"
    elif len(held) < 65536:
        held.append(b"\x01" * (1 << 20))  # written, not just reserved: every page is charged to the cgroup
    else:
        time.sleep(0.05)
del held
create_file(os.path.join(d, "exited"), "%f %s\n" % (time.time(), reason))
""".replace("%s", BALLAST_NAME, 1))
"""``python3 -I -c BALLAST CGROUP_PROCS DIR DURATION_S RANK_PID...``: joins the cgroup, fills it a MiB at a time
until every rank process is gone (or ``DIR/stop``, or the deadline); writes ``DIR/started`` and ``DIR/exited``."""


class OomSpec(FaultSpec):
    """Cap the selected ranks' memory at ``limit_mib`` and fill it: the kernel's OOM killer ends the rank."""

    kind: Literal["mem.oom"]
    limit_mib: int = Field(
        64, ge=1, le=MAX_LIMIT_MIB,
        description="Memory limit of the rank's chaoskit cgroup in MiB (memory newly charged after the fault: what "
                    "the rank already holds stays charged where it was). A ballast fills it; at the limit the "
                    "kernel's OOM killer ends the rank.",
    )
    duration: PositiveDuration = Field(
        30.0, description="How long the cgroup stays; the node removes it by itself after that (the kill comes within "
                          "moments of the fault).")


class OomFault(Fault):
    kind = "mem.oom"
    Spec = OomSpec
    lasting: ClassVar[bool] = True

    def plan(self, ctx: FaultContext, targets: list[Any]) -> list[Action]:
        d, limit = self.spec.duration, self.spec.limit_mib << 20
        out = []
        for t in targets:
            label = t.label()
            out.append(Action(t.node, f"arm lease: watchdog runs 'python3 -I -c <memory tool> restore "
                                      f"<state folder>/{STATE}<token>.json' "
                                      f"after {d:g}s or a stale lease", label))
            out.append(Action(t.node, f"mkdir <memory cgroup>/{CGROUP_PREFIX}{t.node}-<token>; cgroup v2: memory.max {limit}, "
                                      f"memory.swap.max 0 (v1, under the rank's own cgroup: memory.limit_in_bytes {limit}); "
                                      f"move {t.pid} and its descendants in (cgroup.procs), their cgroups written down", label))
            out.append(Action(t.node, f"start detached: python3 -I -c <ballast> (joins the cgroup, oom_score_adj -999, fills "
                                      f"it a MiB at a time): the kernel's OOM killer ends {t.pid}", label))
            out.append(Action(t.node, f"after {d:g}s: stop the ballast, move what is left back to its own cgroups; "
                                      "rmdir the chaoskit cgroup", label))
        return out

    def inject(self, ctx: FaultContext, targets: list[ProcessTarget]) -> list[Injection]:
        out: list[Injection] = []
        covered: set[tuple[str, int]] = set()
        for i, t in enumerate(targets):
            if (t.node, t.pid) in covered:  # a child of a rank already capped (it inherits RANK)
                continue
            fid = f"{self.fault_id}.{i}"
            transport = ctx.transport(t.node)
            pids = process_tree(transport, t.pid)
            covered.update((t.node, p) for p in pids)
            python = node_python(ctx, transport, t.node)
            probe = _tool(transport, python, ["probe"])
            if probe.get("version") is None:
                raise InfraError(f"mem.oom: node {t.node} has no cgroup memory controller (v2 memory.max or v1 memory)")
            state = state_path(transport, STATE, ".json")
            token = os.path.basename(state)[len(STATE):-len(".json")]
            ballast = state[: -len(".json")] + ".ballast"
            revert = helper_argv(python, MEMORY_TOOL, "restore", state)
            ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=t.label())
            try:
                done = _tool(transport, python, ["cap", f"{CGROUP_PREFIX}{t.node}-{token}", str(self.spec.limit_mib << 20),
                                                 state, ballast, *map(str, pids)])
                if t.pid not in done["moved"]:
                    raise InfraError(f"mem.oom: could not move pid {t.pid} into {done['cgroup']} on node {t.node}")
                transport.spawn_detached(helper_argv(python, BALLAST, f"{done['cgroup']}/cgroup.procs", ballast,
                                                     f"{self.spec.duration:g}", *map(str, done["moved"])))
                started = wait_node_file(transport, f"{ballast}/started", STARTED_S)
                if started is None:
                    raise InfraError(f"mem.oom: the ballast did not start on node {t.node} within {STARTED_S:g}s")
                started_at, ballast_pid = parse_started(started, "mem.oom: the ballast's started file", t.node)
            except InfraError:
                undo(ctx, transport, fid, revert)
                raise
            detail = {"mechanism": f"cgroup {done['version']}", "fidelity": "real", "cgroup": done["cgroup"],
                      "state": state, "ballast": ballast, "ballast_pid": ballast_pid, "pids": done["moved"],
                      "limit_bytes": done["limit_bytes"], "rank_oom_score_adj_raised": bool(done["victim_first"]),
                      "revert": revert}
            out.append(Injection(fid, self.kind, t.node, [t.label()], started_at, detail))
        return out

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        transport = ctx.transport(injection.node)
        injection.detail["ballast_exit"] = read_node_file(transport, f"{injection.detail['ballast']}/exited").strip() or None
        res = transport.run(injection.detail["revert"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            raise InfraError(f"mem.oom: restoring the cgroups on node {injection.node} failed: {res.stderr.strip()}")

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        problem = until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"],
                                                             cgroup=injection.detail["cgroup"]))
        if problem is None:
            transport.run(["rm", "-rf", injection.detail["ballast"]], COMMAND_TIMEOUT_S)
        return problem

    @classmethod
    def journaled_revert(cls, revert: list[str], node: Any = None) -> list[str]:
        """The memory tool's ``restore`` of a state file in the node's state folder."""
        return journaled_helper(revert, node, MEMORY_TOOL, "restore", STATE, ".json")

    @classmethod
    def check_reverted(cls, transport: Transport, revert: list[str], node: Any = None, cgroup: str | None = None) -> str | None:
        return check_state_gone(transport, revert, STATE, cgroup or "")

    state_prefixes = (STATE,)

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """Its cgroups (``chaoskit-oom-*``, with their ``memory.max``) and its state (``oom-*``: the cap's, the ballast)."""
        out = [f"cgroup {path} (mem.oom's memory cap)" for path in view.cgroups()
               if path.rsplit("/", 1)[-1].startswith(CGROUP_PREFIX)]
        return out + [f"state {name} (mem.oom)" for name in view.state_entries() if name.startswith(STATE) and "/" not in name.rstrip("/")]


def _tool(transport: Transport, python: str, args: list[str]) -> dict[str, Any]:
    return run_helper(transport, python, MEMORY_TOOL, args, "mem.oom", "cgroups need root on the node")
