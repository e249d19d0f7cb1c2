"""Nothing is ever left behind: controller deaths across every lasting kind that runs here, then ``chaoskit audit``.

Deaths (``--deaths N``, drawn round-robin over the cases below with a seeded random instant each):

- every lasting kind on the lab it runs on (process lab: ``process.hang``, ``node.slow``, ``mem.oom``, ``gpu.fail``'s
  crash loop, ``storage.corrupt``, ``storage.full``, ``storage.slow``, ``storage.error``; netns lab: ``network.link_down``, ``network.blackhole``,
  ``network.degrade``, ``network.partition``, ``node.poweroff``): a real controller process arms and injects the
  fault through the real ``RunContext`` (trusted journal, run marker, leases), and is SIGKILLed at a random instant
  between arming and its revert;
- ``fuse-daemon-kill``: ``storage.slow``'s FUSE daemon (its root parent and its server) SIGKILLed mid-fault, then the
  controller: nothing is left to detach the mount but the lease's watchdog;
- ``agent-kill``: the node's agent is SIGKILLed mid-fault (the controller lives on and must still revert);
- ``mgmt-cut``: the controller's management link to the node is cut for longer than the lease TTL;
- ``mgmt-cut-kill``: the link is cut, and the controller SIGKILLed while it is: its agent on the node hears
  nothing more (no EOF crosses a cut link) and must end itself (here after ``AGENT_IDLE_S``, in place of
  chaoskit's 60 s, so that a death fits in seconds; the mechanism is the same), and the lease reverts the fault;
- ``poweroff-mid-fault``: the netns node is powered off while a NIC fault is on it, then powered on;
- ``state-full``: the controller's state folder is a full file system, so the journal write fails;
- ``slurm.drain`` on a Slurm lab's node, seen as a site's (its inventory, through its slurm.conf): the drain's lease
  is armed on this machine, whose watchdog resumes the node.

After each death it waits for the lease (its watchdog's ``fired`` file) and runs the audit until the node settles
(``--settle``); what is still there then is residue, and ``chaoskit audit --fix`` (rollback from the trusted
journal, then the audit again) is run on it; after a clean settle the rollback runs without that second audit (the
next death's settle audits again and counts what it finds), but for the last death, whose ``--fix`` audit is the
soak's last look. Per case it prints deaths, residue, death -> revert p50/p99/max and what needed rollback;
the last line is ``residue N of M``.

``--soak N`` instead runs N drills of the shipped scenarios (drawn with the seed) as game days, SIGKILLing the game
day's controller in ``--kill-share`` of the drills (the game day then goes on in a new controller, after
``chaoskit rollback``), and checks: 0 residue, every result.json valid, and the controller's fds, threads and RSS per
drill within the stated bound (``--fd-bound``, ``--thread-bound``, ``--rss-bound-mib``: growth from the first
drill to the last, per drill).

Needs root (cgroups, network namespaces, tmpfs). Run: ``sudo .venv/bin/python bench/soak.py --deaths 30``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TTL_S = 2.0
AGENT_IDLE_S = 6.0
"""``mgmt-cut-kill``: how long the node's agent waits without a word from its controller before it ends itself."""
FAULT_S = 5.0
"""Each fault's duration: the controller is killed at a random instant of it (arm .. revert)."""
WORKER = "import time; time.sleep(3600)  # worker"

CONTROLLER = r"""
import json, os, sys, time
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.selectors import TargetSpec, resolve_nodes, resolve_processes
from chaoskit.core.state import private_dir, state_dir
from chaoskit.faults.registry import get_fault
from chaoskit.lab.process import ProcessLab
from chaoskit.session import RunContext  # the runner's own class (runner.RunContext), without importing the runner
from chaoskit.safety.journal import Journal
from chaoskit.safety.lease import LeaseManager, default_lease_root

case = json.loads(sys.argv[1])
run_id = case["run_id"]
if case.get("agent_idle_s"):  # mgmt-cut-kill: the agents' own idle limit, shorter than chaoskit's 60 s
    import functools
    import chaoskit.cluster.transports.agent_transport as agent_transport  # where the ssh transport's agent is made
    agent_transport.agent_program = functools.partial(agent_transport.agent_program, idle_exit_s=case["agent_idle_s"])
if case["lab"] == "process":
    lab = ProcessLab(case["process_lab"], 2)
    inventory, details = lab.inventory(), {"kind": "process", "lab": lab.lab_id, "ephemeral": False}
elif case["lab"] == "slurm":  # the Slurm lab's nodes as a site's: its inventory, through its slurm.conf
    from chaoskit.backends.registry import backend
    details = {"kind": "slurm", "inventory": case["slurm_inventory"], "slurm": {"conf": case["slurm_conf"]},
               "ephemeral": False}
    inventory = backend("slurm").rollback_inventory(details, [])
else:
    inventory, details = load_inventory(case["inventory"]), {"kind": "netns", "inventory": case["inventory"], "ephemeral": False}
marker = state_dir() / "runs" / f"{run_id}.json"
marker.parent.mkdir(parents=True, exist_ok=True)
journal = Journal(private_dir("runs", run_id) / "journal.jsonl")
marker.write_text(json.dumps({"pid": os.getpid(), "run_dir": "", **details}))
leases = LeaseManager(default_lease_root(), run_id, case["ttl"])
ctx = RunContext(inventory, journal, leases, checkpoint_dir=case.get("checkpoint_dir"))
cls = get_fault(case["kind"])
spec = cls.Spec.model_validate({"kind": case["kind"], "target": case["target"], **case["fields"]})
fault = cls(spec, "f0")
targets = (resolve_nodes if cls.target_type == "node" else resolve_processes)(inventory, spec.target)
print("arming %.6f" % time.time(), flush=True)
injections = fault.inject(ctx, targets)
print("injected %.6f" % time.time(), flush=True)
time.sleep(max(0.0, case["duration"] - 0.5))
for inj in injections:
    end = time.time() + case["ttl"] + 20  # a node powered off and on again answers once its sshd is back (as the runner)
    while True:
        try:
            fault.revert(ctx, inj)
            break
        except Exception:
            if time.time() > end:
                raise
            inventory[inj.node].conn.close()
            time.sleep(0.5)
    problem = fault.verify(ctx, inj)
    journal.record("reverted", fault_id=inj.fault_id, kind=inj.kind, node=inj.node, verified=problem is None, problem=problem)
    if problem is None:
        leases.release(inj.fault_id)
leases.close()
journal.close()
marker.unlink()
print("reverted %.6f" % time.time(), flush=True)
"""


@dataclass
class Case:
    name: str
    """The row of the table: a kind, or a kind and a death other than the controller's SIGKILL."""
    kind: str
    lab: str
    fields: dict
    target: dict
    death: str = "controller"


@dataclass
class Outcome:
    case: str
    killed_at: float | None
    revert_s: float | None
    residue: list[str] = field(default_factory=list)
    rollback: list[str] = field(default_factory=list)
    note: str = ""
    took_s: float = 0.0


def cases(ckpt: str, small_fs: str) -> list[Case]:
    rank0 = {"ranks": [0]}
    n1 = {"nodes": ["n1"]}
    d = {"duration": f"{FAULT_S:g}s"}
    return [
        Case("process.hang", "process.hang", "process", d, rank0),
        Case("node.slow", "node.slow", "process", {**d, "cpu_share": 20}, rank0),
        Case("mem.oom", "mem.oom", "process", {**d, "limit_mib": 64}, rank0),
        Case("gpu.fail", "gpu.fail", "process", {**d, "mechanism": "crashloop", "scope": "device"}, rank0),
        Case("storage.corrupt", "storage.corrupt", "process", {**d, "mode": "truncate", "pattern": "ckpt-*.pt"},
             {"nodes": ["n0"]}),
        Case("storage.full", "storage.full", "process", {**d, "size": "8MiB", "path": "small"}, {"nodes": ["n0"]}),
        Case("storage.slow", "storage.slow", "process", {**d, "latency": "50ms", "rate": "8MiB"}, {"nodes": ["n0"]}),
        Case("storage.error", "storage.error", "process", {**d, "errno": "EIO", "percent": 50}, {"nodes": ["n0"]}),
        Case("fuse-daemon-kill (storage.slow)", "storage.slow", "process", {**d, "latency": "50ms"}, {"nodes": ["n0"]},
             death="fuse-daemon"),
        Case("network.link_down", "network.link_down", "netns", d, n1),
        Case("network.blackhole", "network.blackhole", "netns", d, n1),
        Case("network.degrade", "network.degrade", "netns", {**d, "rate": "1mbit"}, n1),
        Case("network.partition", "network.partition", "netns", d, n1),
        Case("node.poweroff", "node.poweroff", "netns", d, n1),
        Case("agent-kill (blackhole)", "network.blackhole", "netns", d, n1, death="agent"),
        Case("mgmt-cut (partition)", "network.partition", "netns", d, n1, death="mgmt"),
        Case("mgmt-cut-kill (partition)", "network.partition", "netns", d, n1, death="mgmt-kill"),
        Case("poweroff-mid-fault (link_down)", "network.link_down", "netns", d, n1, death="power"),
        Case("state-full (hang)", "process.hang", "process", d, rank0, death="state-full"),
        Case("slurm.drain", "slurm.drain", "slurm", d, {"nodes": ["n0"]}),
    ]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.controllers: set[int] = set()
        """The pids of the controllers this soak started: an agent whose gone controller is not one of them is another
        lane's (it ends itself, or that lane's rollback ends it), not this lane's residue."""
        self.work = Path(tempfile.mkdtemp(prefix="chaoskit-soak-"))
        self.state = self.work / "state"
        self.state.mkdir(mode=0o700)
        os.environ["CHAOSKIT_STATE_DIR"] = str(self.state)
        self.ckpt = self.work / "ckpt"
        self.small_fs = self.ckpt / "small"
        """storage.full's own small file system, inside the checkpoint folder (it refuses to fill a larger one)."""
        self.full_state = self.work / "full-state"
        self.workers: dict[str, subprocess.Popen] = {}
        self.netns = None
        self.slurm = None
        self.process_lab = None
        self.mounts: list[Path] = []

    # -- labs -----------------------------------------------------------------------

    def up(self, need_netns: bool, need_slurm: bool = False) -> None:
        from chaoskit.lab.process import ProcessLab

        self.process_lab = ProcessLab.create(2, persistent=True)
        self.ckpt.mkdir(mode=0o700)
        for dest, size in ((self.small_fs, "8m"), (self.full_state, "256k")):
            dest.mkdir(mode=0o700)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(dest)], check=True)
            self.mounts.append(dest)
        if need_netns:
            from chaoskit.lab.netns import NetnsLab

            self.netns = NetnsLab.create(2, directory=self.work / "netns")
        if need_slurm:
            from chaoskit.lab.slurm import SlurmLab

            self.slurm = SlurmLab.create(2, 0, {"sched_interval": 2.0}, directory=self.work / "slurm")

    def down(self) -> None:
        for p in self.workers.values():
            p.kill()
            p.wait()
        if self.process_lab is not None:
            self.process_lab.down()
        if self.netns is not None:
            self.netns.down()
        if self.slurm is not None:
            self.slurm.down()
        for m in self.mounts:
            subprocess.run(["umount", str(m)], capture_output=True)
        if not any(os.path.ismount(m) for m in self.mounts):
            shutil.rmtree(self.work, ignore_errors=True)

    def ensure_workers(self) -> None:
        """One fake worker per process-lab node (rank 0 on n0, rank 1 on n1): a fault that killed one gets a new one."""
        for rank, node in enumerate(("n0", "n1")):
            p = self.workers.get(node)
            if p is not None and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                continue
            env = dict(os.environ, CHAOSKIT_SCOPE=self.process_lab.scope(node), RANK=str(rank), LOCAL_RANK="0",
                       TORCHELASTIC_RUN_ID="soak")
            self.workers[node] = subprocess.Popen([sys.executable, "-c", WORKER], env=env)
        for old in self.ckpt.glob("ckpt-*.pt"):
            old.unlink()
        (self.ckpt / f"ckpt-{time.time_ns()}.pt").write_bytes(os.urandom(64 * 1024))
        time.sleep(0.2)

    # -- one death -------------------------------------------------------------------

    def one(self, case: Case, i: int) -> Outcome:
        if case.lab == "process":
            self.ensure_workers()
        run_id = f"soak-{i:04d}"
        spec = {"run_id": run_id, "lab": case.lab, "kind": case.kind, "fields": case.fields, "target": case.target,
                "ttl": TTL_S, "duration": FAULT_S, "checkpoint_dir": str(self.ckpt), "process_lab": self.process_lab.lab_id,
                "inventory": str(self.netns.inventory_path) if self.netns is not None else None,
                "slurm_inventory": str(self.slurm.inventory_path) if self.slurm is not None else None,
                "slurm_conf": str(self.slurm.conf_path) if self.slurm is not None else None,
                "agent_idle_s": AGENT_IDLE_S if case.death == "mgmt-kill" else None}
        env = dict(os.environ)
        if case.death == "state-full":
            env["CHAOSKIT_STATE_DIR"] = str(self.fill_state())
        proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, json.dumps(spec)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.controllers.add(proc.pid)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        armed = _wait_line(lines, "arming", 60)
        if armed is None:
            proc.wait(30)
            err = proc.stderr.read()[-300:].strip().splitlines()
            note = f"controller ended before arming: {err[-1] if err else proc.returncode}"
            return self.settle(case, run_id, None, None, note=note)
        delay = self.rng.uniform(0, FAULT_S - 1.0)
        died_at = self.kill(case, proc, armed + delay, lines, run_id)
        note = ""
        if case.death == "state-full":  # the journal write failed: the controller must have stopped before injecting
            err = proc.stderr.read()[-300:].strip().splitlines()
            where = next((line.strip() for line in reversed(err) if line.strip().startswith("File ")), "")
            note = f"controller exited {proc.returncode} before the kill: {err[-1] if err else ''} ({where})" if proc.returncode != -9 else \
                "the kill came before the controller's first journal write"
        return self.settle(case, run_id, died_at, proc, note=note, last=i == self.args.deaths - 1)

    def fill_state(self) -> Path:
        """The controller's state folder for ``state-full``: a file system with room for the run's marker (one page)
        and no more, so the journal's first record fails (ENOSPC) before anything is armed."""
        for old in [*self.full_state.glob("runs/*.json"), self.full_state / "fill"]:
            old.unlink(missing_ok=True)
        subprocess.run(["dd", "if=/dev/zero", f"of={self.full_state}/fill", "bs=4k"], capture_output=True)
        with open(self.full_state / "fill", "r+b") as fh:  # give back one page
            fh.truncate(max(0, os.fstat(fh.fileno()).st_size - 4096))
        return self.full_state

    def kill(self, case: Case, proc: subprocess.Popen, when: float, lines: list[str], run_id: str) -> float:
        time.sleep(max(0.0, when - time.time()))
        if case.death in ("controller", "state-full"):
            proc.kill()
            proc.wait()
            return time.time()
        if case.death == "fuse-daemon":  # the FUSE daemon, its root parent first, then the controller: a dead mount
            _wait_line(lines, "injected", 30)
            for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
                try:
                    words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if len(words) > 10 and words[4] == b"serve" and b"/storage-io-" in words[10]:
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
            return time.time()
        ns = self.netns.netns("n1")
        if case.death == "agent":
            _wait_line(lines, "injected", 30)
            for pid in self.netns.pids("n1"):
                if "-I -u -c" in _cmdline(pid):
                    os.kill(pid, signal.SIGKILL)
            return time.time()
        if case.death == "mgmt":
            _wait_line(lines, "injected", 30)
            t = time.time()
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", "eth1", "down"], check=True)
            # cut past the lease's TTL: until its watchdog on the node fired (in place of a fixed TTL_S + 2 s; at
            # most TTL_S + 10 s, where it never fires and the settle then finds the fault still on)
            while time.time() < t + TTL_S + 10 and (time.time() < t + TTL_S or not any(
                    self.work.glob(f"netns/nodes/*/work/leases/{run_id}/*/fired"))):
                time.sleep(0.05)
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", "eth1", "up"], check=True)
            return t
        if case.death == "mgmt-kill":
            _wait_line(lines, "injected", 30)
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", "eth1", "down"], check=True)
            time.sleep(0.5)
            tag = f"/{proc.pid}/"  # the agent's command line names its controller: controller=HOST/PID/START
            mine = [pid for pid in self.netns.pids("n1") if "chaoskit-agent" in _cmdline(pid) and tag in _cmdline(pid)]
            proc.kill()
            proc.wait()
            t = time.time()
            # While the link is still cut (no EOF or reset can reach the node), the agent must end by itself.
            end = t + AGENT_IDLE_S + 6.0
            while time.time() < end and any(_cmdline(pid) for pid in mine):
                time.sleep(0.2)
            left = [pid for pid in mine if _cmdline(pid)]
            self.cut_residue = [f"n1: agent pid {pid} of the killed controller still running {time.time() - t:.1f}s "
                                "after its death, the link cut" for pid in left]
            if not mine:
                self.cut_residue = ["n1: no agent of the controller found to watch (the case proved nothing)"]
            time.sleep(max(0.0, TTL_S + 2.0 - (time.time() - t)))
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", "eth1", "up"], check=True)
            return t
        if case.death == "power":
            _wait_line(lines, "injected", 30)
            t = time.time()
            self.netns.power("n1", "off")
            time.sleep(1.0)
            self.netns.power("n1", "on")
            return t
        raise ValueError(case.death)

    def settle(self, case: Case, run_id: str, died_at: float | None, proc: subprocess.Popen | None,
               note: str = "", last: bool = True) -> Outcome:
        from chaoskit.audit import audit, fix
        from chaoskit.crash import recover
        from chaoskit.safety.rollback import find_crashed_runs

        started = time.time()
        if proc is not None and proc.poll() is None:
            proc.wait(FAULT_S + 30)  # a controller that lived on reverts at the fault's end
        target = {"process": "process", "netns": str(self.netns.inventory_path) if self.netns else "",
                  "slurm": str(self.slurm.inventory_path) if self.slurm else ""}[case.lab]
        conf = str(self.slurm.conf_path) if case.lab == "slurm" else None
        dirs = [str(self.ckpt), str(self.small_fs)] if case.lab == "process" else []
        fired = _fired_at(self.state, self.work, run_id, TTL_S + FAULT_S + 10)
        revert_s = None if fired is None or died_at is None else max(0.0, fired - died_at)
        end = time.time() + self.args.settle
        clean_at = None
        while True:
            result = audit(target, checkpoint_dirs=dirs, slurm_conf=conf)
            # a dead run's journal records are bookkeeping ('chaoskit rollback' clears them below), not residue
            mine = [f"{x.node}: {x.kind}: {x.what}" for x in result.leftovers
                    if x.kind != "journal" and _ours(x.what, self.work, self.controllers)]
            mine += [f"{n}: unreadable: {why}" for n, why in result.unreadable.items()]
            if not mine:
                clean_at = time.time()
            if not mine or time.time() > end:
                break
            time.sleep(0.5)
        if revert_s is None and died_at is not None and clean_at is not None:
            revert_s = clean_at - died_at  # no watchdog fired (the controller lived on and reverted): until clean
        mine += getattr(self, "cut_residue", [])
        self.cut_residue = []
        out = Outcome(case.name, died_at, revert_s, mine, note=note, took_s=time.time() - started)
        if not mine and not last:
            # clean: the rollback an operator runs after a death (it clears the dead run's journal), without the
            # audit after it; the next death's settle audits the node again, and counts what it finds as residue
            for _ in map(recover, find_crashed_runs()):
                pass
            return out
        fixed = fix(target, checkpoint_dirs=dirs, slurm_conf=conf)  # what an operator runs after a death: chaoskit rollback
        if mine:
            out.rollback = [f"{f.get('kind')} on {f.get('node')}: {'ok' if f.get('ok') else f.get('problem')}"
                            for f in fixed.fixed if f.get("kind")]
        left = [x.what for x in fixed.leftovers if _ours(x.what, self.work, self.controllers)]
        if left:
            out.note += " still left after rollback: " + "; ".join(left)[:300]
        return out


def _ours(what: str, work: Path | None = None, controllers: set[int] | None = None) -> bool:
    """A leftover line that is not another session's in-process order (this machine's /run/chaoskit is shared), nor,
    given this soak's ``work`` folder, another lane's FUSE mount or daemon, nor, given the pids of the controllers
    this soak started, an agent of another lane's dead controller: a node's audit reads every mount table and
    process of the machine, and a lane beside this one may be in the middle of its own storage fault, or its
    controller just killed (a process lane's audit then sees a netns lane's agent before that lane settles)."""
    if "inproc/" in what:
        return False
    agent = re.search(r"its controller \(pid (\d+) on ", what)
    if agent is not None and controllers is not None and int(agent.group(1)) not in controllers:
        return False
    if work is None:
        return True
    folder = re.search(r"/\S*chaoskit-soak-[^/\s]+", what)
    if folder is not None and not folder.group(0).startswith(str(work)):
        return False
    daemon = re.search(r"FUSE daemon running: pid (\d+)", what)
    if daemon is not None:
        cmdline = _cmdline(int(daemon.group(1)))
        return "chaoskit-soak-" not in cmdline or str(work) in cmdline
    return True


def _wait_line(lines: list[str], word: str, timeout: float) -> float | None:
    end = time.time() + timeout
    while time.time() < end:
        for line in list(lines):
            if line.startswith(word):
                return float(line.split()[1])
        time.sleep(0.02)
    return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _fired_at(state: Path, work: Path, run_id: str, timeout: float) -> float | None:
    """When the run's watchdog reverted (its ``fired`` file, on this machine or in a netns node's state folder)."""
    end = time.time() + timeout
    while time.time() < end:
        for path in [*state.glob(f"leases/{run_id}/*/fired"), *work.glob(f"netns/nodes/*/work/leases/{run_id}/*/fired")]:
            try:
                return float(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        if not any(state.glob(f"leases/{run_id}/*/lease")) and not any(work.glob(f"netns/nodes/*/work/leases/{run_id}/*/lease")):
            return None  # released (the controller reverted) or never armed
        time.sleep(0.05)
    return None


def report(outcomes: list[Outcome]) -> int:
    print(f"{'case':34} {'deaths':>6} {'residue':>7} {'p50 s':>6} {'p99 s':>6} {'max s':>6}  needed rollback")
    for name in dict.fromkeys(o.case for o in outcomes):
        mine = [o for o in outcomes if o.case == name]
        times = sorted(o.revert_s for o in mine if o.revert_s is not None)
        p = (lambda q: f"{times[min(len(times) - 1, int(round(q * (len(times) - 1))))]:.2f}") if times else (lambda q: "-")
        rolled = sum(1 for o in mine if o.rollback)
        print(f"{name:34} {len(mine):6d} {sum(1 for o in mine if o.residue):7d} {p(0.5):>6} {p(0.99):>6} "
              f"{(f'{times[-1]:.2f}' if times else '-'):>6}  {rolled or '-'}")
        for o in mine:
            for line in o.residue:
                print(f"    residue: {line}")
            if o.note:
                print(f"    note: {o.note}")
    left = sum(1 for o in outcomes if o.residue)
    print(f"residue {left} of {len(outcomes)}")
    return 0 if left == 0 else 1


SOAK_SCENARIOS = ("ckpt-corrupt", "ckpt-disk-full", "gpu-xid-cuda-error", "hang-rank", "kill-rank", "kill-uninstrumented",
                  "oom-rank", "straggler")
"""The shipped scenarios that run on the process lab, which a game day shares between them."""
LASTING = ("ckpt-corrupt", "ckpt-disk-full", "hang-rank", "oom-rank", "straggler", "gpu-xid-cuda-error")
"""Those with a lasting fault: the controller is killed between its arming and its revert."""


@dataclass
class Drill:
    index: int
    scenario: str
    status: str | None = None
    fds: int | None = None
    threads: int | None = None
    rss_mib: float | None = None
    controller: int = 0
    """Which controller process ran it (a new one after each kill)."""
    killed: bool = False
    residue: list[str] = field(default_factory=list)


def short_scenario(name: str, steps: int, folder: Path) -> Path:
    """The shipped scenario ``name`` with its job cut to ``steps`` steps, or to 40 steps past its last fault's end
    (its step, and its duration in steps of the job's step time) where that is later, and never longer than shipped:
    the drill's fault and its recovery are the shipped ones, the steps it trains on after them fewer."""
    from chaoskit.scenario import load_scenario

    path = ROOT / "scenarios" / f"{name}.yaml"
    model = load_scenario(path).model
    work = model.workload
    ends = [(f.at.step or 0) + (getattr(f, "duration", None) or 0.0) / work.step_time for f in model.faults]
    want = min(work.steps, max(steps, math.ceil(max(ends, default=0.0)) + 40))
    text = path.read_text()
    line = f"\n  steps: {work.steps}\n"
    if text.count(line) != 1:
        raise SystemExit(f"{path}: cannot shorten: its workload.steps line ({line.strip()!r}) is not found once")
    short = folder / f"{name}.yaml"
    short.write_text(text.replace(line, f"\n  steps: {want}\n"))
    return short


def soak_drills(soak: Soak, n: int, kill_share: float, steps: int = 0) -> list[Drill]:
    """``n`` drills of the shipped process-lab scenarios (drawn with the seed) as game days in one controller
    process each; the controller is SIGKILLed in ``kill_share`` of the drills (those with a lasting fault), after
    which ``chaoskit rollback`` runs, the audit must come back clean, and a new game day runs the rest. With
    ``steps``, each scenario's job is cut to that many steps (:func:`short_scenario`)."""
    from chaoskit.audit import audit

    rng = soak.rng
    names = [rng.choice(SOAK_SCENARIOS) for _ in range(n)]
    lasting = [i for i, name in enumerate(names) if name in LASTING]
    kills = set(rng.sample(lasting, min(len(lasting), max(1, round(n * kill_share))))) if kill_share > 0 else set()
    drills = [Drill(i, name) for i, name in enumerate(names)]
    env = dict(os.environ, CHAOSKIT_STATE_DIR=str(soak.state))
    shipped = ROOT / "scenarios"
    if steps:
        shipped = soak.work / "scenarios"
        shipped.mkdir(exist_ok=True)
        for name in set(names):
            short_scenario(name, steps, shipped)
    start, controller = 0, 0
    while start < n:
        out = soak.work / f"gameday-{controller}"
        files = [str(shipped / f"{name}.yaml") for name in names[start:]]
        proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "gameday", *files, "--out", str(out)], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        done = 0
        killed_at = None
        while proc.poll() is None:
            records = _records(out)
            finished = [r for r in records if r.get("status") is not None]
            while done < len(finished):  # a drill ended: the controller's figures, read by itself after its teardown
                d = drills[start + done]
                d.status, d.controller = finished[done]["status"], controller
                own = finished[done].get("controller") or {}
                d.fds, d.threads, d.rss_mib = own.get("fds"), own.get("threads"), own.get("rss_mib")
                done += 1
            current = start + done
            if current in kills and killed_at is None and _armed(soak.state):
                time.sleep(rng.uniform(0.0, 2.0))
                proc.kill()
                killed_at = current
                break
            time.sleep(0.2)
        proc.wait()
        if killed_at is None:
            for r, d in zip([r for r in _records(out) if r.get("status") is not None][done:], drills[start + done:]):
                d.status, d.controller = r["status"], controller
                own = r.get("controller") or {}
                d.fds, d.threads, d.rss_mib = own.get("fds"), own.get("threads"), own.get("rss_mib")
            break
        d = drills[killed_at]
        d.killed, d.status, d.controller = True, "killed", controller
        subprocess.run([sys.executable, "-m", "chaoskit", "rollback"], cwd=ROOT, env=env, capture_output=True, timeout=120)
        end = time.time() + soak.args.settle
        while True:
            left = [f"{x.node}: {x.kind}: {x.what}" for x in audit("process").leftovers if _ours(x.what)] \
                if _lab_up(env) else []
            if not left or time.time() > end:
                break
            time.sleep(0.5)
        d.residue = left
        start, controller = killed_at + 1, controller + 1
    subprocess.run([sys.executable, "-m", "chaoskit", "lab", "down"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    return drills


def _lab_up(env: dict[str, str]) -> bool:
    from chaoskit.lab.process import ProcessLab

    return ProcessLab.load() is not None


def _records(out: Path) -> list[dict]:
    try:
        return json.loads((out / "gameday.json").read_text()).get("scenarios") or []
    except (OSError, ValueError):
        return []


def _armed(state: Path) -> bool:
    """A live run's trusted journal holds an armed fault not yet reverted."""
    for journal in state.glob("runs/*/journal.jsonl"):
        try:
            lines = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
        armed = {e.get("fault_id") for e in lines if e.get("action") == "armed"}
        if armed - {e.get("fault_id") for e in lines if e.get("action") == "reverted"}:
            return True
    return False


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares growth per drill."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def soak_report(soak: Soak, drills: list[Drill], args: argparse.Namespace) -> int:
    print(f"{'drill':>5} {'scenario':20} {'status':11} {'ctl':>3} {'fds':>4} {'thr':>4} {'RSS MiB':>8}")
    for d in drills:
        print(f"{d.index + 1:5d} {d.scenario:20} {str(d.status):11} {d.controller:3d} {d.fds if d.fds is not None else '-':>4} "
              f"{d.threads if d.threads is not None else '-':>4} {d.rss_mib if d.rss_mib is not None else '-':>8}")
        for line in d.residue:
            print(f"      residue: {line}")
    invalid = []
    for result in sorted(soak.work.glob("gameday-*/*/result.json")):
        try:
            data = json.loads(result.read_text())
            if not isinstance(data, dict) or not {"verdict", "faults", "phases"} <= data.keys():
                invalid.append(str(result))
        except (OSError, ValueError):
            invalid.append(str(result))
    results = len(list(soak.work.glob("gameday-*/*/result.json")))
    growth = {}
    for what in ("fds", "threads", "rss_mib"):
        points = [[(d.index, getattr(d, what)) for d in drills if d.controller == c and getattr(d, what) is not None]
                  for c in {d.controller for d in drills}]
        per_controller = [_slope(p) for p in points if len(p) >= 2]
        growth[what] = max(per_controller, default=0.0)
    bounds = {"fds": args.fd_bound, "threads": args.thread_bound, "rss_mib": args.rss_bound_mib}
    residue = sum(1 for d in drills if d.residue)
    ok = residue == 0 and not invalid and all(growth[k] <= bounds[k] for k in bounds)
    print(f"result.json: {results} valid of {results + 0}" if not invalid else f"result.json invalid: {', '.join(invalid)}")
    print("growth per drill (least squares, the worst controller): " + ", ".join(
        f"{k} {growth[k]:+.3f} (bound {bounds[k]:g})" for k in bounds))
    print(f"soak: {len(drills)} drills, {sum(d.killed for d in drills)} controller kills, residue {residue}, "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def lanes(chosen: list[Case], args: argparse.Namespace) -> int:
    """``--deaths`` drawn round-robin over ``chosen`` as one process would, each lab's share run by a child soak of
    its own (``--only`` its cases, a seed of its own), all at once; one table of every outcome (and ``--json``'s
    file of them all). Each lane's log is written as it goes (``-u``), so a long run can be watched. With
    ``--lane-cases K`` a lab's cases are split over lanes of at most K cases, each with labs of its own: a death
    mostly waits (for its lease's TTL, the watchdog, the audit), so lanes side by side shorten the longest one."""
    by_lab: dict[str, list[Case]] = {}
    for c in chosen:
        by_lab.setdefault(c.lab, []).append(c)
    if args.lane_cases:
        split: dict[str, list[Case]] = {}
        for lab, mine in by_lab.items():
            # in the cases' order, so that storage.slow, storage.error and the FUSE daemon's death share a lane: the
            # audit of every node sees a FUSE mount anywhere on the machine, and one at a time is what one lane had
            parts = -(-len(mine) // args.lane_cases)
            size = -(-len(mine) // parts)
            for n in range(parts):
                split[lab if parts == 1 else f"{lab}-{n + 1}"] = mine[n * size:(n + 1) * size]
        by_lab = split
    lane_of = {c.name: lab for lab, mine in by_lab.items() for c in mine}
    share = {lab: 0 for lab in by_lab}
    for i in range(args.deaths):
        share[lane_of[chosen[i % len(chosen)].name]] += 1
    work = Path(tempfile.mkdtemp(prefix="chaoskit-soak-lanes-"))
    children = {}
    env = {k: v for k, v in os.environ.items() if k != "CHAOSKIT_STATE_DIR"}
    for n, (lab, mine) in enumerate(by_lab.items()):
        out = work / f"{lab}.json"
        argv = [sys.executable, "-u", str(Path(__file__).resolve()), "--deaths", str(share[lab]), "--seed", str(args.seed + n),
                "--settle", str(args.settle), "--cases", ",".join(c.name for c in mine), "--json", str(out)]
        log = open(work / f"{lab}.log", "w")
        children[lab] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), out, log)
        print(f"lane {lab}: {share[lab]} deaths over {len(mine)} case(s), log {work / (lab + '.log')}", file=sys.stderr)
    outcomes: list[Outcome] = []
    failed = []
    started, ended = time.time(), {}
    while len(ended) < len(children):  # each lane's time, so that a run shows which lane is the longest
        for lab, (proc, _, _) in children.items():
            if lab not in ended and proc.poll() is not None:
                ended[lab] = time.time()
                print(f"lane {lab}: ended in {ended[lab] - started:.1f}s (exit {proc.returncode})", file=sys.stderr)
        time.sleep(0.2)
    for lab, (proc, out, log) in children.items():
        log.close()
        try:
            outcomes += [Outcome(**o) for o in json.loads(out.read_text())]
        except (OSError, ValueError, TypeError) as e:
            failed.append(f"lane {lab} exited {proc.returncode} with no outcomes ({e}); its log: {work / (lab + '.log')}")
    order = {c.name: i for i, c in enumerate(chosen)}
    outcomes.sort(key=lambda o: order.get(o.case, len(order)))
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    code = report(outcomes)
    for line in failed:
        print(line)
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deaths", type=int, default=30)
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds the audit may take to come back clean")
    ap.add_argument("--only", default=None, help="comma-separated cases (names as in the table)")
    ap.add_argument("--cases", default=None, help="comma-separated case names, exactly (what --lanes gives each lane)")
    ap.add_argument("--json", type=Path, default=None, help="write every outcome here")
    ap.add_argument("--lanes", action="store_true",
                    help="run the cases of each lab (process, netns, slurm) in a soak process of their own, at once: "
                         "the same deaths per case in about a third of the time (each lane its own labs, state folder "
                         "and journal, so one lane's rollback never touches another's runs)")
    ap.add_argument("--lane-cases", type=int, default=0,
                    help="--lanes: at most this many cases per lane, a lab's cases split over several lanes")
    ap.add_argument("--soak", type=int, default=0, help="instead of deaths: N drills of the shipped scenarios as game days")
    ap.add_argument("--kill-share", type=float, default=0.1, help="--soak: share of drills whose controller is killed")
    ap.add_argument("--steps", type=int, default=0,
                    help="--soak: cut each scenario's job to this many steps (at least 40 past its last fault's end; "
                         "0: as shipped)")
    ap.add_argument("--fd-bound", type=float, default=0.5, help="--soak: most open fds the controller may gain per drill")
    ap.add_argument("--thread-bound", type=float, default=0.5, help="--soak: most threads it may gain per drill")
    ap.add_argument("--rss-bound-mib", type=float, default=4.0, help="--soak: most RSS (MiB) it may gain per drill")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/soak.py needs root (cgroups, network namespaces, tmpfs)", file=sys.stderr)
        return 2
    soak = Soak(args)
    if args.soak:
        try:
            drills = soak_drills(soak, args.soak, args.kill_share, args.steps)
            if args.json:
                args.json.write_text(json.dumps([d.__dict__ for d in drills], indent=2))
            return soak_report(soak, drills, args)  # before down(): it reads the drills' result.json in soak.work
        finally:
            soak.down()
    chosen = cases(str(soak.ckpt), str(soak.small_fs))
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        chosen = [c for c in chosen if c.name in wanted or c.kind in wanted]
    if args.cases:  # a lane's own: its names exactly (a kind's name would also take the cases of that kind)
        names = set(args.cases.split(","))
        chosen = [c for c in chosen if c.name in names]
    if args.lanes:
        shutil.rmtree(soak.work, ignore_errors=True)  # each lane makes its own
        return lanes(chosen, args)
    outcomes: list[Outcome] = []
    try:
        soak.up(need_netns=any(c.lab == "netns" for c in chosen), need_slurm=any(c.lab == "slurm" for c in chosen))
        for i in range(args.deaths):
            case = chosen[i % len(chosen)]
            outcomes.append(soak.one(case, i))
    finally:
        soak.down()
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    return report(outcomes)


if __name__ == "__main__":
    sys.exit(main())
