"""The Ray transport: faults run through a ChaosAgent actor pinned to the node.

One :class:`ChaosAgent` per target node, placed with
``NodeAffinitySchedulingStrategy(soft=False)`` on the Ray node that carries the
node's custom resource (``chaoskit_node_<name>``), so it can run nowhere else.
It is started on the first call, and that first call is bounded by
``start_timeout``: a node whose raylet cannot place it fails the preflight
instead of hanging the run. When the actor dies (its node was powered off and
came back with a new Ray node id), the next call re-resolves the node id and
starts a new one.

On the node the agent acts exactly like :class:`~chaoskit.cluster.transports.local.LocalTransport`:
only processes whose environment carries the node's ``CHAOSKIT_SCOPE`` are
seen or signalled. Leases (``start_watchdog``) ship the standard-library
watchdog to the node and start it outside the actor's process tree, so a killed
agent leaves the watchdog to revert the fault when the lease goes stale. The
node's files (leases, the watchdog) live in its state folder
(:mod:`chaoskit.nodeside.nodefs`: ``/run/chaoskit`` as root, or ``$CHAOSKIT_WORKDIR`` of the raylet's
environment, which the Ray lab sets), never in ``/tmp``.

A cluster with Ray's token authentication (``RAY_AUTH_MODE=token``; the Ray lab's always has it) is joined with
its token file: :func:`ray_auth_env` names it to a child process, :func:`connect_ray` and :func:`node_table` to
this one. Ray reads the token from ``RAY_AUTH_TOKEN_PATH`` (a file, never a command line); without one given,
the user's own ``RAY_AUTH_*`` settings apply, as they do to ``ray`` itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from chaoskit.cluster.transports.api import CommandResult, InventorySite, JobScope, ListedNode, ProcInfo
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.errors import InfraError, TargetGone
from chaoskit.nodeside.nodefs import REVERT_FILE, inside, make_dirs, read_file, remove_tree, state_dir, touch_file, write_file

__all__ = ["RayTransport", "ChaosAgent", "connect_ray", "find_node_id", "discover_nodes", "ray_auth_env",
           "WORKDIR_ENV"]

WORKDIR_ENV = "CHAOSKIT_WORKDIR"
"""In a Ray node's environment: the state folder its ChaosAgent uses (the Ray lab's nodes run as an account with
no home of its own); unset, the effective user's default one."""

# A launcher that starts argv in a session of its own and exits at once: the
# started process is then no child of the actor's worker, which Ray may kill
# with its children when the worker exits.
_LAUNCHER = (
    "import subprocess,sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
    "                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)\n"
    "print(p.pid)\n"
)


class ChaosAgent:
    """Runs on the node (as a Ray actor); every method acts inside the node's scope only."""

    def __init__(self, node: str, scope: str | None) -> None:
        # Without a scope given, the node's scope is the mark its raylet was started with (the lab sets it).
        self.local = LocalTransport(node, scope or os.environ.get(LocalTransport.SCOPE_ENV))
        self.state_dir = state_dir(os.environ.get(WORKDIR_ENV) or None)
        self.lease_root = os.path.join(self.state_dir, "leases")

    def where(self) -> dict[str, Any]:
        """Who and where the agent is: its pid, Ray node id, scope mark and clock."""
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "scope_env": os.environ.get("CHAOSKIT_SCOPE"), "state_dir": self.state_dir, "t": time.time()}

    def _job(self, job: dict[str, Any] | None) -> LocalTransport:
        """The local scope for one call, with the drilled job the caller sent (calls run one at a time)."""
        self.local.job = JobScope.from_wire(job) if job else None
        return self.local

    def processes(self, workers_only: bool = False, node_wide: bool = False,
                  job: dict[str, Any] | None = None) -> list[ProcInfo]:
        return self._job(job).processes(workers_only, node_wide=node_wide)

    def in_scope(self, pid: int, job: dict[str, Any] | None = None) -> bool:
        return self._job(job).in_scope(pid)

    def state(self, pid: int, start_time: int | None = None, job: dict[str, Any] | None = None) -> str | None:
        return self._job(job).state(pid, start_time)

    def signal(self, pid: int, signum: int, start_time: int | None = None, job: dict[str, Any] | None = None) -> float:
        return self._job(job).signal(pid, signum, start_time)

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        result = self.local.run(argv, timeout)
        return CommandResult(result.argv, result.returncode, result.stdout, result.stderr, time.time())

    def spawn_detached(self, argv: list[str]) -> int:
        out = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, *argv], capture_output=True, text=True, timeout=30,
                             cwd="/")
        if out.returncode != 0:
            raise InfraError(f"could not start {argv[0]} on node {self.local.node}: {out.stderr.strip()}")
        return int(out.stdout.strip())

    def touch(self, path: str) -> None:
        path = inside(self.state_dir, path)
        make_dirs(self.state_dir, os.path.dirname(path))
        touch_file(path)

    def start_watchdog(self, lease_id: str, ttl: float, duration: float, revert: list[str], source: str) -> tuple[str, int]:
        directory = make_dirs(self.state_dir, os.path.join(self.lease_root, lease_id))
        for stale in ("released", "fired", "watchdog.pid", REVERT_FILE):
            try:
                os.unlink(os.path.join(directory, stale))
            except FileNotFoundError:
                pass
        script = os.path.join(self.state_dir, f"watchdog-{hashlib.sha256(source.encode()).hexdigest()[:12]}.py")
        write_file(script, source)
        touch_file(os.path.join(directory, "lease"))
        write_file(os.path.join(directory, REVERT_FILE), json.dumps([str(a) for a in revert]))  # not on a command line
        deadline = time.time() + duration
        pid = self.spawn_detached([sys.executable, "-I", script, directory, f"{ttl:g}", f"{deadline:.3f}"])
        for _ in range(500):  # the watchdog writes its pid file once it is watching
            if os.path.exists(os.path.join(directory, "watchdog.pid")):
                break
            time.sleep(0.01)
        return directory, pid

    def read_file(self, path: str) -> str | None:
        return read_file(path)

    def cleanup_leases(self, run_id: str) -> None:
        remove_tree(inside(self.state_dir, os.path.join(self.lease_root, run_id)))


_CONNECT_LOCK = threading.Lock()
_DRIVER = threading.Condition()
_IN_FLIGHT = 0
"""Calls of this process's Ray driver that are waiting for their answer (:func:`disconnect_ray` waits for them)."""


def connect_ray(address: str, token_file: str | None = None) -> None:
    """Join the Ray cluster at ``address`` as a driver (once per process), with its token file when it has one."""
    import ray

    with _CONNECT_LOCK:
        if ray.is_initialized():
            return
        _use_auth(token_file)
        _errors_to_stderr()
        try:
            ray.init(address=address, namespace="chaoskit", log_to_driver=False, logging_level="ERROR",
                     configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ...: the cluster is not there
            raise InfraError(f"cannot join the Ray cluster at {address}: {exc}",
                             hint="is it up? 'chaoskit lab up --ray' or 'ray status'") from None


def disconnect_ray(wait_s: float = 15.0) -> None:
    """Leave the Ray cluster as a driver (``ray.shutdown``) once the calls in flight have answered or ``wait_s``
    has passed, and no call starts meanwhile: a ``ray.get`` still waiting when its driver shuts down (a process
    watch's poll as the run ends) can spin in Ray's core worker for good, a core lost to a thread nobody waits
    for. Every call has its own deadline, so the wait is bounded by the longest of them."""
    import ray

    end = time.monotonic() + wait_s
    with _DRIVER:
        while _IN_FLIGHT and (left := end - time.monotonic()) > 0:
            _DRIVER.wait(left)
        ray.shutdown()


def ray_auth_env(token_file: str) -> dict[str, str]:
    """The variables that make a Ray process (a node, a driver, ``ray`` itself) use token authentication with the
    token in ``token_file``: the token stays in the file, off every command line and environment."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}


_AUTH_SEEN: list[tuple[str | None, ...]] = []


def _use_auth(token_file: str | None) -> None:
    """Make this process's Ray client use ``token_file`` (when given) for what it does next. Ray reads its
    settings from the environment once and keeps the token it loaded (``RayConfig``, ``AuthenticationTokenLoader``),
    so when they change (another lab's token) both are read again, as ``ray.init`` itself does when it turns
    token mode on (ray/_private/authentication/authentication_token_setup.py, ``_enable_token_auth``)."""
    if token_file is not None:
        os.environ.update(ray_auth_env(token_file))
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    seen = tuple(os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"))
    if _AUTH_SEEN and _AUTH_SEEN[-1] == seen:
        return
    first = not _AUTH_SEEN
    _AUTH_SEEN[:] = [seen]
    if first and token_file is None:
        return  # nothing read yet: Ray reads the environment as it starts
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _errors_to_stderr() -> None:
    """A Ray driver prints the cluster's error messages ("node ... marked dead") on stdout, even
    with ``log_to_driver=False`` (ray/_private/worker.py, listen_error_messages); chaoskit's stdout
    is ``--json`` output, so they go to stderr instead."""
    import ray._private.worker as ray_worker

    original = ray_worker.print_to_stdstream
    if getattr(original, "_chaoskit", False):
        return

    def to_stderr(data, ignore_prefix: bool):
        return original({**data, "is_err": True}, ignore_prefix)

    to_stderr._chaoskit = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


RESOURCE_PREFIX = "chaoskit_node_"


def node_resource(node: str) -> str:
    """The custom Ray resource that names a chaoskit node."""
    return f"{RESOURCE_PREFIX}{node}"


_STATES: dict[str, object] = {}


def node_table(address: str, token_file: str | None = None) -> list[dict]:
    """``ray.nodes()`` of the cluster at ``address`` (with its token file when it has one), without ``ray.init``;
    raise InfraError when the GCS is gone or refuses us."""
    from ray._private.internal_api import get_state_from_address

    _use_auth(token_file)
    try:
        state = _STATES.get(address)
        if state is None:
            state = _STATES[address] = get_state_from_address(address)
        return state.node_table()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - every GCS failure means the same to us
        _STATES.pop(address, None)
        raise InfraError(f"Ray GCS at {address}: {type(exc).__name__}: {exc}") from None


def find_node_id(resource: str, address: str | None = None) -> str | None:
    """The id of the live Ray node that carries ``resource``, or ``None``."""
    if address is not None:
        table = node_table(address)
    else:
        import ray

        table = ray.nodes()
    for entry in table:
        if entry.get("Alive") and entry.get("Resources", {}).get(resource):
            return entry["NodeID"]
    return None


def discover_nodes(address: str = "auto", token_file: str | None = None) -> list[tuple[str, dict[str, str], "RayTransport"]]:
    """(name, labels, transport) of every live Ray node but a head that holds no chaoskit node.

    A node started with a ``chaoskit_node_<name>`` resource (the lab's are) gets that
    name and is found again after a restart; any other is named ``ray-<first 8 hex
    of its node id>`` and pinned to that id. Labels are Ray's node labels, with
    characters selectors do not accept replaced by ``-``.
    """
    import re

    out = []
    for entry in node_table(address, token_file):
        if not entry.get("Alive"):
            continue
        resources = entry.get("Resources") or {}
        named = sorted(k[len(RESOURCE_PREFIX):] for k in resources if k.startswith(RESOURCE_PREFIX))
        if not named and "node:__internal_head__" in resources and not resources.get("CPU") and not resources.get("GPU"):
            continue  # a head that runs nothing (the lab's)
        name = named[0] if named else f"ray-{entry['NodeID'][:8]}"
        labels = {re.sub(r"[^A-Za-z0-9._-]", "-", str(k)): re.sub(r"[^A-Za-z0-9._-]", "-", str(v))
                  for k, v in (entry.get("Labels") or {}).items() if k != "ray.io/node-id"}
        labels["ray"] = "yes"
        conn = RayTransport(name, None, address=address, resource=f"{RESOURCE_PREFIX}{name}" if named else None,
                            node_id=None if named else entry["NodeID"], token_file=token_file)
        out.append((name, labels, conn))
    return out


class RayTransport:
    """A node reached through its ChaosAgent actor (see the module docstring)."""

    name = "ray"
    inventory_node = True  # an inventory node may say transport: ray, made by from_inventory

    has_own_network = False  # the lab's Ray nodes are process scopes on one host
    has_own_clock = False
    processes_here = False  # read through their Ray actors
    container = None

    def __init__(self, node: str, scope: str | None, *, address: str, resource: str | None = None,
                 node_id: str | None = None, start_timeout: float = 30.0, call_timeout: float = 10.0,
                 token_file: str | None = None) -> None:
        if resource is None and node_id is None:
            raise ValueError("a RayTransport needs the node's resource or its Ray node id")
        self.node, self.scope, self.address, self.resource = node, scope, address, resource
        self.token_file = token_file
        """The cluster's token file (:func:`ray_auth_env`); ``None``: the user's own Ray settings."""
        self.start_timeout, self.call_timeout = start_timeout, call_timeout
        self.node_id: str | None = None
        self.pinned_id = node_id
        """A node known only by its Ray id (discovered without a chaoskit resource) cannot be re-resolved."""
        self._actor: Any = None
        self._lock = threading.Lock()
        self._state_dir: str | None = None
        self.job: JobScope | None = None
        """The drilled job within the node's scope; the ChaosAgent enforces it on every call."""

    @classmethod
    def discover(cls, address: str = "auto", token_file: str | None = None) -> dict[str, tuple[dict[str, str], "RayTransport"]]:
        """Every live Ray node by name: (labels, transport) (:func:`discover_nodes`): an inventory's ``ray:``."""
        return {name: (labels, conn) for name, labels, conn in discover_nodes(address, token_file)}

    @classmethod
    def from_inventory(cls, site: InventorySite, index: int, spec: Any) -> ListedNode:
        """An inventory file's node (``transport: ray``): the live Ray node of that name the file's ``ray:`` found,
        its labels under the file's."""
        if spec.name not in site.discovered:
            raise site.error(f"nodes.{index}.name: no live Ray node is named {spec.name!r} (found: "
                             f"{', '.join(sorted(site.discovered)) or 'none'})", "nodes", index, "name")
        labels, conn = site.discovered.pop(spec.name)
        return ListedNode(conn, {**labels, **spec.labels})

    # -- Transport ---------------------------------------------------------------------------

    def _wire_job(self) -> dict[str, Any] | None:
        return self.job.wire() if self.job is not None else None

    def processes(self, workers_only: bool = False, *, node_wide: bool = False) -> list[ProcInfo]:
        return self._call("processes", bool(workers_only), bool(node_wide), self._wire_job())

    def in_scope(self, pid: int) -> bool:
        return self._call("in_scope", int(pid), self._wire_job())

    def state(self, pid: int, start_time: int | None = None) -> str | None:
        return self._call("state", int(pid), start_time, self._wire_job())

    def signal(self, pid: int, signum: int, start_time: int | None = None) -> float:
        return self._call("signal", int(pid), int(signum), start_time, self._wire_job())

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        return self._call("run", [str(a) for a in argv], float(timeout), timeout=float(timeout) + self.call_timeout)

    def spawn_detached(self, argv: list[str]) -> int:
        return self._call("spawn_detached", [str(a) for a in argv])

    def touch(self, path: str) -> None:
        self._call("touch", str(path), timeout=5.0)

    # -- WatchdogHost ------------------------------------------------------------------------

    @property
    def state_dir(self) -> str:
        """chaoskit's state folder on the node, as its agent made and checked it."""
        if self._state_dir is None:
            self._state_dir = str(self._call("where")["state_dir"])
        return self._state_dir

    def start_watchdog(self, lease_id: str, ttl: float, duration: float, revert: list[str], source: str) -> tuple[str, int]:
        return tuple(self._call("start_watchdog", lease_id, float(ttl), float(duration), [str(a) for a in revert],
                                source))  # type: ignore[return-value]

    def lease_fired(self, directory: str) -> str | None:
        return self._call("read_file", f"{directory}/fired")

    def cleanup_leases(self, run_id: str) -> None:
        self._call("cleanup_leases", run_id, timeout=5.0)

    # -- the agent ---------------------------------------------------------------------------

    def connect(self) -> dict[str, Any]:
        """Start the agent now (else the first call does); return where it runs."""
        return self._call("where")

    def ping(self, timeout: float = 5.0) -> float:
        """One round trip to the node's agent (started if needed); return the node's clock."""
        return float(self._call("where", timeout=timeout)["t"])

    @property
    def agent(self) -> Any:
        """The live actor handle, or ``None`` before the first call (tests kill it through this)."""
        return self._actor

    def close(self) -> None:
        """Stop the agent (a later call starts a new one)."""
        with self._lock:
            actor, self._actor = self._actor, None
        if actor is not None:
            import ray

            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass

    def _agent(self) -> Any:
        with self._lock:
            if self._actor is not None:
                return self._actor
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            connect_ray(self.address, self.token_file)
            if self.resource is not None:
                node_id = find_node_id(self.resource)
                missing = f"no live Ray node carries the resource {self.resource}"
            else:
                node_id = self.pinned_id if any(e["NodeID"] == self.pinned_id and e["Alive"] for e in ray.nodes()) else None
                missing = f"Ray node {self.pinned_id} is not alive (a restarted node has a new id: discover the inventory again)"
            if node_id is None:
                raise InfraError(f"node {self.node}: {missing}",
                                 hint="is the node up? 'ray status' lists the nodes and their resources")
            actor = ray.remote(ChaosAgent).options(
                num_cpus=0, max_concurrency=8, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self.node, self.scope)
            try:
                where = ray.get(actor.where.remote(), timeout=self.start_timeout)
            except Exception as exc:  # noqa: BLE001 - GetTimeoutError, ActorDiedError, ...
                ray.kill(actor)
                raise InfraError(f"node {self.node}: the ChaosAgent did not start within {self.start_timeout:g}s "
                                 f"({type(exc).__name__})") from None
            if where["node_id"] != node_id:  # soft=False makes this impossible; check rather than trust
                ray.kill(actor)
                raise InfraError(f"node {self.node}: the ChaosAgent landed on Ray node {where['node_id']}, not {node_id}")
            self.node_id, self._actor = node_id, actor
            return actor

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        global _IN_FLIGHT
        actor = self._agent()
        with _DRIVER:  # not while disconnect_ray holds it; after it, the actor's driver is gone
            if not ray.is_initialized():
                raise InfraError(f"{method} on node {self.node}: this process has left the Ray cluster")
            _IN_FLIGHT += 1
        try:
            return ray.get(getattr(actor, method).remote(*args), timeout=timeout or self.call_timeout)
        except GetTimeoutError:
            raise InfraError(f"{method} on node {self.node}: no answer from the ChaosAgent within "
                             f"{timeout or self.call_timeout:g}s") from None
        except RayActorError as exc:
            with self._lock:  # the node is gone or restarted: the next call re-resolves its Ray node id
                if self._actor is actor:
                    self._actor, self.node_id = None, None
            raise InfraError(f"{method} on node {self.node}: the ChaosAgent died ({type(exc).__name__})") from None
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            message = getattr(cause, "message", None) or str(cause or exc).strip().splitlines()[-1]
            if isinstance(cause, TargetGone):  # the ChaosAgent's own word: the process exited before the op
                raise TargetGone(message) from None
            raise InfraError(message if isinstance(cause, InfraError) else f"{method} on node {self.node} failed: {message}") from None
        finally:
            with _DRIVER:
                _IN_FLIGHT -= 1
                _DRIVER.notify_all()
