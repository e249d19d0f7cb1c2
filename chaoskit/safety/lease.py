"""Leases: a lasting fault's revert, armed on the node before the fault.

:meth:`LeaseManager.arm` starts :mod:`chaoskit.safety.watchdog` detached on the
node; the controller renews every lease from a background thread; ``release``
tells the watchdog its job is done. If the controller dies, the leases go stale
and every node reverts its own faults within the TTL.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from chaoskit.cluster.transports.api import Transport

__all__ = ["Lease", "LeaseManager", "default_lease_root"]

WATCHDOG = str(Path(__file__).with_name("watchdog.py"))


def default_lease_root() -> Path:
    from chaoskit.state import state_dir

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
        path = Path(self.directory) / "fired"
        return path.read_text().strip() if path.exists() else None


class LeaseManager:
    def __init__(self, root: Path, run_id: str, ttl: float) -> None:
        self.root = Path(root) / run_id
        self.ttl = ttl
        self.leases: dict[str, Lease] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def arm(self, transport: Transport, fault_id: str, revert: list[str], duration: float) -> Lease:
        """Start the watchdog for one fault; return once it is running."""
        directory = self.root / fault_id
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "lease").touch()
        deadline = time.time() + duration
        argv = [sys.executable, WATCHDOG, str(directory), f"{self.ttl:g}", f"{deadline:.3f}", "--", *revert]
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

    def release(self, fault_id: str) -> None:
        with self._lock:
            lease = self.leases.pop(fault_id, None)
        if lease is not None:
            (Path(lease.directory) / "released").touch()

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
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
            for lease in leases:
                try:
                    lease.transport.touch(str(Path(lease.directory) / "lease"))
                except OSError:
                    pass  # the watchdog decides; a missed renewal is what it is for
