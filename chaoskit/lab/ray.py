"""A Ray cluster on the process lab: a head plus one ``ray start`` per lab node.

Each node's Ray processes (raylet, its workers, the ChaosAgent actor that runs
faults there) are started with the node's ``CHAOSKIT_SCOPE`` in their
environment, so they belong to that node exactly like its torchrun agent does:
selectors see them, ``lab down`` stops them, and powering the node off kills
them all. Every node also carries a custom resource naming it
(``chaoskit_node_n1: 1``), which is how :class:`~chaoskit.cluster.transports.ray.RayTransport`
finds the node's Ray id.

Ray's Python processes rename themselves, which can blank their environment
as /proc shows it; :func:`scope_pids` therefore also follows the process tree
down from the marked raylet, so power-off and ``down`` miss none of them.
Each node offers 2 logical CPUs, so a Ray Train worker group (one worker per
node, SPREAD) can re-form on the surviving nodes when one is powered off.

The head holds no CPUs (nothing is scheduled there) and lives in a scope of its
own, ``<lab id>.ray-head``; a Ray Train driver gets ``<lab id>.ray-driver``. Ray's failure detector is tightened on the lab
(``RAY_health_check_*``) so that a dead node is declared within a few seconds;
the detection a drill measures is Ray's own, with these settings.

Who may use the cluster: Ray's GCS listens on loopback, where every local user reaches it, and whoever joins a
Ray cluster runs code on its nodes. So the lab turns on Ray's token authentication (``RAY_AUTH_MODE=token``):
a fresh random token per lab, in a 0600 file of the lab's folder, named to the nodes, chaoskit's driver and the
Ray Train driver by ``RAY_AUTH_TOKEN_PATH`` (never on a command line). And when chaoskit is root the nodes run
as a lab account of its own (:func:`~chaoskit.core.accounts.claim_lab_account`), not as root, unless that
account cannot run chaoskit's Python (:attr:`RayLab.root_why` says why; ``lab up`` prints it).

The lab's folder (:data:`TEMP_PREFIX` and a random name in the system's temporary folder, mode 0700, the
nodes' account's) holds Ray's ``--temp-dir`` (sessions, logs, sockets), the token, the agents' state folder
and the nodes' ``HOME`` and ``TMPDIR``. Its name says nothing of the lab: chaoskit's own state folder records
which folder is which lab's (:func:`lab_record_path`), for ``lab down`` and a crashed run's rollback.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaoskit.cluster.inventory import Inventory, Node, PowerCommands
from chaoskit.cluster.transports.local import LocalTransport, proc_info, read_proc
from chaoskit.cluster.transports.ray import WORKDIR_ENV, RayTransport, node_resource, node_table, ray_auth_env
from chaoskit.core.accounts import Account, AccountClaim, account_named, claim_lab_account, python_paths, unreachable_by
from chaoskit.core.errors import InfraError
from chaoskit.core.files import torch_cache_env
from chaoskit.core.state import private_dir, state_dir
from chaoskit.lab.process import ProcessLab

__all__ = ["RayLab", "ray_lab_state_path", "ray_nodes_state_path", "lab_record_path", "HEAD_NODE", "ray_available",
           "scope_pids", "stop_lab_processes", "TEMP_PREFIX"]

HEAD_NODE = "ray-head"

# Ray's defaults declare a node dead after 5 missed checks 3 s apart; the lab uses 1 s x 3. Ray starts its workers
# at nice 15 (worker_niceness), below everything else on the machine: on a lab that shares a busy machine, a Ray
# Train worker then waits behind any other process (two busy loops held the job's first steps off past 180 s). The
# lab's workers run at the priority a training process has on its node, as the other labs' jobs do.
HEALTH_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
              "RAY_health_check_initial_delay_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0",
              "RAY_worker_niceness": "0"}


def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def ray_lab_state_path() -> Path:
    return state_dir() / "lab" / "ray.json"


def ray_nodes_state_path() -> Path:
    """Where the process lab under a persistent Ray lab records itself (apart from a plain process lab's)."""
    return state_dir() / "lab" / "ray-nodes.json"


def lab_record_path(lab_id: str) -> Path:
    """Where chaoskit's private state records a Ray lab while it is up (ephemeral ones too): its address, folder,
    token file and account; what ``lab down``, the power commands and a crashed run's rollback read."""
    if not lab_id or "/" in lab_id or lab_id.startswith("."):
        raise ValueError(f"not a lab id: {lab_id!r}")
    return private_dir("ray-labs") / f"{lab_id}.json"


def _ray_cli() -> str:
    here = Path(sys.executable).with_name("ray")
    found = str(here) if here.exists() else shutil.which("ray")
    if not found:
        raise InfraError("the ray command is not installed", hint="pip install 'chaoskit[ray]'")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayLab:
    """A Ray cluster whose nodes are the process lab's nodes."""

    lab: ProcessLab
    address: str
    num_cpus: int = 2
    object_store_bytes: int = 80 * 1024 * 1024
    persistent: bool = False
    temp_dir: str | None = None
    """Ray's ``--temp-dir``: ``r`` in the lab's folder (see the module docstring; Ray makes its own temp folder
    0777, and the default ``/tmp/ray`` is shared by every user of the machine). Short: Ray's socket paths live in it."""
    account: Account | None = None
    """Whom the nodes run as: the lab's account when chaoskit is root; ``None``: as chaoskit itself."""
    root_why: str | None = None
    """Why the nodes run as root though chaoskit has an account for them (``None``: they do not)."""
    claim: AccountClaim | None = field(default=None, repr=False, compare=False)
    """This process's hold on :attr:`account` while it starts the lab (another lab takes another account), let go
    at :meth:`down`; once the nodes run, their processes keep it the lab's (no other lab takes an account that
    processes run as)."""

    @property
    def folder(self) -> str | None:
        """The lab's own folder (0700, the nodes' account's): Ray's temp folder, the token, the agents' state."""
        return os.path.dirname(self.temp_dir) if self.temp_dir else None

    @property
    def token_file(self) -> str | None:
        """The file holding the cluster's token (0600, the nodes' account's); ``None`` for a lab never started."""
        return os.path.join(self.folder, "token") if self.folder else None

    # -- life cycle -----------------------------------------------------------------------

    @classmethod
    def start(cls, lab: ProcessLab, *, num_cpus: int = 2, object_store_mb: int = 80,
              persistent: bool = False, timeout: float = 90.0) -> "RayLab":
        """Start the head and one Ray node per lab node; return once every node is alive in Ray's table."""
        port = _free_port()
        claim, root_why = _nodes_account()
        account = claim.account if claim is not None else None
        try:
            folder = _make_folder(account)
        except BaseException:
            if claim is not None:
                claim.release()
            raise
        ray_lab = cls(lab, f"127.0.0.1:{port}", num_cpus, object_store_mb * 1024 * 1024, persistent,
                      os.path.join(folder, "r"), account, root_why, claim)
        try:
            ray_lab._record()
            ray_lab._ray_start(HEAD_NODE, ["--head", f"--port={port}", "--num-cpus=0",
                                           "--include-dashboard=false", "--disable-usage-stats",
                                           f"--resources={json.dumps({'chaoskit_head': 1})}"])
            for node in lab.node_names():
                ray_lab.start_node(node, wait=False)
            ray_lab.wait_alive(lab.node_names(), timeout)
        except BaseException:
            ray_lab.down()
            raise
        if persistent:
            path = ray_lab_state_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(ray_lab._fields()))
        return ray_lab

    @classmethod
    def load(cls, lab: ProcessLab | None = None) -> "RayLab | None":
        """The Ray lab ``chaoskit lab up --kind ray`` left, when it belongs to ``lab`` (default: its own process lab)."""
        lab = lab or ProcessLab.load(ray_nodes_state_path())
        path = ray_lab_state_path()
        if lab is None or not path.exists():
            return None
        data = json.loads(path.read_text())
        if data.get("lab_id") != lab.lab_id:
            return None
        return cls._from_fields(lab, data, persistent=True)

    @classmethod
    def recorded(cls, lab_id: str, nodes: int = 0) -> "RayLab | None":
        """The Ray lab ``lab_id`` as chaoskit's state recorded it when it started (:func:`lab_record_path`)."""
        try:
            data = json.loads(lab_record_path(lab_id).read_text())
        except (OSError, ValueError):
            return None
        return cls._from_fields(ProcessLab(lab_id, nodes or int(data.get("nodes", 0))), data)

    @classmethod
    def _from_fields(cls, lab: ProcessLab, data: dict, persistent: bool = False) -> "RayLab":
        account = None
        if data.get("account"):
            try:
                account = account_named(data["account"])
            except InfraError:
                account = None
        return cls(lab, data["address"], int(data["num_cpus"]), int(data["object_store_mb"]) * 1024 * 1024,
                   persistent, data.get("temp_dir"), account, data.get("root_why"))

    def _fields(self) -> dict:
        return {"lab_id": self.lab.lab_id, "nodes": self.lab.nodes, "address": self.address,
                "num_cpus": self.num_cpus, "object_store_mb": self.object_store_bytes // (1024 * 1024),
                "temp_dir": self.temp_dir, "account": self.account.name if self.account else None,
                "root_why": self.root_why}

    def _record(self) -> None:
        path = lab_record_path(self.lab.lab_id)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        tmp.write_text(json.dumps(self._fields()))
        os.replace(tmp, path)

    @property
    def runs_as(self) -> str:
        """Whom the nodes run as, in words (``lab up`` and the run's plan say it)."""
        if self.account is not None:
            return f"as {self.account.name}"
        if os.geteuid() == 0:
            return f"as root ({self.root_why})" if self.root_why else "as root"
        return "as you"

    def start_node(self, node: str, wait: bool = True, timeout: float = 60.0) -> None:
        """``ray start`` one lab node (again, after a power-off) with the node's scope and resource."""
        self._ray_start(node, [f"--address={self.address}", f"--num-cpus={self.num_cpus}", "--num-gpus=0",
                               "--disable-usage-stats", f"--resources={json.dumps({node_resource(node): 1})}"])
        if wait:
            self.wait_alive([node], timeout)

    def kill_node(self, node: str) -> int:
        """Power a node off: SIGKILL its raylet and every other process of the node at once; return how many."""
        killed = 0
        for _ in range(5):  # a worker forking while we kill gets caught on the next pass
            pids = scope_pids({self.lab.scope(node)})
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return killed

    def down(self) -> int:
        """Stop every Ray process of the lab (head included); return how many processes there were.

        The nodes (and a Ray Train driver) first, while the head is up: their raylets and agents end on SIGTERM within
        a second then, and outwait the grace when the head goes at the same time. The head's own processes
        (gcs_server, its raylet, the autoscaler's monitor) do not end on SIGTERM within seconds even alone, and hold
        nothing to keep (the cluster's state is in memory; the lab's folder goes next): they are killed at once."""
        n = _stop_scopes({self.lab.scope(node) for node in ["ray-driver", *self.lab.node_names()]})
        n += _stop_scopes({self.lab.scope(HEAD_NODE)}, grace=0.0)
        if self.persistent:
            ray_lab_state_path().unlink(missing_ok=True)
        if self.folder is not None:  # the lab's own folder (mkdtemp's, 0700): Ray's files with it
            _remove_folder(self.folder, self.account)
        lab_record_path(self.lab.lab_id).unlink(missing_ok=True)
        if self.claim is not None:
            self.claim.release()
        return n

    # -- what runs use ---------------------------------------------------------------------

    def inventory(self) -> Inventory:
        """The lab's nodes, each reached through a ChaosAgent actor pinned to it, with lab power commands."""
        base = self.lab.inventory()
        nodes: list[Node] = []
        for n in base.nodes:
            conn = RayTransport(n.name, self.lab.scope(n.name), address=self.address, resource=node_resource(n.name),
                                token_file=self.token_file)
            power = PowerCommands(**{a: self.power_argv(n.name, a) for a in ("off", "on", "status")}, timeout=90)
            nodes.append(Node(n.name, n.address, "ray", {**n.labels, "ray": "yes"}, n.gpus, conn, power=power))
        return Inventory(base.name, nodes)

    def power_argv(self, node: str, action: str) -> list[str]:
        """The inventory's power command for a lab node (run on the controller). Nothing secret: the token stays
        in its file, which the command finds in the lab's folder."""
        return [sys.executable, "-m", "chaoskit.lab.ray", "power", action, "--lab", self.lab.lab_id,
                "--nodes", str(self.lab.nodes), "--address", self.address, "--num-cpus", str(self.num_cpus),
                "--object-store-mb", str(self.object_store_bytes // (1024 * 1024)),
                *(["--temp-dir", self.temp_dir] if self.temp_dir else []),
                *(["--account", self.account.name] if self.account else []), node]

    def power(self, node: str, action: str) -> bool:
        """off: kill the node's raylet and every process of the node; on: ``ray start`` it again; return whether it is on."""
        if action == "off":
            self.kill_node(node)
            return False
        if action == "on":
            if not self.alive_nodes().get(node) or not self._raylet_running(node):
                self.start_node(node)
            return True
        if action == "status":
            return bool(self.alive_nodes().get(node)) and self._raylet_running(node)
        raise ValueError(f"unknown power action {action!r}")

    def _raylet_running(self, node: str) -> bool:
        scope = self.lab.scope(node)
        return any(p.env.get(LocalTransport.SCOPE_ENV) == scope and p.state != "Z" and "raylet" in p.cmdline.split(" ")[0]
                   for p in read_proc())

    def alive_nodes(self) -> dict[str, bool]:
        """Lab node name -> alive in Ray's node table (a node never seen is absent)."""
        out: dict[str, bool] = {}
        for entry in _ray_list_nodes(self.address, self.token_file):
            for name in self.lab.node_names():
                if entry.get("resources", {}).get(node_resource(name)):
                    out[name] = out.get(name, False) or entry["alive"]
        return out

    def wait_alive(self, nodes: list[str], timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                alive = self.alive_nodes()
            except InfraError:
                alive = {}
            missing = [n for n in nodes if not alive.get(n)]
            if not missing:
                return
            if time.time() > deadline:
                raise InfraError(f"Ray nodes {', '.join(missing)} not alive within {timeout:g}s",
                                 hint=f"see the logs under {self.temp_dir or '/tmp/ray'}/session_latest/logs")
            time.sleep(0.2)

    # -- internals -------------------------------------------------------------------------

    def _ray_start(self, node: str, args: list[str]) -> None:
        if self.folder is None or self.token_file is None:
            raise InfraError(f"Ray lab {self.lab.lab_id} has no folder of its own: was it started by this chaoskit?")
        env = {**os.environ, **HEALTH_ENV, LocalTransport.SCOPE_ENV: self.lab.scope(node),
               **ray_auth_env(self.token_file), WORKDIR_ENV: os.path.join(self.folder, "state"),
               # the workers inherit the raylet's environment: their temporary files and torch caches in the lab's folder
               "TMPDIR": os.path.join(self.folder, "tmp"), **torch_cache_env(self.folder)}
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
            env.pop(name, None)
        ids: dict = {}
        if self.account is not None:  # none of root's identity, and no group but its own
            env.update({**self.account.env(), "HOME": self.folder})
            ids = self.account.popen_ids()
        argv = [_ray_cli(), "start", "--node-ip-address=127.0.0.1", f"--object-store-memory={self.object_store_bytes}",
                "--include-log-monitor=false", f"--temp-dir={self.temp_dir}", *args]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              cwd=self.folder, **ids)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise InfraError(f"ray start for node {node} failed (exit {proc.returncode}): {' | '.join(tail)}")

def scope_pids(scopes: set[str] | None = None, prefix: str | None = None) -> list[int]:
    """Live processes of ``scopes`` (or of every scope starting with ``prefix``): those
    carrying the mark, and every descendant of theirs.

    Ray's Python processes rename themselves (setproctitle), which can blank their
    environment as /proc shows it, so the mark alone misses the raylet's agents
    and workers; they are the raylet's children, so the process tree finds them.
    """
    def marked(scope: str | None) -> bool:
        return bool(scope) and (scope in (scopes or ()) or (prefix is not None and scope.startswith(prefix)))

    procs = [p for p in read_proc() if p.state != "Z"]
    members = {p.pid for p in procs if marked(p.env.get(LocalTransport.SCOPE_ENV))}
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    stack = list(members)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    return sorted(members)


TEMP_PREFIX = "chaoskit-ray-"
"""A Ray lab's folder: ``<system temp>/chaoskit-ray-<random>`` (nothing of the lab's id: a name nobody can guess;
before, ``ckray-<lab id>-<random>``)."""


def _nodes_account() -> tuple[AccountClaim | None, str | None]:
    """Whom the lab's Ray nodes run as (a lab account of its own, held), and why root when chaoskit has an account
    for them but it cannot run them: the account must reach chaoskit's Python, its packages and Ray's own binaries."""
    claim = claim_lab_account()
    if claim is None:
        return None, None
    account = claim.account
    import importlib.util

    spec = importlib.util.find_spec("ray")
    ray_dirs = [Path(d) for d in (spec.submodule_search_locations or [])] if spec is not None else []
    # The runner asks the same of the job's driver (jobuser.decide_job_user): both run as the account, or neither.
    problem = unreachable_by(account, [*python_paths(), *ray_dirs, Path(_ray_cli())])
    if problem:
        claim.release()
        return None, f"{account.name} cannot run Ray here: {problem}"
    return claim, None


def _make_folder(account: Account | None) -> str:
    """The lab's folder: a fresh random name (``mkdtemp``, 0700) with the token file (0600) and the folders the
    nodes write (``state``, ``tmp``) in it, all given to ``account`` (the folder itself last: until then only
    this process can write in it)."""
    folder = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = os.open("token", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
                if account is not None:
                    os.fchown(fh.fileno(), account.uid, account.gid)
            for name in ("state", "tmp"):
                os.mkdir(name, 0o700, dir_fd=dfd)
                if account is not None:
                    os.chown(name, account.uid, account.gid, dir_fd=dfd, follow_symlinks=False)
            if account is not None:
                os.fchown(dfd, account.uid, account.gid)
        finally:
            os.close(dfd)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _remove_folder(folder: str, account: Account | None = None) -> None:
    """``folder`` removed when it is a Ray lab's folder (a folder of the system's temporary one named
    :data:`TEMP_PREFIX`..., not a link) owned by this user or the lab's account."""
    try:
        st = os.lstat(folder)
    except OSError:
        return
    owners = {os.geteuid(), *([account.uid] if account is not None else [])}
    if (stat.S_ISDIR(st.st_mode) and st.st_uid in owners and os.path.dirname(folder) == tempfile.gettempdir()
            and os.path.basename(folder).startswith(TEMP_PREFIX)):
        shutil.rmtree(folder, ignore_errors=True)


def stop_lab_processes(lab_id: str) -> int:
    """Stop every process of a lab, Ray's renamed ones included (``chaoskit rollback`` after a crash), and remove the
    lab's folder that chaoskit's state recorded."""
    n = _stop_scopes(set(), prefix=f"{lab_id}.")
    ray_lab = RayLab.recorded(lab_id)
    if ray_lab is not None:
        if ray_lab.folder is not None:
            _remove_folder(ray_lab.folder, ray_lab.account)
        lab_record_path(lab_id).unlink(missing_ok=True)
    return n


def _stop_scopes(scopes: set[str], grace: float = 3.0, prefix: str | None = None) -> int:
    """SIGTERM every process of ``scopes`` at once, SIGKILL what is left after ``grace``."""
    first = scope_pids(scopes, prefix)
    known: dict[int, int] = {}
    for sig, wait in ((signal.SIGCONT, 0.0), (signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        # Children orphaned by an earlier signal lose their parent link: keep every process seen, known by pid and
        # start time so that a reused pid is never signalled. Not by command line: a Ray worker renames itself
        # (setproctitle) as it starts and with each task, and one renamed between two looks was taken for another
        # process and left running (CI: a worker of a crashed run's lab outlived its rollback).
        known.update({pid: started for pid in scope_pids(scopes, prefix) if (started := _started(pid)) is not None})
        for pid, started in list(known.items()):
            if _started(pid) != started:
                del known[pid]
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                del known[pid]
        deadline = time.time() + wait
        while time.time() < deadline and any(_started(pid) == t for pid, t in known.items()):
            time.sleep(0.05)
    return len(first)


def _started(pid: int) -> int | None:
    """When a live process started (with its pid, what names it), ``None`` when it is gone or a zombie."""
    info = proc_info(pid)
    return info.start_time if info is not None and info.state != "Z" else None


def _ray_list_nodes(address: str, token_file: str | None) -> list[dict]:
    """Ray's node table, read from the GCS (no driver: this process does not join the cluster)."""
    return [{"node_id": e["NodeID"], "alive": bool(e["Alive"]), "resources": e.get("Resources", {}),
             "labels": e.get("Labels", {})} for e in node_table(address, token_file)]


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoskit.lab.ray power off|on|status ... NODE``: the Ray lab's power commands."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m chaoskit.lab.ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_power = sub.add_parser("power")
    p_power.add_argument("action", choices=["off", "on", "status"])
    p_power.add_argument("--lab", required=True)
    p_power.add_argument("--nodes", type=int, required=True)
    p_power.add_argument("--address", required=True)
    p_power.add_argument("--num-cpus", type=int, default=2)
    p_power.add_argument("--object-store-mb", type=int, default=80)
    p_power.add_argument("--temp-dir")
    p_power.add_argument("--account", help="the account the lab's nodes run as (chaoskit as root)")
    p_power.add_argument("node")
    args = parser.parse_args(argv)
    try:
        account = account_named(args.account) if args.account else None
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lab = RayLab(ProcessLab(args.lab, args.nodes), args.address, args.num_cpus, args.object_store_mb * 1024 * 1024,
                 temp_dir=args.temp_dir, account=account)
    if args.node not in lab.lab.node_names():
        print(f"error: {args.node} is not a node of lab {args.lab}", file=sys.stderr)
        return 2
    try:
        on = lab.power(args.node, args.action)
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print("on" if on else "off")
    return 0 if on or args.action == "off" else 1


if __name__ == "__main__":
    sys.exit(main())
