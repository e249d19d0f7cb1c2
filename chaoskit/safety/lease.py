"""Leases: a lasting fault's revert, armed on the node before the fault.

:meth:`LeaseManager.arm` starts :mod:`chaoskit.nodeside.watchdog` detached on the
node; the controller renews every lease from a background thread; ``release``
tells the watchdog its job is done. If the controller dies, the leases go stale
and every node reverts its own faults within the TTL.

A transport that reaches a remote node (SSH) implements
:class:`~chaoskit.cluster.transports.api.WatchdogHost`: it ships the watchdog
script to the node and starts it there, with the lease directory on the node.
Other transports get the controller-local watchdog through ``spawn_detached``, its lease folder made
under a root of the controller's own (checked as :mod:`chaoskit.nodeside.nodefs` checks a node's state folder).
Either way the watchdog runs with ``python3 -I`` as one self-contained program
(:func:`~chaoskit.nodeside.watchdog.watchdog_source`).

A fault with no duration (``inproc.hang`` without one: "for good") has no deadline: its watchdog reverts only
when its lease goes stale, and the run reverts it itself (once recovery is measured or the job ended, at
``abort_after``, on Ctrl-C), renewing its lease until then.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from chaoskit.cluster.transports.api import Transport, WatchdogHost
from chaoskit.core.errors import InfraError
from chaoskit.core.state import state_dir
from chaoskit.core.threads import DaemonPool
from chaoskit.nodeside.nodefs import REVERT_FILE, StateDirError, ensure_dir, make_dirs, read_file, touch_file, write_file
from chaoskit.nodeside.watchdog import watchdog_source

__all__ = ["Lease", "LeaseManager", "default_lease_root"]


def default_lease_root() -> Path:
    return state_dir() / "leases"


@dataclass
class Lease:
    fault_id: str
    node: str
    directory: str
    deadline: float
    revert: list[str]
    transport: Transport
    watchdog_pid: int = 0

    @property
    def fired(self) -> str | None:
        text = read_file(str(Path(self.directory) / "fired"))
        return text.strip() if text is not None else None


class LeaseManager:
    def __init__(self, root: Path, run_id: str, ttl: float) -> None:
        self.root = Path(root) / run_id
        self.run_id = run_id
        self.ttl = ttl
        self._remote: dict[int, Transport] = {}
        self._renewals: dict[str, Future] = {}
        self._pool: DaemonPool | None = None
        self.leases: dict[str, Lease] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def arm(self, transport: Transport, fault_id: str, revert: list[str], duration: float | None) -> Lease:
        """Start the watchdog for one fault; return once it is running.

        ``duration`` ``None``: the fault lasts until the run reverts it; the watchdog has no deadline (``inf``)
        and reverts only on a stale lease."""
        if duration is None:
            duration = math.inf
        if isinstance(transport, WatchdogHost):
            deadline = time.time() + duration
            remote_dir, pid = transport.start_watchdog(f"{self.run_id}/{fault_id}", self.ttl, duration, revert,
                                                      watchdog_source())
            lease = Lease(fault_id, transport.node, remote_dir, deadline, revert, transport, pid)
            with self._lock:
                self.leases[fault_id] = lease
                self._remote[id(transport)] = transport
            self._ensure_renewing()
            return lease
        directory, script = self._local_lease(fault_id)
        try:  # not on the command line: every user of the machine reads those (a power command's password)
            write_file(str(directory / REVERT_FILE), json.dumps(list(revert)), 0o600)
        except (StateDirError, OSError) as exc:
            raise InfraError(f"cannot arm a lease for {fault_id}: {exc}") from None
        deadline = time.time() + duration
        argv = [sys.executable, "-I", str(script), str(directory), f"{self.ttl:g}", f"{deadline:.3f}"]
        pid = transport.spawn_detached(argv)
        lease = Lease(fault_id, transport.node, str(directory), deadline, revert, transport, pid)
        for _ in range(200):  # the watchdog writes its pid file once it is watching
            if (directory / "watchdog.pid").exists():
                break
            time.sleep(0.01)
        with self._lock:
            self.leases[fault_id] = lease
        self._ensure_renewing()
        return lease

    def _local_lease(self, fault_id: str) -> tuple[Path, Path]:
        """A fresh lease folder for ``fault_id`` under this run's root, and the watchdog's script beside the runs."""
        try:
            root = Path(ensure_dir(str(self.root.parent)))
            directory = Path(make_dirs(str(root), str(self.root / fault_id)))
            for stale in ("released", "fired", "watchdog.pid", REVERT_FILE):
                (directory / stale).unlink(missing_ok=True)
            touch_file(str(directory / "lease"))
            script = root / "watchdog.py"
            write_file(str(script), watchdog_source(), 0o600)
        except (StateDirError, OSError) as exc:
            raise InfraError(f"cannot arm a lease for {fault_id}: {exc}") from None
        return directory, script

    def release(self, fault_id: str) -> None:
        with self._lock:
            lease = self.leases.pop(fault_id, None)
        if lease is not None:
            try:
                lease.transport.touch(str(Path(lease.directory) / "released"))
            except Exception:  # noqa: BLE001 - unreachable node: its watchdog reverts (idempotently) on its own
                pass

    def abandon(self, fault_id: str) -> None:
        """Stop renewing a lease *without* releasing it: its watchdog reverts within the TTL.

        For a revert that failed or could not be verified; ``release`` would make the
        watchdog stand down and leave the fault in place.
        """
        with self._lock:
            self.leases.pop(fault_id, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        for transport in self._remote.values():
            try:
                transport.cleanup_leases(self.run_id)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - leftover files in the node's workdir, nothing armed
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def _ensure_renewing(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, name="chaoskit-lease-renew", daemon=True)
            self._thread.start()

    def _renew_loop(self) -> None:
        interval = max(0.2, self.ttl / 4)
        while not self._stop.wait(interval):
            with self._lock:
                leases = list(self.leases.values())
            if self._pool is None:
                self._pool = DaemonPool(16, "chaoskit-lease")  # a wedged renewal must not keep chaoskit from exiting
            for lease in leases:
                # One renewal in flight per lease: a node that does not answer delays only its own.
                busy = self._renewals.get(lease.fault_id)
                if busy is not None and not busy.done():
                    continue
                self._renewals[lease.fault_id] = self._pool.submit(self._renew, lease)

    @staticmethod
    def _renew(lease: Lease) -> None:
        try:
            lease.transport.touch(str(Path(lease.directory) / "lease"))
        except Exception:  # noqa: BLE001 - the watchdog decides; a missed renewal is what it is for
            pass
